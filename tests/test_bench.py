"""The benchmark harness's bookkeeping: the figures of docs/benchmarks.md and the compute counts.

The benchmarks themselves run for an hour (`make bench`) and are not tests; these check the parts
whose mistakes would publish wrong figures: what "compute to reach a target" counts, and that the
committed results draw.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from bench import efficiency
from bench.plots import DRAWERS, draw

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(DRAWERS))
def test_each_committed_result_draws_a_figure(name: str, tmp_path: Path) -> None:
    png = tmp_path / f"{name}.png"
    draw(name, REPO / "bench/results" / f"{name}.json", png)
    with Image.open(png) as image:
        assert image.size == (700, 450)


def test_compute_to_target_counts_every_trial_running_until_then() -> None:
    # Two trials side by side from t=0: the first ends at 100 s with 0.8, the second at 300 s with
    # 0.9; a third runs from 100 s to 400 s. 0.9 is reached at 300 s, when 300 + 300 + 200 CPU-s
    # have been spent (one CPU per trial).
    result = {
        "spans": [(0.0, 100.0), (0.0, 300.0), (100.0, 400.0)],
        "curve": [(100.0, 0.8), (300.0, 0.9), (400.0, 0.85)],
    }
    assert efficiency.reach(result, 0.9) == pytest.approx((100 + 300 + 200) / 3600)
    assert efficiency.reach(result, 0.95) is None
    assert efficiency.progress(result) == [
        (round(200 / 3600, 5), 0.8),
        (round(600 / 3600, 5), 0.9),
        (round(700 / 3600, 5), 0.9),
    ]


def test_the_doc_is_rewritten_from_the_committed_results_with_each_target(tmp_path: Path) -> None:
    from bench.__main__ import BENCHMARKS, main

    doc = tmp_path / "benchmarks.md"
    assert main(["doc", "--doc", str(doc)]) == 0
    text = doc.read_text()
    for name in BENCHMARKS:
        assert f"\n## {name}\n" in text
        assert f"![{name}](" in text
    targets = text.split("## Targets", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in targets.splitlines() if line.startswith("| ") and "---" not in line][1:]
    # throughput (measurements on, TensorBoard on too), 3 dispatch modes, per-trial against the two
    # submitit peers, the Ray start-up, the wide run's losses and connections, storage, efficiency,
    # retrain, the replayed default's three over every task (its median, the median's interval, the
    # seeds beating random), three over the held-out ones and three on the task that only checks
    assert len(rows) == 22, rows
    assert all(row.rstrip(" |").endswith(("met", "**missed**", "stated")) for row in rows), rows


def test_the_fail_fast_bench_measures_a_cell_and_tabulates_it(tmp_path: Path) -> None:
    """One cell of bench/fail_fast.py (a flag the script does not know, local processes, seed 1):
    what it counts is what the table in docs/faults.md reports."""
    from bench import fail_fast

    cell = fail_fast.run_cell(tmp_path, "flag", "local", False, 1)
    assert (cell.runs, cell.failed, cell.exit) == (2, 2, 1), cell
    row = fail_fast.table([cell]).splitlines()[-1]
    assert row == "| flag | local | 0 | 1 | 2, 2 (2: 1) | 2, 2 | 1 of 1 |", row
