"""The trial record: every attribute the service writes on trials, and the only code that writes
them or reaches into Optuna's storage (which of them count, read back, is ``hpo.tally``'s).

A study's state is what its storage holds: Optuna's trial states and values, plus the attributes
below (shown by ``hpo status``, the report and optuna-dashboard) and the study's own
(``hpo.study_record``). Launchers, trial processes, the Ray driver and the views all read and
write them through these two modules, so that an attribute has one name, the budget one rule, and
Optuna's private API (``study._storage``, ``trial._trial_id``) one place to change when Optuna
changes.

Retries: a trial that fails (an exception in the trial, its job cancelled outside the service, its
node lost, its job gone from Slurm) is retried up to ``study.max_retries`` times as a new trial in
the WAITING state with the same parameters, that the next ``ask`` takes before any new proposal.
It records what it retries in the system attributes Optuna's own
``RetryHeartbeatStaleTrialCallback`` writes (``failed_trial``, ``retry_history``), so Optuna's
helpers read them, plus a ``retry_of`` user attribute that optuna-dashboard shows, and inherits the
failed trial's intermediate values. Retries are queued by whoever watches the study (the launcher,
or the Ray driver) from the stored FAIL trials, so a failure told while no launcher ran is retried
by the next one, and each failure is retried once however many times the scan runs. A failure no
rerun changes (a usage error, a missing file, a pattern that never matched: ``hpo.failures``) is
not retried.

A trial that runs out of GPU (or host) memory would fail again with the same parameters: it is
told COMPLETE with the worst value and an ``out_of_memory`` constraint of 1, which Optuna counts
as infeasible. The samplers learn from it (TPE ranks infeasible trials below feasible ones) and
``best_trial`` never picks it.
"""

from __future__ import annotations

import contextlib
import enum
import math
import warnings
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import optuna

from hpo import failures
from hpo.errors import LaunchError, NotReadyError, StudyFileError

if TYPE_CHECKING:
    pass

# --------------------------------------------------------------------------------------------------
# Trial user attributes written by the service (shown by `hpo status` and optuna-dashboard)
# --------------------------------------------------------------------------------------------------

# Where and when the trial ran.
ATTR_JOB_ID = "job_id"
ATTR_EXECUTOR = "executor"
"""Where its job ran: the name of an executor of ``hpo.executors`` (slurm, local)."""
ATTR_DISPATCH = "dispatch"
"""How the launch ran it: a :class:`DispatchMode` value."""
ATTR_NODES = "nodes"
ATTR_PACK_SLOT = "pack_slot"
"""Its place among the trials (or workers) its job ran at once on one GPU (``trials_per_gpu``)."""
ATTR_PACK_SIZE = "pack_size"
"""How many trials (or workers) its job ran at once."""
ATTR_ASKED_AT = "asked_at"
ATTR_SUBMITTED_AT = "submitted_at"
"""When the launcher's submission of the trial's job returned (its job id known)."""
ATTR_JOB_STARTUP = "job_startup"
"""When the trial's job came up, before ``started_at`` (the trial attached): {"process": the job's
process started, "called": its Python had imported and unpickled the trial, "connected": it had
opened the study}; for a trial that ran in a job of its own (per-trial dispatch)."""
ATTR_FIRST_REPORT_S = "first_report_s"
"""Seconds the trial's first report took: its intermediate value stored and the pruner asked."""
ATTR_STARTED_AT = "started_at"
ATTR_FINISHED_AT = "finished_at"
ATTR_ELAPSED_S = "elapsed_s"
ATTR_GPU_HOURS = "gpu_hours"
ATTR_CPU_HOURS = "cpu_hours"
ATTR_THREADS = "threads"
"""The CPU threads the trial's computation used (torch's, OMP_NUM_THREADS): they change the last
digits of its values, so the command `hpo best` prints sets them."""
ATTR_RESTARTS = "restarts"
"""How many times Slurm requeued the trial's job (preemption, time limit, node failure)."""
ATTR_RESUMED_FROM_EPOCH = "resumed_from_epoch"
"""The epoch whose checkpoint the trial's last run resumed from (after a requeue, or a retry)."""

# How it ended, and whether it counts.
ATTR_FAIL_REASON = "fail_reason"
ATTR_INFEASIBLE = "infeasible"
ATTR_STATE = "end_state"
"""The trial's end state where Optuna's differs from the service's (``shown_state``): a user
attribute, so that optuna-dashboard shows DIVERGED and INFEASIBLE too."""
"""Set on a trial that ran out of memory (see tell_infeasible)."""
ATTR_DIVERGED_AT = "diverged_at_step"
"""The step at which a diverged trial's metric turned NaN or infinite (see tell_diverged)."""
ATTR_SURPLUS = "surplus"
"""Set on a trial asked beyond the budget (two workers asking for the last slot) and closed unrun."""
ATTR_NOT_RUN = "not_run"
"""Set on a trial closed before its job was submitted (a submission that failed, a launcher stopped
between ask and submit, a cancel in between): FAIL with its reason, not counted, not retried."""
ATTR_RERUN_OF = "rerun_of"
"""On an enqueued configuration queued again because a set-up mistake failed its trial (the trial's
number): see ``hpo.requeue.rerun_set_up_failures``."""
ATTR_RETRY_OF = "retry_of"
"""The number of the failed trial a retry repeats."""
ATTR_IMPORTED_FROM = "imported_from"
"""A trial imported from an earlier study by a warm start ("study name"): the sampler learns from
it; it was not run here, so it counts in neither the trial budget nor the compute budget, and is
never this study's best."""

# What it measured.
ATTR_EPOCHS_COMPLETED = "epochs_completed"
ATTR_IMAGES_PER_S = "images_per_s"
ATTR_TEST_ACCURACY = "test_accuracy"
"""Accuracy on the held-out test images (trainer.test_held_out), for the completed trials."""
ATTR_EPOCH_TIME_S = "epoch_time_s"
"""Mean seconds per epoch (training and validation) of the trial's last run."""
ATTR_EPOCH_SECONDS = "epoch_seconds"
"""[training, validation] seconds of each epoch in order, a resumed run's checkpointed epochs
included: what the replay benchmark's clock runs on."""
ATTR_EPOCH_VALUES = "epoch_values"
"""{epoch: metric} after each epoch, in a multi-objective study (which takes no intermediate values)."""
ATTR_METRICS = "metrics"
"""Every other metric a trial of the user's objective reported, per step: {name: {step: value}}
(the named groups of ``metric_pattern`` beside ``value`` and ``step``; keyword arguments of
``hpo.trial.report``)."""
# What a built-in trainer trial measured of itself, over the epochs it trained
# (hpo.trial.measured.measurement_attrs).
ATTR_DATA_WAIT_SHARE = "data_wait_share"
"""Share of the training steps' time spent waiting for the next batch (and copying it in)."""
ATTR_STEP_MS = "step_ms"
"""Mean milliseconds of a training step by phase: {data, forward, backward, optimizer}."""
ATTR_PEAK_MEMORY_MIB = "peak_memory_mib"
"""CUDA's maximum allocated on a GPU, the process's peak RSS on CPU (rank 0)."""
ATTR_IMAGES_PER_S_PER_GPU = "images_per_s_per_gpu"
"""Training throughput per rank (per GPU): comparable across trials of different sizes."""
ATTR_GPU_UTILIZATION = "gpu_utilization"
"""Mean NVML utilization (%) of rank 0's GPU while training; absent without NVML."""
ATTR_PROFILE_TRACE = "profile_trace"
"""The folder of a profiled trial's torch.profiler trace."""
ATTR_TENSORBOARD_DIR = "tensorboard_dir"
MEASUREMENT_ATTRS = (
    ATTR_DATA_WAIT_SHARE,
    ATTR_STEP_MS,
    ATTR_PEAK_MEMORY_MIB,
    ATTR_IMAGES_PER_S_PER_GPU,
    ATTR_GPU_UTILIZATION,
    ATTR_PROFILE_TRACE,
)
"""What a trial measured of itself (summary.json's ``measurements``)."""
# Population Based Training (Ray backend): what PBT changed, and the values a member ended with.
ATTR_PBT_SCHEDULE = "pbt_schedule"
ATTR_PBT_FINAL_PARAMS = "pbt_final_params"

# Trial system attributes of a retry: the names Optuna's RetryHeartbeatStaleTrialCallback uses.
SYSTEM_ATTR_FAILED_TRIAL = "failed_trial"
SYSTEM_ATTR_RETRY_HISTORY = "retry_history"
# The constraint an infeasible (out of memory) trial violates.
CONSTRAINT_MEMORY = "out_of_memory"

# Fail reasons the service writes, by their first words.
REASON_CANCELLED = "cancelled by hpo cancel"
REASON_NO_PROGRESS = "no epoch finished between requeues"
REASON_LAUNCHER_STOPPED = "the launcher was stopped while submitting it"
REASON_STOPPED_FAILING = "stopped with the launch: its first trials failed the same way"
REASON_DIVERGED = failures.REASON_DIVERGED

# Failures that a retry cannot help: the user stopped the study; the job's time limit is too
# short for an epoch; the launch stopped because its first trials failed the same way.
NOT_RETRIED_PREFIXES = (REASON_CANCELLED, REASON_NO_PROGRESS, REASON_STOPPED_FAILING)


def now_iso() -> str:
    """The timestamp format of the ``*_at`` attributes."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def iso(unix_time: float) -> str:
    """A Unix time in the format of :func:`now_iso`."""
    return datetime.fromtimestamp(unix_time, timezone.utc).isoformat(timespec="milliseconds")


class DispatchMode(str, enum.Enum):
    """How a launch ran a trial (the ``dispatch`` attribute), apart from where (``executor``)."""

    PER_TRIAL = "per_trial"  # its own job (or a pack of trials sharing one job's GPU)
    WORKERS = "workers"  # pulled by a --workers job that runs trial after trial
    RAY = "ray"  # a Ray Tune trial inside the study's one Ray allocation


# Studies written before ``dispatch`` kept the mode in ``executor``: "worker" (the executor in
# ``job_kind``), "ray" (the allocation's executor unrecorded).
_LEGACY_EXECUTOR_MODES = {"worker": DispatchMode.WORKERS, "ray": DispatchMode.RAY}
_LEGACY_JOB_KIND = "job_kind"


def placement(executor: str, mode: DispatchMode) -> dict[str, str]:
    """What a launch writes on a trial it runs: how, then where (a trial left with ``executor``
    alone would read as written before ``dispatch`` existed)."""
    return {ATTR_DISPATCH: mode.value, ATTR_EXECUTOR: executor}


def dispatch_mode(trial: optuna.trial.FrozenTrial) -> DispatchMode | None:
    """How the trial was run; None for one never placed (imported, or asked and not yet placed).
    Reads studies written before the attribute existed."""
    stored = trial.user_attrs.get(ATTR_DISPATCH)
    if stored is not None:
        known = {mode.value: mode for mode in DispatchMode}
        return known.get(str(stored))  # a mode of a later release: unknown here
    legacy = trial.user_attrs.get(ATTR_EXECUTOR)
    if legacy is None:
        return None
    return _LEGACY_EXECUTOR_MODES.get(str(legacy), DispatchMode.PER_TRIAL)  # slurm, local


def executor_name(trial: optuna.trial.FrozenTrial) -> str | None:
    """The executor its job ran on (None where not recorded). Reads studies written before
    ``dispatch`` existed: a worker's trial then kept its executor in ``job_kind``."""
    stored = trial.user_attrs.get(ATTR_EXECUTOR)
    if stored is None or ATTR_DISPATCH in trial.user_attrs:
        return None if stored is None else str(stored)
    if str(stored) in _LEGACY_EXECUTOR_MODES:
        kind = trial.user_attrs.get(_LEGACY_JOB_KIND)
        return None if kind is None else str(kind)
    return str(stored)


# --------------------------------------------------------------------------------------------------
# Optuna's private storage API: here only
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def unless_told_meanwhile() -> Iterator[None]:
    """A trial told meanwhile by its own process keeps its state; the service's own errors (a full
    disk under the journal) go on: swallowed, a launcher would retry the same write forever."""
    try:
        yield
    except (NotReadyError, LaunchError, StudyFileError):
        raise
    except (RuntimeError, ValueError):  # told meanwhile
        pass


def trial_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """The storage's id of a trial (Optuna keeps it private; the number is per study)."""
    return int(trial._trial_id)


def read_trial(study: optuna.Study, trial_id: int) -> optuna.trial.FrozenTrial:
    """A trial as stored now, read through the study's own connection pool."""
    return study._storage.get_trial(trial_id)


def trial_by_number(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    """One trial of the study as stored now, by its number."""
    return study._storage.get_trial(_ids(study, number)[1])


def attach(study: optuna.Study, trial_number: int) -> optuna.Trial | None:
    """The running trial with this number, or None if it already ended."""

    storage = study._storage  # the study's own storage object: no second connection pool
    study_id = storage.get_study_id_from_name(study.study_name)
    found = storage.get_trial_id_from_study_id_trial_number(study_id, trial_number)
    if storage.get_trial(found).state != optuna.trial.TrialState.RUNNING:
        return None
    return optuna.Trial(study, found)


def fail(study: optuna.Study, trial: optuna.Trial | optuna.trial.FrozenTrial | int, reason: str) -> None:
    """Fail a trial with its reason, whoever holds it (a FrozenTrial cannot set attributes).
    Raises RuntimeError or ValueError if the trial was told meanwhile: then its state stands."""

    number, found = _ids(study, trial)
    study._storage.set_trial_user_attr(found, ATTR_FAIL_REASON, reason)
    study.tell(number, state=optuna.trial.TrialState.FAIL)


def _ids(study: optuna.Study, trial: optuna.Trial | optuna.trial.FrozenTrial | int) -> tuple[int, int]:
    if isinstance(trial, int):
        storage = study._storage
        found = storage.get_trial_id_from_study_id_trial_number(
            storage.get_study_id_from_name(study.study_name), trial
        )
        return trial, found
    return trial.number, trial_id(trial)


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def set_attr(trial: optuna.Trial, key: str, value: Any) -> None:
    """Write one trial attribute (it can no longer be set once the trial is told)."""
    trial.set_user_attr(key, value)


def set_attrs(trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def mark_surplus(study: optuna.Study, trial: optuna.Trial) -> None:
    """Close a trial asked beyond the budget unrun; the budget does not count it."""

    trial.set_user_attr(ATTR_SURPLUS, True)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def close_not_run(
    study: optuna.Study, trial: optuna.Trial | optuna.trial.FrozenTrial | int, reason: str
) -> None:
    """Fail a trial whose job was never submitted; the budget does not count it. Raises
    RuntimeError or ValueError if the trial was told meanwhile: then its state stands."""

    number, found = _ids(study, trial)
    study._storage.set_trial_user_attr(found, ATTR_NOT_RUN, True)
    study._storage.set_trial_user_attr(found, ATTR_FAIL_REASON, reason)
    study.tell(number, state=optuna.trial.TrialState.FAIL)


def close_waiting_not_run(study: optuna.Study, trial: optuna.trial.FrozenTrial, reason: str) -> None:
    """Fail a WAITING trial unrun; the budget does not count it. Optuna tells no WAITING trial: its
    state is set in the storage, unless a launcher took it meanwhile (then it runs: harmless)."""
    storage, found = study._storage, trial_id(trial)
    if storage.get_trial(found).state != optuna.trial.TrialState.WAITING:
        return
    storage.set_trial_user_attr(found, ATTR_NOT_RUN, True)
    storage.set_trial_user_attr(found, ATTR_FAIL_REASON, reason)
    with unless_told_meanwhile():
        storage.set_trial_state_values(found, optuna.trial.TrialState.FAIL)


def worst_value(direction: str | None) -> float:
    """The value an infeasible trial is told with: below any accuracy, above any loss."""
    return 0.0 if direction == "maximize" else math.inf


def tell_infeasible(
    study: optuna.Study,
    trial: optuna.Trial | optuna.trial.FrozenTrial | int,
    reason: str,
    directions: list[str],
) -> None:
    """Tell a trial that ran out of memory: COMPLETE, worst values, memory constraint violated."""

    number, found = _ids(study, trial)
    live = optuna.Trial(study, found)
    live.set_constraint(CONSTRAINT_MEMORY, 1.0)
    live.set_user_attr(ATTR_FAIL_REASON, reason)
    live.set_user_attr(ATTR_INFEASIBLE, True)
    live.set_user_attr(ATTR_STATE, "INFEASIBLE")  # optuna-dashboard shows COMPLETE
    study.tell(number, [worst_value(direction) for direction in directions])


DIVERGED_STATE = optuna.trial.TrialState.PRUNED
"""How a diverged trial is told: TPE ranks pruned trials below completed ones and ignores FAIL ones;
no pruned trial is retried or ever the best. Replayed (bench/replay_divergence.py, 50 seeds, three
tasks): 9/10/7% of the default sampler's trials diverged told so, 16/18/11% told FAIL."""


def tell_diverged(
    study: optuna.Study, trial: optuna.Trial | optuna.trial.FrozenTrial | int, reason: str, step: int
) -> None:
    """Tell a trial whose metric turned non-finite at ``step``: a visible state with its reason
    ("diverged at step N: metric=nan"), never a value."""

    number, found = _ids(study, trial)
    study._storage.set_trial_user_attr(found, ATTR_FAIL_REASON, reason)
    study._storage.set_trial_user_attr(found, ATTR_DIVERGED_AT, step)
    study._storage.set_trial_user_attr(found, ATTR_STATE, "DIVERGED")  # optuna-dashboard shows PRUNED
    study.tell(number, state=DIVERGED_STATE)


def is_diverged(trial: optuna.trial.FrozenTrial) -> bool:
    return ATTR_DIVERGED_AT in trial.user_attrs


END_STATES = ("COMPLETE", "PRUNED", "DIVERGED", "INFEASIBLE", "FAIL")
"""The one vocabulary of a finished trial's state, in every view (status, studies, the launcher's
lines, the report, the trial's ``state`` user attribute in optuna-dashboard)."""


def is_infeasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Told COMPLETE with the worst value because its parameters cannot run (out of memory)."""
    return bool(trial.user_attrs.get(ATTR_INFEASIBLE))


def shown_state(trial: optuna.trial.FrozenTrial) -> str:
    """The trial's state as every view names it: Optuna's, or DIVERGED (a non-finite metric,
    stored as DIVERGED_STATE), or INFEASIBLE (out of memory, stored COMPLETE with worst values)."""
    if is_diverged(trial):
        return "DIVERGED"
    return "INFEASIBLE" if is_infeasible(trial) else trial.state.name


def retry_history(trial: optuna.trial.FrozenTrial) -> list[int]:
    return list(trial.system_attrs.get(SYSTEM_ATTR_RETRY_HISTORY, []))


def report_step(trial: optuna.Trial, step: int, value: float) -> None:
    """``trial.report``, quiet for a step the trial holds already: a retry carries the curve of the
    trial it retries, and a run that starts again from scratch reports those steps a second time
    (Optuna keeps the first value, and would warn at each one)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The reported value is ignored because this")
        trial.report(value, step)
