"""Search strategies replayed against the recorded learning-curve table, many seeds each.

A strategy is a study's sampler and pruner (or the Ray backend's scheduler), built by the same
code that builds them from a study file (``hpo.search``, ``hpo.dispatch.ray.driver``). The replay
runs it against a recorded table (``bench/curves/TASK/table.json``) instead of training: a proposed configuration gets the
curve of the nearest recorded configuration (the parameters scaled to [0, 1], log-scaled where the
space is), epoch after epoch on a clock driven by the recorded seconds of each epoch and the
trial's measured overhead (job start-up, data, checkpoints, final test), with ``max_concurrent``
workers that each start the next trial as soon as theirs ends, as the launcher does.

Compute is charged the way ``hpo status`` charges it, the time a trial holds its allocation
(here from the launcher's ask to the trial's end, about 2 s more per trial than sacct's elapsed
time: the submission) times its CPUs, one here. Per strategy and seed:

- ``compute_to_target``: the compute spent when the best value first reached random search's
  median best (random search without pruning, ``trials`` trials, over the seeds), as a fraction
  of random search's median total compute for those trials;
- ``best_at_equal_compute``: the best value found within random search's median total compute;
- ``test_accuracy_of_best``: the held-out test accuracy of that best configuration.

Every strategy runs on the same seeds: per task, the median compute to target comes with its 90%
bootstrap interval, and each strategy is compared with the shipped default seed by seed
(``bench/replay_statistics.py``).

Its parts: ``bench/replay_table.py`` (the recorded table and the lookups),
``replay_strategies.py`` (each strategy as a study spec, what stops a trial),
``replay_simulation.py`` (the clock and the workers), ``replay_summary.py`` (quartiles, the printed
tables, the figures across tasks); this module runs the seeds and is the command line.

    python -m bench.replay                       # the plain run: 100 seeds, 64 trials, within 30 min
    python -m bench.replay --run pruners         # a named run, read by the plain run's summary
    python -m bench.replay --seeds 5 --strategies random default
    python -m bench.replay --run gp --candidate-seeds 100 --horizon 1 --resume   # on from where it stopped
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np
import threadpoolctl

from bench.replay_journal import RunJournal
from bench.replay_simulation import Replay, replay
from bench.replay_statistics import median_interval, paired
from bench.replay_strategies import (
    NAMED_RUNS,
    RESTARTED,
    RETIRED,
    SAMPLER_WRAPPERS,
    STRATEGIES,
    held_out_portfolio,
    seed_range,
    strategy_spec,
)
from bench.replay_summary import print_summary, print_table, quartiles, summarize
from bench.replay_table import CHOSEN_ON, CURVES, LOOKUPS, REPO, Table, recorded_tables

HORIZON = 3.0
"""How far a strategy runs, in random search's compute, when it has not reached the target: its
compute to target is infinite past it."""
BASELINES = ("random", "default")
"""The strategies every comparison runs on all its seeds: the target, and the pairs."""


def random_baseline(args: tuple[str, int, int, str]) -> tuple[float, float]:
    table_path, seed, trials, lookup = args
    table = Table.load(Path(table_path))
    run = replay(table, strategy_spec("random", table, seed), lookup=LOOKUPS[lookup], n_trials=trials)
    return run.total_compute(), max(t.value for t in run.trials if t.value is not None)


def _one(args: tuple[str, str, int, float, float, float, str, int]) -> dict[str, Any]:
    table_path, name, seed, target, budget, horizon, lookup, trials = args
    table = Table.load(Path(table_path))
    spec = strategy_spec(name, table, seed)
    maximize = spec.study.direction == "maximize"

    def done(run: Replay, spent: float) -> bool:  # the budget spent and the target reached, or far past
        if spent < budget:
            return False
        values = [t.value for t in run.trials if t.value is not None]
        return spent >= horizon or any((v >= target if maximize else v <= target) for v in values)

    started = time.monotonic()
    run = replay(
        table,
        spec,
        lookup=LOOKUPS[lookup],
        compute_budget=horizon,
        stop_when=done,
        restarts=name in RESTARTED,
        enqueue=held_out_portfolio(table, spec.study.portfolio.size or 0),
        wrap_sampler=SAMPLER_WRAPPERS.get(name),
    )
    progress = run.progress(maximize)
    to_target = next((c for c, v, _ in progress if (v >= target if maximize else v <= target)), math.inf)
    if to_target > horizon:  # reached by a trial that started before the horizon and ended after it
        to_target = math.inf
    within = [(c, v, t) for c, v, t in progress if c <= budget]
    best = within[-1] if within else None
    budget_clock = clock_at_compute(run, budget)
    return {
        "strategy": name,
        "seed": seed,
        "trials": sum(1 for t in run.trials if t.asked_s < budget_clock),
        "pruned": sum(1 for t in run.trials if t.asked_s < budget_clock and t.state == "PRUNED"),
        # What a trial costs on average, pruned ones included, against random search's (unpruned).
        "trial_cost": round(statistics.mean(ended) / (budget / trials), 4)
        if (ended := [t.end_s - t.asked_s for t in run.trials if math.isfinite(t.end_s)])
        else None,
        "compute_to_target": to_target / budget,
        "best_at_equal_compute": best[1] if best else None,
        "test_accuracy_of_best": best[2].recorded.test_accuracy if best else None,
        "progress": [(round(c / budget, 4), v) for c, v, _ in progress],
        "seconds": round(time.monotonic() - started, 2),
    }


def _one_thread() -> None:
    """One thread per process: ``processes`` of them already share the cores. NumPy's BLAS was
    started with a thread per core when the parent imported it (an environment variable set now
    comes too late for it), so it is limited in place; torch, which a GP sampler imports later,
    reads the variable. Two processes of two threads each on two cores tripled a GP seed's time."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    threadpoolctl.threadpool_limits(1)


def clock_at_compute(run: Replay, compute: float) -> float:
    """The clock at which ``compute`` had been charged (bisection: compute_at only grows)."""
    low, high = 0.0, max((t.end_s for t in run.trials), default=0.0)
    if run.compute_at(high) <= compute:
        return math.inf
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if run.compute_at(middle) < compute else (low, middle)
    return high


def compare(
    table_path: Path,
    names: Sequence[str],
    seeds: int,
    trials: int,
    lookup: str,
    processes: int,
    candidate_seeds: int | None = None,
    horizon: float = HORIZON,
    journal: RunJournal | None = None,
) -> dict[str, Any]:
    """Every strategy of ``names`` on the same seeds, against random search's median best over
    them, each run until it reaches that or has spent ``HORIZON`` times random search's compute.
    With ``candidate_seeds``, all but random search and the default run on the first that many
    seeds only, and to ``horizon`` (a slow candidate; the target and the pairs are still those of
    every seed). With a ``journal``, each run is kept as it ends and those it holds are not run again."""
    table = Table.load(table_path)
    names = [n for n in names if n not in RESTARTED or table.short]

    def shortened(name: str) -> bool:  # a slow candidate: fewer seeds, its own horizon
        return candidate_seeds is not None and name not in BASELINES

    def reach(name: str) -> float:
        return horizon if shortened(name) else HORIZON

    with ProcessPoolExecutor(processes, initializer=_one_thread) as pool:
        baseline = list(
            pool.map(random_baseline, [(str(table_path), s, trials, lookup) for s in seed_range(seeds)])
        )
        budget = statistics.median(c for c, _ in baseline)
        target = statistics.median(b for _, b in baseline)
        jobs = [
            (str(table_path), n, s, target, budget, reach(n) * budget, lookup, trials)
            for n in names
            for s in seed_range(min(seeds, candidate_seeds or seeds) if shortened(n) else seeds)
        ]
        runs = replay_all(pool, jobs, table.task, journal, reach)
    by_name: dict[str, list[dict[str, Any]]] = {n: [r for r in runs if r["strategy"] == n] for n in names}
    random_best = {r["seed"]: r["best_at_equal_compute"] for r in by_name.get("random", [])}
    shipped = {r["seed"]: r["compute_to_target"] for r in by_name.get("default", [])}
    strategies = {
        name: {**strategy_figures(name, rows, table, random_best, shipped), "horizon": reach(name)}
        for name, rows in by_name.items()
    }
    return {
        "metric": table.metric,
        # The lookup keeps values within [0, 1]: a target at that bound is one that seed noise
        # added to a good curve reaches by being cut there, and no strategy can be told apart.
        "saturated": table.direction == "maximize" and target >= 1.0,
        "horizon": HORIZON,
        "lookup": lookup,
        "seeds": seeds,
        "random_trials": trials,
        "target": target,
        "compute_budget_s": round(budget, 1),
        "noise": noise_floor(table),
        "rank_correlation_with_last_epoch": fidelity(table),
        "strategies": strategies,
        "runs": runs,
    }


def replay_all(
    pool: ProcessPoolExecutor,
    jobs: list[tuple[str, str, int, float, float, float, str, int]],
    task: str,
    journal: RunJournal | None,
    reach: Callable[[str], float],
) -> list[dict[str, Any]]:
    """Every job's run, in the jobs' order: from the journal where it holds the run, else replayed
    and written to it as soon as it ends (in whatever order the processes finish)."""
    runs: list[dict[str, Any] | None] = [None] * len(jobs)
    pending = {}
    for index, job in enumerate(jobs):
        _, name, seed, target, *_ = job
        kept = journal.finished(task, name, seed, target, reach(name)) if journal else None
        if kept is not None:
            runs[index] = kept
        else:
            pending[pool.submit(_one, job)] = index
    for future in as_completed(pending):
        run = runs[pending[future]] = future.result()
        if journal:
            journal.record(task, jobs[pending[future]][3], reach(run["strategy"]), run)
    return [run for run in runs if run is not None]


def strategy_figures(
    name: str,
    rows: list[dict[str, Any]],
    table: Table,
    random_best: dict[int, float | None],
    shipped: dict[int, float | None],
) -> dict[str, Any]:
    """One strategy's figures on a task from its runs (one per seed): medians and quartiles, the
    median's interval, and the seed-by-seed comparisons with random search and the shipped default."""
    worst = -math.inf if table.direction == "maximize" else math.inf  # nothing completed within the compute
    pairs = [(r["best_at_equal_compute"], random_best[r["seed"]]) for r in rows if r["seed"] in random_best]
    beats = [ours is not None and (theirs is None or ours > theirs) for ours, theirs in pairs]
    ties = [ours is not None and ours == theirs for ours, theirs in pairs]
    return {
        "definition": definition(name, table),
        "seeds": len(rows),
        "trials": statistics.median(r["trials"] for r in rows),
        "pruned": statistics.median(r["pruned"] for r in rows),
        "trial_cost": statistics.median(r["trial_cost"] for r in rows if r["trial_cost"] is not None),
        "compute_to_target": quartiles([r["compute_to_target"] for r in rows]),
        "compute_to_target_interval": median_interval([r["compute_to_target"] for r in rows]),
        # Seed by seed against the shipped default (the same seeds): what a switch would change.
        "versus_default": paired({r["seed"]: r["compute_to_target"] for r in rows}, shipped)
        if name != "default" and shipped
        else None,
        "best_at_equal_compute": quartiles([r["best_at_equal_compute"] for r in rows], worst),
        # None where the task keeps no held-out split (its table has no test accuracy).
        "test_accuracy_of_best": quartiles([r["test_accuracy_of_best"] for r in rows], worst)
        if any(r["test_accuracy_of_best"] is not None for r in rows)
        else None,
        "beats_random_at_equal_compute": round(sum(beats) / len(beats), 3) if beats else None,
        # The same best: with the nearest lookup, both found the same recorded configuration.
        "ties_random_at_equal_compute": round(sum(ties) / len(ties), 3) if ties else None,
    }


def definition(name: str, table: Table) -> dict[str, Any]:
    """The strategy's sampler and pruner as built for the table (defaults filled in)."""
    spec = strategy_spec(name, table, seed=0)
    out = {
        "sampler": {"name": spec.study.sampler.name, "options": spec.study.sampler.options},
        "pruner": {"name": spec.study.pruner.name, "options": spec.study.pruner.options},
    }
    return {**out, "backend": spec.study.backend} if spec.study.backend != "optuna" else out


def noise_floor(table: Table) -> dict[str, Any]:
    """How much the last epoch's value moves with the training seed alone (the table's repeats),
    beside the spread of the best recorded configurations: differences under it are luck."""
    runs: dict[int, list[float]] = {}
    for index, run in table.repeats:
        runs.setdefault(index, [table.configs[index].values[-1]]).append(run.values[-1])
    spreads = [statistics.stdev(values) for values in runs.values()]
    last = sorted((c.values[-1] for c in table.configs), reverse=table.direction == "maximize")
    return {
        "configurations_repeated": len(runs),
        "seeds_each": 1 + len(table.repeats) // max(1, len(runs)),
        "seed_sd_median": round(statistics.median(spreads), 4) if spreads else None,
        "seed_sd_max": round(max(spreads), 4) if spreads else None,
        "best_recorded": last[0],
        "tenth_best_recorded": last[9] if len(last) >= 10 else None,
    }


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's: the correlation of the ranks (ties broken by order, rare in these values)."""
    rank_a, rank_b = (np.argsort(np.argsort(np.asarray(v))) for v in (a, b))
    return float(np.corrcoef(rank_a, rank_b)[0, 1])


def fidelity(table: Table) -> list[float]:
    """How well each epoch's value ranks the configurations as the last epoch does: what a pruner
    deciding at that epoch can know."""
    last = [c.values[-1] for c in table.configs]
    return [
        round(rank_correlation([c.values[e] for c in table.configs], last), 3) for e in range(table.epochs)
    ]


PLAIN = [n for n in STRATEGIES if n not in RETIRED and not any(n in run for run in NAMED_RUNS.values())]
"""The plain run's strategies: all but the retired ones and those of the named runs."""


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", nargs="+", help="the tasks to replay (default: every recorded table)")
    parser.add_argument("--table", type=Path, help="one table file instead of the tasks'")
    parser.add_argument("--run", choices=list(NAMED_RUNS),
                        help="a named run's strategies (with random search and the default, for the "
                             "target and the pairs), to bench/results/replay-RUN.json: the plain "
                             "run's summary reads it")  # fmt: skip
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), default=PLAIN,
                        help=f"default: all but the named runs' and {', '.join(sorted(RETIRED))} (retired)")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--candidate-seeds", type=int,
                        help="run the strategies other than random search and the default on the "
                             "first N seeds only (a slow peer's named run)")  # fmt: skip
    parser.add_argument("--summarize-again", action="store_true",
                        help="print the plain run's JSON again with the named runs read anew (replays nothing)")  # fmt: skip
    parser.add_argument("--horizon", type=float, default=HORIZON,
                        help="with --candidate-seeds: how far those strategies run without reaching the "
                             "target, in random search's compute (1: as far as the choice's figures read)")  # fmt: skip
    parser.add_argument("--resume", action="store_true",
                        help="go on from the runs the output JSON and its journal hold (a run stopped "
                             "part way, or one given more --candidate-seeds): those are not replayed again")  # fmt: skip
    parser.add_argument("--trials", type=int, default=64, help="random search's trials (the baseline)")
    parser.add_argument("--lookup", choices=list(LOOKUPS), default="3-nearest+noise")
    parser.add_argument("--also-lookup", nargs="*", choices=list(LOOKUPS), default=[],
                        help="the same again with other lookups (how much the lookup changes the result)")  # fmt: skip
    parser.add_argument("--also-seeds", type=int, default=20, help="seeds for the other lookups")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path, help="default: bench/results/replay.json (replay-RUN.json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.summarize_again:
        return summarize_again(args.json or REPO / "bench/results/replay.json")
    strategies = sorted(NAMED_RUNS[args.run]) if args.run else args.strategies
    names = list(dict.fromkeys(["random", *(["default"] if args.run else []), *strategies]))
    out = args.json or REPO / "bench/results" / (f"replay-{args.run}.json" if args.run else "replay.json")
    if args.table:
        tables = [args.table]
    elif args.tasks:
        tables = [CURVES / task / "table.json" for task in args.tasks]
    else:
        tables = recorded_tables()
    started = time.monotonic()
    journal = RunJournal(out, args.resume, HORIZON)
    result: dict[str, Any] = {
        "lookup": args.lookup,
        "seeds": args.seeds,
        "random_trials": args.trials,
        "chosen_on": CHOSEN_ON,
        "tasks": {},
        "other_lookups": {},
    }
    for path in tables:
        task = Table.load(path).task
        print(f"== task {task} ({path.relative_to(REPO) if path.is_relative_to(REPO) else path})")
        result["tasks"][task] = compare(
            path,
            names,
            args.seeds,
            args.trials,
            args.lookup,
            args.processes,
            args.candidate_seeds,
            args.horizon,
            journal,
        )
        print_table(result["tasks"][task])
        print()
        for lookup in args.also_lookup:
            other = compare(path, names, args.also_seeds, args.trials, lookup, args.processes)
            print_table(other)
            print()
            other.pop("runs")  # the figure draws the main lookup's runs; the others' summaries are kept
            result["other_lookups"].setdefault(lookup, {})[task] = other
    if not args.run:
        result["named_runs"] = read_named_runs(result, out.parent)
    result["summary"] = summarize(result["tasks"])
    print_summary(result["summary"], list(result["tasks"]))
    result["seconds"] = round(time.monotonic() - started, 1)
    result["resumed_runs"] = journal.reused  # finished before this process: its seconds leave them out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    journal.close()
    resumed = f" ({journal.reused} runs resumed, not replayed)" if journal.reused else ""
    print(f"replayed in {result['seconds']:.0f} s{resumed}; {out}")
    return 0


def summarize_again(path: Path) -> int:
    """The plain run's output again from its JSON, the named runs read anew (one that finished
    after the plain run): nothing is replayed."""
    result = json.loads(path.read_text())
    for task, figures in result["tasks"].items():
        figures["strategies"] = {n: s for n, s in figures["strategies"].items() if "named_run" not in s}
        print(f"== task {task} ({(CURVES / task / 'table.json').relative_to(REPO)})")
        print_table(figures)
        print()
    result["named_runs"] = read_named_runs(result, path.parent)
    result["summary"] = summarize(result["tasks"])
    print_summary(result["summary"], list(result["tasks"]))
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"replayed in {result['seconds']:.0f} s (the named runs read again, nothing replayed); {path}")
    return 0


def read_named_runs(result: dict[str, Any], folder: Path) -> dict[str, str]:
    """Add the committed named runs' strategies to the plain run's tasks (their summaries, not
    their runs) where they were replayed as this run was: the same lookup, seeds and baseline, so
    the same target and the same pairs. Returns what became of each named run, as printed."""
    said: dict[str, str] = {}
    for run in NAMED_RUNS:
        path = folder / f"replay-{run}.json"
        if not path.exists():
            said[run] = f"not read: no {path.name} (python -m bench.replay --run {run})"
        else:
            named = json.loads(path.read_text())
            same = all(named[key] == result[key] for key in ("lookup", "seeds", "random_trials"))
            tasks = [t for t in result["tasks"] if t in named["tasks"]] if same else []
            for task in tasks:
                for name, figures in named["tasks"][task]["strategies"].items():
                    if name not in result["tasks"][task]["strategies"]:
                        result["tasks"][task]["strategies"][name] = {**figures, "named_run": run}
            said[run] = (
                f"read {path.name}: {', '.join(sorted(NAMED_RUNS[run]))} on {len(tasks)} tasks"
                if same
                else f"not read: {path.name} was replayed with another lookup, seeds or baseline"
            )
        print(f"named run {run}: {said[run]}")
    return said


if __name__ == "__main__":
    sys.exit(main())
