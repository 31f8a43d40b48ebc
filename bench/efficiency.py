"""HPO efficiency on the real Fashion-MNIST: what each search needs to find a good configuration.

The quickstart's trainer and search space (a narrow ResNet-20, lr, weight decay, batch size and
the OneCycle settings), trials as local processes two at a time, four searches side by side:

- random: random search, every trial trained to the end;
- tpe: TPE, every trial trained to the end;
- tpe+asha: TPE with asynchronous successive halving (the service's default);
- ray+asha: the Ray backend, Tune's ASHA over the same space (a local Ray instance).

The unpruned searches get N trials; the pruned ones get 2N, as a pruned trial costs a third of a
full one. For each: the best validation accuracy, the compute spent (trial-epochs and CPU-hours:
each trial's elapsed time times its CPUs), and the compute spent by the time it first reached
random search's best accuracy (every trial's CPU time up to that moment, running ones included).
Target: tpe+asha reaches random's best with at most a third of random's compute.

The best configuration found is then trained again, on the full training set for longer, and
its accuracy on the held-out test images is set against the published benchmark table's.

    python -m bench.efficiency            # N=8, retrain 8 epochs: about 30 minutes on 2 cores
    python -m bench.efficiency --quick    # N=3 on 8% of the training set: about 5 minutes
    # Longer trials (more rungs for ASHA: epochs 1, 3 and 9) on less data, another seed, no retrain:
    python -m bench.efficiency --searches random tpe+asha --epochs 9 --train-fraction 0.1 \
        --seed 1 --retrain-epochs 0
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]

HPO = str(Path(sys.executable).parent / "hpo")
# Test accuracy of ResNet-18 with augmentation in Fashion-MNIST's benchmark table (zalandoresearch).
PUBLISHED = 0.949
SEARCHES = {
    # name: (sampler, pruner, backend, trials as a multiple of N)
    "random": ("random", "none", "optuna", 1),
    "tpe": ("tpe", "none", "optuna", 1),
    "tpe+asha": ("tpe", "successive_halving", "optuna", 2),
    "ray+asha": ("tpe", "successive_halving", "ray", 2),
}


def study_document(
    name: str, workdir: Path, search: str, n_trials: int, trainer: dict[str, Any], seed: int
) -> dict[str, Any]:
    """The quickstart study for one search; ``trainer`` overrides its trainer settings."""
    document: dict[str, Any] = yaml.safe_load((REPO / "studies/quickstart.yaml").read_text())
    document["trainer"].update(trainer)
    # The validation images the search never scores (val_fraction 0.5 leaves 5,000 of the 10,000
    # out) give each completed trial an unbiased test accuracy.
    document["trainer"]["test_held_out"] = True
    sampler, pruner, backend, _ = SEARCHES[search]
    study = document["study"]
    study.update(name=name, workdir=str(workdir), backend=backend, n_trials=n_trials, timeout=None)
    study["sampler"] = {"name": sampler, "seed": seed} | (
        {"options": {"n_startup_trials": 4}} if sampler == "tpe" else {}
    )
    study["pruner"] = (
        {"name": pruner}
        if pruner == "none"
        else {"name": pruner, "options": {"min_resource": 1, "reduction_factor": 3}}
    )
    study["enqueue"] = []  # no hand-picked start: each search on its own
    return document


def run_search(search: str, n: int, folder: Path, trainer: dict[str, Any], seed: int) -> dict[str, Any]:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    name = f"efficiency-{search.replace('+', '-')}"
    n_trials = n * SEARCHES[search][3]
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study_document(name, folder / name, search, n_trials, trainer, seed)))
    started = time.monotonic()
    proc = subprocess.run(
        [HPO, "launch", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=REPO,
    )
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{search}: hpo launch failed: {(proc.stdout + proc.stderr)[-2000:]}")
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(folder / name / "optuna.journal")))
    trials = [
        t
        for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        if t.state.is_finished() and not t.user_attrs.get("surplus")
    ]
    spans = [_span(t) for t in trials]
    best, best_value, best_at = None, float("-inf"), None
    for trial, (_, end) in sorted(zip(trials, spans, strict=True), key=lambda pair: pair[1][1]):
        if trial.state.name == "COMPLETE" and trial.value is not None and trial.value > best_value:
            best, best_value, best_at = trial, trial.value, end
    if best is None:
        raise RuntimeError(f"{search}: no trial completed")
    return {
        "search": search,
        "trials": len(trials),
        "pruned": sum(t.state.name == "PRUNED" for t in trials),
        "best_val_accuracy": best_value,
        "best_test_accuracy": best.user_attrs.get("test_accuracy"),
        "best_params": best.params,
        "trial_epochs": sum(len(t.intermediate_values) for t in trials),
        "cpu_hours": round(sum(end - start for start, end in spans) / 3600, 4),
        "wall_s": round(wall, 1),
        # When each completed trial ended and what it reached: for the time-to-target figures. A
        # pruned trial's value is its accuracy part-way through its schedule: it does not count.
        "curve": sorted((end, t.value) for t, (_, end) in zip(trials, spans, strict=True)
                        if t.state.name == "COMPLETE" and t.value is not None),
        "spans": spans,
        "best_at": best_at,
    }  # fmt: skip


def _span(trial: Any) -> tuple[float, float]:
    """The trial's running time (start, end) in unix seconds; one CPU each (cpus_per_task: 1)."""
    end = float(trial.datetime_complete.timestamp())
    elapsed = trial.user_attrs.get("elapsed_s")
    start = end - float(elapsed) if elapsed is not None else float(trial.datetime_start.timestamp())
    return start, end


def compute_until(result: dict[str, Any], moment: float) -> float:
    """CPU-hours every trial had used by ``moment``."""
    return sum(max(0.0, min(end, moment) - start) for start, end in result["spans"]) / 3600


def progress(result: dict[str, Any]) -> list[tuple[float, float]]:
    """(CPU-hours spent, best validation accuracy so far) at each completed trial's end: the plot."""
    points, best = [], 0.0
    for end, value in result["curve"]:
        best = max(best, value)
        points.append((round(compute_until(result, end), 5), best))
    return points


def retrain(params: dict[str, Any], epochs: int, train_fraction: float) -> dict[str, Any]:
    """The best configuration trained once more on more data for longer; the held-out test score."""
    import torch

    from hpo.config import load_study

    spec = load_study(REPO / "studies/quickstart.yaml")
    config = spec.trainer_config(
        params, epochs=epochs, train_fraction=train_fraction, test_held_out=True, log_every=0
    )
    torch.set_num_threads(os.cpu_count() or 1)  # alone on the machine now
    from trainer import train

    started = time.monotonic()
    result = train(config)
    last = result.history[-1]
    return {
        "params": params,
        "epochs": epochs,
        "train_fraction": train_fraction,
        "val_accuracy": round(last.val_accuracy, 4),
        "test_accuracy": round(float(last.test_accuracy or 0.0), 4),
        "cpu_hours": round((time.monotonic() - started) * torch.get_num_threads() / 3600, 4),
        "wall_s": round(time.monotonic() - started, 1),
    }


def reach(result: dict[str, Any], target: float) -> float | None:
    """The CPU-hours the search had spent when a trial first reached ``target``; None if never."""
    for end, value in result["curve"]:
        if value >= target:
            return compute_until(result, end)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=8, help="N, the unpruned searches' trial count")
    parser.add_argument("--quick", action="store_true", help="N=3, on 8%% of the training set")
    parser.add_argument("--searches", nargs="+", choices=list(SEARCHES), default=list(SEARCHES))
    parser.add_argument("--epochs", type=int, help="each trial's epochs (default: the quickstart's 3)")
    parser.add_argument(
        "--train-fraction",
        type=float,
        help="each trial's share of the training set (default: the quickstart's 0.25)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the samplers' seed")
    parser.add_argument("--retrain-epochs", type=int, default=8,
                        help="epochs of the best configuration's retrain on the full training set "
                             "(0: no retrain)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    n = 3 if args.quick else args.trials
    # Quick: one epoch on the quick search's 8% of the training set, only to show that the step runs.
    retrain_epochs, retrain_fraction = (1, 0.08) if args.quick else (args.retrain_epochs, 1.0)
    trainer: dict[str, Any] = {"train_fraction": 0.08} if args.quick else {}
    if args.epochs is not None:
        trainer["epochs"] = args.epochs
    if args.train_fraction is not None:
        trainer["train_fraction"] = args.train_fraction
    print(
        f"efficiency benchmark: N={n} ({', '.join(args.searches)}), quickstart trainer and space", flush=True
    )
    results = run_searches(args.searches, n, trainer, args.seed)
    target = score_against_random(results)

    retrained = None
    winner = max(results, key=lambda r: r["best_val_accuracy"])
    search = study_document("", Path(), "random", n, trainer, args.seed)["trainer"]
    print(f"search trials: {search['epochs']} epochs on {search['train_fraction']:.0%} of the training "
          f"set, sampler seed {args.seed}")  # fmt: skip
    if retrain_epochs > 0:
        retrained = retrain_best(winner, retrain_epochs, retrain_fraction)
    print(f"(measured {datetime.now().isoformat(timespec='minutes')})")
    if args.json:
        for r in results:
            r.pop("spans")
        document = {
            "n": n,
            "seed": args.seed,
            "trial_epochs": search["epochs"],
            "train_fraction": search["train_fraction"],
            "target": target,
            "results": results,
            "retrain": retrained,
            "published": PUBLISHED,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


def run_searches(searches: list[str], n: int, trainer: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """Each search in turn, its result printed as it ends."""
    results = []
    with tempfile.TemporaryDirectory(prefix="hpo-bench-efficiency-") as tmp:
        for search in searches:
            result = run_search(search, n, Path(tmp), trainer, seed)
            results.append(result)
            print(f"  {search:<9} best {result['best_val_accuracy']:.4f} (test {result['best_test_accuracy']:.4f}) "
                  f"in {result['trials']} trials "
                  f"({result['pruned']} pruned), {result['trial_epochs']} trial-epochs, "
                  f"{result['cpu_hours']:.3f} CPU-h, {result['wall_s']:.0f} s", flush=True)  # fmt: skip
    return results


def score_against_random(results: list[dict[str, Any]]) -> float:
    """Adds to each result the compute it took to reach random search's best (and that against
    random's own), and its progress; prints the table. The target: random's best."""
    baseline = next((r for r in results if r["search"] == "random"), results[0])
    target = float(baseline["best_val_accuracy"])
    print(f"\ntarget: {baseline['search']}'s best validation accuracy, {target:.4f}")
    print(f"{'search':<10}{'best val':>9}{'its test':>9}{'trials':>7}{'epochs':>7}{'CPU-h':>8}"
          f"{'CPU-h to target':>17}{'x random':>10}")  # fmt: skip
    reference = reach(baseline, target)
    for r in results:
        spent = reach(r, target)
        r["cpu_hours_to_target"] = None if spent is None else round(spent, 4)
        ratio = f"{spent / reference:.2f}" if spent is not None and reference else "-"
        r["ratio_to_random"] = None if ratio == "-" else float(ratio)
        r["progress"] = progress(r)
        shown = f"{spent:.3f}" if spent is not None else "not reached"
        print(f"{r['search']:<10}{r['best_val_accuracy']:>9.4f}{r['best_test_accuracy']:>9.4f}{r['trials']:>7}"
              f"{r['trial_epochs']:>7}{r['cpu_hours']:>8.3f}{shown:>17}{ratio:>10}")  # fmt: skip
    print("(test: the best trial's accuracy on the 5,000 test images that validation never scored)")
    return target


def retrain_best(winner: dict[str, Any], epochs: int, train_fraction: float) -> dict[str, Any]:
    """Prints and returns the retrain of the search winner's best configuration."""
    print(f"\nretrain: {winner['search']}'s best configuration, {epochs} epochs on "
          f"{train_fraction:.0%} of the training set", flush=True)  # fmt: skip
    retrained = retrain(winner["best_params"], epochs, train_fraction)
    print(f"  {', '.join(f'{k}={v:.4g}' for k, v in retrained['params'].items())}")
    print(f"  held-out test accuracy {retrained['test_accuracy']:.4f} (validation {retrained['val_accuracy']:.4f}), "
          f"{retrained['wall_s']:.0f} s, {retrained['cpu_hours']:.3f} CPU-h")  # fmt: skip
    print(f"  published reference (Fashion-MNIST benchmark table): ResNet-18 with augmentation, {PUBLISHED:.3f} "
          f"test accuracy; gap {PUBLISHED - retrained['test_accuracy']:+.4f}")  # fmt: skip
    return retrained


if __name__ == "__main__":
    sys.exit(main())
