"""Stop rules: end a study once it stops improving, and say why and what that saved.

Two rules, either or both (``study.stop``):

- patience: the last ``patience`` finished trials (complete or pruned, in the order they ended)
  did not improve the best value by more than ``min_improvement``. Simple, and what a researcher
  would do by hand.
- Optuna's Terminator (Makarova et al. 2022): a Gaussian process fitted to the completed trials
  bounds how much better the best configuration could still get (the regret bound); once that
  bound is below the metric's noise, more trials cannot be told apart from luck. The noise is the
  study's ``noise`` (e.g. the metric's standard deviation over training seeds), else Optuna's
  estimate from the study's first trials. Every evaluation is stored on the study, so a decision
  to go on is recorded as well as one to stop. (Optuna marks its Terminator deprecated since 4.9;
  it is imported here only, so another implementation replaces it in one place.)

The rules read the trials this study ran; imported warm-start trials seed the Terminator's model
but are no trials of this study for patience.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

import optuna

from hpo import record, search, study_record, tally
from hpo.budget.cost import study_cost
from hpo.budget.usage import format_hours

if TYPE_CHECKING:
    from hpo.config import StudySpec
    from hpo.config.study_section import StopSpec

STUDY_ATTR_TERMINATOR = "hpo_terminator"
"""The Terminator's last evaluation: trial, regret bound, noise, decision."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    reason: str
    """Why the study ends, one line."""
    at_trial: int
    """The last finished trial the rule saw."""


def finished_in_order(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """This study's complete and pruned trials, in the order they ended."""
    ended = [
        t
        for t in tally.counted_trials(study)
        if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        and t.datetime_complete is not None
    ]
    return sorted(ended, key=lambda t: (t.datetime_complete, t.number))


def patience_verdict(
    values: list[float | None], patience: int, min_improvement: float, maximize: bool, min_trials: int
) -> str | None:
    """The patience rule over the finished trials' values in the order they ended (None: pruned,
    or no value); the reason to stop, or None. Pure, for the replay simulator too."""
    if len(values) < max(min_trials, patience + 1):
        return None
    sign = 1.0 if maximize else -1.0
    before = [sign * v for v in values[:-patience] if v is not None]
    recent = [sign * v for v in values[-patience:] if v is not None]
    if not before:
        return None
    best_before = max(before)
    gain = max(recent, default=best_before) - best_before
    if gain > min_improvement:
        return None
    return (
        f"no improvement larger than {min_improvement:g} in the last {patience} finished trials "
        f"(best {tally.format_value(sign * best_before)})"
    )


def terminator_bound(
    trials: list[optuna.trial.FrozenTrial],
    direction: optuna.study.StudyDirection,
    rule: StopSpec,
    noise_trials: list[optuna.trial.FrozenTrial] | None = None,
) -> tuple[float, float]:
    """(regret bound, noise) of Optuna's Terminator over ``trials``; stop when bound < noise.
    Without ``rule.noise``, the noise is Optuna's estimate from ``noise_trials`` (default
    ``trials``), in the order of their numbers."""
    # Optuna's Terminator classes warn that they are deprecated (FutureWarning) and experimental.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from optuna.terminator import MedianErrorEvaluator, RegretBoundEvaluator, StaticErrorEvaluator

        improvement = RegretBoundEvaluator(min_n_trials=rule.min_trials, seed=0)
        error = (
            StaticErrorEvaluator(rule.noise)
            if rule.noise is not None
            else MedianErrorEvaluator(
                RegretBoundEvaluator(min_n_trials=rule.min_trials, seed=0),
                warm_up_trials=0,
                n_initial_trials=rule.min_trials,
            )
        )
        complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.values]
        first = complete if noise_trials is None else noise_trials
        return improvement.evaluate(complete, direction), error.evaluate(first, direction)


def check(study: optuna.Study, spec: StudySpec) -> Verdict | None:
    """Whether a stop rule ends the study now. The Terminator's evaluation is stored on the study
    whatever it decides, so that a decision to go on is on record too."""
    rule = spec.study.stop
    if not rule.active or spec.study.also_minimize:
        return None
    finished = finished_in_order(study)
    complete = [t for t in finished if t.state == optuna.trial.TrialState.COMPLETE]
    if not finished or len(complete) < rule.min_trials:
        return None
    last = finished[-1].number
    reasons = []
    if rule.terminator:
        evaluation = _terminator_evaluation(study, spec, rule, complete, last)
        study.set_user_attr(STUDY_ATTR_TERMINATOR, evaluation)
        if evaluation.get("stop"):
            bound, noise = evaluation["regret_bound"], evaluation["noise"]
            reasons.append(
                f"Optuna's Terminator: regret bound {bound:.4g} below the metric's noise {noise:.4g}"
            )
    if rule.patience is not None:
        values = [
            t.values[0] if t.state == optuna.trial.TrialState.COMPLETE and t.values else None
            for t in finished
        ]
        maximize = spec.study.direction == "maximize"
        reason = patience_verdict(values, rule.patience, rule.min_improvement, maximize, rule.min_trials)
        if reason:
            reasons.append(reason)
    return Verdict("; ".join(reasons), last) if reasons else None


def _terminator_evaluation(
    study: optuna.Study,
    spec: StudySpec,
    rule: StopSpec,
    complete: list[optuna.trial.FrozenTrial],
    last: int,
) -> dict[str, Any]:
    """One look of the Terminator, as stored. Its model takes the complete trials that have every
    parameter of the space (imported ones included); Optuna's noise estimate, once made, is kept,
    and is made from this study's own first trials. A model that cannot be fitted is recorded
    and the study goes on: a stop rule never ends a launcher."""
    space = search.distributions(spec)
    model_trials = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.values and not t.user_attrs.get(record.ATTR_INFEASIBLE) and set(space) <= set(t.params)
    ]
    earlier = terminator_evaluation(study) or {}
    if rule.noise is None and earlier.get("noise_estimated") and earlier.get("noise"):
        rule = dataclasses.replace(rule, noise=float(earlier["noise"]))
        estimated = True
    else:
        estimated = rule.noise is None
    evaluation: dict[str, Any] = {"at_trial": last, "complete_trials": len(complete)}
    try:
        own_first = sorted(complete, key=lambda t: t.number)
        bound, noise = terminator_bound(model_trials, study.direction, rule, noise_trials=own_first)
    except Exception as err:  # Optuna's GP raises several kinds: each means "cannot tell"
        evaluation.update(error=f"{type(err).__name__}: {err}"[:300], stop=False)
        return evaluation
    evaluation.update(
        regret_bound=round(float(bound), 6),
        noise=round(float(noise), 6),
        noise_estimated=estimated,
        stop=bool(bound < noise),
    )
    return evaluation


def terminator_evaluation(study: optuna.Study) -> dict[str, Any] | None:
    value = study.user_attrs.get(STUDY_ATTR_TERMINATOR)
    return dict(value) if value else None


def end(study: optuna.Study, spec: StudySpec, verdict: Verdict) -> str:
    """Store why a rule ended the study and what that saved; returns the line the launcher prints
    (``hpo.budget.admission.Gate``, for every backend)."""
    saved = saving(study, spec)
    study_record.store_stopped(study, verdict.reason, verdict.at_trial, saved)
    return f"stop rule met after trial {verdict.at_trial}: {verdict.reason}; saved {saved}"


def saving(study: optuna.Study, spec: StudySpec) -> str:
    """What stopping now saves: the trials of ``n_trials`` not started, at what the finished
    trials cost on average (an estimate: their own elapsed time, or sacct's for Slurm jobs)."""
    counted = tally.counted_trials(study)
    not_started = max(0, spec.study.n_trials - sum(1 for t in counted if t.state.name != "WAITING"))
    finished = [t for t in counted if t.state.is_finished()]
    cost = study_cost(spec, finished)
    per_trial = cost.total / len(cost.per_trial) if cost.per_trial else 0.0
    hours = not_started * per_trial
    if spec.study.budget is not None:
        hours = min(hours, max(0.0, spec.study.budget - cost.total))
    return f"{not_started} of {spec.study.n_trials} trials not run, ~{format_hours(hours)} {cost.unit}"
