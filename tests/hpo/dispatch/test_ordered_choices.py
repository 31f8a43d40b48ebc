"""Numeric choices shown to the sampler in their order (``study.sampler.ordered_choices``), on
in-memory Optuna studies: the sampler sees positions, the study stores the values."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from hpo import search
from hpo.config import load_study
from hpo.ordered_choices import OrderedChoices, ordered_values
from tests.hpo.helpers import study_document, write_study

pytestmark = pytest.mark.fast

WIDTH = CategoricalDistribution([32, 8, 16])  # ordered by value, whatever the file's order
SPACE: dict[str, BaseDistribution] = {
    "width": WIDTH,
    "optimizer": CategoricalDistribution(["sgd", "adamw", "lion"]),
    "lr": FloatDistribution(1e-3, 1.0, log=True),
}


def test_only_three_or_more_numbers_have_an_order_worth_showing() -> None:
    assert ordered_values(WIDTH) == [8, 16, 32]
    assert ordered_values(CategoricalDistribution([0.5, 0.1, 0.9])) == [0.1, 0.5, 0.9]
    assert ordered_values(CategoricalDistribution([64, 128])) is None
    assert ordered_values(CategoricalDistribution([True, False, 1])) is None
    assert ordered_values(CategoricalDistribution(["sgd", "adamw", "lion"])) is None
    assert ordered_values(IntDistribution(1, 9)) is None


class Recording(optuna.samplers.RandomSampler):
    """A random sampler that notes each distribution it is asked to draw from, and what it saw of
    the study's finished trials."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.asked: list[tuple[str, BaseDistribution]] = []
        self.seen: list[dict[str, Any]] = []

    def sample_independent(
        self, study: optuna.Study, trial: Any, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        self.asked.append((param_name, param_distribution))
        self.seen = [t.params for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
        return super().sample_independent(study, trial, param_name, param_distribution)


def test_the_sampler_draws_positions_and_the_study_stores_the_values() -> None:
    inner = Recording()
    study = optuna.create_study(sampler=OrderedChoices(inner, SPACE))
    for _ in range(6):
        trial = study.ask(SPACE)
        study.tell(trial, float(trial.params["width"]))

    asked = dict(inner.asked)
    assert asked["width"] == IntDistribution(0, 2)  # the position among 8, 16, 32
    assert asked["optimizer"] == SPACE["optimizer"] and asked["lr"] == SPACE["lr"]  # unordered: as is
    # What the sampler saw of the finished trials: positions; what the study holds: the values.
    assert {p["width"] for p in inner.seen} <= {0, 1, 2}
    stored = study.get_trials()
    assert {t.params["width"] for t in stored} <= {8, 16, 32}
    assert all(t.distributions["width"] == WIDTH for t in stored)
    assert all(t.value == float(t.params["width"]) for t in stored)


def test_an_enqueued_value_is_kept_and_read_back_as_its_position() -> None:
    inner = Recording()
    study = optuna.create_study(sampler=OrderedChoices(inner, SPACE))
    study.enqueue_trial({"width": 16, "optimizer": "sgd", "lr": 0.1})
    first = study.ask(SPACE)
    study.tell(first, 1.0)
    second = study.ask(SPACE)
    study.tell(second, 2.0)
    assert first.params == {"width": 16, "optimizer": "sgd", "lr": 0.1}
    assert inner.seen[0]["width"] == 1


def _positions_proposed(ordered: bool, seed: int) -> float:
    """A monotone task over 12 ordered choices (2**0 .. 2**11; the larger the better): the mean
    position TPE proposed in the 15 trials after its 5 random ones."""
    space: dict[str, BaseDistribution] = {"batch": CategoricalDistribution([2**k for k in range(12)])}
    tpe = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)
    study = optuna.create_study(direction="maximize", sampler=OrderedChoices(tpe, space) if ordered else tpe)
    positions = []
    for _ in range(20):
        trial = study.ask(space)
        positions.append(int(trial.params["batch"]).bit_length() - 1)
        study.tell(trial, float(positions[-1]))
    return statistics.mean(positions[5:])


def test_tpe_shown_the_order_proposes_toward_the_larger_choices() -> None:
    seeds = range(8)
    ordered = [_positions_proposed(True, s) for s in seeds]
    unordered = [_positions_proposed(False, s) for s in seeds]
    # A categorical TPE favours the choices it has seen do well; shown the order, it also moves
    # toward their unseen neighbours beyond.
    assert statistics.median(ordered) > statistics.median(unordered), (ordered, unordered)


def test_a_study_file_asks_for_it_by_its_sampler_key(tmp_path: Path) -> None:
    def inner_of(sampler: dict[str, Any]) -> optuna.samplers.BaseSampler:
        document = study_document("ordered", tmp_path / "w", study={"sampler": sampler})
        sampler_built = search.sampler_for(load_study(write_study(tmp_path / "s.yaml", document)))
        assert isinstance(sampler_built, search.DistinctProposals)
        return sampler_built.inner

    ordered = inner_of({"name": "tpe", "ordered_choices": True})
    assert isinstance(ordered, OrderedChoices) and isinstance(ordered.inner, optuna.samplers.TPESampler)
    assert isinstance(inner_of({"name": "tpe"}), optuna.samplers.TPESampler)  # off unless asked
