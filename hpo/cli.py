"""The ``hpo`` command. It only parses arguments and calls the modules that do the work.

Exit status: 0 success, 1 runtime failure, 2 bad input (one line naming the file and key,
nothing submitted), 130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import hpo
from hpo.errors import LaunchError, StudyFileError

if TYPE_CHECKING:
    from hpo.storage import StorageRef
    from hpo.studyfile import StudySpec

EXIT_RUNTIME = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(prog="hpo", description=hpo.__doc__)
    parser.add_argument("--version", action="version", version=f"hpo {hpo.__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_OneLineErrorParser
    )
    commands.add_parser(
        "train",
        help="run one training directly (same flags as `python -m trainer`; see `hpo train --help`)",
        add_help=False,
    )

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
        "--dry-run", action="store_true", help="print the resolved study and the job script; submit nothing"
    )
    launch.add_argument(
        "--detach",
        action="store_true",
        help="run the launcher itself as a small CPU Slurm job (the study's launcher section), requeued "
        "before its time limit; prints its job id and log",
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
    return parser


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
        # Forwarded untouched: the trainer owns its flags.
        from trainer.cli import main as train_main

        return train_main(argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = argv
    # `kill` and Slurm's end of a launcher job send SIGTERM: stop as cleanly as on Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    # A script's background job inherits SIGINT ignored (and Python then keeps ignoring it);
    # `kill -INT` must still stop a launcher cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _run(args)
    except StudyFileError as err:
        print(f"hpo {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LaunchError as err:
        print(f"hpo {args.command}: error: {err}", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        print(f"hpo {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:  # an unforeseen failure (database outage...): one line, not a traceback
        if os.environ.get("HPO_DEBUG"):
            raise
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        detail = lines[-1].strip() if lines else ""
        print(
            f"hpo {args.command}: error: {type(err).__name__}: {detail} (HPO_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_RUNTIME


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run(args: argparse.Namespace) -> int:
    from hpo.storage import has_password, resolve_storage
    from hpo.studyfile import load_study

    command_line_urls = [args.storage] if args.storage is not None else []
    command_line_urls += [o.partition("=")[2] for o in args.overrides if o.startswith("study.storage=")]
    if any(has_password(url) for url in command_line_urls):
        raise StudyFileError(
            "--storage: a password on the command line is visible to every user; put it in "
            "PGPASSWORD or ~/.pgpass"
        )
    overrides = list(args.overrides)
    labels = {}  # names the option behind an override in error messages
    for flag, key in (
        ("storage", "study.storage"),
        ("executor", "resources.executor"),
        ("backend", "study.backend"),
        ("n_trials", "study.n_trials"),
        ("max_concurrent", "study.max_concurrent"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
            labels[key] = "--" + flag.replace("_", "-")
    spec = load_study(args.study_file, overrides, labels)
    storage = resolve_storage(spec, spec.study.storage, spec.source)
    # The study file is pickled into every job: it must carry the URL without its password.
    spec.study.storage = str(storage)
    if args.command == "launch":
        return _launch(args, spec, storage)

    from hpo import study as study_lib
    from hpo import views

    if args.command == "dashboard":
        from hpo import dashboard

        study = views.open_study(spec, storage)  # a missing study: a one-line error, not an empty page
        return dashboard.serve(spec, storage, study, args.host, args.port)
    study = views.open_study(spec, storage)
    if args.command == "tunnel":
        from hpo.ray_backend import tunnel

        if args.open:
            return tunnel.open_tunnel(spec, study)
        with_ray = spec.study.backend == "ray" or bool(study.user_attrs.get(study_lib.STUDY_ATTR_RAY_JOB))
        lines = tunnel.tunnel_commands(spec, study, with_ray=with_ray)
    elif args.command == "status":
        lines = views.status_lines(spec, study)
    elif args.command == "best":
        lines = views.best_lines(spec, study)
    elif args.command == "report":
        from hpo import report

        written = report.write_report(spec, study, args.out)
        lines = [f"report of study {spec.study.name!r}: {written[0]}", *(f"  {p}" for p in written[1:])]
    elif args.command == "logs":
        sys.stdout.write(views.trial_log(spec, study, args.trial, args.err))
        return 0
    else:
        lines = views.cancel(spec, study)
    print("\n".join(lines))
    return 0


def _launch(args: argparse.Namespace, spec: StudySpec, storage: StorageRef) -> int:
    from hpo import executors, launcher
    from hpo import study as study_lib

    if spec.study.backend == "ray":
        from hpo.ray_backend import driver

        driver.check_ray_settings(spec)
    else:
        study_lib.validate_optuna_settings(spec)
    executor = spec.resources.executor
    if args.workers is not None:
        if args.workers < 1:
            raise StudyFileError(f"--workers: must be >= 1, got {args.workers}")
        if spec.resources.world_size > 1:
            raise StudyFileError(
                f"{spec.source}: resources: --workers runs single-process trials; this study's trials "
                f"have {spec.resources.world_size} processes (use per-trial jobs for DDP trials)"
            )
    if args.dry_run:
        _print_dry_run(spec, storage, executor)
        return 0
    if args.detach and executor != "slurm":
        raise StudyFileError(
            f"--detach: the launcher runs as a Slurm job, for trials that run as Slurm jobs; "
            f"{spec.source}: resources.executor is {executor} (add --executor slurm)"
        )
    if spec.study.backend == "ray":
        return _launch_ray(spec, storage, executor, args)
    executors.check_executor_available(spec, executor)
    if executor == "slurm":
        res = spec.resources
        executors.check_partition_capacity(
            spec, res.nodes, res.gpus_per_node, res.cpus_per_task * res.tasks_per_node
        )
    if executor == "local":
        _check_local_data(spec)
    if args.detach:
        return _detach(spec, args)
    summary = launcher.launch(spec, storage, launcher.LaunchOptions(executor=executor, workers=args.workers))
    if summary.best_number is None:
        raise LaunchError(f"no trial of study {spec.study.name!r} completed; see `hpo status {spec.source}`")
    return 0


def _detach(spec: StudySpec, args: argparse.Namespace) -> int:
    from hpo import detach

    job_id = detach.submit(spec, [a for a in args.argv if a != "--detach"])
    print(
        f"launcher submitted as Slurm job {job_id} ({spec.launcher.time_min} min per run, requeued before its limit)"
    )
    print(f"its log: {detach.log_path(spec, job_id)}")
    print(f"follow the study: hpo status {spec.source}")
    return 0


def _launch_ray(spec: StudySpec, storage: StorageRef, executor: str, args: argparse.Namespace) -> int:
    from hpo import executors, launcher
    from hpo.ray_backend import launch as ray_launch
    from hpo.ray_backend.cluster import cpus_per_trial, slots_per_node

    executors.check_executor_available(spec, executor)
    if executor == "slurm":
        res, slots = spec.resources, slots_per_node(spec)
        executors.check_partition_capacity(
            spec, res.nodes, res.gpus_per_node * slots, cpus_per_trial(spec) * slots
        )
    if executor == "local":
        _check_local_data(spec)
    if args.detach:
        return _detach(spec, args)
    study = ray_launch.launch(spec, storage, executor)
    if launcher.summarize(study, spec).best_number is None:
        raise LaunchError(f"no trial of study {spec.study.name!r} completed; see `hpo status {spec.source}`")
    return 0


def _check_local_data(spec: StudySpec) -> None:
    from trainer.config import TrainConfig
    from trainer.errors import ConfigError
    from trainer.sources import check_data_available

    try:
        check_data_available(TrainConfig.from_mapping(spec.trainer))
    except ConfigError as err:
        raise StudyFileError(f"{spec.source}: trainer: {err}") from None


def _print_dry_run(spec: StudySpec, storage: StorageRef, executor: str) -> None:
    import yaml

    from hpo import executors
    from hpo.storage import mask

    document = {
        "study": {**dataclasses.asdict(spec.study), "storage": mask(str(storage))},
        "search_space": {
            name: {k: v for k, v in dataclasses.asdict(p).items() if v is not None and v is not False}
            for name, p in spec.search_space.items()
        },
        "trainer": spec.trainer,
        "resources": dataclasses.asdict(spec.resources),
    }
    print(f"# {spec.source}, resolved (workdir {spec.workdir})")
    print(yaml.safe_dump(document, sort_keys=False).rstrip())
    if executor == "slurm":
        print(
            f"# sbatch script of each trial job (submitted by submitit; folder {executors.jobs_folder(spec)})"
        )
        print(executors.render_sbatch(spec, f"hpo-{spec.study.name}").rstrip())
    else:
        print(f"# each trial runs as a local process: {sys.executable} -m submitit.core._submit <job folder>")
    print("# dry run: nothing submitted")
