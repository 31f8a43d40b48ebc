"""``hpo cancel``: stop the study now (its launchers, workers and jobs); a later launch continues it."""

from __future__ import annotations

from hpo.commands.common import Command, Options, add_study_arguments, open_study, print_lines


def run(options: Options) -> int:
    from hpo.dispatch import cancel

    spec, storage, study = open_study(options)
    return print_lines(cancel.cancel(spec, storage, study))


COMMAND = Command(
    name="cancel", help="cancel the study's running jobs", add_arguments=add_study_arguments, run=run
)
