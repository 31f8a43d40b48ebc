"""What runs inside a trial's job: the trial process(es) and the ``--workers`` pull loop.

The launcher asks Optuna for a trial and submits :class:`TrialTask` (pickled by submitit). On
every rank the task builds the trainer config from the trial's parameters; rank 0 alone opens the
storage, reports the metric each epoch, asks ``should_prune`` and tells the final state; the trainer
broadcasts rank 0's decision so that every rank stops at the same epoch.

The trial process tells its own final state, so a result is stored even if the launcher is gone.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import traceback
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from hpo import accounting, retries
from hpo import study as study_lib
from hpo.storage import StorageRef, open_storage, with_retries
from trainer.reporting import Decision, EpochMetrics, Reporter

if TYPE_CHECKING:
    import optuna

    from hpo.studyfile import StudySpec


@dataclasses.dataclass
class ObjectiveResult:
    value: float
    """The metric at the end of the run (at the last epoch trained)."""
    pruned: bool
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)


class Objective(Protocol):
    """Runs one trial's work on this rank. ``reporter`` is None on ranks other than 0, except in a
    Ray Train DDP trial, whose reporter every rank calls (Train's report is a barrier)."""

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: Reporter | None
    ) -> ObjectiveResult: ...


@dataclasses.dataclass
class TrainerObjective:
    """The real objective: a short trainer run, checkpointed under the study's workdir."""

    resume_may_change: str = ""
    """Optimizer settings a resumed checkpoint may differ in (the trainer's option of that name)."""

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: Reporter | None
    ) -> ObjectiveResult:
        import torch

        from trainer import train

        torch.set_num_threads(spec.resources.cpus_per_task)
        config = spec.trainer_config(
            params,
            checkpoint_dir=str(checkpoint_dir(spec, trial_key)),
            resume_may_change=self.resume_may_change,
        )
        result = train(config, reporter)
        last = result.history[-1] if result.history else None
        value = float(getattr(last, spec.study.metric)) if last is not None else float("nan")
        return ObjectiveResult(
            value=value,
            pruned=result.stopped_early,
            attrs={
                study_lib.ATTR_EPOCHS: result.epochs_completed,
                **(
                    {
                        study_lib.ATTR_EPOCH_TIME_S: round(
                            sum(m.epoch_time_s for m in result.history) / len(result.history), 3
                        )
                    }
                    if result.history
                    else {}
                ),
                study_lib.ATTR_IMAGES_PER_S: result.train_images_per_s,
                **(
                    {study_lib.ATTR_TEST_ACCURACY: last.test_accuracy}
                    if last is not None and last.test_accuracy is not None
                    else {}
                ),
                **(
                    {study_lib.ATTR_RESUMED_FROM: result.resumed_from_epoch}
                    if result.resumed_from_epoch
                    else {}
                ),
            },
        )


@dataclasses.dataclass
class FixedDurationObjective:
    """A stand-in for training that takes a fixed time: for measuring dispatch overhead.

    It sleeps ``seconds`` in ``epochs`` equal steps, reporting after each, and returns a value
    that depends smoothly on the parameters (so a sampler has something to optimize).
    """

    seconds: float
    epochs: int = 3

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: Reporter | None
    ) -> ObjectiveResult:
        import math

        value = 0.0
        for epoch in range(1, self.epochs + 1):
            time.sleep(self.seconds / self.epochs)
            value = (
                sum(math.tanh(float(v)) for v in params.values() if isinstance(v, int | float))
                * epoch
                / self.epochs
            )
            if reporter is not None:
                step_s = self.seconds / self.epochs
                metrics = EpochMetrics(
                    epoch=epoch, step=epoch, train_loss=value, train_accuracy=value, val_loss=value,
                    val_accuracy=value, lr=0.0, images_per_s=0.0, train_time_s=step_s, epoch_time_s=step_s,
                )  # fmt: skip
                if reporter.report(metrics) == Decision.STOP:
                    return ObjectiveResult(value=value, pruned=True)
        return ObjectiveResult(value=value, pruned=False)


class OptunaReporter:
    """The trainer's reporter on rank 0: one intermediate value per epoch, then ``should_prune``.

    A multi-objective study takes no intermediate values and cannot prune: the curve is kept as a
    trial attribute instead (for `hpo status` and the report) and the run always continues.
    """

    def __init__(self, trial: optuna.Trial, metric: str, multi_objective: bool = False) -> None:
        self.trial = trial
        self.metric = metric
        self.multi_objective = multi_objective
        # epoch (a string: attributes are JSON) -> value; a requeued or retried run goes on with it
        self.curve: dict[str, float] = (
            dict(trial.user_attrs.get(study_lib.ATTR_CURVE, {})) if multi_objective else {}
        )

    def report(self, metrics: EpochMetrics) -> Decision:
        # A database restart mid-trial costs a wait, not the trial (a repeated report of the same
        # step is ignored by Optuna).
        value = float(getattr(metrics, self.metric))
        if self.multi_objective:
            earlier = {k: v for k, v in self.curve.items() if int(k) < metrics.epoch}
            self.curve = {**earlier, str(metrics.epoch): value}
            with_retries(lambda: self.trial.set_user_attr(study_lib.ATTR_CURVE, self.curve), "report")
            return Decision.CONTINUE
        with_retries(lambda: self.trial.report(value, step=metrics.epoch), "report")
        prune = with_retries(self.trial.should_prune, "should_prune")
        return Decision.STOP if prune else Decision.CONTINUE


def trial_dir(spec: StudySpec, trial_key: int | str) -> Any:
    return spec.workdir / "trials" / str(trial_key)


def checkpoint_dir(spec: StudySpec, trial_key: int | str) -> Any:
    return trial_dir(spec, trial_key) / "checkpoint"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclasses.dataclass
class TrialTask:
    """One trial, submitted as one job (one process per task; DDP across them)."""

    spec: StudySpec
    storage: StorageRef
    trial_number: int
    params: dict[str, Any]
    """Sampled by the launcher before submission; every rank builds its config from them."""
    objective: Objective = dataclasses.field(default_factory=TrainerObjective)

    def __call__(self) -> dict[str, Any]:
        rank = _export_rank_environment()
        if rank != 0:
            result = self.objective(self.spec, self.trial_number, dict(self.params), None)
            return {"rank": rank, "value": result.value, "pruned": result.pruned}
        study = with_retries(
            lambda: study_lib.load(self.spec, open_storage(self.storage, create=False), create=False),
            "load the study",
        )
        trial = with_retries(lambda: attach(study, self.trial_number), "attach")
        if trial is None:
            message = f"trial {self.trial_number} is already finished in the study; nothing to run"
            print(message, flush=True)
            if self.spec.resources.world_size > 1:
                # The other ranks are already starting to train: a failing rank 0 makes srun
                # (--kill-on-bad-exit) end them now rather than after the DDP timeout.
                raise TrialAlreadyFinished(message)
            return {"rank": 0, "skipped": True}
        return run_attached(self.spec, study, trial, self.objective)

    def checkpoint(self) -> Any:
        """Called by submitit on the signal Slurm sends before a time limit or a preemption
        (``--signal=USR2@90``): the trainer checkpoints every epoch, so the job only needs
        requeueing with the same task; it resumes the same trial from its last epoch."""
        import submitit

        REQUEUE_REQUESTED.set()
        return submitit.helpers.DelayedSubmission(self)


REQUEUE_REQUESTED = threading.Event()
"""Set when submitit is about to requeue this job: the SystemExit it raises is not a failure."""


class TrialAlreadyFinished(RuntimeError):
    """A trial job started for a trial that the study already holds as finished (a requeued job
    whose trial the launcher failed meanwhile)."""


def attach(study: optuna.Study, trial_number: int) -> optuna.Trial | None:
    """The running trial with this number, or None if it already ended."""
    import optuna

    storage = study._storage  # the study's own storage object: no second connection pool
    study_id = storage.get_study_id_from_name(study.study_name)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial_number)
    if storage.get_trial(trial_id).state != optuna.trial.TrialState.RUNNING:
        return None
    return optuna.Trial(study, trial_id)


def run_attached(
    spec: StudySpec, study: optuna.Study, trial: optuna.Trial, objective: Objective
) -> dict[str, Any]:
    """Run a trial on rank 0: record where it runs, train while reporting, tell the end state."""
    import optuna

    started = time.monotonic()
    trial.set_user_attr(study_lib.ATTR_STARTED_AT, now_iso())
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if restarts:
        trial.set_user_attr(study_lib.ATTR_RESTARTS, restarts)
    for key, value in job_identity().items():
        trial.set_user_attr(key, value)
    print(f"rank 0 reporting to study {spec.study.name!r}, trial {trial.number}: {trial.params}", flush=True)
    try:
        reporter = OptunaReporter(trial, spec.study.metric, multi_objective=bool(spec.study.also_minimize))
        result = objective(spec, trial.number, dict(trial.params), reporter)
    except BaseException as err:
        if REQUEUE_REQUESTED.is_set() and isinstance(err, SystemExit):
            # submitit requeued the job (preemption or time limit): the trial stays RUNNING and
            # the requeued job resumes it from its last checkpoint.
            print(f"trial {trial.number} requeued; it resumes from its last checkpoint", flush=True)
            raise
        reason = _one_line(err)
        if retries.is_out_of_memory(err):
            _finish_attrs(spec, trial, started, {})
            with_retries(
                lambda: retries.tell_infeasible(
                    study, trial._trial_id, trial.number, reason, study_lib.directions(spec)
                ),
                "tell",
            )
            print(f"trial {trial.number} infeasible (out of memory): {reason}", flush=True)
            return {"rank": 0, "state": "INFEASIBLE", "value": retries.worst_value(spec.study.direction)}
        _finish_attrs(spec, trial, started, {study_lib.ATTR_FAIL_REASON: reason})
        _tell(study, trial, state=optuna.trial.TrialState.FAIL)
        print(f"trial {trial.number} FAIL: {reason}", flush=True)
        raise
    attrs = _finish_attrs(spec, trial, started, result.attrs)
    if result.pruned:
        _tell(study, trial, state=optuna.trial.TrialState.PRUNED)
        state = "PRUNED"
    else:
        cost = [cost_objective(spec, attrs)] if spec.study.also_minimize else []
        _tell(study, trial, values=[result.value, *cost])
        state = "COMPLETE"
    print(f"trial {trial.number} {state}: {spec.study.metric}={result.value:.4f}", flush=True)
    return {"rank": 0, "state": state, "value": result.value}


def cost_objective(spec: StudySpec, attrs: dict[str, Any]) -> float:
    """The second objective of a multi-objective study, from the trial's attributes: its last
    run's GPU- or CPU-hours (elapsed time times its allocation) or its mean epoch time."""
    if spec.study.also_minimize == "epoch_time_s" and study_lib.ATTR_EPOCH_TIME_S not in attrs:
        return float(attrs[study_lib.ATTR_ELAPSED_S]) / max(1, int(attrs.get(study_lib.ATTR_EPOCHS, 1)))
    return float(attrs[str(spec.study.also_minimize)])


def _finish_attrs(
    spec: StudySpec, trial: optuna.Trial, started: float, attrs: dict[str, Any]
) -> dict[str, Any]:
    # Attributes can no longer be set once the trial is told, so they are written just before.
    elapsed = time.monotonic() - started
    gpus, cpus = accounting.own_allocation(spec)
    attrs = {
        **attrs,
        study_lib.ATTR_ELAPSED_S: round(elapsed, 3),
        study_lib.ATTR_FINISHED_AT: now_iso(),
        # This run's cost, for optuna-dashboard; `hpo status` and reports take sacct's figures.
        study_lib.ATTR_GPU_HOURS: round(elapsed * gpus / 3600, 6),
        study_lib.ATTR_CPU_HOURS: round(elapsed * cpus / 3600, 6),
    }

    def write() -> None:
        for key, value in attrs.items():
            trial.set_user_attr(key, value)

    with_retries(write, "set attributes")
    return attrs


def _tell(
    study: optuna.Study, trial: optuna.Trial, *, values: list[float] | None = None, state: Any = None
) -> None:
    """Tell once: if a tell cut off by an outage had in fact been stored, the retry leaves it."""
    with_retries(lambda: study.tell(trial.number, values, state=state, skip_if_finished=True), "tell")


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def job_identity() -> dict[str, str]:
    """The Slurm job id and node list of this process (or the local controller's pid and host)."""
    # submitit says which executor started us: a local trial on an interactive Slurm node also
    # sees SLURM_JOB_ID, which is not its job.
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
        array = os.environ.get("SLURM_ARRAY_JOB_ID")
        job_id = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ["SLURM_JOB_ID"]
        return {study_lib.ATTR_JOB_ID: job_id, study_lib.ATTR_NODES: os.environ.get("SLURM_JOB_NODELIST", "")}
    return {
        study_lib.ATTR_JOB_ID: os.environ.get("SUBMITIT_LOCAL_JOB_ID", str(os.getpid())),
        study_lib.ATTR_NODES: socket.gethostname(),
    }


def _export_rank_environment() -> int:
    """Make the trainer see its rank. Under srun it reads Slurm's variables itself; submitit's
    local executor sets its own, which are translated to torchrun's for multi-process trials."""
    if os.environ.get("SUBMITIT_LOCAL_NTASKS", "1") != "1":
        import submitit

        dist_env = submitit.helpers.TorchDistributedEnvironment()
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.update(
            RANK=str(dist_env.rank),
            WORLD_SIZE=str(dist_env.world_size),
            LOCAL_RANK=str(dist_env.local_rank),
            MASTER_PORT=str(dist_env.master_port),
        )
        return dist_env.rank
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
        return int(os.environ.get("SLURM_PROCID", "0"))
    return 0


@dataclasses.dataclass
class WorkerTask:
    """A long-running worker job (``--workers``): ask, run, tell, until the budget is met."""

    spec: StudySpec
    storage: StorageRef
    deadline_unix: float | None = None
    objective: Objective = dataclasses.field(default_factory=TrainerObjective)
    started: float = 0.0
    """When the launcher started: an `hpo cancel` after it stops the worker."""
    time_limit_min: float | None = None
    """The worker job's time limit: no trial is started that could not end within it."""

    def __call__(self) -> dict[str, Any]:
        import optuna
        from submitit.core.utils import UncompletedJobError

        job_started = time.time()
        longest_trial_s = 0.0
        study = study_lib.load(self.spec, open_storage(self.storage, create=False), create=False)
        # Each worker samples its own sequence (same seed everywhere would mean the same proposals).
        worker = (
            os.environ.get("SLURM_ARRAY_TASK_ID")
            or os.environ.get("SUBMITIT_LOCAL_JOB_ID")
            or str(os.getpid())
        )
        study_lib.reseed_sampler(
            study, self.spec, seed_stream=1 + len(study.get_trials(deepcopy=False)) + 7919 * int(worker)
        )
        space = study_lib.distributions(self.spec)
        ran = 0
        while len(study_lib.counted_trials(study)) < self.spec.study.n_trials:
            if self.deadline_unix is not None and time.time() >= self.deadline_unix:
                break
            if study_lib.cancel_requested_at(study) >= self.started:
                break
            if self.time_limit_min is not None:
                left_s = job_started + 60 * self.time_limit_min - time.time()
                if left_s < 1.2 * longest_trial_s + 60:
                    print(
                        f"worker stops: {left_s:.0f} s left, the longest trial took {longest_trial_s:.0f} s",
                        flush=True,
                    )
                    break
            trial = study.ask(space)
            retries.inherit_checkpoint(self.spec, trial)
            # Several workers may ask at the same moment for the last slot: the trial numbers
            # decide, and a surplus trial is closed unrun so that the budget is exact.
            earlier = [t for t in study_lib.counted_trials(study) if t.number < trial.number]
            if len(earlier) >= self.spec.study.n_trials:
                trial.set_user_attr(study_lib.ATTR_SURPLUS, True)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                break
            trial.set_user_attr(study_lib.ATTR_EXECUTOR, "worker")
            trial.set_user_attr(study_lib.ATTR_JOB_KIND, os.environ.get("SUBMITIT_EXECUTOR", "local"))
            trial_started = time.time()
            try:
                run_attached(self.spec, study, trial, self.objective)
            except UncompletedJobError:
                raise  # the job is at its time limit or preempted: no further trial
            except Exception:
                traceback.print_exc()  # recorded as FAIL with its reason; the worker goes on
            longest_trial_s = max(longest_trial_s, time.time() - trial_started)
            ran += 1
        return {"trials_run": ran}
