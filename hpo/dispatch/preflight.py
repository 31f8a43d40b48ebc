"""The checks ``hpo launch`` makes before it creates or submits anything that need more than the
study file: this machine, Slurm (``sinfo``, ``sacctmgr``), the backend chosen (Optuna's sampler and
pruner settings, Ray's), optional packages, data on disk. The file's own checks (keys, types,
bounds, what sections allow together) are ``hpo.config``'s, made when it is loaded.

Two kinds of problem come out of here. What the study file, an override or an option asks for
that cannot be done is bad input (:class:`StudyFileError`, exit 2). What this machine or a service
lacks (no ``sbatch``, a partition too small for the job, Ray not installed, data not on disk) is
not the file's fault (:class:`NotReadyError`, exit 3, with a hint). The checks on the storage
itself happen when it is opened (``hpo.storage.check_reachable``).
"""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from hpo import executors, portfolio, search
from hpo.config.user_code import import_function, placeholders
from hpo.dispatch.ray import ddp_trial, population
from hpo.dispatch.ray.cluster import cpus_per_trial, slots_per_node
from hpo.dispatch.ray.cluster import gpus_per_node as ray_gpus_per_node
from hpo.dispatch.ray.driver import RAY_PRUNERS
from hpo.errors import NotReadyError, StudyFileError, one_line, optional_extra
from hpo.executors.base import JobShape
from hpo.journal import cannot_write
from hpo.paths import why_not_creatable, why_not_writable, why_not_writable_file
from hpo.storage import default_storage, storage_file

if TYPE_CHECKING:
    from hpo.config.schema import StudySpec


def check_launch(spec: StudySpec, *, executor: str, workers: int | None, detach: bool, dry_run: bool) -> None:
    """The checks of ``hpo launch``, cheapest first; ``dry_run`` stops after those of the file."""
    if spec.study.on_ray:
        check_ray_settings(spec)
    else:
        search.validate_optuna_settings(spec)
    check_sampler_installed(spec)
    portfolio.check(spec)
    if workers is not None:
        if workers < 1:
            raise StudyFileError(f"--workers: must be >= 1, got {workers}")
        if spec.resources.world_size > 1:
            raise StudyFileError(
                f"{spec.source}: resources: --workers runs single-process trials; this study's trials "
                f"have {spec.resources.world_size} processes (use per-trial jobs for DDP trials)"
            )
    check_folders(spec)
    if spec.objective is not None:
        check_objective(spec)
    if dry_run:
        return
    runs_on = executors.get(executor)
    if detach and runs_on.on_this_machine:
        raise StudyFileError(
            f"--detach: the launcher runs as a Slurm job, for trials that run as Slurm jobs; "
            f"{spec.source}: resources.executor is {executor} (add --executor slurm)"
        )
    runs_on.preflight(spec, job_shape(spec))


def job_shape(spec: StudySpec) -> JobShape:
    """What one job of the launch asks for: a trial's (a pack's), or the Ray allocation's node."""
    res = spec.resources
    if spec.study.on_ray:
        slots = slots_per_node(spec)  # one allocation holding its share of the concurrent trials
        return JobShape(res.nodes, ray_gpus_per_node(spec), cpus_per_trial(spec) * slots)
    return JobShape(res.nodes, res.gpus_per_node, res.job_cpus_per_task * res.tasks_per_node)


def check_sampler_installed(spec: StudySpec) -> None:
    """The packages the study's sampler imports, found before the study starts rather than when
    Optuna first needs them (for gp, after its ten random start-up trials)."""

    name = spec.study.sampler.name
    missing = [p for p in search.SAMPLER_PACKAGES.get(name, ()) if importlib.util.find_spec(p) is None]
    if missing:
        raise NotReadyError(
            f"{spec.source}: study.sampler.name: {name} needs {', '.join(missing)}, which is not installed",
            "pip install 'slurm-hpo[samplers]', or use sampler tpe or random",
        )
    # The Terminator fits a Gaussian process (Optuna's, on SciPy), first when a trial ends.
    if spec.study.stop.terminator and importlib.util.find_spec("scipy") is None:
        raise NotReadyError(
            f"{spec.source}: study.stop.terminator: Optuna's Terminator needs scipy, which is not installed",
            "pip install 'slurm-hpo[samplers]', or use the patience rule",
        )


def check_folders(spec: StudySpec) -> None:
    """The workdir and a journal or SQLite file (the file, and its folder, where its lock is made)
    must be writable, or creatable, before anything is submitted; a dry run checks it too, creating
    nothing. A path that cannot be (under /proc, a file in the way) is bad input; one that a mode,
    a read-only mount or an immutable file refuses is this machine's state (exit 3)."""

    folders = [("study.workdir", spec.workdir)]
    stored = storage_file(spec.study.storage)
    journal, what = stored if stored is not None else (None, "journal")
    mode: int | None = None
    if journal is not None:
        try:
            mode = journal.stat().st_mode
        except (OSError, ValueError):
            mode = None  # not there yet (or not reachable: the folder's check says why)
        if mode is not None and not stat.S_ISREG(mode):
            raise StudyFileError(
                f"{spec.source}: study.storage: {journal} is not a {what.removesuffix(' file')} file"
            )
        if journal.parent != spec.workdir:
            folders.append(("study.storage", journal.parent))
    for key, folder in folders:
        refused = why_not_writable(folder)
        if refused is not None:
            where, reason = refused
            why = reason if where == folder else f"{where}: {reason}"
            if key == "study.workdir":
                raise NotReadyError(
                    f"{spec.source}: study.workdir: cannot write the study's workdir {folder}: {why}",
                    "make it writable, or name another with study.workdir (--set study.workdir=PATH)",
                )
            assert journal is not None
            raise _journal_refused(spec, journal, f"{where}: {reason}", what)
        problem = why_not_creatable(folder)
        if problem is not None:
            raise StudyFileError(f"{spec.source}: {key}: cannot create {folder}: {problem}")
    if journal is not None and mode is not None:
        denial = why_not_writable_file(journal)
        if denial is not None:
            raise _journal_refused(spec, journal, denial, what)


def _journal_refused(spec: StudySpec, journal: Path, reason: str, what: str) -> NotReadyError:
    # The default journal lives in the workdir: another workdir moves it too.
    other = "study.workdir" if journal == default_storage(spec.workdir).journal_file else "study.storage"
    hint = f"make it writable, or name another with --storage or {other}"
    return cannot_write(journal, reason, hint, where=f"{spec.source}: study.storage: ", what=what)


def check_ray_settings(spec: StudySpec) -> None:
    """Reject, before anything starts, what the Ray backend cannot do."""

    with optional_extra(
        "the Ray backend", "pip install 'slurm-hpo[ray]' (ray[default,tune]), or use study.backend: optuna"
    ):
        import ray  # noqa: F401
        from ray import tune  # noqa: F401
    if spec.study.pruner.name not in RAY_PRUNERS:
        raise StudyFileError(
            f"{spec.source}: study.pruner.name: {spec.study.pruner.name!r} has no Ray Tune scheduler; "
            f"the Ray backend takes {', '.join(RAY_PRUNERS)}"
        )
    if spec.study.pruner.name == "pbt":
        population.build_scheduler(spec)
    else:
        # The options are Optuna's pruner's, so that one study file serves both backends.
        search.build_pruner(spec.study.pruner, spec.source)
    if spec.resources.tasks_per_node > 1:  # each trial a DDP run of Ray Train workers
        ddp_trial.check_settings(spec)


def check_objective(spec: StudySpec) -> None:
    """The user's code must be there: a function importable here (the launcher's environment is
    the jobs'), a program or script given as a path must exist; its folder must exist."""

    objective = spec.objective
    assert objective is not None
    where = f"{spec.source}: objective"
    if not Path(spec.objective_cwd).is_dir():
        raise StudyFileError(f"{where}.cwd: {spec.objective_cwd} is not a folder")
    if objective.function is not None:
        try:
            import_function(objective.function, spec.objective_cwd)
        except Exception as err:  # any import error is the file's: it names the function
            raise StudyFileError(
                f"{where}.function: cannot import {objective.function} here: {type(err).__name__}: "
                f"{one_line(err)}"
            ) from None
        return
    command = objective.command or []
    # The program, or the script of an interpreter ({python} train.py): checked when it is a path.
    index = 1 if command[0] == "{python}" and len(command) > 1 else 0
    program = command[index]
    if placeholders(program) or ("/" not in program and not (index and program.endswith(".py"))):
        return  # a name looked up on the compute node's PATH (after resources.setup), or filled per trial
    path = Path(spec.objective_cwd) / program  # no ~ expansion: the command runs without a shell
    if not path.is_file():
        raise StudyFileError(f"{where}.command[{index}]: {program} not found (in {spec.objective_cwd})")
    if index == 0 and not os.access(path, os.X_OK):
        raise StudyFileError(
            f"{where}.command[0]: {program} is not executable (chmod +x, or run it with {{python}})"
        )
