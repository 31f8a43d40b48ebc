"""The ``hpo`` command line: it parses arguments into a :class:`hpo.commands.Request` and executes it.

Exit status: 0 success, 1 runtime failure, 2 bad input (one line naming the file and key,
nothing submitted), 3 this machine or a service it needs is not ready (one line and a hint),
130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hpo
from hpo.commands import Request, execute_as_process, schema_text
from trainer.cli import OneLineErrorParser
from trainer.cli import main as train_main


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="hpo", description=hpo.__doc__)
    parser.add_argument("--version", action="version", version=f"hpo {hpo.__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=OneLineErrorParser
    )
    commands.add_parser(
        "train",
        help="run one training directly (same flags as `python -m trainer`; see `hpo train --help`)",
        add_help=False,
    )

    _add_launch(commands)
    _add_read_commands(commands)
    return parser


def _add_launch(commands: Any) -> None:
    """``hpo launch`` and its options."""
    launch = commands.add_parser("launch", help="create or resume a study and run its trials")
    _study_arguments(launch)
    launch.add_argument("--executor", choices=("slurm", "local"), help="override resources.executor")
    launch.add_argument("--backend", choices=("optuna", "ray"), help="override study.backend")
    launch.add_argument("--n-trials", type=int, help="override study.n_trials (the whole study's budget)")
    launch.add_argument("--max-concurrent", type=int, help="override study.max_concurrent")
    launch.add_argument(
        "--workers",
        type=int,
        metavar="K",
        help="submit K long-running worker jobs (one job array) that pull trials",
    )
    launch.add_argument(
        "--enqueue-best-of",
        metavar="STUDY",
        help="run the best configurations of another study (same storage) first; sets "
        "study.warm_start.enqueue_best_of",
    )
    launch.add_argument(
        "--allow-space-change",
        action="store_true",
        help="resume a stored study whose search space the file changed (where Optuna can still "
        "model its trials); without it, such a relaunch is refused",
    )
    launch.add_argument(
        "--dry-run", action="store_true", help="print the resolved study and the job script; submit nothing"
    )
    launch.add_argument(
        "--check",
        action="store_true",
        help="run the objective once on this machine up to its first report (the value the study "
        "would read), then stop it; submit nothing",
    )
    launch.add_argument(
        "--check-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long --check waits for the first report (default 300)",
    )
    launch.add_argument(
        "--detach",
        action="store_true",
        help="run the launcher itself as a small CPU Slurm job (the study's launcher section), requeued "
        "before its time limit; prints its job id and log",
    )


def _add_read_commands(commands: Any) -> None:
    """The commands that read (or stop, or remove) a stored study, and ``hpo schema``."""
    commands.add_parser(
        "schema",
        help="print the JSON Schema of study files (for editors: the shipped files name "
        "docs/study.schema.json in a yaml-language-server line)",
    )

    tunnel = commands.add_parser("tunnel", help="print the ssh commands that reach the study's dashboards")
    _study_arguments(tunnel)
    tunnel.add_argument("--open", action="store_true", help="run the Ray dashboard's tunnel")
    for name, text in (
        ("status", "trials by state, with parameters, last value, job id and GPU-hours"),
        ("best", "the best trial and a ready full-training command"),
        ("cancel", "cancel the study's running jobs"),
    ):
        _study_arguments(commands.add_parser(name, help=text))
    studies = commands.add_parser(
        "studies",
        help="the studies in a storage (--storage), or every study you launched: trials, best, compute",
    )
    studies.add_argument("--storage", help="a storage URL (no password here: use PGPASSWORD or ~/.pgpass)")
    delete = commands.add_parser(
        "delete", help="remove the study from its storage (nothing of it may run; asks to confirm)"
    )
    _study_arguments(delete)
    delete.add_argument("--yes", action="store_true", help="do not ask to confirm")
    dashboard = commands.add_parser("dashboard", help="optuna-dashboard on the study's storage")
    _study_arguments(dashboard)
    dashboard.add_argument("--port", type=int, default=8080, help="default 8080")
    dashboard.add_argument(
        "--host", default="127.0.0.1", help="default 127.0.0.1 (the dashboard has no authentication)"
    )
    report = commands.add_parser(
        "report", help="an HTML report, trials.csv, summary.json and PNG plots of the study"
    )
    _study_arguments(report)
    report.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write it to")
    logs = commands.add_parser("logs", help="the Slurm output of a trial, by its number")
    _study_arguments(logs)
    logs.add_argument("trial", type=int, metavar="TRIAL", help="the trial's number (see hpo status)")
    logs.add_argument("--err", action="store_true", help="its stderr (tracebacks, the trainer's log)")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="print new lines as the job writes them, until the trial ends (Ctrl-C stops)",
    )
    logs.add_argument(
        "--trace", action="store_true", help="where its torch.profiler trace is (study.profile_trials)"
    )


def _study_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    parser.add_argument(
        "--storage", help="override study.storage (no password here: use PGPASSWORD or ~/.pgpass)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a study-file key",
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        return train_main(argv[1:])  # forwarded untouched: the trainer owns its flags
    args = vars(build_parser().parse_args(argv))
    if args["command"] == "schema":  # reads no study file
        print(schema_text())
        return 0
    args.setdefault("study_file", None)  # `hpo studies` reads none
    request = Request(**args, argv=argv)
    return execute_as_process(request)
