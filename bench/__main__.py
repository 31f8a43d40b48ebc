"""Every benchmark in one run: ``python -m bench all [--quick]`` (or ``make bench``).

Runs, one after the other (each compares its sides within its own run and prints ratios):

- throughput: the trainer against the naive reference script and a bare loop (images/s);
- dispatch: per-trial jobs, --workers and the Ray backend on the local Slurm cluster, makespan
  against the ideal N*t/K;
- storage: ask/report/tell throughput and errors against worker processes, per storage;
- efficiency: random, TPE, TPE+ASHA and Ray ASHA on the real Fashion-MNIST;
- replay: search strategies against each recorded learning-curve table, 50 seeds each (the other
  ways of reading a table: ``python -m bench.replay --also-lookup nearest 3-nearest``).

Each one's printed output, JSON and figure land in ``bench/results/`` (or ``--out``), with
``run.json`` (when each ran, how long, on what machine), and ``docs/benchmarks.md`` is rewritten
from them all, starting with each target against what was measured.

    python -m bench all            # about 60 minutes on the 2-core development machine
    python -m bench all --quick    # about 10 minutes
    python -m bench storage        # one of them (the doc keeps the others' latest results)
    python -m bench doc            # rewrite the doc from the results, running nothing
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# name: (module, its full-run arguments, its quick arguments, what the table shows)
BENCHMARKS: dict[str, tuple[str, list[str], list[str], str]] = {
    "throughput": (
        "bench.throughput", ["--repeats", "3"], ["--repeats", "3", "--steps", "25"],
        "Training throughput on CPU: the trainer against the naive reference configuration and a "
        "bare loop, images/s, medians of paired repeats.",
    ),
    "dispatch": (
        "bench.dispatch", ["--trials", "32", "--seconds", "20"], ["--quick"],
        "Orchestration overhead on the local Slurm cluster: N trials of a fixed-duration objective "
        "at K=4, makespan against the ideal N*t/K (target at most 1.15x).",
    ),
    "storage": (
        "bench.storage", [], ["--quick"],
        "Storage scale: trials/s (ask, 3 reports, tell) and errors against concurrent worker "
        "processes (target: 64 workers on PostgreSQL without an error).",
    ),
    "efficiency": (
        "bench.efficiency", [], ["--quick"],
        "HPO efficiency on the real Fashion-MNIST: each search's best validation accuracy, that "
        "trial's accuracy on the held-out test images, the compute each search needs to reach random "
        "search's best (target: TPE+ASHA at most 1/3 of random's), and the best configuration "
        "retrained on the full training set against the published 0.949.",
    ),
    "replay": (
        "bench.replay", [], ["--seeds", "5"],
        "Search strategies replayed against the learning-curve tables the service recorded "
        "(bench/curves/TASK/table.json, one per task), many seeds each: the compute each needs to "
        "reach random search's median best, its best at random's compute, and that configuration's "
        "held-out test accuracy, each median with its 90% bootstrap interval over the seeds (target, "
        "on every task: the shipped default at most 1/3 of random's compute, the interval's upper end "
        "at most 0.40, and better than random at equal compute in 80% of seeds).",
    ),
}  # fmt: skip
JSON_FLAG = {"throughput": "--output"}
# Where the figures of the doc stand beside, for a GPU node this development machine lacks.
GPU_REFERENCES = """\
On a GPU node the same script runs unchanged with `python -m bench.throughput --preset gpu`
(ResNet-50, 224 px, bf16, channels_last, synthetic ImageNet-sized data). Published references to
set its figure against: 2,470 images/s for PyTorch ResNet-50 training on one A100 (NVIDIA's
Deep Learning Examples, mixed precision), and about 7,000 images/s per H100 in MLPerf Training
(ResNet-50 with DALI data loading). Not measured here: this machine has no GPU."""


def run(name: str, quick: bool, out: Path) -> tuple[int, float]:
    module, full, quick_args, _ = BENCHMARKS[name]
    command = [sys.executable, "-m", module, *(quick_args if quick else full),
               JSON_FLAG.get(name, "--json"), str(out / f"{name}.json")]  # fmt: skip
    print(f"== {name}: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    with (out / f"{name}.txt").open("w") as log:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
        )
        assert proc.stdout is not None
        for line in proc.stdout:  # shown as it comes and kept for the doc
            sys.stdout.write(line)
            log.write(line)
        proc.wait()
    return proc.returncode, time.monotonic() - started


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{os.cpu_count()} cores ({cpu}), {memory_gib:.0f} GiB, {gpu}; {platform.platform()}; "
            f"Python {platform.python_version()}, torch {torch.__version__}")  # fmt: skip


def targets(out: Path) -> list[tuple[str, str, str]]:
    """(target, what was measured, met or not) for each benchmark that has results in ``out``."""
    rows: list[tuple[str, str, str]] = []
    for name, rows_of in TARGET_ROWS.items():
        path = out / f"{name}.json"
        if path.exists() and (result := json.loads(path.read_text())):
            rows += rows_of(result)
    return rows


def verdict(met: bool) -> str:
    return "met" if met else "**missed**"


def _throughput_rows(throughput: Any) -> list[tuple[str, str, str]]:
    """The targets of throughput: the trainer's overhead against a bare loop."""
    rows: list[tuple[str, str, str]] = []
    overhead = 1 - statistics.median(throughput["ratios"]["bare"])
    rows.append(("trainer overhead against a bare loop <= 5% (CPU), measurements on", f"{100 * overhead:+.1f}%",
                 verdict(overhead <= 0.05)))  # fmt: skip
    if "tb_bare" in throughput["ratios"]:
        overhead = 1 - statistics.median(throughput["ratios"]["tb_bare"])
        rows.append(("the same with TensorBoard event files on", f"{100 * overhead:+.1f}%",
                     verdict(overhead <= 0.05)))  # fmt: skip
    return rows


def _dispatch_rows(dispatch: Any) -> list[tuple[str, str, str]]:
    """The targets of dispatch: the makespans, the peers' and the wide run's."""
    rows: list[tuple[str, str, str]] = []
    by_mode = {r["mode"]: r for r in dispatch["results"]}
    for mode, most in (("per-trial", 1.15), ("workers", 1.03), ("ray", 1.15)):
        if r := by_mode.get(mode):
            rows.append((f"dispatch makespan <= {most} x ideal, N={dispatch['n']}: {mode}",
                         f"{r['ratio']:.3f}x", verdict(r["ratio"] <= most)))  # fmt: skip
    trial, driver, array = (by_mode.get(m) for m in ("per-trial", "submitit-async", "submitit-array"))
    if trial and driver:
        rows.append(("per-trial jobs' makespan <= an async submitit driver's (same run)",
                     f"{trial['ratio']:.3f}x against {driver['ratio']:.3f}x",
                     verdict(trial["ratio"] <= driver["ratio"])))  # fmt: skip
    if trial and array and "slurmctld_rpcs_per_trial" in trial:
        mine, theirs = trial["slurmctld_rpcs_per_trial"], array["slurmctld_rpcs_per_trial"]
        rows.append(("per-trial jobs' slurmctld RPCs per trial <= a submitit job array's (same run)",
                     f"{mine:.1f} against {theirs:.1f}", verdict(mine <= theirs)))  # fmt: skip
    if ray := by_mode.get("ray"):
        rows.append(("the Ray backend's first trial running <= 10 s after launch",
                     f"{ray['startup_s']:.1f} s", verdict(ray["startup_s"] <= 10)))  # fmt: skip
    if wide := dispatch.get("wide"):
        first = wide[0]
        lost, doubled = sum(r["lost"] for r in wide), sum(r["doubled"] for r in wide)
        rows.append((f"wide run (N={first['n']}, K={first['k']}, 16 nodes, {len(wide)} runs): no trial lost or doubled",
                     f"{lost} lost, {doubled} doubled", verdict(lost == doubled == 0)))  # fmt: skip
        peak = max(r["postgresql_connections_peak"] or 0 for r in wide)
        rows.append((f"PostgreSQL connections at most K + 8 = {first['k'] + 8} (wide run)",
                     f"{peak}", verdict(peak <= first["k"] + 8)))  # fmt: skip
    return rows


def _storage_rows(storage: Any) -> list[tuple[str, str, str]]:
    """The targets of storage: PostgreSQL with 64 workers."""
    rows: list[tuple[str, str, str]] = []
    cells = [c for c in storage if c["storage"] == "postgresql"]
    if cells:
        top = max(cells, key=lambda c: c["workers"])
        rows.append((f"PostgreSQL with 64 workers, no error (largest run: {top['workers']})",
                     f"{top['errors']} errors, {top['trials_per_s']:.1f} trials/s",
                     verdict(top["workers"] >= 64 and top["errors"] == 0)))  # fmt: skip
    return rows


def _efficiency_rows(efficiency: Any) -> list[tuple[str, str, str]]:
    """The targets of efficiency: TPE+ASHA against random, and the retrained best."""
    rows: list[tuple[str, str, str]] = []
    by_search = {r["search"]: r for r in efficiency["results"]}
    asha = by_search.get("tpe+asha")
    if asha and "random" in by_search:
        ratio = asha.get("ratio_to_random")
        rows.append((f"TPE+ASHA reaches random search's best with <= 1/3 of its compute (N={efficiency['n']})",
                     "never reached" if ratio is None else f"{ratio:.2f} x random's compute",
                     verdict(ratio is not None and ratio <= 1 / 3)))  # fmt: skip
    if retrained := efficiency.get("retrain"):
        gap = efficiency["published"] - retrained["test_accuracy"]
        rows.append((f"retrained best configuration against the published {efficiency['published']:.3f}",
                     f"{retrained['test_accuracy']:.4f} ({retrained['epochs']} epochs), gap {gap:+.4f}",
                     "stated"))  # fmt: skip
    return rows


def _replay_rows(replayed: Any) -> list[tuple[str, str, str]]:
    """The targets of replay: the shipped default on every task it was chosen with, on the held-out
    ones, and on each task that only checks the choice."""
    from bench.replay_table import CHECK_ONLY

    default = replayed["summary"]["strategies"].get("default", {})
    judged = [
        t for t in replayed["tasks"] if t not in replayed["summary"]["saturated"] and t not in CHECK_ONLY
    ]
    saturated = len(replayed["summary"]["saturated"])
    how = f"replay, {replayed['lookup']} lookup, medians of {replayed['seeds']} seeds"
    held_out = len(judged) - (replayed["chosen_on"] in judged)
    scopes = [
        ("every task", f"the worst of {len(judged)} judged, {saturated} saturated; {how}", default.get("worst")),
        ("the held-out tasks", f"the worst of {held_out} judged; {how}", default.get("worst_held_out")),
        *((task, f"it only checks the choice; {how}", default.get("per_task", {}).get(task)) for task in sorted(CHECK_ONLY)),
    ]  # fmt: skip
    rows: list[tuple[str, str, str]] = []
    for scope, note, figures in scopes:
        if not figures:
            continue
        ratio, beats = figures["compute_to_target"], figures["beats_random"]
        worst = " (the worst)" if "worst" in note else ""
        high = (
            figures["interval_high"]
            if "interval_high" in figures
            else (figures.get("interval") or {}).get("high", "-")
        )
        rows.append((f"the shipped default reaches random search's median best with <= 1/3 of its compute on {scope} ({note})",
                     "never reached" if ratio is None else f"{ratio:.2f} x random's compute",
                     verdict(ratio is not None and ratio <= 1 / 3)))  # fmt: skip
        if high != "-":  # replays since the intervals (a 90% bootstrap interval of each median)
            rows.append((f"the upper end of the shipped default's 90% interval is <= 0.40 x random's compute on {scope}{worst}",
                         "unbounded (never reached)" if high is None else f"{high:.2f} x random's compute",
                         verdict(high is not None and high <= 0.40)))  # fmt: skip
        rows.append((f"the shipped default beats random search at equal compute in >= 80% of seeds on {scope}{worst}",
                     "-" if beats is None else f"{beats:.0%} of seeds", verdict(beats is not None and beats >= 0.8)))  # fmt: skip
    return rows


TARGET_ROWS: dict[str, Callable[[Any], list[tuple[str, str, str]]]] = {
    "throughput": _throughput_rows,
    "dispatch": _dispatch_rows,
    "storage": _storage_rows,
    "efficiency": _efficiency_rows,
    "replay": _replay_rows,
}


def write_doc(out: Path, doc: Path) -> None:
    record_path = out / "run.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    runs: dict[str, dict[str, Any]] = record.get("benchmarks", {})
    names = [name for name in BENCHMARKS if (out / f"{name}.txt").exists()]
    lines = [
        "# Benchmarks",
        "",
        "Produced by `python -m bench` (`make bench`; `make bench-quick` for the short variant). Each",
        "benchmark runs all its sides in the same invocation; the figures below are its own printed",
        "output, with its JSON and figure in `bench/results/`. What the figures mean, misses",
        "included: [Benchmarks: what the figures mean](benchmarks-explained.md). Back to the",
        "[README](../README.md).",
        "",
        "## Targets",
        "",
        "| target | measured | |",
        "|---|---|---|",
        *(f"| {target} | {measured} | {met} |" for target, measured, met in targets(out)),
        "",
    ]
    for name in names:
        run_info = runs.get(name, {})
        how = "the quick variant" if run_info.get("quick") else "the full variant"
        lines += [f"## {name}", "", BENCHMARKS[name][3], "",
                  f"Ran {run_info.get('seconds', 0) / 60:.1f} min ({how}, {run_info.get('finished', '?')}) "
                  f"on {run_info.get('machine', '?')}.", "",
                  "```", (out / f"{name}.txt").read_text().rstrip(), "```", ""]  # fmt: skip
        figure = out / f"{name}.png"
        if figure.exists():
            lines += [f"![{name}]({os.path.relpath(figure, doc.parent)})", ""]
        if name == "throughput":
            lines += [GPU_REFERENCES, ""]
        notes = out / f"{name}-notes.md"  # what the figures of a full run mean, written by hand
        if notes.exists() and not run_info.get("quick"):
            lines += [notes.read_text().rstrip(), ""]
        if name == "replay" and (out / "replay-stopping-notes.md").exists():
            # bench/replay_stopping.py's figures (stop rules, warm start), run on their own.
            lines += [(out / "replay-stopping-notes.md").read_text().rstrip(), ""]
    gpu = out / "gpu.json"
    if gpu.exists() and not json.loads(gpu.read_text()).get("rehearsal_on_cpu"):
        lines += ["## gpu", "", "`python -m bench gpu` (`make gpu-check`) on a GPU node: every GPU path, "
                  "the ResNet-50 images/s against the published figures, trials per GPU-hour packed "
                  "k = 1, 2, 4 per GPU.", "", "```", (out / "gpu.txt").read_text().rstrip(), "```", ""]  # fmt: skip
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(lines))


def gpu_check(out: Path, doc: Path) -> int:
    """``python -m bench gpu``: bench/gpu.py, its output kept for the doc where a GPU ran it."""
    out.mkdir(parents=True, exist_ok=True)
    result = out / "gpu.json"
    before = result.stat().st_mtime if result.exists() else None
    command = [sys.executable, "-m", "bench.gpu", "--json", str(result)]
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    sys.stdout.write(proc.stdout)
    if result.exists() and result.stat().st_mtime != before:  # a GPU was there: keep its output
        (out / "gpu.txt").write_text(proc.stdout)
        write_doc(out, doc)
    return proc.returncode


def record_run(out: Path, name: str, quick: bool, seconds: float) -> None:
    """Adds this benchmark's run to ``run.json``, keeping the others' latest."""
    path = out / "run.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    record.setdefault("benchmarks", {})[name] = {
        "quick": quick,
        "seconds": round(seconds, 1),
        "finished": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
    }
    path.write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("which", nargs="+", choices=["all", "doc", "gpu", *BENCHMARKS],
                        help="all, some of them, doc (rewrite the doc only), or gpu (the GPU check, "
                             "on a GPU node; not part of all)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="the short variant of each")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results", help="where outputs go")
    parser.add_argument("--doc", type=Path, default=REPO / "docs/benchmarks.md", help="the doc to rewrite")
    args = parser.parse_args(argv)
    if args.which == ["gpu"]:
        return gpu_check(args.out, args.doc)
    names = list(BENCHMARKS) if "all" in args.which else [n for n in BENCHMARKS if n in args.which]
    if not names:  # `doc` alone
        write_doc(args.out, args.doc)
        print(f"{args.doc} rewritten from {args.out}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    failed = []
    for name in names:
        code, seconds = run(name, args.quick, args.out)
        timings[name] = seconds
        if code != 0:
            failed.append(name)
            continue
        from bench.plots import draw  # matplotlib: only once there is something to draw

        draw(name, args.out / f"{name}.json", args.out / f"{name}.png")
        record_run(args.out, name, args.quick, seconds)
    write_doc(args.out, args.doc)
    total = sum(timings.values())
    print(f"\n{len(names)} benchmarks in {total / 60:.1f} min; {args.doc} rewritten"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
