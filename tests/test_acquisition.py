"""The replay's candidate samplers whose TPE acquisition gets a fading term (bench/acquisition.py):
a transfer prior learned from other tasks that drops out where a task contradicts it, and the
trials' predicted cost."""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np
import optuna
import pytest

from bench.acquisition import AcquisitionTPE, TransferPrior
from bench.replay_table import Table, recorded_tables
from hpo import record
from hpo.config import ParamSpec
from hpo.portfolio import position

pytestmark = pytest.mark.fast

SPACE = {
    "lr": ParamSpec(type="float", low=1e-3, high=1.0, log=True),
    "width": ParamSpec(type="categorical", choices=[8, 16, 32, 64]),
}
DISTRIBUTIONS: dict[str, optuna.distributions.BaseDistribution] = {
    "lr": optuna.distributions.FloatDistribution(1e-3, 1.0, log=True),
    "width": optuna.distributions.CategoricalDistribution([8, 16, 32, 64]),
}
HIGH_LR = TransferPrior(tasks=(({"lr": 0.9},), ({"lr": 0.85},)))
"""Two tasks whose best configurations sit at the top of the learning-rate range."""


def study_of(sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    return optuna.create_study(direction="maximize", sampler=sampler)


def lr_positions(study: optuna.Study) -> list[float]:
    return [position(SPACE["lr"], t.params["lr"]) for t in study.trials]


def test_the_prior_is_densest_at_the_other_tasks_best_and_never_below_its_floor() -> None:
    density = HIGH_LR.log_density({"lr": np.array([0.9, 0.5, 0.0])})
    assert density[0] > density[1] > density[2] >= math.log(0.1) - 1e-9


def test_a_prior_learned_for_a_task_holds_none_of_its_configurations() -> None:
    tables = [Table.load(p) for p in recorded_tables(check_only=False)]
    held_out = tables[0].task
    prior = TransferPrior.learn(tables, without=held_out)
    assert len(prior.tasks) == len(tables) - 1
    assert all(
        len(entries) == max(3, round(0.1 * len(t.configs)))
        for entries, t in zip(prior.tasks, tables[1:], strict=True)
    )


def test_start_up_trials_come_from_the_prior_while_the_task_agrees_with_it() -> None:
    """The objective rises with the learning rate, as the prior says: every start-up trial is
    drawn near the prior's mode, none from the rest of the range."""
    sampler = AcquisitionTPE(SPACE, DISTRIBUTIONS, prior=HIGH_LR, seed=1, n_startup_trials=10)
    study = study_of(sampler)
    study.optimize(
        lambda t: (
            t.suggest_float("lr", 1e-3, 1.0, log=True) + 0 * t.suggest_categorical("width", [8, 16, 32, 64])
        ),
        n_trials=10,
    )
    assert min(lr_positions(study)) > 0.5


def test_the_prior_drops_out_where_the_task_contradicts_it() -> None:
    """The objective falls with the learning rate: once the first trials show it, the agreement is 0
    and the start-up trials are drawn at random again, over the whole range."""
    sampler = AcquisitionTPE(SPACE, DISTRIBUTIONS, prior=HIGH_LR, seed=1, n_startup_trials=40)
    study = study_of(sampler)

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_categorical("width", [8, 16, 32, 64])
        return -trial.suggest_float("lr", 1e-3, 1.0, log=True)

    study.optimize(objective, n_trials=40)
    assert sampler._agreement(study) == 0.0
    late = lr_positions(study)[10:]
    assert sum(p < 0.5 for p in late) >= 10


def test_the_cost_term_prefers_candidates_near_cheap_finished_trials() -> None:
    sampler = AcquisitionTPE(SPACE, DISTRIBUTIONS, cost_aware=True, seed=0)
    study = study_of(sampler)
    for width in (8, 8, 64, 64):  # a cost that grows with the width
        study.add_trial(
            optuna.trial.create_trial(
                params={"lr": 0.01, "width": width},
                distributions=DISTRIBUTIONS,
                value=0.5,
                user_attrs={record.ATTR_ELAPSED_S: float(width)},
            )
        )
    candidates: dict[str, Any] = {"lr": [0.01, 0.01], "width": [8, 64]}
    cheap, dear = sampler._log_relative_cost(candidates, study.trials)
    assert cheap < 0 < dear


def test_without_a_term_the_sampler_proposes_what_tpe_proposes() -> None:
    def objective(trial: optuna.Trial) -> float:
        return -((math.log10(trial.suggest_float("lr", 1e-3, 1.0, log=True)) + 2) ** 2)

    plain, ours = (
        study_of(optuna.samplers.TPESampler(seed=3)),
        study_of(AcquisitionTPE(SPACE, DISTRIBUTIONS, seed=3)),
    )
    for study in (plain, ours):
        study.optimize(objective, n_trials=20)
    assert [t.params for t in plain.trials] == [t.params for t in ours.trials]
    assert statistics.median(t.value or 0.0 for t in ours.trials[10:]) > statistics.median(
        t.value or 0.0 for t in ours.trials[:10]
    )


def test_smac_is_asked_and_told_through_optunas_sampler_interface() -> None:
    """SMAC3's facade behind an Optuna sampler: its Sobol start, then its forest's proposals, on
    a function whose best is at lr 0.01 and width 32; a pruned trial is told as the worst so far."""
    from bench.smac_sampler import SmacSampler

    study = study_of(SmacSampler(DISTRIBUTIONS, seed=0))

    def objective(trial: optuna.Trial) -> float:
        lr, width = (
            trial.suggest_float("lr", 1e-3, 1.0, log=True),
            trial.suggest_categorical("width", [8, 16, 32, 64]),
        )
        if trial.number == 3:
            raise optuna.TrialPruned()
        return -((math.log10(lr) + 2) ** 2) - (width != 32)

    study.optimize(objective, n_trials=24)
    assert study.trials[3].state == optuna.trial.TrialState.PRUNED
    assert len({tuple(t.params.items()) for t in study.trials}) == 24
    assert study.best_value > statistics.median(t.value for t in study.trials[:16] if t.value is not None)
