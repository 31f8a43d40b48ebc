"""The curve pruner the replay measures (bench/curve_pruner.py, not shipped): prune a trial whose
predicted final value is confidently below the best, from a line fitted to the study's own
completed trials; never where the step predicts nothing."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from bench import replay_strategies, replay_table
from bench.curve_pruner import CurvePruner, predicted_upper_bound

pytestmark = pytest.mark.fast
SPACE = {"x": FloatDistribution(0.0, 1.0)}


def study_with(
    curves: list[tuple[list[float], float]], direction: str = "maximize", **options: float
) -> optuna.Study:
    """An in-memory study whose completed trials reported ``values`` at steps 1.. and ended at ``final``."""
    study = optuna.create_study(direction=direction, pruner=CurvePruner(**options))  # type: ignore[arg-type]
    for values, final in curves:
        study.add_trial(
            create_trial(
                params={"x": 0.5}, distributions=SPACE, value=final,
                intermediate_values={step: v for step, v in enumerate(values, start=1)},
            )
        )  # fmt: skip
    return study


def asks_to_prune(study: optuna.Study, values: list[float]) -> bool:
    trial = study.ask(SPACE)
    for step, v in enumerate(values, start=1):
        trial.report(v, step)
    return trial.should_prune()


# Eight completed trials whose step-1 value predicts the end closely (final = value + 0.2, +-0.01).
PREDICTIVE = [
    ([v], v + 0.2 + d)
    for v, d in zip([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.65, 0.7], [0.01, -0.01] * 4, strict=True)
]


def test_a_trial_confidently_below_the_best_is_pruned_one_that_may_reach_it_is_not() -> None:
    study = study_with(PREDICTIVE)
    assert asks_to_prune(study, [0.3])  # predicted 0.5, the best is 0.89
    assert not asks_to_prune(study, [0.69])  # predicted 0.89: it may reach the best


def test_where_the_step_predicts_nothing_no_trial_is_pruned() -> None:
    # A warm-up: the value at step 1 is unrelated to the end (finals 0.5..0.9 in no order).
    rng = np.random.default_rng(0)
    finals = rng.permutation(np.linspace(0.5, 0.9, 8))
    study = study_with([([v], float(f)) for v, f in zip(np.linspace(0.1, 0.8, 8), finals, strict=True)])
    assert not asks_to_prune(study, [0.05])  # the lowest step-1 value of all, and still not pruned


def test_too_few_completed_trials_or_a_step_in_the_warm_up_prunes_nothing() -> None:
    assert not asks_to_prune(study_with(PREDICTIVE[:4]), [0.1])  # 4 < n_startup_trials = 5
    assert asks_to_prune(study_with(PREDICTIVE[:4], n_startup_trials=3), [0.1])
    assert not asks_to_prune(study_with(PREDICTIVE, n_warmup_steps=2), [0.1])


def test_a_minimized_metric_is_the_mirror_image() -> None:
    study = study_with(
        [([1 - v], 1 - f) for (v,), f in ((x, y) for x, y in PREDICTIVE)], direction="minimize"
    )
    assert asks_to_prune(study, [0.7])  # predicted loss 0.5, the best 0.11
    assert not asks_to_prune(study, [0.31])


def test_the_bound_is_the_textbook_prediction_interval() -> None:
    x = np.array([0.0, 1.0, 2.0, 3.0])
    y = np.array([0.0, 1.0, 2.0, 3.5])  # slope 1.15, intercept -0.1
    residuals = y - (-0.1 + 1.15 * x)
    s2 = float((residuals**2).sum() / 2)
    expected = -0.1 + 1.15 * 4 + 2 * math.sqrt(s2 * (1 + 1 / 4 + (4 - 1.5) ** 2 / 5))
    assert predicted_upper_bound(x, y, 4.0, 2.0) == pytest.approx(expected)
    assert predicted_upper_bound(np.ones(4), y, 1.0, 2.0) == math.inf  # no spread: no prediction


def test_the_replay_builds_it_for_a_strategy_that_names_it_and_refuses_bad_options() -> None:
    table = replay_table.Table.load(replay_table.CURVES / "dlojz-cnn-12ep" / "table.json")
    spec = replay_strategies.strategy_spec("tpe+curve-z3", table, seed=1)
    assert (spec.study.pruner.name, spec.study.pruner.options) == ("curve", {"z": 3.0})
    pruner = replay_strategies.build_pruner(spec)
    assert isinstance(pruner, CurvePruner) and (pruner.z, pruner.n_startup_trials) == (3.0, 5)
    with pytest.raises(ValueError, match="z must be 0 or more"):
        CurvePruner(z=-1)
    with pytest.raises(ValueError, match="n_startup_trials must be at least 3"):
        CurvePruner(n_startup_trials=2)


def test_pruned_and_running_trials_teach_it_nothing() -> None:
    study = study_with(PREDICTIVE[:4])
    for values, _ in PREDICTIVE[4:]:  # four more with the same curves, pruned: still 4 completed
        trial = study.ask(SPACE)
        trial.report(values[0], 1)
        study.tell(trial, state=TrialState.PRUNED)
    assert not asks_to_prune(study, [0.1])
