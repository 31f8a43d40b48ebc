"""The Ray Tune driver: the study's trials as Tune trials, written to the same Optuna storage.

Ray Tune packs trials into one allocation and stops weak ones with its schedulers; Optuna (through
Tune's ``OptunaSearch``) proposes them and keeps the record, in the study's own storage, so that
``hpo status``, ``hpo best`` and optuna-dashboard read a Ray-backed study like any other.

The study file is the same as for the Optuna backend. Its pruner maps onto Tune's schedulers:
``successive_halving`` -> ASHA, ``hyperband`` -> HyperBand, ``median`` -> median stopping,
``none`` -> FIFO, each counting time in epochs (Tune's ``training_iteration``); ``pbt`` is
Population Based Training (see ``population``).

Ray is imported inside the functions that use it: the launcher, ``hpo status`` and the pre-flight
checks import this module on machines and in processes where Ray is absent or not wanted.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from hpo import executors, failures, portfolio, record, study_record, tally, warm_start
from hpo.budget import admission
from hpo.budget.usage import trial_gpus
from hpo.dispatch.common import (
    open_study,
    refuse_during_cancel,
    refuse_live_jobs_of_other_modes,
    rerun_set_up_failures,
)
from hpo.dispatch.ray import ddp_trial, optuna_search, population
from hpo.errors import NotReadyError
from hpo.paths import checkpoint_dir
from hpo.storage import StorageRef
from hpo.trial.objective import Objective, StepReport, TrainerObjective
from hpo.trial.task import objective_for
from trainer.reporting import Decision, EpochMetrics

if TYPE_CHECKING:
    from hpo.config import StudySpec

# Set where Ray's processes start (the local instance, `ray start` on each node), so that every
# worker process has them:
# - Tune's default 2 s for a stopped trial's thread to end, before its actor is reused, is short
#   for a trainer closing its DataLoader workers on a busy node;
# - PL_DISABLE_FORK is what Tune gives each trial actor as a runtime_env (`_trials_in_started_workers`);
# - each raylet starts its worker processes (one per CPU) as it starts, instead of when the first
#   driver connects: the driver's connect waited for them (1.2 s on a 2-core node), and a worker
#   node, which no driver connects to, started none.
RAY_NODE_ENV = {
    "TUNE_FUNCTION_THREAD_TIMEOUT_S": "20",
    "PL_DISABLE_FORK": "1",
    "RAY_enable_worker_prestart": "1",
}

RAY_PRUNERS = ("successive_halving", "hyperband", "median", "none", "pbt")


def build_scheduler(spec: StudySpec, epochs: int) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler, MedianStoppingRule

    options = dict(spec.study.pruner.options)
    name = spec.study.pruner.name
    if name == "successive_halving":
        # Optuna's names for the same quantities: min_resource epochs before the first cut,
        # reduction_factor between rungs.
        grace = options.get("min_resource", 1)
        return ASHAScheduler(
            time_attr="training_iteration",
            max_t=epochs,
            grace_period=1 if grace == "auto" else int(grace),
            reduction_factor=float(options.get("reduction_factor", 4)),
        )
    if name == "hyperband":
        return HyperBandScheduler(
            time_attr="training_iteration",
            max_t=epochs,
            reduction_factor=float(options.get("reduction_factor", 3)),
        )
    if name == "median":
        # Optuna's first decision is at step n_warmup_steps, Ray's at time grace_period; epochs
        # count from 1.
        return MedianStoppingRule(
            time_attr="training_iteration",
            grace_period=float(max(1, int(options.get("n_warmup_steps", 0)))),
            min_samples_required=int(options.get("n_startup_trials", 5)),
        )
    return FIFOScheduler()


def _trainable(config: dict[str, Any], spec: StudySpec, objective: Objective, pbt: bool = False) -> None:
    """One Tune trial: the objective, reporting each epoch to Tune (which may stop it there).

    Under PBT each epoch's report carries the trainer's checkpoint, and a trial that Tune starts
    from a checkpoint (another member's weights, or its own after a pause) trains on from it.
    """
    from ray import tune

    trial_key = f"ray-{tune.get_context().get_trial_id()}"  # unique across launches
    own_checkpoint = checkpoint_dir(spec, trial_key)

    class TuneReporter:
        checkpoint_before_report = pbt

        def report(self, metrics: EpochMetrics | StepReport) -> Decision:
            node = executors.here().node()
            payload = {**metrics.to_dict(), "node": node}  # Tune overwrites "hostname"
            if pbt:
                tune.report(payload, checkpoint=tune.Checkpoint.from_directory(str(own_checkpoint)))
            else:
                tune.report(payload)
            # Tune stops the trial itself when its scheduler says so; a non-finite metric stops it
            # here (the searcher tells it DIVERGED).
            value = getattr(metrics, spec.study.metric, None)
            return (
                Decision.STOP if value is not None and not math.isfinite(float(value)) else Decision.CONTINUE
            )

    config = {key: value for key, value in config.items() if key != population.MEMBER_KEY}
    handed = tune.get_checkpoint() if pbt else None
    if handed is not None:
        from trainer.checkpoint import CHECKPOINT_NAME  # imports torch: only where it is needed

        with handed.as_directory() as folder:
            own_checkpoint.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(folder) / CHECKPOINT_NAME, own_checkpoint / CHECKPOINT_NAME)

    # A Tune trial is one process, but Ray's workers inherit the job step's variables of the
    # node they run on: the trainer would take itself for one rank of a multi-task step and wait
    # for the other ranks.
    executors.here().leave_step()
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        os.environ.pop(name, None)
    try:
        objective(spec, trial_key, config, TuneReporter())
    except Exception as err:
        if not _ended_on(spec, err):
            raise


def _ended_on(spec: StudySpec, err: Exception) -> bool:
    """End a Tune trial on its objective's failure where Tune must not run it again, as the Optuna
    backend would not: the program's own "loss is nan" (DIVERGED), or a failure no rerun changes
    (a usage error, a missing module: FAIL with its reason). A result with the metric NaN and the
    reason says so to the searcher. False: the failure is Tune's to retry."""
    from ray import tune

    reason = optuna_search.failure_reason(err)
    failure = failures.classify(reason)
    if failure.kind == failures.DIVERGED:
        tune.report({spec.study.metric: math.nan, optuna_search.PROGRAM_DIVERGED: reason})
        return True
    optuna_search.note_failure(spec, tune.get_context().get_trial_id(), reason)
    if failure.permanent:
        tune.report({spec.study.metric: math.nan, optuna_search.PROGRAM_FAILED: reason})
        return True
    return False


def fail_leftovers(spec: StudySpec, study: optuna.Study) -> int:
    """Trials RUNNING in the storage when a Ray-backed launch starts belong to a Ray job that has
    ended (time limit, preemption, crash): they are failed, and the budget goes on counting them.
    Those of another launch mode whose jobs still run, or of another Ray job that still runs (a
    local launch beside the study's allocation), refuse the launch in one line."""
    this_job = executors.here().current_job()
    refuse_live_jobs_of_other_modes(spec, study, record.DispatchMode.RAY)
    leftovers = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if record.dispatch_mode(trial) in (None, record.DispatchMode.RAY)
    ]
    jobs = {str(t.user_attrs[record.ATTR_JOB_ID]): t for t in leftovers if record.ATTR_JOB_ID in t.user_attrs}
    others = {job: t for job, t in jobs.items() if job != this_job and not job.startswith("local-")}
    for job_id, trial in others.items():  # each job asked once, before any trial is failed
        runs_on = executors.get(record.executor_name(trial) or spec.resources.executor)
        if not runs_on.ended(job_id, runs_on.job(spec, job_id)):
            raise NotReadyError(
                f"study {spec.study.name!r}: its Ray job {job_id} still runs trial {trial.number}",
                "relaunch with the same executor to follow it, or end it with `hpo cancel`",
            )
    for trial in leftovers:
        record.fail(study, trial, "its Ray job ended first")
    return len(leftovers)


def run(
    spec: StudySpec,
    storage: StorageRef,
    objective: Objective | None = None,
    log: Any = print,
    allow_space_change: bool = False,
    cluster: Callable[[], str] | None = None,
) -> None:
    """Run the study's remaining trials on a Ray cluster or a local Ray instance (``cluster``
    None). In an allocation, the launcher that submitted it has checked the study file already.
    ``cluster()`` returns the cluster's address once it is up: the study is opened while it starts."""
    import ray

    pbt = spec.study.pruner.name == "pbt"
    # Under PBT a member goes on from another's checkpoint with perturbed optimizer settings.
    if objective is None and spec.objective is not None:
        objective = objective_for(spec)
    objective = objective or TrainerObjective(",".join(population.mutations(spec)) if pbt else "")
    started = time.time()  # an `hpo cancel` from before this launch does not stop it
    study, backend, planned = open_study(
        spec, storage, reseed=False, allow_space_change=allow_space_change, schema_checked=cluster is not None
    )
    if cluster is None:  # a local launch (in an allocation, the launcher that submitted it checked)
        refuse_during_cancel(spec, study)
    leftovers = fail_leftovers(spec, study)
    study_record.clear_failing_stop(study)  # an earlier launch's verdict: this one judges its own trials
    warm_start.apply(spec, study, planned, log)
    study_record.enqueue_first_trials(study, portfolio.first_trials(study, spec))
    remaining = admission.trials_left(spec, study)
    log(f"study {spec.study.name!r}: {spec.study.n_trials - remaining} of {spec.study.n_trials} trials stored"
        + (f" ({leftovers} left running by an ended Ray job, now failed)" if leftovers else ""))  # fmt: skip
    if remaining == spec.study.n_trials and (said := portfolio.coverage_line(spec)):
        log(said)
    rerun_set_up_failures(study, log)
    if remaining <= 0:
        return
    job_id = executors.here().current_job() or f"local-{os.getpid()}"
    plan: _TunePlan | None = None
    try:
        # Tune's plan needs no running Ray: made (Tune imported, the searcher built) while the
        # head's Ray starts, which ``cluster()`` waits for.
        if pbt:
            plan = _population_plan(study, spec, remaining, job_id)
        else:
            search_alg = optuna_search.study_search(
                spec, backend, spec.max_steps, job_id, _admission(spec, study, started, log)
            )
            plan = _TunePlan(search_alg, build_scheduler(spec, spec.max_steps), spec.study.max_concurrent)
        _trials_in_started_workers()
        if cluster is not None:
            ray.init(address=cluster(), log_to_driver=False)
        else:
            os.environ.update(RAY_NODE_ENV)
            ray.init(num_cpus=max(1, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
        _tuner(spec, _tune_trainable(spec, objective, pbt), plan, remaining).fit()
    finally:
        if plan is not None and plan.recorder is not None:
            plan.recorder.fail_unfinished("not finished when its Ray run ended (time budget or stop)")
        ray.shutdown()


def _trials_in_started_workers() -> None:
    """Tune gives each trial actor a runtime_env of its default variables (``PL_DISABLE_FORK``),
    and Ray runs an actor with a runtime_env only in a worker process started for it, never in one
    of the workers the raylet started ahead: each first trial waited for a new process to start and
    import Ray (1.3 s on a busy node) while those idled. The variables are in every worker's
    environment instead (RAY_NODE_ENV), and Tune's default is emptied in this driver process, where
    Tune reads it as it makes the trials' actor class. A Ray whose default holds a variable
    RAY_NODE_ENV lacks keeps its default, and the slower start."""
    from ray.tune.execution import class_cache

    defaults = getattr(class_cache, "DEFAULT_ENV_VARS", None)
    if isinstance(defaults, dict) and defaults.items() <= RAY_NODE_ENV.items():
        defaults.clear()


@dataclasses.dataclass
class _TunePlan:
    """How Tune picks, stops and keeps the study's trials."""

    search_alg: Any
    scheduler: Any
    max_concurrent: int | None
    callbacks: list[Any] = dataclasses.field(default_factory=list)
    checkpoints: Any = None
    param_space: dict[str, Any] | None = None
    recorder: population.PopulationRecorder | None = None


def _population_plan(study: optuna.Study, spec: StudySpec, remaining: int, job_id: str) -> _TunePlan:
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    # PBT takes no search algorithm: Optuna's sampler proposes the first population.
    members, configs = population.first_population(study, spec, remaining, job_id)
    recorder = population.PopulationRecorder(study, spec, members)
    return _TunePlan(
        search_alg=BasicVariantGenerator(
            points_to_evaluate=configs, max_concurrent=spec.study.max_concurrent
        ),
        scheduler=population.build_scheduler(spec),
        max_concurrent=None,
        callbacks=[recorder.as_tune_callback()],
        # PBT hands a member the donor's checkpoint of the moment it exploits; the donor trains on
        # while the member restarts, so keep 5 epochs of slack before that checkpoint is deleted
        # (Tune warns below 3; a slow restart on a busy node once outlasted 3 short epochs).
        checkpoints=tune.CheckpointConfig(num_to_keep=5),
        # Tune sets a preset config's keys only where the search space has them.
        param_space=dict.fromkeys(configs[0]),
        recorder=recorder,
    )


def _tune_trainable(spec: StudySpec, objective: Objective, pbt: bool) -> Any:
    from ray import tune

    if spec.resources.tasks_per_node > 1:  # a DDP trial: its Ray Train workers hold the resources
        return ddp_trial.tune_trainable(spec, objective)
    # trials_per_gpu > 1: Ray's fractional GPUs place that many trials on each GPU.
    resources = {"cpu": float(spec.resources.cpus_per_task), "gpu": trial_gpus(spec)}
    return tune.with_resources(
        tune.with_parameters(_trainable, spec=spec, objective=objective, pbt=pbt), resources=resources
    )


def _tuner(spec: StudySpec, trainable: Any, plan: _TunePlan, remaining: int) -> Any:
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    # Tune adds a TensorBoardX logger of its own unless told not to: importing tensorboardX cost 2 s
    # of every launch before its first trial, for event files nothing reads (the trainer writes
    # its own, study.tensorboard). Tune's CSV and JSON results stay, named here.
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"

    timeout_min = spec.study.timeout_min
    return tune.Tuner(
        trainable,
        param_space=plan.param_space,
        tune_config=tune.TuneConfig(
            search_alg=plan.search_alg,
            scheduler=plan.scheduler,
            num_samples=remaining,
            max_concurrent_trials=plan.max_concurrent,
            # A trial in a warm actor skips a new worker process and its imports (seconds on a
            # busy node). Tune fails the new trial if the last one's thread has not ended within
            # TUNE_FUNCTION_THREAD_TIMEOUT_S (see RAY_NODE_ENV); a stopped trial ends at its report.
            reuse_actors=True,
            time_budget_s=None if timeout_min is None else 60 * timeout_min,
            metric=spec.study.metric,
            mode="max" if spec.study.direction == "maximize" else "min",
        ),
        run_config=tune.RunConfig(
            name=f"{spec.study.name}-{int(time.time())}",
            storage_path=str(spec.workdir / "ray_results"),
            callbacks=[*plan.callbacks, CSVLoggerCallback(), JsonLoggerCallback()],
            checkpoint_config=plan.checkpoints,
            # Tune restarts a failed trial (same Optuna trial; the trainer resumes from its
            # checkpoint under the study's workdir) up to max_retries times.
            failure_config=tune.FailureConfig(max_failures=spec.study.max_retries),
            verbose=0,
        ),
    )


def _admission(
    spec: StudySpec, study: optuna.Study, started: float, log: Any
) -> Callable[[optuna.Study], admission.Admission]:
    """Whether Tune may start another trial: the launch's admission (``hpo.budget.admission``:
    `hpo cancel`, fail fast, the stop rules, the compute budget as the hours of the study's Slurm
    allocations, whole, or estimates for a local Ray). Its trials are those that end from now on:
    not the ones an ended Ray job left running, failed as this launch began."""
    deadline = None if spec.study.timeout_min is None else started + 60 * spec.study.timeout_min
    gate = admission.Gate(
        spec,
        study,
        started=started,
        deadline=deadline,
        log=log,
        cancel_line="hpo cancel: starting no more trials",
        ray_jobs=study_record.ray_jobs(study),
    )
    before = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}

    def ask(live: optuna.Study) -> admission.Admission:
        ended = [t for t in tally.ended_since(live, started) if t.number not in before]
        running = len(live.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))
        return gate.ask(ended, running)

    return ask
