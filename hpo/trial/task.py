"""What runs inside a trial's job: one trial, on every rank of the job.

The launcher asks Optuna for a trial and submits :class:`TrialTask` (pickled by submitit). On
every rank the task builds the trainer config from the trial's parameters; rank 0 alone opens the
storage, reports the metric each epoch, asks ``should_prune`` and tells the final state; the trainer
broadcasts rank 0's decision so that every rank stops at the same epoch.

The trial process tells its own final state, so a result is stored even if the launcher is gone.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

import optuna
import submitit

from hpo import executors, failures, joblog, record, search, tally
from hpo.errors import one_line
from hpo.executors import jobs
from hpo.outages import with_retries
from hpo.storage import StorageRef, open_storage
from hpo.trial import packing, retries
from hpo.trial.command_objective import CommandObjective
from hpo.trial.objective import FunctionObjective, Objective, ObjectiveFailed, TrainerObjective, TrialDiverged
from hpo.trial.reporter import OptunaReporter

if TYPE_CHECKING:
    from hpo.config import StudySpec

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrialTask:
    """One trial, submitted as one job (one process per task; DDP across them)."""

    spec: StudySpec
    storage: StorageRef
    trial_number: int
    params: dict[str, Any]
    """Sampled by the launcher before submission; every rank builds its config from them."""
    objective: Objective = dataclasses.field(default_factory=TrainerObjective)
    requeues_without_progress: int = 0
    """Requeues in a row whose run stored no new epoch (see ``checkpoint``)."""

    def __call__(self) -> dict[str, Any]:
        called_at = record.now_iso()
        joblog.to_stdout()
        rank = executors.here().rank()
        if rank != 0:
            result = self.objective(self.spec, self.trial_number, dict(self.params), None)
            return {"rank": rank, "value": result.value, "pruned": result.pruned}
        study = with_retries(  # connecting is outside the storage's own policy
            lambda: search.load(self.spec, open_storage(self.storage, create=False), create=False),
            "load the study",
        )
        startup = {
            "process": None if (process := jobs.process_started_at()) is None else record.iso(process),
            "called": called_at,
            "connected": record.now_iso(),
        }
        trial = record.attach(study, self.trial_number)
        if trial is None:
            message = f"trial {self.trial_number} is already finished in the study; nothing to run"
            log.info(message)
            if self.spec.resources.world_size > 1:
                # The other ranks are already starting to train: a failing rank 0 makes srun
                # (--kill-on-bad-exit) end them now rather than after the DDP timeout.
                raise TrialAlreadyFinished(message)
            return {"rank": 0, "skipped": True}
        return run_attached(self.spec, study, trial, self.objective, startup)

    def checkpoint(self) -> Any:
        """Called by submitit on the signal Slurm sends before a time limit or a preemption
        (``--signal=B:USR2@90``, or ``USR2@90`` for a DDP trial's srun step): the trainer checkpoints every epoch, so the job only needs
        requeueing with the same task; it resumes the same trial from its last epoch."""

        # A time limit shorter than an epoch would requeue the job forever. Counted in the task,
        # which submitit pickles for the requeued run: a signal handler must not use the database.
        self.requeues_without_progress = 0 if _RUN.progressed() else self.requeues_without_progress + 1
        if self.requeues_without_progress >= MAX_REQUEUES_WITHOUT_PROGRESS:
            _RUN.stop_reason = (
                f"{record.REASON_NO_PROGRESS}: requeued {self.requeues_without_progress} times after epoch "
                f"{_RUN.start_epoch}; the job's time limit ({self.spec.resources.time_min} min) may be shorter "
                "than an epoch: raise resources.time"
            )
            if _RUN.reporter is not None:
                # The error submitit raises from this handler may land in code that swallows it:
                # the next report ends the trial then.
                _RUN.reporter.abort = _RUN.stop_reason
            return None  # submitit then raises UncompletedJobError in the trial instead of requeueing
        REQUEUE_REQUESTED.set()
        return submitit.helpers.DelayedSubmission(self)


def objective_for(spec: StudySpec) -> Objective:
    """The study's objective: its own command or function, or the built-in trainer."""
    if spec.objective is None:
        return TrainerObjective()
    return CommandObjective() if spec.objective.command is not None else FunctionObjective()


REQUEUE_REQUESTED = threading.Event()
"""Set when submitit is about to requeue this job: the SystemExit it raises is not a failure."""

MAX_REQUEUES_WITHOUT_PROGRESS = 2


@dataclasses.dataclass
class _RunningTrial:
    """This job's run of its trial, as the requeue signal's handler sees it."""

    start_epoch: int = 0
    reporter: OptunaReporter | None = None
    stop_reason: str = ""

    def progressed(self) -> bool:
        return self.reporter is not None and self.reporter.last_epoch > self.start_epoch


_RUN = _RunningTrial()


class TrialAlreadyFinished(RuntimeError):
    """A trial job started for a trial that the study already holds as finished (a requeued job
    whose trial the launcher failed meanwhile)."""


def run_attached(
    spec: StudySpec,
    study: optuna.Study,
    trial: optuna.Trial,
    objective: Objective,
    startup: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """Run a trial on rank 0: record where it runs (and, in a job of its own, how its job came up:
    ``startup``), train while reporting, tell the end state."""

    started = time.monotonic()
    restarts = executors.here().restart_count()
    record.set_attrs(
        trial,
        {
            record.ATTR_STARTED_AT: record.now_iso(),
            **({record.ATTR_RESTARTS: restarts} if restarts else {}),
            record.ATTR_THREADS: compute_threads(spec),
            **job_identity(),
            **({record.ATTR_JOB_STARTUP: startup} if startup else {}),
        },
    )
    log.info(f"rank 0 reporting to study {spec.study.name!r}, trial {trial.number}: {trial.params}")
    reporter: OptunaReporter | None = None
    try:
        reporter = OptunaReporter(trial, spec.study.metric, multi_objective=bool(spec.study.also_minimize))
        reporter.abort = _RUN.stop_reason  # a requeue signal may have come already
        _RUN.start_epoch, _RUN.reporter = reporter.last_epoch, reporter
        result = objective(spec, trial.number, dict(trial.params), reporter)
    except BaseException as err:
        if REQUEUE_REQUESTED.is_set() and (isinstance(err, SystemExit) or _requeue_under_way(err)):
            # submitit requeued the job (preemption or time limit): the trial stays RUNNING and
            # the requeued job resumes it from its last checkpoint.
            log.info(f"trial {trial.number} requeued; it resumes from its last checkpoint")
            raise
        told = _tell_failure(spec, study, trial, started, err, reporter)
        if told is None:
            raise
        return told
    diverged = reporter.diverged
    if diverged is None and not result.pruned and not math.isfinite(result.value):
        # A final value (final_pattern, a function's return) that is not a number.
        diverged = TrialDiverged(reporter.last_epoch + 1, spec.study.metric, result.value)
    if diverged is not None:
        return _tell_diverged(spec, study, trial, started, result.attrs, diverged)
    first_report = {record.ATTR_FIRST_REPORT_S: reporter.first_report_s} if reporter.first_report_s else {}
    attrs = _finish_attrs(spec, trial, started, {**result.attrs, **first_report})
    if result.pruned:
        _tell(study, trial, state=optuna.trial.TrialState.PRUNED)
        state = "PRUNED"
    else:
        cost = [cost_objective(spec, attrs)] if spec.study.also_minimize else []
        _tell(study, trial, values=[result.value, *cost])
        state = "COMPLETE"
    log.info(f"trial {trial.number} {state}: {spec.study.metric}={tally.format_value(result.value)}")
    return {"rank": 0, "state": state, "value": result.value}


def _tell_failure(
    spec: StudySpec,
    study: optuna.Study,
    trial: optuna.Trial,
    started: float,
    err: BaseException,
    reporter: OptunaReporter | None,
) -> dict[str, Any] | None:
    """Tell how the objective's error ended the trial: diverged, infeasible (out of memory, or its
    command SIGKILLed twice with these parameters), else failed (None: the caller re-raises)."""
    diverged = err if isinstance(err, TrialDiverged) else reporter.diverged if reporter else None
    if diverged is not None:
        return _tell_diverged(spec, study, trial, started, {}, diverged)
    # The user's objective says in its own words why it failed: no exception name before them.
    reason = _RUN.stop_reason or one_line(err, name=not isinstance(err, ObjectiveFailed))
    if failures.classify(reason).kind == failures.DIVERGED and reporter is not None:
        # The program's own "loss is nan": diverged, as if it had reported the NaN.
        step = reporter.last_epoch + 1
        return _tell_diverged(spec, study, trial, started, {}, TrialDiverged(step, "", reason))
    killed_twice = retries.killed_again(study, trial, reason)
    if killed_twice:
        reason = f"{reason} (twice with these parameters: out of memory, most likely)"
    if killed_twice or retries.is_out_of_memory(err):
        _finish_attrs(spec, trial, started, {})
        record.tell_infeasible(study, trial, reason, search.directions(spec))
        log.info(f"trial {trial.number} infeasible (out of memory): {reason}")
        return {"rank": 0, "state": "INFEASIBLE", "value": record.worst_value(spec.study.direction)}
    _finish_attrs(spec, trial, started, {record.ATTR_FAIL_REASON: reason})
    _tell(study, trial, state=optuna.trial.TrialState.FAIL)
    log.info(f"trial {trial.number} FAIL: {reason}")
    return None


def _tell_diverged(
    spec: StudySpec,
    study: optuna.Study,
    trial: optuna.Trial,
    started: float,
    attrs: dict[str, Any],
    diverged: TrialDiverged,
) -> dict[str, Any]:
    """End the trial as diverged (every rank of a DDP trial stopped at the same step: the
    reporter told them STOP)."""
    _finish_attrs(spec, trial, started, attrs)
    record.tell_diverged(study, trial, str(diverged), diverged.step)
    log.info(f"trial {trial.number} DIVERGED: {diverged}")
    return {"rank": 0, "state": "DIVERGED", "value": float("nan")}


def compute_threads(spec: StudySpec) -> int:
    """The CPU threads of the trial's computation: the trainer sets torch's to ``cpus_per_task``;
    a command runs with OMP_NUM_THREADS (its own, else ``cpus_per_task``, set for it)."""
    if spec.objective is not None and spec.objective.command is not None:
        own = spec.objective.env.get("OMP_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        if own and own.isdigit():
            return int(own)
    return spec.resources.cpus_per_task


def _requeue_under_way(err: BaseException) -> bool:
    """submitit's ``scontrol requeue`` killed by a signal: Slurm ending this run of the job for
    the requeue it asked for, before scontrol returned (seen on a loaded machine)."""
    return (
        isinstance(err, subprocess.CalledProcessError)
        and list(err.cmd)[:2] == ["scontrol", "requeue"]
        and err.returncode < 0
    )


def cost_objective(spec: StudySpec, attrs: dict[str, Any]) -> float:
    """The second objective of a multi-objective study, from the trial's attributes: its last
    run's GPU- or CPU-hours (elapsed time times its allocation) or its mean epoch time."""
    if spec.study.also_minimize == "epoch_time_s" and record.ATTR_EPOCH_TIME_S not in attrs:
        return float(attrs[record.ATTR_ELAPSED_S]) / max(1, int(attrs.get(record.ATTR_EPOCHS_COMPLETED, 1)))
    return float(attrs[str(spec.study.also_minimize)])


def _finish_attrs(
    spec: StudySpec, trial: optuna.Trial, started: float, attrs: dict[str, Any]
) -> dict[str, Any]:
    # Attributes can no longer be set once the trial is told, so they are written just before.
    elapsed = time.monotonic() - started
    gpus, cpus = own_allocation(spec)
    attrs = {
        **attrs,
        record.ATTR_ELAPSED_S: round(elapsed, 3),
        record.ATTR_FINISHED_AT: record.now_iso(),
        # This run's cost, for optuna-dashboard; `hpo status` and reports take sacct's figures.
        record.ATTR_GPU_HOURS: round(elapsed * gpus / 3600, 6),
        record.ATTR_CPU_HOURS: round(elapsed * cpus / 3600, 6),
    }

    record.set_attrs(trial, attrs)
    return attrs


def _tell(
    study: optuna.Study, trial: optuna.Trial, *, values: list[float] | None = None, state: Any = None
) -> None:
    """Tell once: if a tell cut off by an outage had in fact been stored, a second tell leaves it."""
    study.tell(trial.number, values, state=state, skip_if_finished=True)


def job_identity() -> dict[str, Any]:
    """The job id and node list of this process (a local job: its controller's pid and this
    host), and its place in its job where the job runs several trials at once."""
    job_id, nodes = executors.here().identity()
    packed = (
        {
            record.ATTR_PACK_SLOT: int(os.environ[packing.ENV_SLOT]),
            record.ATTR_PACK_SIZE: int(os.environ[packing.ENV_SIZE]),
        }
        if packing.ENV_SLOT in os.environ
        else {}
    )
    return {record.ATTR_JOB_ID: job_id, record.ATTR_NODES: nodes, **packed}


def own_allocation(spec: StudySpec) -> tuple[float, float]:
    """(GPUs, CPUs) of the job this process runs in (the executor's numbers, else the study's),
    divided among the trials packed into it."""
    return executors.here().allocation(spec, share=int(os.environ.get(packing.ENV_SIZE) or 1))
