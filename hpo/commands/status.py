"""``hpo status``: the study's trials by state, with their parameters, last value, job and cost."""

from __future__ import annotations

from hpo.commands.common import Command, Options, add_view_arguments, open_study, print_json, print_lines


def run(options: Options) -> int:
    from hpo.observe import documents, views

    spec, _, study = open_study(options)
    if options.json:
        return print_json(documents.status(spec, study))
    return print_lines(views.status_lines(spec, study))


COMMAND = Command(
    name="status",
    help="trials by state, with parameters, last value, job id and GPU-hours",
    add_arguments=add_view_arguments,
    run=run,
)
