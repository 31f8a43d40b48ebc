"""Failed trials are retried; a trial that runs out of memory is infeasible, not failed.

A trial that fails (an exception in the trial, its job cancelled outside the service, its node
lost, its job gone from Slurm) is retried up to ``study.max_retries`` times: a new trial in the
WAITING state, with the same parameters, that the next ``ask`` takes before any new proposal. It
records what it retries in the system attributes Optuna's own
``RetryHeartbeatStaleTrialCallback`` writes (``failed_trial``, ``retry_history``), so Optuna's
helpers read them, plus a ``retry_of`` user attribute that optuna-dashboard shows. It inherits the
failed trial's intermediate values and, when its job starts, its last checkpoint: the work done
before the failure is not paid for twice.

Retries are queued by whoever watches the study (the launcher, or the Ray driver) from the stored
FAIL trials, so a failure told while no launcher ran is retried by the next one, and each failure
is retried once however many times the scan runs.

A trial that runs out of GPU (or host) memory would fail again with the same parameters: it is
told COMPLETE with the worst value and an ``out_of_memory`` constraint of 1, which Optuna counts
as infeasible. The samplers learn from it (TPE ranks infeasible trials below feasible ones) and
``best_trial`` never picks it.
"""

from __future__ import annotations

import math
import shutil
import sys
from typing import TYPE_CHECKING

from hpo import study as study_lib
from hpo.paths import private_dir

if TYPE_CHECKING:
    import optuna

    from hpo.studyfile import StudySpec

ATTR_RETRY_OF = "retry_of"
CONSTRAINT_MEMORY = "out_of_memory"
# A failure that a retry cannot help: the user stopped the study, or the retry budget is spent.
_NOT_RETRIED_PREFIXES = (study_lib.REASON_CANCELLED,)


def retry_history(trial: optuna.trial.FrozenTrial) -> list[int]:
    return list(trial.system_attrs.get(study_lib.SYSTEM_ATTR_RETRY_HISTORY, []))


def queue_retries(study: optuna.Study, max_retries: int) -> list[int]:
    """Queue a retry of every FAIL trial that has none yet and has retries left; returns the
    numbers of the trials retried."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    already = study_lib.retried_numbers(trials)
    retried = []
    for trial in trials:
        if trial.state != optuna.trial.TrialState.FAIL or trial.number in already:
            continue
        if trial.user_attrs.get(study_lib.ATTR_SURPLUS) or not trial.params:
            continue  # closed unrun, or failed before it had parameters: nothing to repeat
        if str(trial.user_attrs.get(study_lib.ATTR_FAIL_REASON, "")).startswith(_NOT_RETRIED_PREFIXES):
            continue
        history = [*retry_history(trial), trial.number]
        if len(history) > max_retries:
            continue
        study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState.WAITING,
                params=dict(trial.params),
                distributions=dict(trial.distributions),
                user_attrs={
                    ATTR_RETRY_OF: trial.number,
                    # A multi-objective trial's curve, as intermediate values are for the others.
                    **(
                        {study_lib.ATTR_CURVE: trial.user_attrs[study_lib.ATTR_CURVE]}
                        if study_lib.ATTR_CURVE in trial.user_attrs
                        else {}
                    ),
                },
                system_attrs={
                    study_lib.SYSTEM_ATTR_FAILED_TRIAL: history[0],
                    study_lib.SYSTEM_ATTR_RETRY_HISTORY: history,
                },
                intermediate_values=dict(trial.intermediate_values),
            )
        )
        retried.append(trial.number)
    return retried


def inherit_checkpoint(spec: StudySpec, trial: optuna.Trial | optuna.trial.FrozenTrial) -> int | None:
    """Give a retry the checkpoint of the trial it retries, before its job starts; returns that
    trial's number if a checkpoint was copied."""
    from hpo.trial_job import checkpoint_dir

    failed = trial.user_attrs.get(ATTR_RETRY_OF)
    if failed is None:
        return None
    source, target = checkpoint_dir(spec, int(failed)), checkpoint_dir(spec, trial.number)
    if not source.is_dir() or target.exists():
        return None
    private_dir(target.parent)
    shutil.copytree(source, target)
    return int(failed)


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or an allocator's "out of memory" (CUDA, MPS) / "can't allocate
    memory" / "not enough memory" (torch's CPU allocator)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    if isinstance(err, MemoryError):
        return True
    text = str(err).lower()
    markers = ("out of memory", "can't allocate memory", "not enough memory")
    return isinstance(err, RuntimeError) and any(marker in text for marker in markers)


def worst_value(direction: str | None) -> float:
    """The value an infeasible trial is told with: below any accuracy, above any loss."""
    return 0.0 if direction == "maximize" else math.inf


def tell_infeasible(
    study: optuna.Study, trial_id: int, number: int, reason: str, directions: list[str]
) -> None:
    """Tell a trial that ran out of memory: COMPLETE, worst values, memory constraint violated."""
    import optuna

    trial = optuna.Trial(study, trial_id)
    trial.set_constraint(CONSTRAINT_MEMORY, 1.0)
    trial.set_user_attr(study_lib.ATTR_FAIL_REASON, reason)
    trial.set_user_attr(study_lib.ATTR_INFEASIBLE, True)
    study.tell(number, [worst_value(direction) for direction in directions])
