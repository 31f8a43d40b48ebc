"""A starting portfolio learned from recorded tasks: an ordered list of configurations tried first
on a new task, before the sampler proposes (TaskSet-style greedy portfolios).

Tasks differ in their parameters' names, ranges and even optimizers (an AdamW task's learning
rates live two decades below an SGD task's), so a configuration transfers as positions in the
user's own ranges, not as values: a parameter's position is where its value lies in the study's
range, in [0, 1], log-scaled where the range is (the replay's scaling). Parameters are matched by
role (``ROLES``: ``weight_decay`` and ``wd`` are one role, ``hidden`` and ``width`` the model's
capacity); a parameter of no role, or a role the portfolio's entry lacks, is left to the sampler.

A candidate is any recorded configuration of a training task. Its score on a training task is the
share of that task's recorded configurations whose final value it matches or beats, where its own
final value is the mean of its nearest recorded neighbours in the roles it has (the task's other
parameters averaged over, as the sampler would draw them). The portfolio is built greedily: each
entry the candidate that most raises the mean, over the training tasks, of the best score of the
entries so far. Every choice is made from the training tasks alone: the task a portfolio is scored
on is left out of its learning (``learn(tables, without=task)``).

    python bench/portfolio.py            # the portfolio learned from every recorded task
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    from bench.replay import Table

ROLES = {
    "lr": "lr",
    "wd": "weight_decay",
    "weight_decay": "weight_decay",
    "batch_size": "batch_size",
    "pct_start": "pct_start",
    "hidden": "capacity",
    "width": "capacity",
}
"""A parameter's role, by its name in the study file: the same role transfers between tasks."""
NEIGHBOURS = 3
"""How many recorded configurations nearest in the shared roles predict a candidate's final value
(as many as the replay's lookup averages)."""

Entry = dict[str, float]
"""A portfolio entry: a position in [0, 1] by role."""


def position(param: dict[str, Any], value: Any) -> float:
    """Where ``value`` lies in the study file's range ``param``, in [0, 1] (log-scaled for a log or
    power-of-two range; a categorical's choices in their order)."""
    if param.get("type") == "categorical":
        choices = list(param["choices"])
        return choices.index(value) / max(1, len(choices) - 1)
    low, high, x = float(param["low"]), float(param["high"]), float(value)
    if param.get("log") or param.get("power_of_two"):
        low, high, x = math.log(low), math.log(high), math.log(x)
    return (x - low) / (high - low) if high > low else 0.0


def value_at(param: dict[str, Any], where: float) -> Any:
    """The value of the range ``param`` at a position, one the study's distribution holds: the
    nearest choice (categorical, power of two), an integer for an int range."""
    where = min(1.0, max(0.0, where))
    if param.get("type") == "categorical" or param.get("power_of_two"):
        if param.get("type") == "categorical":
            choices = list(param["choices"])
        else:
            least, most = int(param["low"]), int(param["high"])
            choices = [
                2**k for k in range(least.bit_length() - 1, most.bit_length()) if least <= 2**k <= most
            ]
        return min(choices, key=lambda c: abs(position(param, c) - where))
    low, high = float(param["low"]), float(param["high"])
    if param.get("log"):
        x = math.exp(math.log(low) + where * (math.log(high) - math.log(low)))
    else:
        x = low + where * (high - low)
    if param.get("type") == "int":
        return min(int(param["high"]), max(int(param["low"]), round(x)))
    return min(high, max(low, x))


def entry_of(table: Table, params: dict[str, Any]) -> Entry:
    """A configuration of ``table`` as positions by role."""
    return {ROLES[n]: position(p, params[n]) for n, p in table.space.items() if n in ROLES}


def params_for(table: Table, entry: Entry) -> dict[str, Any]:
    """A portfolio entry as ``table``'s parameters: those whose role the entry has (the rest are
    the sampler's to draw)."""
    return {n: value_at(p, entry[ROLES[n]]) for n, p in table.space.items() if ROLES.get(n) in entry}


def finals(table: Table) -> np.ndarray:
    """Each recorded configuration's final value, oriented so that larger is better; a run that
    ended non-finite counts as the worst."""
    sign = 1.0 if table.direction == "maximize" else -1.0
    return np.array(
        [sign * v.values[-1] if math.isfinite(v.values[-1]) else -math.inf for v in table.configs]
    )


def score(table: Table, entry: Entry) -> float:
    """The share of ``table``'s configurations whose final value the entry's matches or beats."""
    names = [n for n in table.space if ROLES.get(n) in entry]
    if not names:
        return 0.5  # nothing in common: as good as a median draw
    recorded = table.points[:, [list(table.space).index(n) for n in names]]
    distances = np.linalg.norm(recorded - np.array([entry[ROLES[n]] for n in names]), axis=1)
    values = finals(table)
    nearest = np.argsort(distances, kind="stable")[:NEIGHBOURS]
    predicted = float(np.mean(values[nearest])) if np.all(np.isfinite(values[nearest])) else -math.inf
    return float(np.mean(values <= predicted))


def learn(tables: Sequence[Table], size: int, without: str | None = None) -> list[Entry]:
    """The greedy portfolio of ``size`` entries from the recorded configurations of ``tables``
    (the task named ``without`` left out): each entry the one that most raises the mean over the
    tasks of the best score so far; ties go to the candidate met first."""
    training = [t for t in tables if t.task != without]
    candidates = [entry_of(t, c.params) for t in training for c in t.configs]
    if not training or not candidates:
        return []
    scores = np.array([[score(t, e) for t in training] for e in candidates])  # candidates x tasks
    best = np.zeros(len(training))
    chosen: list[Entry] = []
    for _ in range(min(size, len(candidates))):
        gains = np.maximum(scores, best).mean(axis=1)
        pick = int(np.argmax(gains))
        chosen.append(candidates[pick])
        best = np.maximum(best, scores[pick])
    return chosen


def main() -> int:
    from bench.replay import Table, recorded_tables

    tables = [Table.load(p) for p in recorded_tables()]
    for i, entry in enumerate(learn(tables, size=4), 1):
        cells = ", ".join(f"{role} {where:.2f}" for role, where in entry.items())
        per_task = ", ".join(f"{t.task} {score(t, entry):.2f}" for t in tables)
        print(f"{i}. {cells}  (scores: {per_task})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
