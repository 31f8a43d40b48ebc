"""What a set-up mistake costs before fail fast stops the launch, in every launch mode, over seeds.

Each cell is one `hpo launch` of a 6-trial study, 2 trials in flight, of the user's own script
(standard library only) with one mistake in its set-up:

- ``module``: the script imports a module the environment does not have;
- ``pattern``: ``objective.metric_pattern`` matches none of the lines the script prints;
- ``flag``: ``objective.command`` passes a flag the script does not know (argparse's usage error);
- ``killed``: every run is SIGKILLed before its first report (a memory limit too small for any
  configuration).

Modes: ``local`` (per-trial local processes), ``slurm`` (per-trial jobs on the local Slurm cluster),
``workers`` (``--workers 2``, local processes), ``ray`` (the Ray backend on a local Ray instance).
Each with and without the starting portfolio (``study.portfolio`` 4 or 0), TPE seeds 1 to 12. The
search space has the portfolio's roles (lr, weight_decay, batch_size as a categorical of numbers)
and a parameter of its own.

For each launch: the runs the script started (each writes a line first), the trials that ran and
failed, and the exit status (1 when fail fast stopped it). Prints, per mistake and mode, the runs
and failures as max, median and counts over the seeds, and writes ``bench/results/fail_fast.json``.
The table in docs/faults.md is this output.

    python -m bench.fail_fast                                  # everything: about an hour
    python -m bench.fail_fast --modes local --seeds 1-3        # a part
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
HPO = str(Path(sys.executable).with_name("hpo"))

MISTAKES = ("module", "pattern", "flag", "killed")
MODES = ("local", "slurm", "workers", "ray")
PATTERN = r"^step (?P<step>\d+) score (?P<value>\S+)$"

# The user's script: it notes each start, then makes its mistake, or reports 3 steps.
SCRIPT = r"""
import argparse, os, signal, sys, time
with open(os.environ["BENCH_RUNS"], "a") as runs:
    runs.write(f"{time.time()}\n")
mistake = os.environ["BENCH_MISTAKE"]
if mistake == "module":
    import a_module_the_nodes_do_not_have  # noqa: F401
parser = argparse.ArgumentParser()
for name in ("--lr", "--weight_decay", "--batch_size", "--x"):
    parser.add_argument(name, type=float, required=True)
args = parser.parse_args()
if mistake == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
for step in range(1, 4):
    time.sleep(0.2)
    score = args.x * step
    print(f"epoch {step} loss={1 / (1 + score):.4f}" if mistake == "pattern" else f"step {step} score {score}", flush=True)
"""


@dataclass
class Cell:
    mistake: str
    mode: str
    portfolio: bool
    seed: int
    runs: int
    failed: int
    trials: int
    exit: int
    seconds: float


def study_document(folder: Path, mistake: str, mode: str, portfolio: bool, seed: int) -> dict[str, Any]:
    command = ["{python}", "train.py", "--lr", "{lr}", "--weight_decay", "{weight_decay}"]
    command += ["--batch_size", "{batch_size}", "--x", "{x}"]
    if mistake == "flag":
        command += ["--hidden-size", "16"]
    document: dict[str, Any] = {
        "study": {
            "name": f"ff-{mistake}-{mode}-{seed}-{int(portfolio)}-{uuid.uuid4().hex[:4]}",
            "workdir": str(folder / "work"),
            "metric": "score",
            "direction": "maximize",
            "sampler": {"name": "tpe", "seed": seed},
            "portfolio": 4 if portfolio else 0,
            "pruner": {"name": "none"},
            "n_trials": 6,
            "max_concurrent": 2,
            "max_retries": 1,
        },
        "search_space": {
            "lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
            "weight_decay": {"type": "float", "low": 1e-6, "high": 1e-2, "log": True},
            "batch_size": {"type": "categorical", "choices": [512, 32, 128, 64]},
            "x": {"type": "float", "low": 0.0, "high": 1.0},
        },
        "objective": {
            "command": command,
            "metric_pattern": PATTERN,
            "steps": 3,
            "env": {"BENCH_RUNS": str(folder / "runs.txt"), "BENCH_MISTAKE": mistake},
        },
        "resources": {"executor": "slurm" if mode == "slurm" else "local", "time": "5m"},
    }
    if mode == "ray":
        document["study"]["backend"] = "ray"
    return document


def run_cell(root: Path, mistake: str, mode: str, portfolio: bool, seed: int) -> Cell:
    folder = root / f"{mistake}-{mode}-{int(portfolio)}-{seed}"
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(SCRIPT)
    document = study_document(folder, mistake, mode, portfolio, seed)
    study_file = folder / "study.yaml"
    study_file.write_text(yaml.safe_dump(document, sort_keys=False))
    extra = ["--workers", "2"] if mode == "workers" else []
    started = time.monotonic()
    proc = subprocess.run(
        [HPO, "launch", str(study_file), *extra],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    seconds = time.monotonic() - started
    runs_file = folder / "runs.txt"
    runs = len(runs_file.read_text().split()) if runs_file.exists() else 0
    trials = _trials(document)
    failed = sum(1 for t in trials if t["state"] == "FAIL" and t["ran"])
    return Cell(mistake, mode, portfolio, seed, runs, failed, len(trials), proc.returncode, round(seconds, 1))


def _trials(document: dict[str, Any]) -> list[dict[str, Any]]:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    from hpo import tally

    path = Path(document["study"]["workdir"]) / "optuna.journal"
    if not path.exists():
        return []
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    study = optuna.load_study(study_name=document["study"]["name"], storage=storage)
    return [{"state": t.state.name, "ran": tally.ran_and_failed(t)} for t in study.get_trials(deepcopy=False)]


def cells(mistakes: list[str], modes: list[str], seeds: list[int]) -> Iterator[tuple[str, str, bool, int]]:
    for mode in modes:
        for mistake in mistakes:
            for portfolio in (False, True):
                for seed in seeds:
                    yield mistake, mode, portfolio, seed


def table(results: list[Cell]) -> str:
    lines = [
        "| mistake | mode | portfolio | seeds | failed trials: max, median (counts) | runs: max, median | stopped (exit 1) |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, bool], list[Cell]] = {}
    for cell in results:
        groups.setdefault((cell.mistake, cell.mode, cell.portfolio), []).append(cell)
    for (mistake, mode, portfolio), group in groups.items():
        failed = [c.failed for c in group]
        runs = [c.runs for c in group]
        counts = ", ".join(f"{n}: {failed.count(n)}" for n in sorted(set(failed)))
        stopped = sum(1 for c in group if c.exit == 1)
        lines.append(
            f"| {mistake} | {mode} | {'4' if portfolio else '0'} | {len(group)} | {max(failed)}, "
            f"{statistics.median(failed):g} ({counts}) | {max(runs)}, {statistics.median(runs):g} | "
            f"{stopped} of {len(group)} |"
        )
    return "\n".join(lines)


def _seeds(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mistakes", default=",".join(MISTAKES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seeds", default="1-12", help="a range, e.g. 1-12")
    parser.add_argument("--parallel", type=int, default=2, help="launches at a time (not for ray)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "fail_fast.json")
    args = parser.parse_args(argv)
    todo = list(cells(args.mistakes.split(","), args.modes.split(","), _seeds(args.seeds)))
    results: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="bench-fail-fast-") as tmp:
        root = Path(tmp)
        # Ray's cells one at a time: each starts a Ray instance sized to the machine.
        rest, ray = [c for c in todo if c[1] != "ray"], [c for c in todo if c[1] == "ray"]
        with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            for cell in pool.map(lambda c: run_cell(root, *c), rest):
                results.append(cell)
                print(json.dumps(asdict(cell)), flush=True)
        for c in ray:
            cell = run_cell(root, *c)
            results.append(cell)
            print(json.dumps(asdict(cell)), flush=True)
    results.sort(key=lambda c: (MODES.index(c.mode), MISTAKES.index(c.mistake), c.portfolio, c.seed))
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([asdict(c) for c in results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
