"""One figure per benchmark, drawn from its JSON: ``draw(name, json_path, png_path)``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no screen on a cluster's login node
import matplotlib.pyplot as plt
from matplotlib.axes import Axes


def _throughput(data: dict[str, Any], ax: Axes) -> None:
    runs = list(data["median"])
    ax.bar(runs, [data["median"][r] for r in runs], color=["C0", "C1", "C2"][: len(runs)])
    for name, repeats in data["repeats"].items():  # each paired repeat, over the median's bar
        ax.plot([runs.index(name)] * len(repeats), repeats, "k.", alpha=0.6)
    ax.set_ylabel("images/s (median of paired repeats; dots: each repeat)")
    ax.set_title("Training throughput on CPU")


def _dispatch(data: dict[str, Any], ax: Axes) -> None:
    modes = [r["mode"] for r in data["results"]]
    ax.bar(modes, [r["makespan_s"] for r in data["results"]], color="C0")
    ax.tick_params(axis="x", labelsize=8)
    ideal = data["results"][0]["ideal_s"]
    ax.axhline(ideal, color="k", linestyle="--", label=f"ideal N*t/K = {ideal:.0f} s")
    ax.axhline(1.15 * ideal, color="C3", linestyle=":", label="target 1.15 x ideal")
    for i, r in enumerate(data["results"]):
        rpcs = f"\n{r['slurmctld_rpcs_per_trial']:.1f} RPC/trial" if "slurmctld_rpcs_per_trial" in r else ""
        ax.annotate(f"{r['ratio']:.2f}x{rpcs}", (i, r["makespan_s"]), ha="center", va="bottom")
    ax.set_ylabel("makespan (s)")
    ax.set_title(f"Dispatch: N={data['n']} trials of {data['t']:.0f} s at K={data['k']}")
    ax.legend()


def _storage(data: list[dict[str, Any]], ax: Axes) -> None:
    for i, storage in enumerate(dict.fromkeys(cell["storage"] for cell in data)):
        cells = sorted((c for c in data if c["storage"] == storage), key=lambda c: c["workers"])
        workers = [c["workers"] for c in cells]
        label = "journal (the embedded default)" if storage == "journal" else storage
        ax.plot(workers, [c["trials_per_s"] for c in cells], "o-", color=f"C{i}", label=label)
        for c in cells:
            if c["errors"]:
                ax.annotate(f"{c['errors']} errors", (c["workers"], c["trials_per_s"]), color=f"C{i}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent worker processes")
    ax.set_ylabel("trials/s (ask, 3 reports, tell)")
    ax.set_title("Storage scale")
    ax.legend()


def _efficiency(data: dict[str, Any], ax: Axes) -> None:
    for i, r in enumerate(data["results"]):
        points = r["progress"]
        ax.step([p[0] for p in points], [p[1] for p in points], where="post", color=f"C{i}",
                label=f"{r['search']} (best {r['best_val_accuracy']:.4f})")  # fmt: skip
    ax.axhline(data["target"], color="k", linestyle="--", label="random search's best")
    # Near the target is where the searches differ; a poor first trial would squash that band.
    top = max(r["best_val_accuracy"] for r in data["results"])
    ax.set_ylim(data["target"] - 0.06, top + 0.01)
    ax.set_xlabel("CPU-hours spent (all trials, running ones included)")
    ax.set_ylabel("best validation accuracy so far")
    ax.set_title(f"HPO efficiency on Fashion-MNIST (N={data['n']})")
    ax.legend(loc="lower right")


def _replay(data: dict[str, Any], ax: Axes) -> None:
    """Each strategy's median compute to reach random search's median best, one marker per task:
    a strategy holds where all its markers sit low, the held-out tasks' included."""
    shown = [
        "tpe",
        "default",
        "tpe+median",
        "ray-asha",
        "tpe+sha-restarts",
        "tpe+median-from-4/9",
        "portfolio+median-from-4/9",
    ]
    summary = data["summary"]["strategies"]
    names = [n for n in shown if n in summary]
    ceiling = 3.0  # a target not reached within 3x random's compute is drawn above this line
    judged = [t for t in data["tasks"] if t not in data["summary"]["saturated"]]
    for i, task in enumerate(judged):
        at, heights = [], []
        for x, name in enumerate(names):
            if task not in summary[name]["per_task"]:
                continue  # not run there (a restarted strategy on a task without short runs)
            value = summary[name]["per_task"][task]["compute_to_target"]
            at.append(x + (i - (len(judged) - 1) / 2) * 0.12)
            heights.append(ceiling * 1.15 if value is None else value)
        held = "" if task != data.get("chosen_on") else " (default chosen here)"
        ax.scatter(
            at,
            heights,
            marker="osD^v"[i % 5],
            color=f"C{i}",
            label=f"{task}{held}",
            zorder=3,
        )
    ax.axhline(1 / 3, color="C3", linestyle=":", linewidth=0.8, label="target: 1/3 of random's compute")
    ax.axhline(ceiling, color="k", linewidth=0.5)
    ax.text(len(names) - 0.5, ceiling * 1.02, "not reached above", ha="right", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylim(0.08, ceiling * 1.5)
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    ax.set_ylabel("compute to random's median best (x random's)")
    ax.set_title(f"Replay per task: medians over {data['seeds']} seeds ({data['lookup']} lookup)")
    ax.legend(loc="upper left", fontsize=7)


DRAWERS: dict[str, Callable[[Any, Axes], None]] = {
    "throughput": _throughput,
    "dispatch": _dispatch,
    "storage": _storage,
    "efficiency": _efficiency,
    "replay": _replay,
}


def draw(name: str, json_path: Path, png_path: Path) -> None:
    figure, ax = plt.subplots(figsize=(7, 4.5))
    DRAWERS[name](json.loads(json_path.read_text()), ax)
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
