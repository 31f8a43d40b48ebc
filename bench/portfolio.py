"""A starting portfolio learned from recorded tasks: an ordered list of configurations tried first
on a new task, before the sampler proposes (TaskSet-style greedy portfolios).

A configuration transfers as positions by role in the study's own ranges (``hpo.portfolio``,
which the service reads the shipped portfolio with; the replay scales a table's points the same way).

A candidate is any recorded configuration of a training task. Its score on a training task is the
share of that task's recorded configurations whose final value it matches or beats, where its own
final value is the mean of its nearest recorded neighbours in the roles it has (the task's other
parameters averaged over, as the sampler would draw them). The portfolio is built greedily: each
entry the candidate that most raises the mean, over the training tasks, of the best score of the
entries so far. Every choice is made from the training tasks alone: the task a portfolio is scored
on is left out of its learning (``learn(tables, without=task)``).

    python -m bench.portfolio            # the portfolio learned from every recorded task
    python -m bench.portfolio --write    # ... written to hpo/portfolio.json, the service's start
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hpo import portfolio as hpo_portfolio
from hpo.config.study_section import DEFAULT_PORTFOLIO
from hpo.portfolio import Entry, position, roles

REPO = Path(__file__).resolve().parents[1]

if TYPE_CHECKING:
    from bench.replay_table import Table

NEIGHBOURS = 3
"""How many recorded configurations nearest in the shared roles predict a candidate's final value
(as many as the replay's lookup averages)."""


def entry_of(table: Table, params: dict[str, Any]) -> Entry:
    """A configuration of ``table`` as positions by role."""
    found = roles(table.params)
    return {found[n]: position(p, params[n]) for n, p in table.params.items() if n in found}


def params_for(table: Table, entry: Entry) -> dict[str, Any]:
    """A portfolio entry as ``table``'s parameters (``hpo.portfolio.params_for``)."""
    return hpo_portfolio.params_for(table.params, entry)


def finals(table: Table) -> np.ndarray:
    """Each recorded configuration's final value, oriented so that larger is better; a run that
    ended non-finite counts as the worst."""
    sign = 1.0 if table.direction == "maximize" else -1.0
    return np.array(
        [sign * v.values[-1] if math.isfinite(v.values[-1]) else -math.inf for v in table.configs]
    )


def score(table: Table, entry: Entry) -> float:
    """The share of ``table``'s configurations whose final value the entry's matches or beats."""
    found = roles(table.space)
    names = [n for n in table.space if found.get(n) in entry]
    if not names:
        return 0.5  # nothing in common: as good as a median draw
    recorded = table.points[:, [list(table.space).index(n) for n in names]]
    distances = np.linalg.norm(recorded - np.array([entry[found[n]] for n in names]), axis=1)
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


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    from bench.replay_table import Table, recorded_tables

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=DEFAULT_PORTFOLIO)
    parser.add_argument(
        "--write", action="store_true", help=f"write {hpo_portfolio.SHIPPED.relative_to(REPO)}"
    )
    args = parser.parse_args(argv)
    tables = [Table.load(p) for p in recorded_tables(check_only=False)]
    entries = learn(tables, size=args.size)
    shipped = []
    for i, entry in enumerate(entries, 1):
        scores = {t.task: round(score(t, entry), 3) for t in tables}
        cells = ", ".join(f"{role} {where:.2f}" for role, where in entry.items())
        print(f"{i}. {cells}  (scores: {', '.join(f'{k} {v:.2f}' for k, v in scores.items())})")
        shipped.append({"positions": {r: round(w, 4) for r, w in entry.items()}, "scores": scores})
    if args.write:
        document = {
            "learned_by": "python -m bench.portfolio --write",
            "from_tasks": [t.task for t in tables],
            "entries": shipped,
        }
        hpo_portfolio.SHIPPED.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {hpo_portfolio.SHIPPED.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
