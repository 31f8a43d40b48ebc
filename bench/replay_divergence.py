"""Diverged trials, replayed: how a trial whose metric turned non-finite should be told to Optuna
so that the sampler learns that its region is bad.

The replay of ``bench/replay.py`` (the same tables, lookup, clock, two workers and compute charge),
with divergence made real: on each task, a configuration whose learning rate lies in the top
``DIVERGING_SHARE`` of the space's log range diverges. The tables' ``lr`` is the optimizer's
learning rate, the batch size a separate parameter (the loss is a batch mean), so the rule reads
the learning rate alone, and the share of the space's volume that diverges is exactly the
share of the learning rate's log range, the space being log-uniform in it. A diverging
configuration's curve turns NaN at epoch 2, or at epoch 1 in the upper half of that band (the
further above, the sooner). The trial ends there, as the service ends it (its reporter sees
the value first), and the replay never counts it as a best.

Tell modes (how the diverged trial is told to Optuna; the finite epochs before it were reported
as usual):

- ``fail``: FAIL. Every Optuna sampler ignores failed trials: TPE never sees the region.
- ``pruned``: PRUNED at the last finite step, its curve as intermediate values. TPE ranks pruned
  trials below every complete one, by the last step reached and then its value; a trial with no
  intermediate value (diverged at epoch 1) ranks last.
- ``worst``: COMPLETE with the worst value (0 accuracy, +inf loss): a worst-value constant liar.
- ``worst+constraint``: the same with a violated constraint, as ``hpo.record.tell_infeasible``
  tells an out-of-memory trial: TPE ranks infeasible trials below the feasible ones.

Per task, 50 seeds: the default strategy as it was measured here, before the starting portfolio
(``bench.replay`` "tpe+median-from-4/9": TPE with its constant liar over the two workers, median
stopping from 4/9 of the epochs) with each mode, and random search,
which no mode changes, on the same diverging table. Compute to target and the equal-compute
comparison are ``bench/replay.py``'s, measured against that random search (its target: its
median best after ``--trials`` trials). The share of trials in the diverging region is counted over
the trials asked within random search's median total compute: random search's share is the
region's volume; lower means the sampler learned to avoid it.

    python -m bench.replay_divergence               # 3 tasks, 50 seeds, 2 processes: 15 minutes on 2 shared cores
    python -m bench.replay_divergence --seeds 5     # a smoke run
    python -m bench.replay_divergence --tables-only # the tables again from the saved runs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import optuna

from bench.replay import clock_at_compute
from bench.replay_simulation import Replay, TellDiverged, TrialRun, replay
from bench.replay_strategies import seed_range, strategy_spec
from bench.replay_summary import leave_one_task_out, per_task_figures, quartiles, worst_figures
from bench.replay_table import LOOKUPS, Lookup, Recorded, Table, recorded_tables
from hpo import record

REPO = Path(__file__).resolve().parents[1]

DIVERGING_SHARE = 0.2
"""The share of the learning rate's log range, from the top, whose configurations diverge."""
PARAM = "lr"
STRATEGY = "tpe+median-from-4/9"  # the default when these were measured
STARTUP = 10
"""TPE's random start-up trials (Optuna's default, which the default strategy keeps): the share
of diverging trials after them is what the sampler chose."""
CONSTRAINT = "diverged"


# -- the divergence --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Which configurations diverge, and from which epoch on."""

    param: str
    threshold: float
    """Above this learning rate a configuration diverges, at epoch 2."""
    early: float
    """Above this one (the log middle of the band), at epoch 1."""

    @classmethod
    def for_table(cls, table: Table, share: float = DIVERGING_SHARE, param: str = PARAM) -> Divergence:
        if not 0 < share < 1:
            raise ValueError(f"share must be in (0, 1), got {share!r}")
        space = table.space.get(param)
        if space is None or space.get("type") != "float" or not space.get("log"):
            raise ValueError(
                f"{table.task}: the divergence needs a log-scaled float {param!r}, got {space!r}"
            )
        low, high = math.log(float(space["low"])), math.log(float(space["high"]))
        threshold = high - share * (high - low)
        return cls(param, math.exp(threshold), math.exp((threshold + high) / 2))

    def epoch(self, params: dict[str, Any]) -> int | None:
        """The first epoch whose value is non-finite, or None if the configuration trains."""
        value = float(params[self.param])
        if value <= self.threshold:
            return None
        return 1 if value > self.early else 2

    def apply(self, recorded: Recorded, params: dict[str, Any]) -> Recorded:
        epoch = self.epoch(params)
        if epoch is None:
            return recorded
        values = [v if e < epoch else math.nan for e, v in enumerate(recorded.values, start=1)]
        return dataclasses.replace(recorded, values=values, test_accuracy=None)

    def lookup(self, lookup: Lookup) -> Lookup:
        return lambda table, params: self.apply(lookup(table, params), params)


# -- how a diverged trial is told ---------------------------------------------------------------


def _tell_fail(study: optuna.Study, trial: optuna.Trial, direction: str | None) -> None:
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def _tell_pruned(study: optuna.Study, trial: optuna.Trial, direction: str | None) -> None:
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)


def _tell_worst(study: optuna.Study, trial: optuna.Trial, direction: str | None) -> None:
    study.tell(trial, record.worst_value(direction))


def _tell_worst_infeasible(study: optuna.Study, trial: optuna.Trial, direction: str | None) -> None:
    trial.set_constraint(CONSTRAINT, 1.0)  # as record.tell_infeasible marks an out-of-memory trial
    study.tell(trial, record.worst_value(direction))


TELL_MODES: dict[str, TellDiverged] = {
    "fail": _tell_fail,
    "pruned": _tell_pruned,
    "worst": _tell_worst,
    "worst+constraint": _tell_worst_infeasible,
}


# -- many seeds ------------------------------------------------------------------------------


def label(mode: str | None) -> str:
    return "random" if mode is None else f"{STRATEGY}, {mode}"


def _baseline(args: tuple[str, int, int, str]) -> tuple[float, float | None]:
    """Random search on the diverging table: its total compute and best for ``trials`` trials."""
    table_path, seed, trials, lookup = args
    table = Table.load(Path(table_path))
    divergence = Divergence.for_table(table)
    run = replay(
        table,
        strategy_spec("random", table, seed),
        lookup=divergence.lookup(LOOKUPS[lookup]),
        n_trials=trials,
        tell_diverged=_tell_fail,
    )
    values = [t.value for t in run.trials if t.value is not None]
    return run.total_compute(), max(values) if values else None


def _one(args: tuple[str, str | None, int, float, float, float, str]) -> dict[str, Any]:
    table_path, mode, seed, target, budget, horizon, lookup = args
    table = Table.load(Path(table_path))
    divergence = Divergence.for_table(table)
    spec = strategy_spec("random" if mode is None else STRATEGY, table, seed)
    maximize = spec.study.direction == "maximize"

    def reached(v: float) -> bool:
        return v >= target if maximize else v <= target

    # As bench.replay: the budget spent, and the target reached or far past.
    def done(run: Replay, spent: float) -> bool:
        if spent < budget:
            return False
        return spent >= horizon or any(t.value is not None and reached(t.value) for t in run.trials)

    started = time.monotonic()
    tell = _tell_fail if mode is None else TELL_MODES[mode]
    run = replay(
        table,
        spec,
        lookup=divergence.lookup(LOOKUPS[lookup]),
        compute_budget=horizon,
        stop_when=done,
        tell_diverged=tell,
    )
    progress = run.progress(maximize)
    to_target = next((c for c, v, _ in progress if reached(v)), math.inf)
    if to_target > horizon:
        to_target = math.inf
    within = [(c, v) for c, v, _ in progress if c <= budget]
    clock = clock_at_compute(run, budget)
    asked = [t for t in run.trials if t.asked_s < clock]
    after_startup = [t for t in asked if t.number >= STARTUP]

    def diverging(trials: Sequence[TrialRun]) -> float | None:
        if not trials:
            return None
        return round(sum(divergence.epoch(t.params) is not None for t in trials) / len(trials), 4)

    return {
        "mode": label(mode),
        "seed": seed,
        "trials": len(asked),
        "pruned": sum(t.state == "PRUNED" for t in asked),
        "diverged": sum(t.state == "DIVERGED" for t in asked),
        "diverging_share": diverging(asked),
        "diverging_share_after_startup": diverging(after_startup),
        "compute_to_target": None if math.isinf(to_target) else round(to_target / budget, 4),
        "best_at_equal_compute": within[-1][1] if within else None,
        "seconds": round(time.monotonic() - started, 2),
    }


def compare(
    table_path: Path, modes: Sequence[str], seeds: int, trials: int, lookup: str, processes: int
) -> dict[str, Any]:
    table = Table.load(table_path)
    divergence = Divergence.for_table(table)
    with ProcessPoolExecutor(processes) as pool:
        baseline = list(
            pool.map(_baseline, [(str(table_path), s, trials, lookup) for s in seed_range(seeds)])
        )
        budget = statistics.median(c for c, _ in baseline)
        worst = -math.inf if table.direction == "maximize" else math.inf
        target = statistics.median(worst if b is None else b for _, b in baseline)
        jobs = [
            (str(table_path), mode, s, target, budget, 3 * budget, lookup)
            for mode in [None, *modes]
            for s in seed_range(seeds)
        ]
        runs = list(pool.map(_one, jobs))
    strategies = strategies_from(runs, [label(None), *(label(m) for m in modes)], worst)
    return {
        "metric": table.metric,
        "direction": table.direction,
        "divergence": {
            "param": divergence.param,
            "share_of_volume": DIVERGING_SHARE,
            "diverges_above": round(divergence.threshold, 4),
            "at_epoch_1_above": round(divergence.early, 4),
            "range": [table.space[divergence.param]["low"], table.space[divergence.param]["high"]],
        },
        "lookup": lookup,
        "seeds": seeds,
        "random_trials": trials,
        "target": target,
        "compute_budget_s": round(budget, 1),
        "strategies": strategies,
        "runs": runs,
    }


REFERENCE = "fail"
"""The mode the others are compared with seed by seed: Optuna's way for a failed trial."""


def strategies_from(runs: list[dict[str, Any]], names: Sequence[str], worst: float) -> dict[str, Any]:
    """Per strategy, its runs' quartiles; against random search at equal compute, the share of
    seeds that beat it; and against the reference mode, seed by seed (the same sampler seed: the
    same start-up trials), how many seeds spent a lower or higher share of trials in the
    diverging region, and reached the target with less or more compute (the rest: ties)."""
    by_seed = {name: {r["seed"]: r for r in runs if r["mode"] == name} for name in names}
    random_best = {seed: r["best_at_equal_compute"] for seed, r in by_seed[label(None)].items()}
    reference = by_seed.get(label(REFERENCE), {})

    def compute(r: dict[str, Any]) -> float:
        return math.inf if r["compute_to_target"] is None else r["compute_to_target"]

    strategies = {}
    for name in names:
        rows = list(by_seed[name].values())
        paired = [(r["best_at_equal_compute"], random_best[r["seed"]]) for r in rows]
        beats = [ours is not None and (theirs is None or ours > theirs) for ours, theirs in paired]
        strategies[name] = {
            "seeds": len(rows),
            "trials": statistics.median(r["trials"] for r in rows),
            "pruned": statistics.median(r["pruned"] for r in rows),
            "diverged": statistics.median(r["diverged"] for r in rows),
            "compute_to_target": quartiles([r["compute_to_target"] for r in rows]),
            "best_at_equal_compute": quartiles([r["best_at_equal_compute"] for r in rows], worst),
            "beats_random_at_equal_compute": round(sum(beats) / len(beats), 3),
            "diverging_share": quartiles([r["diverging_share"] for r in rows]),
            "diverging_share_mean": round(statistics.mean(r["diverging_share"] for r in rows), 4),
            "diverging_share_after_startup": quartiles([r["diverging_share_after_startup"] for r in rows]),
        }
        if name in (label(None), label(REFERENCE)) or not reference:
            continue
        pairs = [(r, reference[r["seed"]]) for r in rows if r["seed"] in reference]
        strategies[name][f"versus_{REFERENCE}"] = {
            "seeds": len(pairs),
            "diverging_share_lower": sum(r["diverging_share"] < f["diverging_share"] for r, f in pairs),
            "diverging_share_higher": sum(r["diverging_share"] > f["diverging_share"] for r, f in pairs),
            "compute_to_target_less": sum(compute(r) < compute(f) for r, f in pairs),
            "compute_to_target_more": sum(compute(r) > compute(f) for r, f in pairs),
        }
    return strategies


def summarize(tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per mode, each task's median compute to target and share beating random; the worst over
    the tasks; and the mode chosen without each task in turn, scored on it (``bench.replay``'s
    rule: the lowest worst compute to target on the others, ties by the share beating random)."""
    names = list(next(iter(tasks.values()))["strategies"])
    out: dict[str, Any] = {}
    for name in names:
        per_task = per_task_figures(tasks, name)
        out[name] = {"per_task": per_task, "worst": worst_figures(per_task)}
    summary: dict[str, Any] = {"strategies": out}
    summary["leave_one_task_out"] = leave_one_task_out(summary)
    return summary


def _cell(q: dict[str, float | None], digits: int, percent: bool = False) -> str:
    def shown(v: float | None) -> str:
        if v is None:
            return "inf"
        return f"{v:.0%}" if percent else f"{v:.{digits}f}"

    return f"{shown(q['median'])} [{shown(q['q1'])}, {shown(q['q3'])}]"


def _versus(v: dict[str, int] | None) -> str:
    if v is None:
        return "-"
    return (
        f"lower {v['diverging_share_lower']}/higher {v['diverging_share_higher']}, "
        f"less {v['compute_to_target_less']}/more {v['compute_to_target_more']}"
    )


def table_lines(result: dict[str, Any]) -> list[str]:
    d = result["divergence"]
    lines = [
        f"{d['param']} in [{d['range'][0]:g}, {d['range'][1]:g}] diverges above {d['diverges_above']:.4g} "
        f"(the top {d['share_of_volume']:.0%} of its log range: NaN at epoch 2; above {d['at_epoch_1_above']:.4g}, "
        f"at epoch 1); target: random search's median best {result['target']:.4f} after "
        f"{result['random_trials']} trials; compute in units of its median total "
        f"({result['compute_budget_s'] / 3600:.2f} CPU-h)",
        f"{'tell mode':26} {'trials':>6} {'diverged':>8} {'compute to target':>22} {'beats random':>12} "
        f"{'trials diverging':>18} {'mean':>5} {'after start-up':>18} {'vs ' + REFERENCE + ': diverging, compute':>26}",
    ]
    for name, s in result["strategies"].items():
        beats = "-" if name == "random" else f"{s['beats_random_at_equal_compute']:.0%}"
        lines.append(
            f"{name:26} {s['trials']:>6.0f} {s['diverged']:>8.0f} {_cell(s['compute_to_target'], 3):>22} "
            f"{beats:>12} {_cell(s['diverging_share'], 0, True):>18} "
            f"{s['diverging_share_mean']:>5.0%} {_cell(s['diverging_share_after_startup'], 0, True):>18} "
            f"{_versus(s.get(f'versus_{REFERENCE}')):>26}"
        )
    return lines


def summary_lines(summary: dict[str, Any], tasks: Sequence[str]) -> list[str]:
    def cell(v: dict[str, Any]) -> str:
        compute = "inf" if v["compute_to_target"] is None else f"{v['compute_to_target']:.3f}"
        return f"{compute} / {v['beats_random']:.0%}"

    lines = [
        "every task: median compute to target (x random's) / share of seeds beating random at equal compute",
        f"{'tell mode':26} " + " ".join(f"{t[:22]:>22}" for t in tasks) + f" {'worst':>14}",
    ]
    for name, s in summary["strategies"].items():
        if name == "random":
            continue
        cells = " ".join(f"{cell(s['per_task'][t]):>22}" for t in tasks)
        lines.append(f"{name:26} {cells} {cell(s['worst']):>14}")
    for task, fold in summary["leave_one_task_out"].items():
        compute = "inf" if fold["compute_to_target"] is None else f"{fold['compute_to_target']:.3f}"
        lines.append(
            f"chosen without {task}: {fold['chosen']}; on {task}: compute to target {compute}, "
            f"beats random in {fold['beats_random'] or 0:.0%} of seeds"
        )
    return lines


def report(result: dict[str, Any]) -> list[str]:
    """The printed tables of a result: each task's, then the summary's."""
    lines: list[str] = []
    for task, replayed in result["tasks"].items():
        lines += [f"== task {task}", *table_lines(replayed), ""]
    return lines + summary_report(result)


def summary_report(result: dict[str, Any]) -> list[str]:
    return [
        *summary_lines(result["summary"], list(result["tasks"])),
        "(median [first quartile, third quartile] over the seeds; inf: not reached within 3x random's "
        "compute; trials diverging: the share of the trials asked within random's median total compute "
        "whose configuration diverges (its mean beside it), after start-up: those after TPE's "
        f"{STARTUP} random ones; vs {REFERENCE}: seeds whose share was lower/higher than with {REFERENCE} "
        "told, and that reached the target with less/more compute, the same sampler seed)",
        f"replayed in {result['seconds']:.0f} s",
    ]


def retabulate(result: dict[str, Any]) -> None:
    """Recompute every figure of a saved result from its runs (no replay)."""
    for replayed in result["tasks"].values():
        names = list(replayed["strategies"])
        for run in replayed["runs"]:  # a result saved before an unreached target was written as None
            if run["compute_to_target"] is not None and math.isinf(run["compute_to_target"]):
                run["compute_to_target"] = None
        worst = -math.inf if replayed["direction"] == "maximize" else math.inf
        replayed["strategies"] = strategies_from(replayed["runs"], names, worst)
    result["summary"] = summarize(result["tasks"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", nargs="+", help="the tasks to replay (default: every recorded table)")
    parser.add_argument("--modes", nargs="+", choices=list(TELL_MODES), default=list(TELL_MODES))
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--trials", type=int, default=64, help="random search's trials (the baseline)")
    parser.add_argument("--lookup", choices=list(LOOKUPS), default="3-nearest+noise")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/replay-divergence.json")
    parser.add_argument("--tables-only", action="store_true",
                        help="recompute the figures and tables of --json from its saved runs, replaying nothing")  # fmt: skip
    args = parser.parse_args(argv)
    if args.tables_only:
        result = json.loads(args.json.read_text())
        retabulate(result)
    else:
        tables = (
            [REPO / "bench/curves" / t / "table.json" for t in args.tasks]
            if args.tasks
            else recorded_tables()
        )
        started = time.monotonic()
        result = {
            "strategy": STRATEGY,
            "modes": args.modes,
            "lookup": args.lookup,
            "seeds": args.seeds,
            "random_trials": args.trials,
            "tasks": {},
        }
        for path in tables:
            task = Table.load(path).task
            replayed = compare(path, args.modes, args.seeds, args.trials, args.lookup, args.processes)
            result["tasks"][task] = replayed
            print("\n".join([f"== task {task}", *table_lines(replayed), ""]), flush=True)
        result["summary"] = summarize(result["tasks"])
        result["seconds"] = round(time.monotonic() - started, 1)
    print("\n".join(report(result) if args.tables_only else summary_report(result)))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    args.json.with_suffix(".txt").write_text("\n".join(report(result)) + "\n")
    print(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
