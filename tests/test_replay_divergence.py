"""The divergence replay (bench/replay_divergence.py): which configurations of a recorded table
diverge and from which epoch, and how each tell mode leaves a diverged trial in the Optuna study."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest

from bench import replay_divergence as rd
from bench.replay_simulation import replay
from bench.replay_strategies import strategy_spec
from bench.replay_table import LOOKUPS, Table

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "bench/curves/dlojz-cnn-12ep/table.json"  # lr in [0.003, 1], 12 epochs: the fastest to replay


@pytest.fixture(scope="module")
def table() -> Table:
    return Table.load(TABLE)


def test_the_top_share_of_the_learning_rates_log_range_diverges(table: Table) -> None:
    divergence = rd.Divergence.for_table(table, share=0.2)
    low, high = math.log(0.003), math.log(1.0)
    assert math.log(divergence.threshold) == pytest.approx(high - 0.2 * (high - low))
    assert math.log(divergence.early) == pytest.approx(high - 0.1 * (high - low))
    assert divergence.epoch({"lr": 0.01}) is None
    assert divergence.epoch({"lr": divergence.threshold}) is None  # the threshold itself trains
    assert divergence.epoch({"lr": divergence.threshold * 1.01}) == 2
    assert divergence.epoch({"lr": 0.9}) == 1


def test_a_diverging_curve_is_finite_before_its_epoch_and_nan_from_it(table: Table) -> None:
    divergence = rd.Divergence.for_table(table)
    recorded = table.configs[0]
    params = {**recorded.params, "lr": divergence.threshold * 1.01}
    curve = divergence.apply(recorded, params).values
    assert curve[0] == recorded.values[0]
    assert all(math.isnan(v) for v in curve[1:])
    assert math.isnan(divergence.apply(recorded, {"lr": 0.9}).values[0])
    assert divergence.apply(recorded, {"lr": 0.01}) is recorded


def test_a_table_without_a_log_scaled_learning_rate_is_refused(table: Table) -> None:
    with pytest.raises(ValueError, match="log-scaled float 'width'"):
        rd.Divergence.for_table(table, param="width")
    with pytest.raises(ValueError, match="share must be in"):
        rd.Divergence.for_table(table, share=1.0)


LAST_FINITE = "the last finite value"
"""Optuna gives a PRUNED trial the value of its last step (none if it reported none)."""
EXPECTED = {  # mode: (Optuna's state, its value, its constraints)
    "fail": (optuna.trial.TrialState.FAIL, None, {}),
    "pruned": (optuna.trial.TrialState.PRUNED, LAST_FINITE, {}),
    "worst": (optuna.trial.TrialState.COMPLETE, 0.0, {}),
    "worst+constraint": (optuna.trial.TrialState.COMPLETE, 0.0, {rd.CONSTRAINT: 1.0}),
}


@pytest.mark.parametrize("mode", sorted(rd.TELL_MODES))
def test_each_tell_mode_leaves_a_diverged_trial_in_its_state_and_never_a_best(
    table: Table, mode: str
) -> None:
    divergence = rd.Divergence.for_table(table, share=0.5)  # half the trials diverge: some among 12
    spec = strategy_spec("default", table, seed=1)
    run = replay(
        table,
        spec,
        lookup=divergence.lookup(LOOKUPS["nearest"]),
        n_trials=12,
        tell_diverged=rd.TELL_MODES[mode],
    )
    diverged = [t for t in run.trials if t.state == "DIVERGED"]
    assert diverged and len(diverged) < len(run.trials)
    assert [t.number for t in diverged] == [t.number for t in run.trials if divergence.epoch(t.params)]
    state, value, constraints = EXPECTED[mode]
    for t in diverged:
        frozen = run.study.trials[t.number]
        at = divergence.epoch(t.params)
        told = (frozen.intermediate_values.get(1) if at == 2 else None) if value == LAST_FINITE else value
        assert (frozen.state, frozen.value, frozen.constraints) == (state, told, constraints)
        # The finite epochs before the divergence were reported; the non-finite one never was.
        assert sorted(frozen.intermediate_values) == list(range(1, at or 0))
        assert t.value is None and t.epochs == at
    assert all(t.state != "DIVERGED" for _, _, t in run.progress(maximize=True))


def test_a_seed_replays_the_same_trials() -> None:
    runs = [rd._one((str(TABLE), "pruned", 3, 0.87, 3000.0, 6000.0, "3-nearest+noise")) for _ in range(2)]
    for run in runs:
        run.pop("seconds")
    assert runs[0] == runs[1]
    assert runs[0]["diverging_share"] is not None
