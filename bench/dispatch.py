"""Dispatch overhead on the real local Slurm cluster: makespan against the ideal N*t/K.

N trials of a fixed-duration dummy objective (t seconds, no training, no pruning) run at
concurrency K, through `hpo launch`'s three ways side by side in one run:

- per-trial jobs: one Slurm job per trial, up to K in flight, the next submitted as one ends;
- workers: K long-running worker jobs (one job array) pulling trials from the study;
- the Ray backend: one Slurm job over both nodes holding a Ray cluster, Tune running the trials
  (its makespan includes starting the cluster);

and beside them the two ways a study is written by hand with submitit (``bench/dispatch_peers.py``):
a job array whose tasks ask and tell, and an async ask-and-tell driver, one job per trial.

For each it prints the makespan, its ratio to the ideal N*t/K (target: at most 1.15), what it cost
Slurm's daemons (slurmctld RPCs from ``sdiag`` and slurmdbd's sacct queries from ``sacctmgr show
stats``, both reset before each mode: per trial and per minute, ``bench/scheduler_load.py``), and
the per-trial dispatch latencies from the timestamps stored on the trials: asked -> running (the
trial process has started and attached) and finished -> told (result stored), plus the gap between
one trial being told and the next being asked.

    python -m bench.dispatch            # N=16, K=4, t=30 s: about 7 minutes
    python -m bench.dispatch --quick    # N=8,  K=4, t=10 s
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import dispatch_peers, dispatch_wide, scheduler_load
from bench.dispatch_study import result_line, study_file
from hpo.config import load_study
from hpo.dispatch.backends import LaunchOptions, launch
from hpo.dispatch.ray.allocation import run_on_ray
from hpo.storage import resolve_storage
from hpo.trial.objective import FixedDurationObjective

REPO = Path(__file__).resolve().parents[1]


def run_mode(mode: str, folder: Path, storage_url: str, n: int, k: int, seconds: float) -> dict[str, Any]:
    import optuna

    name = f"bench-dispatch-{mode}-{uuid.uuid4().hex[:6]}"
    scheduler_load.reset()
    started, launched_at = time.monotonic(), time.time()
    _run_study(mode, folder, storage_url, name, n, k, seconds)
    makespan = time.monotonic() - started
    _let_the_last_jobs_leave()
    load = scheduler_load.read()
    trials = optuna.load_study(study_name=name, storage=storage_url).get_trials(deepcopy=False)
    trials = [t for t in trials if not t.user_attrs.get("surplus")]
    assert len(trials) == n and all(t.state.name == "COMPLETE" for t in trials), [t.state for t in trials]
    ideal = n * seconds / k
    timings = _latencies(mode, trials, k)
    # Ray: when the first trial began running (finished minus its own run time) is what starting
    # the cluster inside the job cost; the rest is Tune's scheduling.
    first_run = timings.pop("first_run")
    job_started = _ray_job_started(folder / name, trials) if mode == "ray" else None
    return {
        "mode": mode,
        "makespan_s": round(makespan, 2),
        "ideal_s": round(ideal, 2),
        "ratio": round(makespan / ideal, 3),
        **timings,
        "startup_s": round(first_run - launched_at, 2),
        # Ray: the same from its job's start, without the launcher's checks and Slurm's scheduling.
        **({"startup_in_job_s": round(first_run - job_started, 2)} if job_started else {}),
        "after_startup_ratio": round((makespan - (first_run - launched_at)) / ideal, 3),
        **load.summary(n, makespan / 60),
    }


def _run_study(mode: str, folder: Path, storage_url: str, name: str, n: int, k: int, seconds: float) -> None:
    """The study of ``n`` trials of ``seconds`` each at ``k`` at once, run the ``mode``'s way."""
    if mode in PEERS:
        PEERS[mode](storage_url, name, n, k, seconds, folder / name)
        return
    spec = load_study(study_file(folder, name, n, k, ray=mode == "ray"))
    storage = resolve_storage(spec, storage_url, spec.source)
    objective = FixedDurationObjective(seconds)
    if mode == "ray":
        run_on_ray(spec, storage, "slurm", objective=objective, log=lambda line: None)
    else:
        options = LaunchOptions(
            executor="slurm",
            workers=k if mode == "workers" else None,
            objective=objective,
            progress=False,
        )
        launch(spec, storage, options, log=lambda line: None)


def _latencies(mode: str, trials: list[Any], k: int) -> dict[str, Any]:
    """The dispatch latencies from the trials' stamps: asked to running, finished to told, told to
    the next asked; and ``first_run``, when the first trial began running."""

    def stamp(trial: Any, key: str) -> float:
        return datetime.fromisoformat(trial.user_attrs[key]).timestamp()

    def asked_at(trial: Any) -> float:
        return float(trial.datetime_start.timestamp())

    def told_at(trial: Any) -> float:
        return float(trial.datetime_complete.timestamp())

    def running_from(trial: Any) -> float:
        if mode == "ray":  # Ray's searcher marks a trial started when Tune asks for it
            return stamp(trial, "finished_at") - float(trial.user_attrs.get("elapsed_s", 0.0))
        return stamp(trial, "started_at")

    # A job array's task asks its own trial once running: no dispatch latency to measure per trial.
    to_running = [running_from(t) - asked_at(t) for t in trials] if mode != "submitit-array" else []
    to_told = [told_at(t) - stamp(t, "finished_at") for t in trials]
    # In per-trial mode, a slot is reused when the launcher asks the next trial.
    told = sorted(told_at(t) for t in trials)
    asked = sorted(asked_at(t) for t in trials)[k:]
    gaps = [a - c for a, c in zip(asked, told, strict=False)]
    return {
        "breakdown_s": _breakdown(trials) if mode in ("per-trial", "submitit-async") else None,
        "asked_to_running_s": _summary(to_running) if to_running else None,
        "finished_to_told_s": _summary(to_told),
        "told_to_next_asked_s": _summary(gaps) if mode in ("per-trial", "ray", "submitit-async") else None,
        "first_run": min(running_from(t) for t in trials),
    }


def _ray_job_started(workdir: Path, trials: list[Any]) -> float | None:
    """When the Ray job's head task began (submitit's first line in its log), or None if unread."""
    job_id = trials[0].user_attrs.get("job_id")
    log = workdir / "jobs" / str(job_id) / f"{job_id}_0_log.out"
    try:
        first = log.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    found = re.search(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\)", first)
    if not found:
        return None
    return datetime.fromisoformat(f"{found.group(1)}.{found.group(2)}").timestamp()


BREAKDOWN = (
    ("submission", "asked", "submitted"),
    ("Slurm start", "submitted", "process"),
    ("Python start", "process", "called"),
    ("storage connection", "called", "connected"),
    ("attach", "connected", "running"),
)
"""Where a trial's seconds go between its ask and its run, stamp to stamp: the launcher's
submission (sbatch returned), Slurm's start of the job (its process began: scheduling, the node's
launch), the job's Python start (imports, the pickle), opening the study, attaching to the trial
(and writing where it runs). The async driver's job opens no study: its last two are absent."""


def _breakdown(trials: list[Any]) -> dict[str, dict[str, float]]:
    """Each step of :data:`BREAKDOWN` over the trials (median, p90, max), and the first report's
    own time (the value stored and the pruner asked)."""

    def stamps(trial: Any) -> dict[str, float]:
        attrs = trial.user_attrs
        found = {"asked": trial.datetime_start.timestamp()}
        for key, attr in (("submitted", "submitted_at"), ("running", "started_at")):
            if attr in attrs:
                found[key] = datetime.fromisoformat(attrs[attr]).timestamp()
        for key, value in dict(attrs.get("job_startup") or {}).items():
            if value:
                found[key] = datetime.fromisoformat(value).timestamp()
        return found

    per_trial = [stamps(t) for t in trials]
    steps = {}
    for name, start, end in BREAKDOWN:
        values = [s[end] - s[start] for s in per_trial if start in s and end in s]
        if values:
            steps[name] = _summary(values)
    reports = [float(t.user_attrs["first_report_s"]) for t in trials if "first_report_s" in t.user_attrs]
    if reports:
        steps["first report"] = _summary(reports)
    return steps


PEERS = {"submitit-array": dispatch_peers.run_array, "submitit-async": dispatch_peers.run_async}
MODES = ("per-trial", "workers", "ray", *PEERS)


def _let_the_last_jobs_leave(seconds: float = 5.0) -> None:
    """The jobs' last RPCs (batch completion, epilog) come a moment after the study ends; waited
    for without asking slurmctld, whose RPCs are what is being counted."""
    time.sleep(seconds)


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 3),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "max": round(ordered[-1], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=16, help="N")
    parser.add_argument("--concurrency", type=int, default=4, help="K (the local cluster has 4 CPU slots)")
    parser.add_argument("--seconds", type=float, default=30.0, help="t, the duration of one trial")
    parser.add_argument("--quick", action="store_true", help="N=8, t=10 s")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated subset of {','.join(MODES)}; none: the wide run only",
    )
    parser.add_argument("--wide-trials", type=int, default=256, help="N of the wide run (0: no wide run)")
    parser.add_argument("--wide-concurrency", type=int, default=64, help="K of the wide run")
    parser.add_argument("--wide-seconds", type=float, default=60.0, help="t of the wide run")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.seconds, args.wide_trials = 8, 10.0, 0
    up = subprocess.run(["bash", str(REPO / "deploy/local-cluster/up.sh")], capture_output=True, text=True)
    if up.returncode != 0:
        print(up.stderr[-2000:], file=sys.stderr)
        return 1
    storage_url = up.stdout.strip().splitlines()[-1]
    n, k, t = args.trials, args.concurrency, args.seconds
    print(f"dispatch benchmark: N={n} trials of t={t:g} s at K={k}, ideal makespan N*t/K = {n * t / k:.1f} s")
    results = []
    with tempfile.TemporaryDirectory(prefix="hpo-bench-") as tmp:
        for mode in [m for m in args.modes.split(",") if m and m != "none"]:
            result = run_mode(mode, Path(tmp), storage_url, n, k, t)
            results.append(result)
            print(result_line(mode, result))
    _print_comparisons(results)

    wide = run_wide_runs(storage_url, args.wide_trials, args.wide_concurrency, args.wide_seconds)
    if args.json:
        document = {"n": n, "k": k, "t": t, "results": results, "wide": wide}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


def _print_comparisons(results: list[dict[str, Any]]) -> None:
    """Each mode's slurmctld RPCs by type, and the makespans of the modes against each other."""
    by_mode = {result["mode"]: result["makespan_s"] for result in results}
    for result in results:
        top = ", ".join(f"{kind} {count}" for kind, count in list(result["slurmctld_by_type"].items())[:6])
        print(f"{result['mode']:>14} slurmctld RPCs by type: {top}")
    pairs = (("per-trial", "submitit-async"), ("per-trial", "workers"), ("workers", "submitit-array"),
             ("ray", "per-trial"), ("ray", "workers"))  # fmt: skip
    for a, b in pairs:
        if a in by_mode and b in by_mode:
            print(f"makespan ratio {a} / {b}: {by_mode[a] / by_mode[b]:.3f}")


def run_wide_runs(storage_url: str, n: int, k: int, t: float) -> list[dict[str, Any]]:
    """The wide run (``bench/dispatch_wide.py``) for both ways and both storages."""
    if n <= 0:
        return []
    print(
        f"wide run: N={n} trials of t={t:g} s at K={k} over the 16 nodes of partition wide, ideal {n * t / k:.0f} s"
    )
    dispatch_wide.wide_nodes("up")
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="hpo-bench-wide-") as tmp:
            for mode in ("per-trial", "workers"):
                for url in (storage_url, None):
                    r = dispatch_wide.run_wide(mode, url, Path(tmp), n, k, t)
                    runs.append(r)
                    connections = r["postgresql_connections_peak"]
                    print(
                        f"{mode:>9} on {r['storage']:>10}: {r['trials']} trials, lost {r['lost']}, doubled {r['doubled']}, "
                        f"{r['jobs']} Slurm jobs (expected {r['jobs_expected']}); makespan {r['makespan_s']:.0f} s = "
                        f"{r['ratio']:.3f} x ideal; launcher {r['launcher_cpu_s']:.0f} CPU-s, peak {r['launcher_peak_rss_mb']:.0f} MB; "
                        + (
                            f"PostgreSQL connections at most {connections}; "
                            if connections is not None
                            else ""
                        )
                        + f"{r['sbatch_per_min']:.1f} sbatch/min, {r['slurmctld_rpcs_per_min']:.0f} slurmctld RPCs/min "
                        f"({r['slurmctld_rpcs_per_trial']:.1f} per trial), {r['sacct_queries_per_trial']:.2f} sacct queries per trial"
                    )
    finally:
        dispatch_wide.wide_nodes("down")
    return runs


if __name__ == "__main__":
    raise SystemExit(main())
