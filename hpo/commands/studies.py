"""``hpo studies``: the studies of a storage, or of every storage the user launched in."""

from __future__ import annotations

import argparse

from hpo.commands.common import PASSWORD_ON_COMMAND_LINE, STORAGE_HELP, Command, Options, print_lines
from hpo.errors import StudyFileError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage", help=f"a storage URL ({STORAGE_HELP})")


def run(options: Options) -> int:
    from hpo.observe import studies
    from hpo.storage import has_password, resolve_url

    if options.storage is not None:
        if has_password(options.storage):
            raise StudyFileError(PASSWORD_ON_COMMAND_LINE)
        refs = [resolve_url(options.storage, "--storage")]
    else:
        refs = studies.launched_storages()
    return print_lines(studies.list_studies(refs))


COMMAND = Command(
    name="studies",
    help="the studies in a storage (--storage), or every study you launched: trials, best, compute",
    add_arguments=add_arguments,
    run=run,
)
