"""The learned starting portfolio (hpo/portfolio.py, hpo/portfolio.json): a study that names no
sampler runs its entries first, in the study's own ranges, once; one that names a sampler, or is
warm-started, does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpo import portfolio
from hpo.config import load_study
from tests.hpo.helpers import load_trials, run_hpo, score_study, write_study

# A user's own objective over parameters two of which have a portfolio role (lr, wd).
OBJECTIVE = """
import math

def objective(params, trial):
    value = -abs(math.log10(params["lr"]) + 2) - abs(math.log10(params["wd"]) + 4) + params["x"]
    trial.report(1, value)
    return value
"""


def portfolio_study(tmp_path: Path, name: str, **study: Any) -> dict[str, Any]:
    (tmp_path / "my_objective.py").write_text(OBJECTIVE)
    document = score_study(tmp_path, name, {"steps": 1, "function": "my_objective:objective"}, **study)
    del document["study"]["sampler"]
    document["search_space"] = {
        "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
        "wd": {"type": "float", "low": 1e-6, "high": 1e-2, "log": True},
        "x": {"type": "float", "low": 0.0, "high": 1.0},
    }
    return document


@pytest.mark.fast
def test_the_shipped_entries_map_into_any_studys_ranges(tmp_path: Path) -> None:
    shipped = json.loads(portfolio.SHIPPED.read_text())
    assert len(shipped["entries"]) >= 4 and len(shipped["from_tasks"]) >= 5
    study_file = write_study(tmp_path / "s.yaml", portfolio_study(tmp_path, "map", n_trials=8))
    spec = load_study(study_file)
    assert spec.study.portfolio == 4
    first = portfolio.starting_trials(spec)
    assert len(first) == 4 and all(set(p) == {"lr", "wd"} for p in first)  # x: no role, the sampler's
    dry = run_hpo("launch", str(study_file), "--dry-run")
    assert dry.returncode == 0 and "the learned starting portfolio's 4" in dry.stdout, dry.stdout + dry.stderr
    for params in first:
        assert not [n for n, v in params.items() if spec.search_space[n].rejects(v)], params
    # Positions, not values: the first entry's lr sits where it sits in every range.
    lr = portfolio.shipped()[0]["lr"]
    assert portfolio.position(spec.search_space["lr"], first[0]["lr"]) == pytest.approx(lr, abs=1e-9)
    # An enqueued configuration that already holds an entry's values takes its place.
    spec.study.enqueue = [{**first[1], "x": 0.5}]
    assert portfolio.starting_trials(spec) == [first[0], *first[2:]]
    # A grid (step) and an int range hold the values the distribution holds.
    grid = load_study(
        write_study(
            tmp_path / "g.yaml",
            {
                **portfolio_study(tmp_path, "grid"),
                "search_space": {
                    "pct_start": {"type": "float", "low": 0.1, "high": 0.5, "step": 0.1},
                    "hidden": {"type": "int", "low": 10, "high": 100, "step": 10},
                },
            },
        )
    )
    for params in portfolio.starting_trials(grid):
        assert not [n for n, v in params.items() if grid.search_space[n].rejects(v)], params
        assert round(params["pct_start"] * 10, 9).is_integer() and params.get("hidden", 10) % 10 == 0


@pytest.mark.fast
def test_a_named_sampler_or_a_warm_start_gets_no_portfolio(tmp_path: Path) -> None:
    document = portfolio_study(tmp_path, "named")
    document["study"]["sampler"] = {"name": "tpe", "seed": 1}
    assert portfolio.starting_trials(load_study(write_study(tmp_path / "s.yaml", document))) == []
    document = portfolio_study(tmp_path, "warm")
    document["study"]["warm_start"] = {"studies": ["earlier"]}
    assert portfolio.starting_trials(load_study(write_study(tmp_path / "w.yaml", document))) == []


def test_a_study_without_a_sampler_runs_the_portfolio_first_and_once(tmp_path: Path) -> None:
    document = portfolio_study(tmp_path, "portfolio-first", n_trials=5, max_concurrent=1)
    study_file = write_study(tmp_path / "study.yaml", document)
    first = portfolio.starting_trials(load_study(study_file))

    launched = run_hpo("launch", str(study_file))

    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "4 enqueued to run first (4 from the learned starting portfolio)" in launched.stdout
    trials = sorted(load_trials(document), key=lambda t: t.number)
    assert [{n: t.params[n] for n in ("lr", "wd")} for t in trials[:4]] == first
    assert all(t.state.name == "COMPLETE" for t in trials) and len(trials) == 5
    # A relaunch with a larger budget enqueues nothing again: the sampler proposes the rest.
    document["study"]["n_trials"] = 7
    write_study(study_file, document)
    relaunched = run_hpo("launch", str(study_file))
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    assert "enqueued" not in relaunched.stdout
    later = sorted(load_trials(document), key=lambda t: t.number)[5:]
    assert len(later) == 2 and all({n: t.params[n] for n in ("lr", "wd")} not in first for t in later)
