"""What a replay's runs say: quartiles over the seeds, the table of one task, and the figures
across tasks (each strategy's worst task, the default chosen without each task)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bench.replay_table import CHECK_ONLY, CHOSEN_ON


def quartiles(values: Sequence[float | None], missing: float = math.inf) -> dict[str, float | None]:
    """Quartiles by linear interpolation. A missing value counts as ``missing``: +inf for a
    compute (the target never reached), -inf for a value to maximize (nothing completed); an
    infinite value makes every quantile it takes part in infinite, shown as None."""
    ordered = sorted(missing if v is None else v for v in values)
    if not ordered:
        return {"q1": None, "median": None, "q3": None}

    def quantile(p: float) -> float:
        at = p * (len(ordered) - 1)
        below, weight = int(at), at - int(at)
        if weight == 0:
            return ordered[below]
        if math.isinf(ordered[below]) or math.isinf(ordered[below + 1]):
            return ordered[below] if math.isinf(ordered[below]) else ordered[below + 1]
        return ordered[below] + weight * (ordered[below + 1] - ordered[below])  # inf stays inf

    return {
        "q1": json_figure(quantile(0.25)),
        "median": json_figure(quantile(0.5)),
        "q3": json_figure(quantile(0.75)),
    }


def json_figure(x: float) -> float | None:
    return None if math.isinf(x) else round(x, 4)  # not reached: None in JSON, inf in the table


def print_table(result: dict[str, Any]) -> None:
    print(
        f"replay ({result['lookup']} lookup), {result['seeds']} seeds; target: random search's median best "
        f"{result['target']:.4f} after {result['random_trials']} trials; compute in units of random's "
        f"median total ({result['compute_budget_s'] / 3600:.2f} CPU-h)"
    )

    def cell(q: dict[str, float | None] | None, digits: int) -> str:
        if q is None:
            return "-"
        shown = ["inf" if v is None else f"{v:.{digits}f}" for v in (q["q1"], q["median"], q["q3"])]
        return f"{shown[1]} [{shown[0]}, {shown[2]}]"

    print(f"{'strategy':30} {'trials':>6} {'compute to target':>22} {'its median, 90% CI':>19} "
          f"{'best at equal compute':>26} {'its test accuracy':>26} {'beats/ties random':>17} "
          f"{'beats/ties default':>18}")  # fmt: skip
    for name, s in result["strategies"].items():
        beats = s["beats_random_at_equal_compute"]
        versus = "" if beats is None else f"{beats:.0%}/{s['ties_random_at_equal_compute']:.0%}"
        pair = s.get("versus_default")
        shipped = "" if not pair or pair["beats"] is None else f"{pair['beats']:.0%}/{pair['ties']:.0%}"
        label = f"{name} ({s['named_run']})" if s.get("named_run") else name
        if s["seeds"] < result["seeds"]:
            label += f" ({s['seeds']} seeds)"
        if s.get("horizon", 3.0) != result.get("horizon", 3.0):
            label += f" (to {s['horizon']:g}x)"
        print(f"{label:30} {s['trials']:>6.0f} {cell(s['compute_to_target'], 3):>22} "
              f"{interval_cell(s.get('compute_to_target_interval')):>19} "
              f"{cell(s['best_at_equal_compute'], 4):>26} {cell(s['test_accuracy_of_best'], 4):>26} {versus:>17} "
              f"{shipped:>18}")  # fmt: skip
    print(
        "(median [first quartile, third quartile] over the seeds; inf: not reached within "
        f"{result.get('horizon', 3.0):g}x random's compute;"
        " 90% CI: the median's bootstrap interval; beats/ties default: the share of seeds, seed by seed,"
        " in which the strategy reached the target with less compute than the shipped default / the same)"
    )
    if result.get("saturated"):
        print("saturated: random search's median best is the bound of the values (1.0); these figures tell "
              "no strategy apart (the uniform draw of seed noise lifts good curves to the bound)")  # fmt: skip
    if (noise := result.get("noise")) and noise["seed_sd_median"] is not None:
        print(f"noise floor: the last epoch's {result['metric']} moves by {noise['seed_sd_median']:.4f} "
              f"(median SD; max {noise['seed_sd_max']:.4f}) with the training seed alone "
              f"({noise['configurations_repeated']} configurations x {noise['seeds_each']} seeds); the best "
              f"recorded is {noise['best_recorded']:.4f}, the tenth best {noise['tenth_best_recorded']:.4f}")  # fmt: skip
    if correlations := result.get("rank_correlation_with_last_epoch"):
        print("rank correlation of each epoch's value with the last epoch's: "
              + ", ".join(f"{e + 1}: {c:.2f}" for e, c in enumerate(correlations)))  # fmt: skip


def interval_cell(interval: dict[str, float | None] | None) -> str:
    """A 90% interval as ``[0.301, 0.412]`` (inf for a bound never reached; - where not computed)."""
    if not interval:
        return "-"
    low, high = ("inf" if v is None else f"{v:.3f}" for v in (interval["low"], interval["high"]))
    return f"[{low}, {high}]"


def summarize(tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per strategy: each task's median compute to target and share of seeds that beat random at
    equal compute, and the worst of them over every task and over the held-out ones (those the
    shipped default was not chosen on). A target not reached counts as infinitely far. A task
    whose target saturated (see ``compare``) is listed apart and judges nothing; a ``CHECK_ONLY``
    one has its cells, and no part in the worst figures or the choice."""
    names = list(dict.fromkeys(n for r in tasks.values() for n in r["strategies"]))
    judged = {task: r for task, r in tasks.items() if not r.get("saturated")}
    choosing = set(judged) - CHECK_ONLY
    out: dict[str, Any] = {}
    for name in names:  # over the tasks it ran on (a restarted one: those with short runs)
        per_task = per_task_figures({t: r for t, r in judged.items() if name in r["strategies"]}, name)
        chosen_from = {t: v for t, v in per_task.items() if t in choosing}
        ran = [r["strategies"][name] for r in judged.values() if name in r["strategies"]]
        out[name] = {
            "seeds": min((s.get("seeds", 0) for s in ran), default=0),
            "horizon": max((s.get("horizon", 3.0) for s in ran), default=3.0),
            "per_task": per_task,
            "worst": worst_figures(chosen_from),
            "worst_held_out": worst_figures({t: v for t, v in chosen_from.items() if t != CHOSEN_ON}),
        }
    candidates = {
        n: s["per_task"] for n, s in out.items() if n != "random" and choosing <= set(s["per_task"])
    }
    summary: dict[str, Any] = {
        "strategies": out,
        "saturated": sorted(set(tasks) - set(judged)),
        # The rule that chose the shipped default, applied to every task it may choose with.
        "chosen": choose(candidates, sorted(choosing)) if choosing and candidates else None,
    }
    summary["leave_one_task_out"] = leave_one_task_out(summary)
    return summary


def per_task_figures(tasks: dict[str, dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    """A strategy's median compute to target and share of seeds beating random, task by task."""
    return {
        task: {
            "compute_to_target": (s := r["strategies"][name])["compute_to_target"]["median"],
            "interval": s.get("compute_to_target_interval"),
            "beats_random": s["beats_random_at_equal_compute"],
            "beats_default": (s.get("versus_default") or {}).get("beats"),
        }
        for task, r in tasks.items()
    }


def worst_figures(per_task: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The worst of ``per_task_figures`` over its tasks (None for no task)."""
    if not per_task:
        return None
    compute = [
        math.inf if v["compute_to_target"] is None else v["compute_to_target"] for v in per_task.values()
    ]
    beats = [v["beats_random"] for v in per_task.values() if v["beats_random"] is not None]
    highs = [
        math.inf if v["interval"]["high"] is None else v["interval"]["high"]
        for v in per_task.values()
        if v.get("interval")
    ]
    worst = {"compute_to_target": json_figure(max(compute)), "beats_random": min(beats) if beats else None}
    return {**worst, "interval_high": json_figure(max(highs))} if highs else worst


TARGETS_MET_BY = "the median at most 1/3 of random's compute, its interval's upper end at most 0.40, 80% of seeds beating random"
"""The three targets of the shipped default on each task (docs/benchmarks.md), which choose it."""


def targets_met(cell: dict[str, Any]) -> int:
    """How many of the three targets a strategy meets on a task (an interval not computed: not met)."""
    compute, high = cell["compute_to_target"], (cell.get("interval") or {}).get("high")
    return (
        (compute is not None and compute <= 1 / 3)
        + (high is not None and high <= 0.40)
        + ((cell["beats_random"] or 0.0) >= 0.8)
    )


INCUMBENT = "default"
"""The shipped default: another strategy replaces it only on the evidence ``choose`` asks for."""


def choose(per_task: dict[str, dict[str, dict[str, Any]]], tasks: Sequence[str]) -> str:
    """The strategy that meets the most targets over ``tasks``; ties: the lower worst compute to
    target, then the higher worst share of seeds beating random. A count of targets rather than
    the worst median alone: the worst task's medians lie within each other's intervals, and a
    choice by it alone swapped the default for one that missed every target on two other tasks.
    The shipped default stays unless the strategy so found also needs less compute than it, seed
    by seed, in more than half of the seeds on at least half of the tasks: a count of targets
    moves with a share of seeds that crosses 80% by one seed."""

    def rank(name: str) -> tuple[int, float, float]:
        cells = [per_task[name][t] for t in tasks]
        compute = max(math.inf if c["compute_to_target"] is None else c["compute_to_target"] for c in cells)
        return -sum(targets_met(c) for c in cells), compute, -min(c["beats_random"] or 0.0 for c in cells)

    best = min(per_task, key=rank)
    if best == INCUMBENT or INCUMBENT not in per_task:
        return best
    ahead = sum((per_task[best][t].get("beats_default") or 0.0) > 0.5 for t in tasks)
    return best if 2 * ahead >= len(tasks) else INCUMBENT


def leave_one_task_out(summary: dict[str, Any]) -> dict[str, Any]:
    """Choose a default as it would be chosen without each task, and score it on that task.

    For each judged task, the strategy (random search aside) ``choose`` picks over the other
    tasks, and its figures on the task left out: what the choice is worth on a task it never saw.
    A ``CHECK_ONLY`` task is neither left out nor chosen with."""
    tasks = sorted({t for s in summary["strategies"].values() for t in s["per_task"]} - CHECK_ONLY)
    per_task = {  # a candidate must have run on every task
        n: s["per_task"]
        for n, s in summary["strategies"].items()
        if n != "random" and set(tasks) <= set(s["per_task"])
    }
    if len(tasks) < 2 or not per_task:
        return {}
    folds = {}
    for held_out in tasks:
        chosen = choose(per_task, [t for t in tasks if t != held_out])
        folds[held_out] = {"chosen": chosen, **per_task[chosen][held_out]}
    return folds


def print_summary(summary: dict[str, Any], all_tasks: Sequence[str]) -> None:
    tasks = [t for t in all_tasks if t not in summary["saturated"]]
    print(f"every task: median compute to target (x random's), share of seeds beating random at equal "
          f"compute; worst over all tasks, and over those held out (all but {CHOSEN_ON}); "
          f"{', '.join(sorted(CHECK_ONLY))} only checks the choice (in no worst figure)")  # fmt: skip

    def cell(v: dict[str, Any] | None) -> str:
        if v is None:
            return "-"
        compute = "inf" if v["compute_to_target"] is None else f"{v['compute_to_target']:.3f}"
        beats = "-" if v["beats_random"] is None else f"{v['beats_random']:.0%}"
        bounds = v.get("interval") or {}
        upper = ""
        if "high" in bounds or "interval_high" in v:  # a task's interval, or the worst of them
            high = bounds["high"] if "high" in bounds else v["interval_high"]
            upper = f" <{'inf' if high is None else f'{high:.2f}'}"
        return f"{compute}{upper} / {beats}"

    print("(in each task's cell: the median, the upper end of its 90% interval after <, the share of seeds)")
    print(
        f"{'strategy':30} "
        + " ".join(f"{t[:24]:>24}" for t in tasks)
        + f" {'worst':>14} {'worst held-out':>14}"
    )
    seeds = max((s.get("seeds", 0) for s in summary["strategies"].values()), default=0)
    for name, s in summary["strategies"].items():
        cells = " ".join(f"{cell(s['per_task'].get(t)):>24}" for t in tasks)
        shortened = [f"{s['seeds']} seeds"] if s.get("seeds", seeds) < seeds else []
        if s.get("horizon", 3.0) != 3.0:  # "inf" then means not reached within that compute
            shortened.append(f"to {s['horizon']:g}x")
        if shortened:
            name += f" ({', '.join(shortened)})"
        print(f"{name:30} {cells} {cell(s['worst']):>14} {cell(s['worst_held_out']):>14}")
    for task, fold in summary.get("leave_one_task_out", {}).items():
        compute = "inf" if fold["compute_to_target"] is None else f"{fold['compute_to_target']:.3f}"
        print(f"chosen without {task}: {fold['chosen']}; on {task}: compute to target {compute}, "
              f"beats random in {fold['beats_random'] or 0:.0%} of seeds")  # fmt: skip
    if summary.get("chosen"):
        print(f"chosen on every judged task ({TARGETS_MET_BY}; the most targets met): {summary['chosen']}")
    for task in summary["saturated"]:
        print(f"not judged: {task} (random search's median best reached the bound of the values, 1.0: "
              "the seed noise drawn for a good curve lifts it there, and the strategies tie)")  # fmt: skip
