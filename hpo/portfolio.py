"""The learned starting portfolio: configurations tried first on a new study, before the sampler.

A configuration transfers between tasks as positions in the study's own ranges, not as values (an
AdamW task's learning rates live two decades below an SGD task's): a parameter's position is where
its value lies in its range, in [0, 1], log-scaled where the range is. Parameters are matched by
role (``ROLES``: ``weight_decay`` and ``wd`` are one role, ``hidden`` and ``width`` the model's
capacity); a parameter of no role is left to the sampler.

``portfolio.json`` beside this module is learned by ``python -m bench.portfolio --write`` from
every task the service recorded (bench/curves/); replayed with each task held out from its own
portfolio, TPE after it is the measured default (bench/results/replay.json, docs/benchmarks-explained.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

    from hpo.config import ParamSpec, StudySpec

ROLES = {
    "lr": "lr",
    "learning_rate": "lr",
    "wd": "weight_decay",
    "weight_decay": "weight_decay",
    "batch_size": "batch_size",
    "pct_start": "pct_start",
    "hidden": "capacity",
    "width": "capacity",
}
"""A parameter's role, by its name in the study file: the same role transfers between tasks."""

SHIPPED = Path(__file__).with_name("portfolio.json")

Entry = dict[str, float]
"""A portfolio entry: a position in [0, 1] by role."""


def position(param: ParamSpec, value: Any) -> float:
    """Where ``value`` lies in the range ``param``, in [0, 1] (log-scaled for a log or power-of-two
    range; a categorical's choices in their order)."""
    if param.type == "categorical":
        choices = list(param.choices or [])
        return choices.index(value) / max(1, len(choices) - 1)
    low, high, x = float(param.low or 0), float(param.high or 0), float(value)
    if param.log or param.power_of_two:
        low, high, x = math.log(low), math.log(high), math.log(x)
    return (x - low) / (high - low) if high > low else 0.0


def value_at(param: ParamSpec, where: float) -> Any:
    """The value of the range ``param`` at a position, one its distribution holds: the nearest
    choice (categorical, power of two), on the step's grid, an integer for an int range."""
    where = min(1.0, max(0.0, where))
    if param.type == "categorical" or param.power_of_two:
        choices = list(param.choices or []) if param.type == "categorical" else param.powers_of_two()
        return min(choices, key=lambda c: abs(position(param, c) - where))
    low, high = float(param.low or 0), float(param.high or 0)
    if param.log:
        x = math.exp(math.log(low) + where * (math.log(high) - math.log(low)))
    else:
        x = low + where * (high - low)
    if param.step is not None:  # Optuna holds only low + k * step
        x = low + round((x - low) / float(param.step)) * float(param.step)
    x = min(high, max(low, x))
    return min(int(high), max(int(low), round(x))) if param.type == "int" else x


def params_for(space: Mapping[str, ParamSpec], entry: Entry) -> dict[str, Any]:
    """A portfolio entry as a study's parameters: those whose role the entry has (the rest are the
    sampler's to draw)."""
    return {n: value_at(p, entry[ROLES[n]]) for n, p in space.items() if ROLES.get(n) in entry}


def shipped() -> list[Entry]:
    """The portfolio learned from every recorded task, best entry first."""
    return [dict(e["positions"]) for e in json.loads(SHIPPED.read_text())["entries"]]


def starting_trials(spec: StudySpec) -> list[dict[str, Any]]:
    """The parameters a study tries first from the shipped portfolio: its first
    ``study.portfolio`` entries in the study's ranges, those that share no role with the space,
    repeat one before or an enqueued configuration left out. None after a warm start: the
    user's earlier trials are the better start."""
    if not spec.study.portfolio or spec.study.warm_start.sources:
        return []
    trials: list[dict[str, Any]] = []
    for entry in shipped()[: spec.study.portfolio]:
        params = params_for(spec.search_space, entry)
        if (
            params
            and params not in trials
            and not any(params.items() <= e.items() for e in spec.study.enqueue)
        ):
            trials.append(params)
    return trials


def first_trials(study: optuna.Study, spec: StudySpec) -> list[dict[str, Any]]:
    """What a launch enqueues to run first (``hpo.study_record.enqueue_first_trials``): the study
    file's enqueue, then, on a study with no trial yet, the portfolio's ``starting_trials``."""
    learned = starting_trials(spec)
    if learned and study.get_trials(deepcopy=False):  # read only where there is something to add
        learned = []
    return [*spec.study.enqueue, *learned]
