"""Which trials count, read from a study as every part of the service reads it: the trials that
use up the budget, a study's own trials (not surplus, not imported), those that ended since a
launch, the best trial and the Pareto front, a trial's curve, metric and run time, and how a value
and parameters are shown. Reading only: what writes trials, and Optuna's private API, is
``hpo.record``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import optuna

from hpo import study_record
from hpo.record import (
    ATTR_ELAPSED_S,
    ATTR_EPOCH_VALUES,
    ATTR_FAIL_REASON,
    ATTR_IMPORTED_FROM,
    ATTR_JOB_ID,
    ATTR_METRICS,
    ATTR_NOT_RUN,
    ATTR_PACK_SIZE,
    ATTR_SURPLUS,
    REASON_CANCELLED,
    REASON_STOPPED_FAILING,
    SYSTEM_ATTR_RETRY_HISTORY,
    DispatchMode,
    dispatch_mode,
    is_infeasible,
)

if TYPE_CHECKING:
    from hpo.config import StudySpec


def counted_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that use up the budget: all of them, except surplus ones closed unrun, imported
    ones, and failed ones whose retry (queued or run) takes their place."""
    trials = study.get_trials(deepcopy=False)
    # A retry closed unrun leaves the trial it retried in the count.
    retried = retried_numbers([t for t in trials if not t.user_attrs.get(ATTR_NOT_RUN)])
    set_up = set(study_record.set_up_failures(study))
    return [
        t
        for t in trials
        if not t.user_attrs.get(ATTR_SURPLUS)
        and not t.user_attrs.get(ATTR_NOT_RUN)
        and ATTR_IMPORTED_FROM not in t.user_attrs
        and t.number not in retried
        and t.number not in set_up
    ]


def steps_mismatch(trial: optuna.trial.FrozenTrial, spec: StudySpec) -> int | None:
    """The last step a completed trial of the user's objective reported, when it is not
    ``objective.steps`` (the step the pruners and an unnamed pruner's 4/9 warm-up take for a full
    run's last); None when they agree, or for the trainer (its epochs are the steps)."""
    if spec.objective is None or trial.state != optuna.trial.TrialState.COMPLETE:
        return None
    steps = curve(trial)
    last = max(steps, default=None)
    return last if last is not None and last != spec.objective.steps else None


def other_metric(trial: optuna.trial.FrozenTrial, name: str) -> float | None:
    """Another metric of the trial (``ATTR_METRICS``) at the last step it was reported at."""
    steps = trial.user_attrs.get(ATTR_METRICS, {}).get(name, {})
    return float(steps[max(steps, key=int)]) if steps else None


def ran_and_failed(trial: optuna.trial.FrozenTrial) -> bool:
    """A FAIL trial that ran and failed on its own: not closed unrun, not cancelled or cut short."""
    reason = str(trial.user_attrs.get(ATTR_FAIL_REASON, ""))
    return (
        trial.state == optuna.trial.TrialState.FAIL
        and not trial.user_attrs.get(ATTR_SURPLUS)
        and not trial.user_attrs.get(ATTR_NOT_RUN)
        and not reason.startswith((REASON_CANCELLED, REASON_STOPPED_FAILING))
    )


def ended_since(study: optuna.Study, since: float) -> list[optuna.trial.FrozenTrial]:
    """This study's own trials that ended at or after ``since`` (unix time), in the order they ended."""
    ended = [
        t
        for t in study.get_trials(deepcopy=False)
        if is_own(t) and t.datetime_complete is not None and t.datetime_complete.timestamp() >= since
    ]
    return sorted(ended, key=lambda t: (t.datetime_complete, t.number))


def own_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials this study ran or will run: not surplus, not imported by a warm start."""
    return [t for t in study.get_trials(deepcopy=False) if is_own(t)]


def packs(trials: Sequence[optuna.trial.FrozenTrial]) -> dict[str, list[int]]:
    """The per-trial jobs that ran several trials at once on one GPU (``trials_per_gpu``): each
    job's id and its trials' numbers. (A packed --workers job's trials ran k at a time, one after
    another in each of its slots.)"""
    jobs: dict[str, list[int]] = {}
    for trial in trials:
        if ATTR_PACK_SIZE in trial.user_attrs and dispatch_mode(trial) != DispatchMode.WORKERS:
            jobs.setdefault(str(trial.user_attrs.get(ATTR_JOB_ID, "-")), []).append(trial.number)
    return {job: numbers for job, numbers in jobs.items() if job != "-"}


def is_own(trial: optuna.trial.FrozenTrial) -> bool:
    return not trial.user_attrs.get(ATTR_SURPLUS) and ATTR_IMPORTED_FROM not in trial.user_attrs


def imported_count(study: optuna.Study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if ATTR_IMPORTED_FROM in t.user_attrs)


def retried_numbers(trials: list[optuna.trial.FrozenTrial]) -> set[int]:
    """The numbers of the trials that have a retry."""
    return {
        t.system_attrs[SYSTEM_ATTR_RETRY_HISTORY][-1]
        for t in trials
        if t.system_attrs.get(SYSTEM_ATTR_RETRY_HISTORY)
    }


def started_count(study: optuna.Study) -> int:
    """Trials of the budget that have started (counted, not WAITING): what a launcher compares
    with ``n_trials``."""
    return sum(1 for t in counted_trials(study) if t.state.name != "WAITING")


def curve(trial: optuna.trial.FrozenTrial) -> dict[int, float]:
    """The metric after each epoch: Optuna's intermediate values, or the attribute that holds
    them in a multi-objective study."""
    if trial.intermediate_values:
        return dict(trial.intermediate_values)
    return {int(epoch): float(v) for epoch, v in trial.user_attrs.get(ATTR_EPOCH_VALUES, {}).items()}


def metric_value(trial: optuna.trial.FrozenTrial) -> float | None:
    """The trial's metric: its (first) objective value, else its last reported one."""
    if trial.values:
        return trial.values[0]
    values = curve(trial)
    return values[max(values)] if values else None


def best_trial(study: optuna.Study, spec: StudySpec) -> optuna.trial.FrozenTrial | None:
    """The best trial; in a multi-objective study, the one of the Pareto front best in the metric."""
    if not spec.study.also_minimize:
        complete = [
            t
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if is_own(t) and t.values and not is_infeasible(t)
        ]
        if not complete:
            return None
        pick = max if spec.study.direction == "maximize" else min
        return pick(complete, key=lambda t: t.values[0])
    front = _own_front(study)
    if not front:
        return None
    pick = max if spec.study.direction == "maximize" else min
    return pick(front, key=lambda t: t.values[0])


def _own_front(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The non-dominated feasible trials among this study's own (Optuna's ``best_trials`` would
    let an imported trial dominate, and so hide, trials of this study)."""
    signs = [1.0 if d == optuna.study.StudyDirection.MINIMIZE else -1.0 for d in study.directions]
    points = [
        (t, [s * v for s, v in zip(signs, t.values, strict=True)])
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if is_own(t) and t.values and not is_infeasible(t)
    ]

    def dominated(a: list[float]) -> bool:
        return any(all(x <= y for x, y in zip(b, a, strict=True)) and b != a for _, b in points)

    return [t for t, a in points if not dominated(a)]


def pareto_front(study: optuna.Study, spec: StudySpec) -> list[optuna.trial.FrozenTrial]:
    """The multi-objective study's non-dominated trials, best metric first; [] for one objective."""
    if not spec.study.also_minimize:
        return []
    return sorted(
        _own_front(study),
        key=lambda t: t.values[0],
        reverse=spec.study.direction == "maximize",
    )


def elapsed_s(trial: optuna.trial.FrozenTrial) -> float | None:
    """The trial's own run time: as it stored it, else Optuna's start-to-end."""
    elapsed = trial.user_attrs.get(ATTR_ELAPSED_S)
    if elapsed is None and trial.duration is not None:
        return trial.duration.total_seconds()
    return None if elapsed is None else float(elapsed)


def format_value(value: float | None) -> str:
    """A metric as every view shows it: the shortest text that reads back as the stored float, so
    that two different values never look alike (2.6e-05 and 2.3e-05 are not both 0.0000) and one
    value looks the same in every view; "-" for none."""
    if value is None:
        return "-"
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def format_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
