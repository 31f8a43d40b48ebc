"""A replay stopped part way goes on where it stopped (bench/replay_journal.py): the runs it had
finished are kept as they end and are not replayed again, and the result is the one an unbroken
replay gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.replay import HORIZON, compare
from bench.replay_journal import RunJournal
from bench.replay_table import CURVES

pytestmark = pytest.mark.fast

TABLE = CURVES / "dlojz-cnn-12ep" / "table.json"  # the cheapest recorded task to replay


def run(seed: int, strategy: str = "gp") -> dict[str, object]:
    return {"strategy": strategy, "seed": seed, "compute_to_target": 0.5}


def test_a_run_is_reused_only_where_it_would_be_replayed_the_same(tmp_path: Path) -> None:
    output = tmp_path / "replay-gp.json"
    journal = RunJournal(output, resume=False, default_horizon=HORIZON)
    journal.record("task", 0.9, 1.0, run(1))
    journal.record("task", 0.9, 1.0, run(2))
    with journal.path.open("a") as lines:
        lines.write('{"task": "task", "target": 0.9, "hor')  # the line being written when killed

    resumed = RunJournal(output, resume=True, default_horizon=HORIZON)
    assert resumed.finished("task", "gp", 1, 0.9, 1.0) == run(1)
    assert resumed.finished("task", "gp", 2, 0.9, 1.0) == run(2)
    assert resumed.finished("task", "gp", 3, 0.9, 1.0) is None  # never finished
    assert resumed.finished("task", "gp", 1, 0.91, 1.0) is None  # another target: another baseline
    assert resumed.finished("task", "gp", 1, 0.9, 3.0) is None  # run to another horizon
    assert resumed.finished("other", "gp", 1, 0.9, 1.0) is None
    assert resumed.reused == 2

    RunJournal(output, resume=False, default_horizon=HORIZON)  # a fresh run
    assert not journal.path.exists()


def test_the_runs_of_a_written_result_are_resumed_with_their_horizon(tmp_path: Path) -> None:
    output = tmp_path / "replay-gp.json"
    strategies = {"gp": {"horizon": 1.0}, "default": {}}  # written before the horizon was kept
    output.write_text(json.dumps({"tasks": {"task": {"target": 0.9, "strategies": strategies,
                                                     "runs": [run(1), run(1, "default")]}}}))  # fmt: skip
    resumed = RunJournal(output, resume=True, default_horizon=HORIZON)
    assert resumed.finished("task", "gp", 1, 0.9, 1.0) == run(1)
    assert resumed.finished("task", "default", 1, 0.9, HORIZON) == run(1, "default")


def test_a_replay_killed_part_way_resumes_to_what_an_unbroken_one_gives(tmp_path: Path) -> None:
    output = tmp_path / "replay.json"
    names, seeds = ["random", "default"], 3
    journal = RunJournal(output, resume=False, default_horizon=HORIZON)
    unbroken = compare(TABLE, names, seeds, 64, "3-nearest+noise", 2, journal=journal)
    lines = journal.path.read_text().splitlines()
    assert len(lines) == len(names) * seeds  # each run written as it ended

    journal.path.write_text("\n".join(lines[:4]) + "\n" + lines[4][:40])  # killed while writing the 5th
    resumed = RunJournal(output, resume=True, default_horizon=HORIZON)
    again = compare(TABLE, names, seeds, 64, "3-nearest+noise", 2, journal=resumed)
    assert resumed.reused == 4
    assert as_written(again["runs"]) == as_written(unbroken["runs"])
    assert again["strategies"] == unbroken["strategies"]


def as_written(runs: list[dict[str, object]]) -> list[dict[str, object]]:
    """The runs as the JSON keeps them, less the seconds each took."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads(json.dumps(runs))]
