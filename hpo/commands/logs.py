"""``hpo logs``: a trial's output (stdout or stderr), followed as it grows, or where its profiler
trace is."""

from __future__ import annotations

import argparse
import sys

from hpo.commands.common import Command, Options, add_study_arguments, open_study, print_lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_study_arguments(parser)
    parser.add_argument("trial", type=int, metavar="TRIAL", help="the trial's number (see hpo status)")
    parser.add_argument("--err", action="store_true", help="its stderr (tracebacks, the trainer's log)")
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="print new lines as the job writes them, until the trial ends (Ctrl-C stops)",
    )
    parser.add_argument(
        "--trace", action="store_true", help="where its torch.profiler trace is (study.profile_trials)"
    )


def run(options: Options) -> int:
    from hpo.observe import views

    spec, _, study = open_study(options)
    if options.trace:
        return print_lines(views.trial_trace(spec, study, options.trial))
    if options.follow:
        views.follow_log(spec, study, options.trial, options.err, _write_flushed)
    else:
        sys.stdout.write(views.trial_log(spec, study, options.trial, options.err))
    return 0


def _write_flushed(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


COMMAND = Command(
    name="logs",
    help="the Slurm output of a trial, by its number",
    add_arguments=add_arguments,
    run=run,
)
