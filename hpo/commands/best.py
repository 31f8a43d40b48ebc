"""``hpo best``: the study's best trial and the command that runs it again."""

from __future__ import annotations

from hpo.commands.common import Command, Options, add_view_arguments, open_study, print_json, print_lines


def run(options: Options) -> int:
    from hpo.observe import documents, views

    spec, _, study = open_study(options)
    if options.json:
        return print_json(documents.best(spec, study))
    return print_lines(views.best_lines(spec, study))


COMMAND = Command(
    name="best",
    help="the best trial and a ready full-training command",
    add_arguments=add_view_arguments,
    run=run,
)
