"""``hpo dashboard``: optuna-dashboard on the study's storage."""

from __future__ import annotations

import argparse

from hpo.commands.common import Command, Options, add_study_arguments, open_study
from hpo.observe.dashboard import DEFAULT_HOST, DEFAULT_PORT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_study_arguments(parser)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST} (the dashboard has no authentication)"
    )


def run(options: Options) -> int:
    from hpo.observe import dashboard

    spec, storage, study = open_study(options)
    return dashboard.serve(spec, storage, study, options.host, options.port)


COMMAND = Command(
    name="dashboard", help="optuna-dashboard on the study's storage", add_arguments=add_arguments, run=run
)
