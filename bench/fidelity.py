"""How well a cheap run ranks configurations under a OneCycle schedule, at equal compute: the
first E epochs of the full run (a prefix, what a pruner sees mid-schedule, at a high learning
rate) against a complete run of E epochs (the whole schedule compressed, annealed at its end).

For every task whose table holds complete shorter runs (``python -m bench.curves record-short``),
and every length E among them, over the same configurations:

- ``spearman``: the rank correlation of the cheap run's last value with the full run's last value;
- ``top_kept``: of the full runs' best tenth, the share a cut to the cheap runs' best third keeps
  (what successive halving with reduction factor 3 would promote);
- ``noise ceiling``: the rank correlation of the full run's last value with the same
  configuration's under another seed (the repeats), the most any cheap run can reach.

    python -m bench.fidelity            # every task with short runs: a table, bench/results/fidelity.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
CURVES = REPO / "bench/curves"
RESULT = REPO / "bench/results/fidelity.json"


def spearman(x: list[float], y: list[float]) -> float:
    return float(stats.spearmanr(x, y).statistic)


def top_kept(cheap: list[float], full: list[float], maximize: bool) -> float:
    """Of the full values' best tenth, the share inside the cheap values' best third."""
    sign = -1.0 if maximize else 1.0
    best_full = set(np.argsort(sign * np.asarray(full))[: max(1, len(full) // 10)].tolist())
    kept = set(np.argsort(sign * np.asarray(cheap))[: max(1, len(cheap) // 3)].tolist())
    return len(best_full & kept) / len(best_full)


def measure(table: dict[str, Any]) -> dict[str, Any]:
    metric, maximize = table["metric"], table["direction"] == "maximize"
    full = {row["number"]: row[metric] for row in table["configs"]}
    rows = []
    for length, runs in sorted(table.get("short", {}).items(), key=lambda item: int(item[0])):
        epochs = int(length)
        numbers = [run["of"] for run in runs if len(full[run["of"]]) >= epochs]
        final = [full[n][-1] for n in numbers]
        prefix = [full[n][epochs - 1] for n in numbers]
        complete = [run[metric][-1] for run in runs if len(full[run["of"]]) >= epochs]
        rows.append(
            {
                "epochs": epochs,
                "share_of_full": round(epochs / table["epochs"], 3),
                "configs": len(numbers),
                "prefix": {
                    "spearman": round(spearman(prefix, final), 3),
                    "top_kept": round(top_kept(prefix, final, maximize), 3),
                },
                "complete": {
                    "spearman": round(spearman(complete, final), 3),
                    "top_kept": round(top_kept(complete, final, maximize), 3),
                },
            }
        )
    repeats = [(full[r["of"]][-1], r[metric][-1]) for r in table["repeats"]]
    ceiling = spearman([a for a, _ in repeats], [b for _, b in repeats]) if len(repeats) > 2 else None
    return {
        "task": table["task"],
        "epochs": table["epochs"],
        "noise_ceiling_spearman": None if ceiling is None else round(ceiling, 3),
        "lengths": rows,
    }


def main() -> int:
    results = []
    for path in sorted(CURVES.glob("*/table.json")):
        table = json.loads(path.read_text())
        if table.get("short"):
            results.append(measure(table))
    if not results:
        print(
            "no table holds complete shorter runs: python -m bench.curves record-short --task T --epochs E ..."
        )
        return 1
    print(
        "task                 epochs  of full  prefix: spearman top-10% kept  complete: spearman top-10% kept"
    )
    for result in results:
        for row in result["lengths"]:
            prefix, complete = row["prefix"], row["complete"]
            print(
                f"{result['task']:20} {row['epochs']:6} {row['share_of_full']:8.2f}"
                f"  {prefix['spearman']:16.3f} {prefix['top_kept']:13.2f}"
                f"  {complete['spearman']:18.3f} {complete['top_kept']:13.2f}"
            )
        print(
            f"{result['task']:20} noise ceiling (a repeat under another seed): {result['noise_ceiling_spearman']}"
        )
    RESULT.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {RESULT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
