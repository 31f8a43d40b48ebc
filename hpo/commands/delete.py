"""``hpo delete``: remove the study from its storage, once nothing of it runs."""

from __future__ import annotations

import argparse

from hpo.commands.common import Command, Options, add_study_arguments, open_study, print_lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_study_arguments(parser)
    parser.add_argument("--yes", action="store_true", help="do not ask to confirm")


def run(options: Options) -> int:
    from hpo.observe import studies

    spec, storage, _ = open_study(options)
    return print_lines(studies.delete_study(spec, storage, confirmed=options.yes))


COMMAND = Command(
    name="delete",
    help="remove the study from its storage (nothing of it may run; asks to confirm)",
    add_arguments=add_arguments,
    run=run,
)
