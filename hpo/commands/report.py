"""``hpo report``: the study as an HTML page, a CSV, a JSON summary and PNG plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpo.commands.common import Command, Options, add_study_arguments, open_study, print_lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_study_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write it to")


def run(options: Options) -> int:
    from hpo.observe import report

    spec, _, study = open_study(options)
    written = report.write_report(spec, study, options.out)
    return print_lines(
        [f"report of study {spec.study.name!r}: {written[0]}", *(f"  {p}" for p in written[1:])]
    )


COMMAND = Command(
    name="report",
    help="an HTML report, trials.csv, summary.json and PNG plots of the study",
    add_arguments=add_arguments,
    run=run,
)
