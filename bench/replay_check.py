"""The replay checked against reality: strategies run for real on the local Slurm cluster, set
beside the replay's spread for the same settings.

Each real study is the recording's study file (``bench/curves/TASK/study.yaml``: the same trainer
or command, space and data) with the strategy's sampler and pruner, ``--trials`` trials, ``max_concurrent`` as
recorded, one per seed, run with ``hpo launch``. The replay then runs the same strategy with the
same trial budget over many seeds; for each real run the check prints where its best value, its
held-out test accuracy and its compute fall in the replay's distribution (the percentile), and
whether each lies within the replay's range.

    python -m bench.replay_check                     # default and random, seeds 1 and 2, 24 trials
    python -m bench.replay_check --task dlojz-cnn-12ep   # on a task the default was not chosen on
    python -m bench.replay_check --only-replay       # the comparison again, from the runs recorded
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
import yaml

from bench.replay import noise_floor, rank_correlation
from bench.replay_simulation import replay
from bench.replay_strategies import STRATEGIES, apply_strategy, held_out_portfolio, seed_range, strategy_spec
from bench.replay_table import CHOSEN_ON, CURVES, LOOKUPS, Table
from hpo import record, storage
from hpo.config import load_study
from trainer.yamlfile import load_yaml_mapping

REPO = Path(__file__).resolve().parents[1]

WORKDIR = REPO / "runs/replay-check"


def result_path(task: str) -> Path:
    """The first task's check keeps its historical name; another task's is named after it."""
    name = "replay-check" if task == CHOSEN_ON else f"replay-check-{task}"
    return REPO / f"bench/results/{name}.json"


def study_file(task: str, strategy: str, seed: int, trials: int) -> Path:
    """The recording's study with the strategy's sampler and pruner, as the replay builds them."""
    source = CURVES / task / "study.yaml"
    document = load_yaml_mapping(source)
    study = document["study"]
    if "cwd" in (document.get("objective") or {}):  # relative to the study file, which moves
        document["objective"]["cwd"] = str((source.parent / document["objective"]["cwd"]).resolve())
    table = Table.load(CURVES / task / "table.json")
    apply_strategy(study, STRATEGIES[strategy], seed, table.epochs)
    study.pop("enqueue", None)  # the hand-picked start is not part of a strategy
    if size := strategy_spec(strategy, table, seed).study.portfolio.size:
        # The portfolio the replay scores this task with, learned without it: the shipped one
        # was learned from this task too.
        study.update(enqueue=held_out_portfolio(table, size), portfolio=0)
    name = f"check-{strategy}-s{seed}" if task == CHOSEN_ON else f"check-{task}-{strategy}-s{seed}"
    study.update(
        name=name, n_trials=trials, storage=f"journal:{WORKDIR / name}.journal", workdir=str(WORKDIR / name)
    )
    path = WORKDIR / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def outcome(path: Path) -> dict[str, Any]:
    spec = load_study(path)
    ref = storage.resolve_storage(spec, spec.study.storage, str(path))
    study = optuna.load_study(study_name=spec.study.name, storage=storage.open_storage(ref, create=False))
    trials = [t for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED")]
    spans = [
        (
            datetime.fromisoformat(t.user_attrs[record.ATTR_ASKED_AT]),
            datetime.fromisoformat(t.user_attrs[record.ATTR_FINISHED_AT]),
        )
        for t in trials
    ]
    best = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: float(t.value or 0.0))
    return {
        "study": spec.study.name,
        "trials": len(trials),
        "pruned": sum(t.state.name == "PRUNED" for t in trials),
        "best": best.value,
        "test_accuracy_of_best": best.user_attrs.get(record.ATTR_TEST_ACCURACY),
        "compute_s": round(sum((end - ask).total_seconds() for ask, end in spans), 1),
    }


def replayed(strategy: str, seeds: int, trials: int, table: Table, lookup: str) -> list[dict[str, Any]]:
    out = []
    for seed in seed_range(seeds):
        spec = strategy_spec(strategy, table, seed)
        run = replay(
            table,
            spec,
            lookup=LOOKUPS[lookup],
            n_trials=trials,
            enqueue=held_out_portfolio(table, spec.study.portfolio.size or 0),
        )
        best = max((t for t in run.trials if t.state == "COMPLETE"), key=lambda t: t.value or 0.0)
        out.append({"best": best.value, "test_accuracy_of_best": best.recorded.test_accuracy,
                    "compute_s": run.total_compute(), "pruned": sum(t.state == "PRUNED" for t in run.trials)})  # fmt: skip
    return out


def lookup_error(
    task: str, strategies: list[str], seeds: list[int], trials: int, table: Table
) -> dict[str, Any]:
    """Each real trial that ran every epoch, its last value against what each lookup gives for
    its parameters: how far the replay's curves are from a new training run of the same point."""
    pairs: list[tuple[dict[str, Any], float]] = []
    for strategy in strategies:
        for seed in seeds:
            spec = load_study(study_file(task, strategy, seed, trials))
            ref = storage.resolve_storage(spec, spec.study.storage, spec.source)
            study = optuna.load_study(
                study_name=spec.study.name, storage=storage.open_storage(ref, create=False)
            )
            pairs += [(dict(t.params), float(t.value)) for t in study.get_trials(deepcopy=False)
                      if t.state.name == "COMPLETE" and t.value is not None]  # fmt: skip
    out: dict[str, Any] = {
        "trials": len(pairs),
        "seed_sd_median": noise_floor(table)["seed_sd_median"],
    }
    for name, lookup in LOOKUPS.items():
        predicted = [lookup(table, params).values[-1] for params, _ in pairs]
        errors = [p - real for p, (_, real) in zip(predicted, pairs, strict=True)]
        out[name] = {
            "rmse": round(math.sqrt(sum(e * e for e in errors) / len(errors)), 4),
            "mean_error": round(sum(errors) / len(errors), 4),
            "rank_correlation": round(rank_correlation(predicted, [r for _, r in pairs]), 3),
        }  # fmt: skip
        print(f"{name} lookup against {len(pairs)} real trials' last epoch: RMSE {out[name]['rmse']:.4f}, "
              f"mean error {out[name]['mean_error']:+.4f}, rank correlation {out[name]['rank_correlation']:.3f} "
              f"(training seed alone: SD {out['seed_sd_median']:.4f})")  # fmt: skip
    return out


def machine_speed(result: dict[str, Any]) -> dict[str, Any]:
    """The compute of the real runs in units of random search's on the same machine, beside the
    replay's in units of its own random search's: the table was recorded on another machine (or
    the same one on another day), whose seconds need not be this one's, and the replay's claims
    are ratios to random search's compute."""
    real_random = statistics.median(run["compute_s"] for run in result["strategies"]["random"]["real"])
    out: dict[str, Any] = {"real_random_s": real_random, "strategies": {}}
    for lookup in LOOKUPS:
        replay_random = statistics.median(
            s["compute_s"] for s in result["strategies"]["random"]["replay"][lookup]
        )
        out.setdefault("real_over_replay", {})[lookup] = round(real_random / replay_random, 3)
        for name, data in result["strategies"].items():
            sample = [s["compute_s"] / replay_random for s in data["replay"][lookup]]
            for run in data["real"]:
                share = run["compute_s"] / real_random
                inside = min(sample) <= share <= max(sample)
                out["strategies"].setdefault(name, {}).setdefault(lookup, []).append(
                    {"seed": run["seed"], "compute_share": round(share, 3),
                     "replay_range": [round(min(sample), 3), round(max(sample), 3)],
                     "percentile": round(percentile(share, sample), 3)}
                )  # fmt: skip
                print(f"{name} seed {run['seed']}: compute {share:.3f} of random search's on this machine; "
                      f"replay ({lookup}) {min(sample):.3f}..{max(sample):.3f} of its own random search's "
                      f"(percentile {percentile(share, sample):.0%}{'' if inside else ', OUTSIDE the range'})")  # fmt: skip
    print("this machine's seconds against the recording's: "
          + ", ".join(f"{k} {v:.3f}" for k, v in out["real_over_replay"].items()))  # fmt: skip
    return out


def percentile(value: float, sample: list[float]) -> float:
    """Where ``value`` falls in ``sample``: the share below it, ties counted half."""
    below = sum(v < value for v in sample) + 0.5 * sum(v == value for v in sample)
    return below / len(sample)


def _against_replay(run: dict[str, Any], sample: list[dict[str, Any]]) -> str:
    """One real run's figures, each with its percentile in the replay's sample of the same settings."""
    cells = []
    for key, digits in (
        ("best", 4),
        ("test_accuracy_of_best", 4),
        ("compute_s", 0),
        ("pruned", 0),
    ):
        values = [s[key] for s in sample if s[key] is not None]
        if run[key] is None or not values:  # a task without a held-out split
            continue
        inside = min(values) <= run[key] <= max(values)
        cells.append(f"{key} {run[key]:.{digits}f} (replay percentile {percentile(run[key], values):.0%}"
                     f"{'' if inside else ', OUTSIDE the range'})")  # fmt: skip
    return f"  real seed {run['seed']}: {run['trials']} trials, {run['pruned']} pruned; " + "; ".join(cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--strategies", nargs="+", default=["default", "random"], choices=list(STRATEGIES))
    # Not seed 0: the recording ran random sampling from seed 0, so random search's seed 0, and
    # TPE's start-up draws from it, would propose the recorded configurations again, and the
    # training, itself seeded, would repeat the recorded curves to the last digit.
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--task", default=CHOSEN_ON, help="a recorded task (bench/curves/TASK)")
    parser.add_argument("--replay-seeds", type=int, default=50)
    parser.add_argument("--only-replay", action="store_true", help="compare the runs already recorded")
    args = parser.parse_args(argv)
    if not args.only_replay:
        subprocess.run(
            ["bash", str(REPO / "deploy/local-cluster/up.sh")], check=True, stdout=subprocess.DEVNULL
        )
    table = Table.load(CURVES / args.task / "table.json")
    result: dict[str, Any] = {
        "task": args.task,
        "trials": args.trials,
        "replay_seeds": args.replay_seeds,
        "strategies": {},
    }
    for strategy in args.strategies:
        real = []
        for seed in args.seeds:
            path = study_file(args.task, strategy, seed, args.trials)
            if not args.only_replay:
                subprocess.run(
                    [str(Path(sys.executable).parent / "hpo"), "launch", str(path)], cwd=REPO, check=True
                )
            real.append({"seed": seed, **outcome(path)})
        result["strategies"][strategy] = {"real": real, "replay": {}}
        for lookup in LOOKUPS:
            sample = replayed(strategy, args.replay_seeds, args.trials, table, lookup)
            result["strategies"][strategy]["replay"][lookup] = sample
            print(f"{strategy}, {args.trials} trials; replay ({lookup} lookup) over {args.replay_seeds} seeds: "
                  f"best {min(s['best'] for s in sample):.4f}..{max(s['best'] for s in sample):.4f}, "
                  f"compute {min(s['compute_s'] for s in sample) / 3600:.3f}..{max(s['compute_s'] for s in sample) / 3600:.3f} CPU-h")  # fmt: skip
            for run in real:
                print(_against_replay(run, sample))
    if "random" in result["strategies"]:
        result["machine_speed"] = machine_speed(result)
    result["lookup_error"] = lookup_error(args.task, args.strategies, args.seeds, args.trials, table)
    out = result_path(args.task)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(out.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
