"""The starting portfolio (bench/portfolio.py): positions in a study's ranges and back, the greedy
choice on hand-made tasks whose best regions are known, the held-out task left out of its own
portfolio, and the replay asking the portfolio first."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench import portfolio, replay_simulation, replay_strategies
from bench.replay_table import Recorded, Table
from hpo.config import ParamSpec
from hpo.portfolio import position, value_at

LOG_LR = ParamSpec(type="float", low=0.001, high=1.0, log=True)
STUDY = """\
study:
  name: start
  metric: val_accuracy
  sampler: {name: tpe, seed: 0}
  pruner: {name: none}
  n_trials: 6
  max_concurrent: 2
search_space:
  lr: {type: float, low: 0.001, high: 1.0, log: true}
  weight_decay: {type: float, low: 1.0e-5, high: 0.1, log: true}
trainer: {model: resnet8, width: 8, dataset: fashion-mnist, epochs: 2}
"""


def test_a_value_goes_to_its_position_in_the_range_and_back() -> None:
    assert position(LOG_LR, 0.001) == 0.0 and position(LOG_LR, 1.0) == 1.0
    assert position(LOG_LR, 0.03162) == pytest.approx(0.5, abs=1e-4)
    assert value_at(LOG_LR, 0.5) == pytest.approx(0.031623, rel=1e-4)
    assert value_at(LOG_LR, 1.7) == 1.0  # clipped to the range
    powers = ParamSpec(type="int", low=16, high=128, power_of_two=True)
    assert [value_at(powers, w) for w in (0.0, 0.3, 0.7, 1.0)] == [16, 32, 64, 128]
    choices = ParamSpec(type="categorical", choices=[32, 64, 128])
    assert position(choices, 64) == 0.5 and value_at(choices, 0.8) == 128
    hidden = ParamSpec(type="int", low=16, high=256, log=True)
    assert value_at(hidden, 0.5) == 64 and isinstance(value_at(hidden, 0.5), int)


def task(name: str, best_lr: float, names: tuple[str, str] = ("lr", "wd")) -> Table:
    """A task whose final value falls with the distance of lr's position from ``best_lr``'s;
    weight decay (named ``names[1]``) does not matter. 11 x 3 configurations on a grid."""
    space = {names[0]: LOG_LR, names[1]: ParamSpec(type="float", low=1e-5, high=0.1, log=True)}
    configs = []
    for i in range(11):
        for j in (0.0, 0.5, 1.0):
            params = {
                names[0]: value_at(LOG_LR, i / 10),
                names[1]: value_at(space[names[1]], j),
            }
            final = 1.0 - abs(i / 10 - best_lr)
            configs.append(Recorded(params, [final / 2, final], [1.0, 1.0], 1.0, final))
    as_file = {n: {k: v for k, v in dataclasses.asdict(p).items() if v is not None} for n, p in space.items()}
    return Table("val_accuracy", "maximize", 2, 2, as_file, configs, task=name)


def test_the_greedy_portfolio_covers_each_tasks_best_region_and_never_sees_the_held_out_task() -> None:
    low, high, held_out = task("low", 0.2), task("high", 0.8, ("lr", "weight_decay")), task("held-out", 0.5)
    entries = portfolio.learn([low, high, held_out], size=2, without="held-out")
    # One entry in each training task's best region (within a grid step of its best lr); the
    # held-out task's best (lr at 0.5) is in neither.
    assert [max(portfolio.score(t, e) for e in entries) for t in (low, high)] >= [0.9, 0.9]
    assert max(portfolio.score(held_out, e) for e in entries) < 0.9
    assert all(set(e) == {"lr", "weight_decay"} for e in entries)  # wd and weight_decay: one role
    # With the held-out task among the training ones, one entry serves all three best on average:
    # one near the held-out task's best.
    [single] = portfolio.learn([low, high, held_out], size=1)
    assert portfolio.score(held_out, single) >= 0.9
    # As a task's parameters: a value of its own range for each role the entry has.
    params = portfolio.params_for(held_out, entries[0])
    assert set(params) == {"lr", "wd"} and 0.001 <= params["lr"] <= 1.0


def test_a_candidate_scores_the_share_of_configurations_it_beats() -> None:
    low = task("low", 0.2)
    assert portfolio.score(low, {"lr": 0.2}) == 1.0  # the best lr, whatever the weight decay
    assert portfolio.score(low, {"lr": 1.0}) < 0.2  # the worst region
    assert portfolio.score(low, {"capacity": 0.3}) == 0.5  # nothing in common: a median draw


def test_the_replay_asks_the_portfolio_first_then_the_sampler(tmp_path: Path) -> None:
    study = tmp_path / "study.yaml"
    study.write_text(STUDY)
    table = task("t", 0.5, ("lr", "weight_decay"))
    spec = replay_strategies.spec_with({}, table, seed=3, default_study=study)
    first = [{"lr": 0.01, "weight_decay": 0.001}, {"lr": 0.1}]
    run = replay_simulation.replay(table, spec, n_trials=6, enqueue=first)
    assert run.trials[0].params == first[0]
    assert (
        run.trials[1].params["lr"] == 0.1 and "weight_decay" in run.trials[1].params
    )  # drawn by the sampler
    assert len({t.params["lr"] for t in run.trials}) == 6
