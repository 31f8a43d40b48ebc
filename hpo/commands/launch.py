"""``hpo launch``: create or resume a study and run its trials (or only check it: ``--dry-run``,
``--check``), here or as a detached launcher job (``--detach``)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hpo.commands.common import Command, Options, add_study_arguments, execute_as_process, load_spec
from hpo.config.values import BACKENDS
from hpo.errors import LaunchError

if TYPE_CHECKING:
    from hpo.config import StudySpec
    from hpo.storage import StorageRef

CHECK_TIMEOUT_S = 300.0
"""How long ``--check`` waits for the objective's first report, by default."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_study_arguments(parser)
    parser.add_argument(
        "--executor", help="override resources.executor (slurm, local, or an installed plugin's)"
    )
    parser.add_argument("--backend", choices=BACKENDS, help="override study.backend")
    parser.add_argument("--n-trials", type=int, help="override study.n_trials (the whole study's budget)")
    parser.add_argument("--max-concurrent", type=int, help="override study.max_concurrent")
    parser.add_argument(
        "--workers",
        type=int,
        metavar="K",
        help="submit K long-running worker jobs (one job array) that pull trials",
    )
    parser.add_argument(
        "--enqueue-best-of",
        metavar="STUDY",
        help="run the best configurations of another study (same storage) first; sets "
        "study.warm_start.enqueue_best_of",
    )
    parser.add_argument(
        "--allow-space-change",
        action="store_true",
        help="resume a stored study whose search space the file changed (where Optuna can still "
        "model its trials); without it, such a relaunch is refused",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the resolved study and the job script; submit nothing"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="run the objective once on this machine up to its first report (the value the study "
        "would read), then stop it; submit nothing",
    )
    parser.add_argument(
        "--check-timeout",
        type=float,
        default=CHECK_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long --check waits for the first report (default {CHECK_TIMEOUT_S:.0f})",
    )
    parser.add_argument(
        "--detach",
        action="store_true",
        help="run the launcher itself as a small CPU Slurm job (the study's launcher section), requeued "
        "before its time limit; prints its job id and log",
    )


def run(options: Options) -> int:
    spec, storage = load_spec(options)
    from hpo.dispatch import preflight

    executor = spec.resources.executor
    preflight.check_launch(
        spec,
        executor=executor,
        workers=options.workers,
        detach=options.detach,
        dry_run=options.dry_run or options.check,
    )
    for warning in spec.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if options.dry_run:
        _print_dry_run(spec, storage, executor)
    if options.check:
        from hpo.trial.check import run_check

        run_check(spec, options.check_timeout)
    if options.dry_run or options.check:
        return 0
    import gc

    from hpo import launch_history
    from hpo.storage import check_reachable

    # Recorded once the storage opens: a launch on one that cannot be (a server down, a typo in
    # --storage) fails here (exit 3) and leaves the last launch that worked for later commands.
    # Optuna's storage has no close; collected, it frees its connection before the launcher's own.
    check_reachable(storage, spec.source)
    gc.collect()
    launch_history.record(Path(spec.source), spec.study.name, str(storage), spec.workdir)
    if options.detach:
        return _detach(options, spec, storage)
    from hpo.dispatch import backends

    launch_options = backends.LaunchOptions(
        executor=executor, workers=options.workers, allow_space_change=options.allow_space_change
    )
    summary = backends.launch(spec, storage, launch_options)
    if summary.failing:
        raise LaunchError(summary.failing)
    if summary.best_number is None and not summary.cancelled:
        raise LaunchError(f"no trial of study {spec.study.name!r} completed; see `hpo status {spec.source}`")
    return 0


def _detach(options: Options, spec: StudySpec, storage: StorageRef) -> int:
    """Submit the launcher as a job that runs this same command, minus ``--detach``."""
    from hpo.dispatch.lease import Lease, StudyBusy
    from hpo.slurm import detach

    holder = Lease(storage, spec.study.name).held_by_another()
    if holder is not None:  # a second launcher job would only be refused when it starts
        raise StudyBusy(
            f"study {spec.study.name!r} is being launched by {holder}", "wait for it, or `hpo cancel` it"
        )

    again = Options(
        **{**vars(options), "detach": False, "argv": [a for a in options.argv if a != "--detach"]}
    )
    job_id = detach.submit(spec, functools.partial(execute_as_process, again), again.argv)
    print(
        f"launcher submitted as Slurm job {job_id} ({spec.launcher.time_min} min per run, requeued before its limit)"
    )
    print(f"its log: {detach.log_path(spec, job_id)}")
    print(f"follow the study: hpo status {spec.source}")
    return 0


def _print_dry_run(spec: StudySpec, storage: StorageRef, executor: str) -> None:
    import yaml

    from hpo import executors, portfolio, search
    from hpo.budget import compute
    from hpo.storage import mask

    document = {
        "study": {**dataclasses.asdict(spec.study), "storage": mask(str(storage))},
        "search_space": {
            name: {k: v for k, v in dataclasses.asdict(p).items() if v is not None and v is not False}
            for name, p in spec.search_space.items()
        },
        **(
            {"objective": dataclasses.asdict(spec.objective)} if spec.objective else {"trainer": spec.trainer}
        ),
        "resources": {
            **dataclasses.asdict(spec.resources),
            **{name: dataclasses.asdict(section) for name, section in spec.executor_settings.items()},
        },
    }
    print(f"# {spec.source}, resolved (workdir {spec.workdir})")
    print(yaml.safe_dump(document, sort_keys=False).rstrip())
    print(f"# {search.strategy_line(spec)}")
    if learned := portfolio.starting_trials(spec):  # shown to 4 digits; enqueued exactly
        shown = [{k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in p.items()} for p in learned]
        print(
            f"# then the learned starting portfolio's {len(learned)} (hpo/portfolio.json), before the sampler:"
        )
        print(yaml.safe_dump(shown, sort_keys=False).rstrip())
    if said := portfolio.coverage_line(spec):
        print(f"# {said}")
    for line in executors.get(executor).dry_run_lines(spec):
        print(line)
    print(f"# {compute.expected_line(spec)}")
    print("# dry run: nothing submitted")


COMMAND = Command(
    name="launch", help="create or resume a study and run its trials", add_arguments=add_arguments, run=run
)
