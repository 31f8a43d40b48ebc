"""The machine-readable views: ``hpo status --json``, ``hpo best --json`` and the report's
``summary.json`` (their keys: docs/watching-a-study.md#machine-readable-output).

Values are the stored floats, whole; a value that is not finite (a diverged run's last report) is
null, since JSON has no nan, and the trial's state says why. Each document names its
``format`` version: a key is only ever added to a version, never renamed or removed.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from hpo import record, search, study_record, tally
from hpo.budget import stopping
from hpo.budget.cost import StudyCost, study_cost
from hpo.errors import LaunchError, StudyFileError
from hpo.record import ATTR_PBT_FINAL_PARAMS, ATTR_PBT_SCHEDULE, ATTR_RETRY_OF

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudySpec

FORMAT = 1
"""The version of the documents' keys."""


def summary(
    spec: StudySpec, study: optuna.Study, trials: list[optuna.trial.FrozenTrial], cost: StudyCost
) -> dict[str, Any]:
    """The study at a glance: its best, its trials by state, its cost, its stop and what its
    trials measured (the report's summary.json, and the head of ``hpo status --json``)."""
    from hpo.observe import views

    trial = tally.best_trial(study, spec)
    return _finite(
        {
            "format": FORMAT,
            "study": spec.study.name,
            "metric": spec.study.metric,
            "direction": spec.study.direction,
            "n_trials": spec.study.n_trials,
            "trials": len(trials),
            "states": dict(Counter(record.shown_state(t) for t in trials)),
            "best": None if trial is None else _best(spec, trial),
            "objectives": dict(zip(search.objective_names(spec), search.directions(spec), strict=True)),
            "pareto_front": _front(spec, study),
            "cost": _cost(spec, cost),
            "stopped": study_record.stopped(study),
            "terminator": stopping.terminator_evaluation(study),
            "imported_trials": tally.imported_count(study),
            "packed_jobs": tally.packs(trials),
            "measurements": {
                str(t.number): {
                    key: t.user_attrs[key] for key in record.MEASUREMENT_ATTRS if key in t.user_attrs
                }
                for t in trials
                if any(key in t.user_attrs for key in record.MEASUREMENT_ATTRS)
            },
            "input": views.input_verdict(trials),
        }
    )


def status(spec: StudySpec, study: optuna.Study) -> dict[str, Any]:
    """``hpo status --json``: the summary, then every trial of the study's own (not imported) as
    the table lists it."""
    trials = tally.own_trials(study)
    cost = study_cost(spec, trials)
    others = sorted({name for t in trials for name in t.user_attrs.get(record.ATTR_METRICS, {})})
    return {
        **summary(spec, study, trials, cost),
        "counted_trials": len(tally.counted_trials(study)),
        "trial_list": [_finite(_trial(t, cost, others)) for t in trials],
    }


def best(spec: StudySpec, study: optuna.Study) -> dict[str, Any]:
    """``hpo best --json``: the best trial, how to run it again, and a Pareto study's front."""
    trial = tally.best_trial(study, spec)
    if trial is None:
        raise LaunchError(f"study {spec.study.name!r} has no completed trial yet")
    return _finite(
        {
            "format": FORMAT,
            "study": spec.study.name,
            "metric": spec.study.metric,
            "direction": spec.study.direction,
            "best": _best(spec, trial),
            "pareto_front": _front(spec, study),
        }
    )


def _best(spec: StudySpec, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    from hpo.observe import views

    try:
        command: str | None = views.rerun_command(spec, trial)
    except StudyFileError:  # the trainer section changed since the trial ran
        command = None
    return {
        "number": trial.number,
        "value": trial.values[0],
        "values": trial.values,
        "params": trial.params,
        "final_params": trial.user_attrs.get(ATTR_PBT_FINAL_PARAMS) or trial.params,
        "pbt_schedule": trial.user_attrs.get(ATTR_PBT_SCHEDULE, []),
        "test_accuracy": trial.user_attrs.get(record.ATTR_TEST_ACCURACY),
        "job_id": trial.user_attrs.get(record.ATTR_JOB_ID),
        "command": command,
    }


def _front(spec: StudySpec, study: optuna.Study) -> list[dict[str, Any]]:
    return [
        {"number": t.number, "values": t.values, "params": t.params} for t in tally.pareto_front(study, spec)
    ]


def _cost(spec: StudySpec, cost: StudyCost) -> dict[str, Any]:
    return {
        "unit": cost.unit,
        "total": cost.total,
        "by_state": cost.by_state,
        "saved_by_pruning": cost.saved_by_pruning,
        "source": "measured" if cost.measured else "estimates (elapsed time x resources) where not measured",
        "per_trial": {str(n): cost.of(u) for n, u in sorted(cost.per_trial.items())},
        "budget": spec.study.budget,
        "left": None if spec.study.budget is None else max(0.0, spec.study.budget - cost.total),
    }


def _trial(t: optuna.trial.FrozenTrial, cost: StudyCost, others: list[str]) -> dict[str, Any]:
    """One row of ``hpo status``, whole: the value the table shows (a pruned trial's last report),
    its curve, parameters, job, time and cost, and why it failed."""
    return {
        "number": t.number,
        "state": record.shown_state(t),
        "value": tally.metric_value(t),
        "values": t.values,
        "curve": {str(step): value for step, value in sorted(tally.curve(t).items())},
        "params": t.params,
        "metrics": {name: tally.other_metric(t, name) for name in others},
        "job_id": t.user_attrs.get(record.ATTR_JOB_ID),
        "elapsed_s": tally.elapsed_s(t),
        "cost": cost.of(cost.per_trial[t.number]) if t.number in cost.per_trial else None,
        "fail_reason": t.user_attrs.get(record.ATTR_FAIL_REASON),
        "retry_of": t.user_attrs.get(ATTR_RETRY_OF),
        "started": t.datetime_start.isoformat() if t.datetime_start else None,
        "ended": t.datetime_complete.isoformat() if t.datetime_complete else None,
    }


def _finite(value: Any) -> Any:
    """``value`` with every float that is not finite as None (JSON has no nan)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
