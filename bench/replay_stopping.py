"""Stop rules and warm start, replayed: what ending a study early saves and loses, and what seeding
a study with an earlier one's trials buys.

Both run the default strategy as it was measured here, before the starting portfolio
(``bench.replay``'s "tpe+median-from-4/9": TPE, median pruner from 4/9 of the epochs) against the recorded learning-curve table, the main reading's way (``3-nearest+noise``
lookup, sampler seeds 1 to 50), and measure compute in units of random search's median total
compute for ``--trials`` trials, as ``bench/replay.py`` does.

- **Stop rules** (``hpo.budget.stopping``), read as the launcher reads them, each time a trial
  ends: a study of ``--horizon`` trials, once without a rule and once per rule; a rule that fires
  lets the running trials end and asks no more. Per rule: the compute spent, its ratio to the same
  seed's run without a rule, the best value at the end against that run's final best, and how
  often the rule stopped the study before its horizon.
- **Warm start**: the study first gets the COMPLETE trials (final values only) of an earlier study,
  imported as finished trials that cost nothing. The earlier study is the same strategy with
  another sampler seed (1000 + seed) and another draw of the seed noise, run for 10, 20 or 64
  trials: the same task, so an upper bound for a study on a related but different task. Per
  start: the compute this study's own trials need to reach random search's median best (imported
  trials never count as reaching it), against the cold start of the same seed.

    .venv/bin/python -m bench.replay_stopping            # 50 seeds, 2 processes: 7 to 13 minutes
    .venv/bin/python -m bench.replay_stopping --quick    # 5 seeds, a smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
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

from bench.replay import noise_floor, random_baseline
from bench.replay_simulation import Replay, TrialRun, replay
from bench.replay_strategies import STRATEGIES, seed_range, spec_with, strategy_spec
from bench.replay_summary import quartiles
from bench.replay_table import LOOKUPS, TABLE, Lookup, Table, noisy_k_nearest
from hpo import record, search
from hpo.budget.stopping import patience_verdict, terminator_bound
from hpo.config import StudySpec
from hpo.config.study_section import StopSpec

REPO = Path(__file__).resolve().parents[1]

STRATEGY = "tpe+median-from-4/9"  # the default when these were measured
SOURCE_SEED = 1000
"""The earlier study's sampler seed is this plus the study's: no target seed (1 to 50) repeats it."""
WARM_SIZES = (10, 20, 64)
"""Trials the earlier study ran; its COMPLETE ones (pruned ones are not imported) seed the study."""
PRUNER_STARTUP = 5
"""Optuna's MedianPruner n_startup_trials, which the default pruner keeps."""
MIN_TRIALS = 10
"""Completed trials before a rule may stop the study: TPE's random start-up is over by then."""


def stop_rules(noise: float) -> dict[str, StopSpec | None]:
    """The rules measured, by name: each alone, as a study file's ``study.stop`` would set it."""
    sd = f"{noise:g}"
    return {
        "none": None,
        "patience 8": StopSpec(patience=8, min_trials=MIN_TRIALS),
        "patience 8, 0.002": StopSpec(patience=8, min_improvement=0.002, min_trials=MIN_TRIALS),
        "patience 16": StopSpec(patience=16, min_trials=MIN_TRIALS),
        "patience 16, 0.002": StopSpec(patience=16, min_improvement=0.002, min_trials=MIN_TRIALS),
        f"terminator, noise {sd}": StopSpec(terminator=True, noise=noise, min_trials=MIN_TRIALS),
        "terminator, Optuna's noise": StopSpec(terminator=True, min_trials=MIN_TRIALS),
        f"terminator, noise {sd}, min 5": StopSpec(terminator=True, noise=noise, min_trials=5),
        "terminator, Optuna's noise, min 5": StopSpec(terminator=True, min_trials=5),
    }


class RuleWatch:
    """One stop rule over a replay, read as ``hpo.budget.stopping.check`` reads a study: the
    finished trials (complete or pruned) in the order they ended, at least ``min_trials`` of them
    complete; patience over their values, the Terminator over the complete trials."""

    def __init__(self, rule: StopSpec, spec: StudySpec) -> None:
        self.rule = rule
        self.maximize = spec.study.direction == "maximize"
        self.direction = (
            optuna.study.StudyDirection.MAXIMIZE if self.maximize else optuna.study.StudyDirection.MINIMIZE
        )
        self.distributions = search.distributions(spec)
        self.frozen: dict[int, optuna.trial.FrozenTrial] = {}
        self.reason: str | None = None
        self.finished_at_stop = 0
        self.evaluations: list[tuple[int, float, float]] = []
        """The Terminator's (complete trials, regret bound, noise) at each evaluation."""

    def _frozen(self, run: TrialRun) -> optuna.trial.FrozenTrial:
        if run.number not in self.frozen:
            trial = optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE,
                params=run.params,
                distributions=self.distributions,
                value=run.value,
            )
            trial.number = run.number
            self.frozen[run.number] = trial
        return self.frozen[run.number]

    def __call__(self, run: Replay, spent: float) -> bool:
        finished = sorted(
            (t for t in run.trials if t.state in ("COMPLETE", "PRUNED")), key=lambda t: (t.end_s, t.number)
        )
        complete = [t for t in finished if t.state == "COMPLETE"]
        if not finished or len(complete) < self.rule.min_trials:
            return False
        reason = None
        if self.rule.patience is not None:
            reason = patience_verdict(
                [t.value for t in finished],
                self.rule.patience,
                self.rule.min_improvement,
                self.maximize,
                self.rule.min_trials,
            )
        if reason is None and self.rule.terminator:
            model = [self._frozen(t) for t in sorted(complete, key=lambda t: t.number)]
            bound, noise = terminator_bound(model, self.direction, self.rule)
            self.evaluations.append((len(complete), float(bound), float(noise)))
            if bound < noise:
                reason = f"regret bound {bound:.4g} below the noise {noise:.4g}"
        if reason is None:
            return False
        self.reason, self.finished_at_stop = reason, len(finished)
        return True


def _best(run: Replay, maximize: bool) -> float | None:
    values = [t.value for t in run.trials if t.value is not None]
    if not values:
        return None
    return max(values) if maximize else min(values)


def _init_worker() -> None:
    import torch  # Optuna's Gaussian process (the Terminator): one thread per process

    torch.set_num_threads(1)


def _seed(args: tuple[str, int, str, int, float, float, float, float]) -> dict[str, Any]:
    """Everything for one sampler seed: each stop rule's study, then the cold and warm starts."""
    table_path, seed, lookup_name, horizon_trials, noise, target, budget, horizon_compute = args
    started = time.monotonic()
    table = Table.load(Path(table_path))
    spec = strategy_spec(STRATEGY, table, seed)
    one = _Seed(table, spec, LOOKUPS[lookup_name], target, budget, horizon_compute)
    rules = one.rules(noise, horizon_trials)
    starts = one.starts(seed)
    return {"seed": seed, "rules": rules, "starts": starts, "seconds": round(time.monotonic() - started, 2)}


@dataclasses.dataclass(frozen=True)
class _Seed:
    """One sampler seed's study settings, shared by its stop-rule studies and its starts."""

    table: Table
    spec: StudySpec
    lookup: Lookup
    target: float
    budget: float
    """Random search's median total compute."""
    horizon_compute: float

    @property
    def maximize(self) -> bool:
        return self.spec.study.direction == "maximize"

    def hit(self, value: float) -> bool:
        return value >= self.target if self.maximize else value <= self.target

    def rules(self, noise: float, horizon_trials: int) -> dict[str, Any]:
        """Each stop rule's study of ``horizon_trials`` trials: whether and when the rule stopped it."""
        rules: dict[str, Any] = {}
        for name, rule in stop_rules(noise).items():
            watch = RuleWatch(rule, self.spec) if rule is not None else None
            run = replay(self.table, self.spec, lookup=self.lookup, n_trials=horizon_trials, stop_when=watch)
            best = _best(run, self.maximize)
            rules[name] = {
                "trials": len(run.trials),
                "pruned": sum(1 for t in run.trials if t.state == "PRUNED"),
                "fired": watch is not None and watch.reason is not None,
                "reason": watch.reason if watch else None,
                "finished_at_stop": watch.finished_at_stop if watch else None,
                "compute": run.total_compute() / self.budget,
                "best": best,
                "reached_target": best is not None and self.hit(best),
                "terminator": [(n, round(b, 5), round(e, 6)) for n, b, e in watch.evaluations]
                if watch
                else [],
            }
        return rules

    def to_target(
        self, initial: Sequence[optuna.trial.FrozenTrial], spec: StudySpec | None = None
    ) -> dict[str, Any]:
        """As bench/replay.py's main reading: on until random's compute is spent and the target
        reached, or 3x random's compute; the compute at the first own trial that reached it."""
        budget, horizon_compute, hit = self.budget, self.horizon_compute, self.hit

        def done(run: Replay, spent: float) -> bool:
            if spent < budget:
                return False
            return spent >= horizon_compute or any(hit(t.value) for t in run.trials if t.value is not None)

        run = replay(
            self.table,
            self.spec if spec is None else spec,
            lookup=self.lookup,
            compute_budget=horizon_compute,
            stop_when=done,
            initial_trials=initial,
        )
        progress = run.progress(self.maximize)
        reached = next((c for c, v, _ in progress if hit(v)), math.inf)
        within = [v for c, v, _ in progress if c <= budget]
        asked = [t for t in run.trials if run.compute_at(t.asked_s) < budget]  # within random's compute
        return {
            "imported": len(initial),
            "trials": len(asked),
            "pruned": sum(1 for t in asked if t.state == "PRUNED"),
            "imported_reached_target": any(hit(t.value) for t in initial if t.value is not None),
            "compute_to_target": reached / budget if reached <= horizon_compute else math.inf,
            "best_at_equal_compute": within[-1] if within else None,
        }

    def starts(self, seed: int) -> dict[str, Any]:
        """The cold start, then warm starts from an earlier study of each of ``WARM_SIZES``."""
        table, spec = self.table, self.spec
        starts = {"cold": self.to_target(())}
        source_spec = strategy_spec(STRATEGY, table, SOURCE_SEED + seed)
        other_draw = functools.partial(noisy_k_nearest, draw=1)  # another training seed's noise
        distributions = search.distributions(spec)
        for size in WARM_SIZES:
            source = replay(table, source_spec, lookup=other_draw, n_trials=size)
            imported = [
                optuna.trial.create_trial(
                    state=optuna.trial.TrialState.COMPLETE,
                    params=t.params,
                    distributions=distributions,
                    value=t.value,
                    user_attrs={record.ATTR_IMPORTED_FROM: f"replay seed {SOURCE_SEED + seed}"},
                )
                for t in source.trials
                if t.state == "COMPLETE"
            ]
            starts[f"warm, {size} trials"] = self.to_target(imported)
            # The median pruner counts the imported trials towards its n_startup_trials (5), though
            # they have no intermediate values: it starts pruning after fewer trials of this study.
            # The same warm start with the start-up counted on this study's own trials tells what
            # that costs.
            pruner = {"name": "median", "options": {**spec.study.pruner.options,
                                                    "n_startup_trials": PRUNER_STARTUP + len(imported)}}  # fmt: skip
            own_startup = spec_with({**STRATEGIES[STRATEGY], "pruner": pruner}, table, seed)
            starts[f"warm, {size}, own start-up"] = self.to_target(imported, own_startup)
        return starts


def _share(flags: Sequence[bool]) -> float:
    return round(sum(flags) / len(flags), 3) if flags else math.nan


def summarize(runs: list[dict[str, Any]], noise: float, maximize: bool) -> dict[str, Any]:
    sign = 1.0 if maximize else -1.0
    worst = -math.inf if maximize else math.inf
    rules: dict[str, Any] = {}
    for name in runs[0]["rules"]:
        rows = [(r["rules"][name], r["rules"]["none"]) for r in runs]
        # How much worse the stopped study's best is than the same seed's final best without a rule.
        losses = [
            sign * (free["best"] - ours["best"]) if ours["best"] is not None else math.inf
            for ours, free in rows
        ]
        rules[name] = {
            "stopped_before_horizon": _share(
                [ours["fired"] and ours["trials"] < free["trials"] for ours, free in rows]
            ),
            "fired": _share([ours["fired"] for ours, _ in rows]),
            "trials": statistics.median(ours["trials"] for ours, _ in rows),
            "compute": quartiles([ours["compute"] for ours, _ in rows]),
            "compute_vs_none": quartiles([ours["compute"] / free["compute"] for ours, free in rows]),
            "best": quartiles([ours["best"] for ours, _ in rows], worst),
            "loss_vs_none": quartiles(losses),
            "loss_above_noise": _share([loss > noise for loss in losses]),
            "reached_target": _share([ours["reached_target"] for ours, _ in rows]),
        }
    starts: dict[str, Any] = {}
    for name in runs[0]["starts"]:
        pairs = [(r["starts"][name], r["starts"]["cold"]) for r in runs]
        medians = [statistics.median(s["compute_to_target"] for s, _ in pairs),
                   statistics.median(c["compute_to_target"] for _, c in pairs)]  # fmt: skip
        starts[name] = {
            "imported": statistics.median(s["imported"] for s, _ in pairs),
            "trials": statistics.median(s["trials"] for s, _ in pairs),
            "pruned": statistics.median(s["pruned"] for s, _ in pairs),
            "imported_reached_target": _share([s["imported_reached_target"] for s, _ in pairs]),
            "compute_to_target": quartiles([s["compute_to_target"] for s, _ in pairs]),
            "ratio_of_medians_to_cold": round(medians[0] / medians[1], 3)
            if math.isfinite(sum(medians))
            else None,
            "beats_cold": _share([s["compute_to_target"] < c["compute_to_target"] for s, c in pairs]),
            "ties_cold": _share([s["compute_to_target"] == c["compute_to_target"] for s, c in pairs]),
            "best_at_equal_compute": quartiles([s["best_at_equal_compute"] for s, _ in pairs], worst),
        }
    return {"rules": rules, "starts": starts}


def measure(
    table_path: Path, seeds: int, trials: int, horizon: int, lookup: str, processes: int
) -> dict[str, Any]:
    table = Table.load(table_path)
    floor = noise_floor(table)
    noise = float(floor["seed_sd_median"])
    with ProcessPoolExecutor(processes, initializer=_init_worker) as pool:
        baseline = list(
            pool.map(random_baseline, [(str(table_path), s, trials, lookup) for s in seed_range(seeds)])
        )
        budget = statistics.median(c for c, _ in baseline)
        target = statistics.median(b for _, b in baseline)
        jobs = [
            (str(table_path), s, lookup, horizon, noise, target, budget, 3 * budget)
            for s in seed_range(seeds)
        ]
        runs = list(pool.map(_seed, jobs))
    return {
        "strategy": STRATEGY,
        "lookup": lookup,
        "seeds": seeds,
        "random_trials": trials,
        "horizon_trials": horizon,
        "min_trials": MIN_TRIALS,
        "target": target,
        "compute_budget_s": round(budget, 1),
        "noise": floor,
        "rules": {name: _rule_json(rule) for name, rule in stop_rules(noise).items()},
        "warm_source": f"{STRATEGY}, sampler seed {SOURCE_SEED} + seed, noise draw 1, {list(WARM_SIZES)} trials",
        **summarize(runs, noise, table.direction == "maximize"),
        "runs": [_finite(r) for r in runs],
    }


def _rule_json(rule: StopSpec | None) -> dict[str, Any] | None:
    if rule is None:
        return None
    return {"patience": rule.patience, "min_improvement": rule.min_improvement, "terminator": rule.terminator,
            "noise": rule.noise, "min_trials": rule.min_trials}  # fmt: skip


def _finite(value: Any) -> Any:
    """inf (not reached) as None, for JSON."""
    if isinstance(value, float) and math.isinf(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def report(result: dict[str, Any]) -> list[str]:
    def cell(q: dict[str, float | None], digits: int) -> str:
        shown = ["inf" if v is None else f"{v:.{digits}f}" for v in (q["q1"], q["median"], q["q3"])]
        return f"{shown[1]} [{shown[0]}, {shown[2]}]"

    sd = result["noise"]["seed_sd_median"]
    lines = [
        f"stop rules: the {result['strategy']} strategy, {result['lookup']} lookup, {result['seeds']} seeds, "
        f"horizon {result['horizon_trials']} trials; compute in units of random search's median total for "
        f"{result['random_trials']} trials ({result['compute_budget_s'] / 3600:.2f} CPU-h); noise: the seed SD {sd:.4f}",
        f"{'rule':34} {'stopped':>7} {'trials':>6} {'compute':>22} {'compute / no rule':>22} "
        f"{'best at the end':>26} {'loss vs no rule':>26} {'loss>SD':>7} {'target':>6}",
    ]
    for name, s in result["rules"].items():
        lines.append(
            f"{name:34} {s['stopped_before_horizon']:>7.0%} {s['trials']:>6.0f} {cell(s['compute'], 3):>22} "
            f"{cell(s['compute_vs_none'], 3):>22} {cell(s['best'], 4):>26} {cell(s['loss_vs_none'], 4):>26} "
            f"{s['loss_above_noise']:>7.0%} {s['reached_target']:>6.0%}"
        )
    lines += [
        f"(median [first quartile, third quartile] over the seeds; min_trials {result['min_trials']} unless "
        "'min 5'; 'patience N, 0.002': min_improvement 0.002; stopped: the share of seeds stopped before the "
        f"horizon; loss: the same seed's final best without a rule minus this run's best; loss>SD: the share "
        f"losing more than {sd:.4f}; target: the share whose best reached random's median best {result['target']:.4f})",
        "",
        f"warm start: the {result['strategy']} strategy seeded with the COMPLETE trials of an earlier study "
        f"({result['warm_source']}); compute (this study's own trials) to reach random's median best "
        f"{result['target']:.4f}, in the same units",
        f"{'start':28} {'imported':>8} {'trials':>6} {'pruned':>6} {'compute to target':>22} {'median / cold':>13} {'warm < cold':>11} "
        f"{'ties':>5} {'best at equal compute':>26} {'source had it':>13}",
    ]
    for name, s in result["starts"].items():
        ratio = s["ratio_of_medians_to_cold"]
        lines.append(
            f"{name:28} {s['imported']:>8.0f} {s['trials']:>6.0f} {s['pruned']:>6.0f} {cell(s['compute_to_target'], 3):>22} "
            f"{'inf' if ratio is None else f'{ratio:.2f}':>13} {s['beats_cold']:>11.0%} {s['ties_cold']:>5.0%} "
            f"{cell(s['best_at_equal_compute'], 4):>26} {s['imported_reached_target']:>13.0%}"
        )
    lines.append(
        "(median [first quartile, third quartile]; trials, pruned: this study's, asked within random's compute; "
        "inf: not reached within 3x random's compute; own start-up: the median pruner's n_startup_trials "
        "raised by the trials imported, so that it counts this study's trials only; source had it: the share "
        "of seeds whose imported trials already include one at the target, which does not count)"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.replay_stopping",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="5 seeds: a smoke run")
    parser.add_argument("--trials", type=int, default=64, help="random search's trials (the baseline)")
    parser.add_argument("--horizon", type=int, default=64, help="the stop-rule studies' n_trials")
    parser.add_argument("--lookup", choices=list(LOOKUPS), default="3-nearest+noise")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/replay-stopping.json",
                        help="the results; the printed table goes beside it (.txt)")  # fmt: skip
    args = parser.parse_args(argv)
    seeds = 5 if args.quick else args.seeds
    started = time.monotonic()
    result = measure(args.table, seeds, args.trials, args.horizon, args.lookup, args.processes)
    result["seconds"] = round(time.monotonic() - started, 1)
    lines = [*report(result), f"replayed in {result['seconds']:.0f} s on {args.processes} processes"]
    print("\n".join(lines))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    args.json.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
