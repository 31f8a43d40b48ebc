"""Slurm's SchedulerParameters against dispatch overhead: ``bench.dispatch --quick`` (N=8 trials of
t=10 s at K=4) on the fault cluster, once per setting, the settings alternating round by round.

Each variant is written into the fault cluster's ``/etc/slurm-faults/slurm.conf`` (a
``SchedulerParameters=`` line after ``SchedulerType``, or none for Slurm's defaults), applied with
``scontrol reconfigure`` and checked in ``scontrol show config``; then the dispatch modes run in a
child process with ``SLURM_CONF`` pointing at that cluster, so its jobs go to partition ``faults``
(nodes f1 and f2, 4 CPU slots, as the local cluster's ``debug``). The local cluster, and the tests
running on it, are not touched. The variants alternate (A B C D A B C D ...) for ``--repeats``
rounds, so that the machine's load drifts over each alike.

The child is this module's ``--measure``, which calls ``bench.dispatch.run_mode`` for each mode:
``python -m bench.dispatch`` itself cannot run there, since it starts with ``up.sh``, which, run
with ``SLURM_CONF`` at the fault cluster, would register ``localcluster`` and its QoS in the fault
cluster's accounting database, wait 60 s for nodes n1 to n3 that are not there and fail, and whose
last step (``faults.sh``) rewrites a changed ``/etc/slurm-faults/slurm.conf`` from its template and
restarts the fault cluster's daemons, undoing the setting under test.

While it runs it holds the fault tests' lock (``/tmp/hpo-test-locks/fault-cluster.lock``, taken
exclusively, through its turnstile, as ``tests/conftest.py`` does), so a fault test waits for it and
it waits for a fault test; and, for each measurement (about a minute), up.sh's own lock
(``/run/lock/hpo-local-cluster-up.lock``), since a test worker starting runs up.sh, whose
``faults.sh`` would put the template's file back and restart the fault cluster mid-measurement (a run
disturbed anyway is reported and left out of the medians). On the way out, error and Ctrl-C included, the file gets its original
bytes back and ``scontrol reconfigure`` runs again, so that ``faults.sh`` finds it unchanged.

    python -m bench.scheduler_settings                               # 5 variants x 2 rounds: ~25 min
    python -m bench.scheduler_settings --repeats 3 --modes per-trial
    python -m bench.scheduler_settings --variants default,batch_sched_delay=0
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FAULTS_CONF = Path("/etc/slurm-faults/slurm.conf")
FAULTS_SLURMCTLD_PID = Path("/run/slurm-faults/slurmctld.pid")
FAULT_NODES = ("f1", "f2")
PARTITION = "faults"
LOCKS = Path(tempfile.gettempdir()) / "hpo-test-locks"
LOCK_NAME = "fault-cluster"
UP_LOCK = Path("/run/lock/hpo-local-cluster-up.lock")  # up.sh's own, one run at a time
STORAGE_URL = (
    "postgresql://hpo@127.0.0.1:5432/hpo"  # the local cluster's PostgreSQL (deploy/local-cluster/lib.sh)
)
RESULTS = REPO / "bench/results/scheduler_settings.json"
JOB_PREFIX = "hpo-bench-dispatch-"  # bench.dispatch's study names, hence its job names

# bench.dispatch --quick
N_TRIALS, CONCURRENCY, SECONDS = 8, 4, 10.0

# name -> the value of SchedulerParameters ("" for no line: Slurm's defaults). Slurm 22.05's
# defaults (man slurm.conf): batch_sched_delay=3 s, sched_min_interval=2 us, sched_interval=60 s,
# bf_interval=30 s (a SchedulerParameters option, not a line of its own), no defer.
VARIANTS: dict[str, str] = {
    "default": "",
    "batch_sched_delay=0": "batch_sched_delay=0",
    # Already 2 us by default: the man page's "0 disables throttling" changes next to nothing, so
    # this one doubles as a check of the noise between two near-identical settings.
    "sched_min_interval=0": "sched_min_interval=0",
    # The other way: no scheduling attempt at submit time (what a busy site may set).
    "defer": "defer",
    # For short jobs: no batching delay, the main loop over the whole queue every 5 s, backfill
    # every 1 s (each of them cheap with a handful of jobs and nodes).
    "fast": "batch_sched_delay=0,sched_min_interval=0,sched_interval=5,bf_interval=1",
}
DEFAULT_VARIANTS = ("default", "batch_sched_delay=0", "sched_min_interval=0", "defer", "fast")


def log(line: str) -> None:
    print(f"[scheduler_settings] {line}", file=sys.stderr, flush=True)


def slurm(*args: str, timeout: float = 60, check: bool = True) -> str:
    """A Slurm command on the fault cluster (``SLURM_CONF`` is set in this process's environment)."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


# ---- the lock, the file, the controller ----------------------------------------------------------


@contextlib.contextmanager
def fault_cluster_lock() -> Iterator[None]:
    """The fault tests' lock, held alone, entered through its turnstile (``tests/conftest.py``'s
    ``shared_lock``). Python opens files close-on-exec: no child inherits it."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    with (
        open(LOCKS / f"{LOCK_NAME}.turnstile", "a") as turnstile,
        open(LOCKS / f"{LOCK_NAME}.lock", "a") as lock,
    ):
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for {LOCKS / LOCK_NAME}.lock (a fault test holds it)")
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
            finally:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def flocked(path: Path, what: str) -> Iterator[None]:
    """An exclusive flock on ``path`` (as ``flock(1)`` takes it), for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for {what}: {path}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def with_variant(original: str, value: str) -> str:
    """``original`` without its SchedulerParameters lines, plus ``SchedulerParameters=value`` (when
    not empty) after the SchedulerType line."""
    lines = [
        line for line in original.splitlines(keepends=True) if not line.startswith("SchedulerParameters=")
    ]
    if value:
        at = next(i for i, line in enumerate(lines) if line.startswith("SchedulerType="))
        lines.insert(at + 1, f"SchedulerParameters={value}\n")
    return "".join(lines)


def write_conf(content: bytes, mode: int) -> None:
    """Replaces the file at once (as faults.sh's update_file does): a reader never sees half of it."""
    partial = FAULTS_CONF.with_name(f"{FAULTS_CONF.name}.bench-{os.getpid()}")
    partial.write_bytes(content)
    os.chmod(partial, mode)
    os.replace(partial, FAULTS_CONF)


def shown_parameters() -> str:
    """SchedulerParameters as the fault cluster's slurmctld has it now ("" for none)."""
    match = re.search(r"^SchedulerParameters\s*=\s*(.*)$", slurm("scontrol", "show", "config"), re.M)
    value = match.group(1).strip() if match else ""
    return "" if value == "(null)" else value


def reconfigure(expected: str, timeout: float = 60) -> float:
    """``scontrol reconfigure``, then waits until ``scontrol show config`` shows ``expected``;
    how long that took."""
    started = time.monotonic()
    slurm("scontrol", "reconfigure")
    while (shown := shown_parameters()) != expected:
        if time.monotonic() - started > timeout:
            raise RuntimeError(
                f"SchedulerParameters still {shown!r}, not {expected!r}, {timeout:.0f} s after reconfigure"
            )
        time.sleep(0.5)
    return time.monotonic() - started


def controller_pid() -> str:
    try:
        return FAULTS_SLURMCTLD_PID.read_text().strip()
    except OSError:
        return ""


def wait_until_idle(timeout: float = 120) -> None:
    """No job left in the fault cluster's queue and both nodes idle: each run starts alike."""
    deadline = time.monotonic() + timeout
    while True:
        queue = slurm("squeue", "-h", "-o", "%i").split()
        states = dict(
            line.split() for line in slurm("sinfo", "-h", "-N", "-o", "%N %t").splitlines() if line.strip()
        )
        if not queue and all(states.get(node) == "idle" for node in FAULT_NODES):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"fault cluster not idle after {timeout:.0f} s: jobs {queue}, nodes {states}")
        time.sleep(1)


def cancel_leftovers() -> list[str]:
    """Cancels this benchmark's jobs left on the fault cluster (a run stopped midway)."""
    jobs = [line.split(None, 1) for line in slurm("squeue", "-h", "-o", "%i %j", check=False).splitlines()]
    ids = [job[0] for job in jobs if len(job) == 2 and job[1].startswith(JOB_PREFIX)]
    if ids:
        slurm("scancel", *ids, check=False)
    return ids


@dataclasses.dataclass
class Job:
    """One of this benchmark's jobs as the fault cluster's sacct has it."""

    id: str
    name: str
    partition: str
    submit: str
    start: str

    def submit_to_start(self) -> float | None:
        """Slurm's own share of a trial's dispatch: submitted to started (whole seconds)."""
        try:
            return (datetime.fromisoformat(self.start) - datetime.fromisoformat(self.submit)).total_seconds()
        except ValueError:  # Unknown, None: never started
            return None


def bench_jobs(since: str) -> list[Job]:
    """This benchmark's jobs on the fault cluster since ``since``."""
    fields = "JobID,JobName,Partition,Submit,Start"
    out = slurm("sacct", "-X", "-n", "-P", "-S", since, "-E", "now", "-o", fields)
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == fields.count(",")]
    return [Job(*row) for row in rows if row[1].startswith(JOB_PREFIX)]


def submit_to_start(jobs: list[Job], modes: list[str]) -> dict[str, dict[str, float]]:
    """Per mode, the median and the largest submitted-to-started time of its jobs."""
    summary = {}
    for mode in modes:
        waits = [
            w
            for job in jobs
            if job.name.startswith(f"{JOB_PREFIX}{mode}-") and (w := job.submit_to_start()) is not None
        ]
        if waits:
            summary[mode] = {"median": statistics.median(waits), "max": max(waits), "jobs": len(waits)}
    return summary


def local_cluster_job_names(since: str) -> set[str]:
    """The job names seen on the local cluster since ``since`` (SLURM_CONF dropped)."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    proc = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-a", "-S", since, "-E", "now", "-o", "JobName"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    return {line.strip() for line in proc.stdout.splitlines() if line.strip()}


# ---- one measurement: the child --------------------------------------------------------------------


def measure(modes: list[str], storage_url: str, out: Path) -> int:
    """``bench.dispatch --quick`` without its up.sh (see the module's docstring): each mode's
    ``run_mode`` on the cluster of ``SLURM_CONF``, the same JSON document as its ``--json``."""
    from bench import dispatch
    from bench.dispatch_study import result_line

    assert os.environ.get("SLURM_CONF") == str(FAULTS_CONF), "run by the parent, SLURM_CONF set"
    results = []
    with tempfile.TemporaryDirectory(prefix="hpo-bench-sched-") as tmp:
        for mode in modes:
            result = dispatch.run_mode(mode, Path(tmp), storage_url, N_TRIALS, CONCURRENCY, SECONDS)
            results.append(result)
            print(result_line(mode, result), flush=True)
    document = {"n": N_TRIALS, "k": CONCURRENCY, "t": SECONDS, "results": results, "wide": []}
    out.write_text(json.dumps(document, indent=2) + "\n")
    return 0


def run_child(modes: list[str], storage_url: str, timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(prefix="hpo-bench-sched-", suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    try:
        command = [sys.executable, "-m", "bench.scheduler_settings", "--measure", "--modes", ",".join(modes)]
        command += ["--storage", storage_url, "--json", str(out)]
        proc = subprocess.run(command, cwd=REPO, env=dict(os.environ), timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"the measurement exited {proc.returncode}")
        document: dict[str, Any] = json.loads(out.read_text())
        return document
    finally:
        out.unlink(missing_ok=True)


# ---- the rounds --------------------------------------------------------------------------------------


def run_rounds(args: argparse.Namespace, variants: list[str], modes: list[str]) -> dict[str, Any]:
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S")
    log("faults.sh: the fault cluster up, its slurm.conf as rendered from faults.conf.in")
    with flocked(UP_LOCK, "up.sh's lock (an up.sh is running)"):
        up = subprocess.run(
            ["bash", str(REPO / "deploy/local-cluster/faults.sh")],
            capture_output=True,
            text=True,
            timeout=300,
        )
    if up.returncode != 0:
        raise RuntimeError(f"faults.sh failed:\n{up.stderr[-2000:]}")
    check = subprocess.run(["psql", "-X", "-w", "-A", "-t", args.storage, "-c", "select 1"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    if check.stdout.strip() != "1":
        raise RuntimeError(
            f"PostgreSQL at {args.storage}: {check.stderr.strip()} (run deploy/local-cluster/up.sh)"
        )

    original = FAULTS_CONF.read_bytes()
    mode_bits = FAULTS_CONF.stat().st_mode & 0o7777
    original_parameters = shown_parameters()
    written = {original}
    runs: list[dict[str, Any]] = []
    restored = "no change made"
    try:
        for round_ in range(args.repeats):
            for name in variants:
                content = with_variant(original.decode(), VARIANTS[name]).encode()
                written.add(content)
                # No up.sh (the test suite's, at each worker's start) may run faults.sh meanwhile:
                # it would rewrite the file from its template and restart the fault cluster.
                with flocked(UP_LOCK, "up.sh's lock (an up.sh is running)"):
                    runs.append(measure_variant(args, name, round_ + 1, content, mode_bits, modes))
    finally:
        restored = restore(original, written, mode_bits, original_parameters)
    names = {name for run in runs for name in run.get("job_names", [])}
    on_local = sorted(names & local_cluster_job_names(started_at))
    return {"runs": runs, "restored": restored, "local_cluster_jobs_of_this_run": on_local}


def measure_variant(
    args: argparse.Namespace, name: str, round_: int, content: bytes, mode_bits: int, modes: list[str]
) -> dict[str, Any]:
    """Writes variant ``name`` (``content``), applies it, runs the modes; the run's record."""
    value = VARIANTS[name]
    write_conf(content, mode_bits)
    took = reconfigure(value)
    wait_until_idle()
    pid = controller_pid()
    log(f"round {round_}/{args.repeats}, {name} ({value or 'no SchedulerParameters'}), "
        f"in effect {took:.1f} s after reconfigure")  # fmt: skip
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    run: dict[str, Any] = {
        "round": round_,
        "variant": name,
        "parameters": value,
        "load_before": os.getloadavg(),
    }
    try:
        run["dispatch"] = run_child(modes, args.storage, args.child_timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        run["error"] = str(err)
        log(f"{name}, round {round_}: {err}")
        cancel_leftovers()
    run["load_after"] = os.getloadavg()
    # Disturbed: the file rewritten or slurmctld restarted under the run (faults.sh run by someone
    # not taking up.sh's lock): the run did not measure the setting.
    disturbed = []
    if FAULTS_CONF.read_bytes() != content:
        disturbed.append("slurm.conf rewritten during the run")
    if controller_pid() != pid:
        disturbed.append("slurmctld restarted during the run")
    if shown_parameters() != value:
        disturbed.append("SchedulerParameters changed during the run")
    run["disturbed"] = disturbed
    jobs = bench_jobs(since)
    run["jobs"] = len(jobs)
    run["partitions"] = sorted({job.partition for job in jobs})
    run["job_names"] = sorted({job.name for job in jobs})
    run["slurm_submit_to_start_s"] = submit_to_start(jobs, modes)
    if run["partitions"] != [PARTITION]:
        run.setdefault("error", f"jobs in partitions {run['partitions']}, not only {PARTITION}")
    return run


def restore(original: bytes, written: set[bytes], mode_bits: int, parameters: str) -> str:
    """The file's original bytes back, unless someone else (faults.sh, from a template changed
    meanwhile) wrote it since: theirs is then the newer, and is left. Under up.sh's lock, so that
    no faults.sh is restarting the cluster meanwhile."""
    for attempt in range(1, 4):
        try:
            with flocked(UP_LOCK, "up.sh's lock (an up.sh is running)"):
                left = cancel_leftovers()
                if left:
                    log(f"cancelled leftover jobs {' '.join(left)}")
                current = FAULTS_CONF.read_bytes()
                if current == original:
                    how = "unchanged"
                elif current in written:
                    write_conf(original, mode_bits)
                    how = "restored to its original bytes"
                else:
                    log(f"{FAULTS_CONF} was rewritten by someone else meanwhile: left as it is")
                    return "rewritten by someone else meanwhile, left as it is"
                reconfigure(parameters)
            log(
                f"{FAULTS_CONF} {how}; scontrol reconfigure done, SchedulerParameters {parameters or '(null)'}"
            )
            return how
        except KeyboardInterrupt:  # a second Ctrl-C: restore anyway
            log(f"interrupted while restoring {FAULTS_CONF}: trying again ({attempt}/3)")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
            log(f"restoring {FAULTS_CONF}: {err}; trying again in 5 s ({attempt}/3)")
            time.sleep(5)
    return "restore interrupted"


# ---- the table -----------------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]], variants: list[str], modes: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in variants:
        for mode in modes:
            ratios: list[float] = []
            running: list[float] = []
            gaps: list[float] = []
            waits: list[float] = []
            for run in runs:
                if run["variant"] != name or "dispatch" not in run or run["disturbed"] or "error" in run:
                    continue
                result = next((r for r in run["dispatch"]["results"] if r["mode"] == mode), None)
                if result is None:
                    continue
                ratios.append(result["ratio"])
                if result.get("asked_to_running_s"):
                    running.append(result["asked_to_running_s"]["median"])
                if result.get("told_to_next_asked_s"):
                    gaps.append(result["told_to_next_asked_s"]["median"])
                if mode in run.get("slurm_submit_to_start_s", {}):
                    waits.append(run["slurm_submit_to_start_s"][mode]["median"])
            rows.append({
                "variant": name, "mode": mode, "parameters": VARIANTS[name], "ratios": ratios,
                "median": round(statistics.median(ratios), 3) if ratios else None,
                "asked_to_running_median_s": round(statistics.median(running), 3) if running else None,
                "told_to_next_asked_median_s": round(statistics.median(gaps), 3) if gaps else None,
                "slurm_submit_to_start_median_s": round(statistics.median(waits), 3) if waits else None,
            })  # fmt: skip
    for row in rows:
        base = next(r for r in rows if r["variant"] == "default" and r["mode"] == row["mode"])
        row["vs_default"] = (
            round(row["median"] / base["median"], 3) if row["median"] and base.get("median") else None
        )
    return rows


def table(rows: list[dict[str, Any]], repeats: int) -> str:
    def num(value: float | None, fmt: str, unit: str = "") -> str:
        return "-" if value is None else format(value, fmt) + unit

    header = (
        f"{'variant':<21} {'mode':<10} {'makespan/ideal per repeat':<26} {'median':>7} {'/default':>9}"
        f" {'asked->running':>15} {'told->next asked':>17} {'Slurm submit->start':>20}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        each = " ".join(f"{r:.3f}" for r in row["ratios"]) + (
            f" ({len(row['ratios'])} of {repeats})" if len(row["ratios"]) < repeats else ""
        )
        lines.append(
            f"{row['variant']:<21} {row['mode']:<10} {each:<26} {num(row['median'], '.3f'):>7}"
            f" {num(row['vs_default'], '.3f'):>9} {num(row['asked_to_running_median_s'], '.2f', ' s'):>15}"
            f" {num(row['told_to_next_asked_median_s'], '.2f', ' s'):>17}"
            f" {num(row['slurm_submit_to_start_median_s'], '.1f', ' s'):>20}"
        )
    return "\n".join(lines)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=2, help="rounds over all the variants (default 2)")
    parser.add_argument(
        "--modes", default="per-trial,workers", help="bench.dispatch's modes, comma-separated"
    )
    parser.add_argument(
        "--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--storage", default=STORAGE_URL, help="the studies' database (the local cluster's)")
    parser.add_argument("--json", type=Path, default=RESULTS, help="where the results go")
    parser.add_argument("--child-timeout", type=float, default=900, help="seconds for one measurement")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    os.environ["SLURM_CONF"] = str(FAULTS_CONF)  # for this process and every child
    if args.measure:
        return measure(modes, args.storage, args.json)

    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or "default" not in variants:
        parser.error(f"variants must include default and be among {', '.join(VARIANTS)}; unknown: {unknown}")
    if os.geteuid() != 0:
        parser.error("run as root: it rewrites /etc/slurm-faults/slurm.conf")
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    started = time.monotonic()
    print(
        f"scheduler settings: bench.dispatch --quick (N={N_TRIALS}, t={SECONDS:g} s, K={CONCURRENCY}, ideal "
        f"{N_TRIALS * SECONDS / CONCURRENCY:.0f} s) on the fault cluster (partition {PARTITION}), modes "
        f"{', '.join(modes)}, {len(variants)} variants x {args.repeats} rounds",
        flush=True,
    )
    with fault_cluster_lock():
        outcome = run_rounds(args, variants, modes)
    rows = summarize(outcome["runs"], variants, modes)
    print(table(rows, args.repeats))
    failed = [r for r in outcome["runs"] if "error" in r or r["disturbed"]]
    for run in failed:
        print(
            f"left out: {run['variant']}, round {run['round']}: {run.get('error') or '; '.join(run['disturbed'])}"
        )
    print(f"{FAULTS_CONF}: {outcome['restored']}; jobs in partitions "
          f"{sorted({p for r in outcome['runs'] for p in r.get('partitions', [])})}; this run's job names on the "
          f"local cluster: {outcome['local_cluster_jobs_of_this_run'] or 'none'}")  # fmt: skip
    write_results(args, variants, modes, rows, outcome, started)
    return 1 if failed or outcome["restored"] == "restore interrupted" else 0


def write_results(
    args: argparse.Namespace,
    variants: list[str],
    modes: list[str],
    rows: list[dict[str, Any]],
    outcome: dict[str, Any],
    started: float,
) -> None:
    document = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "slurm": slurm("sinfo", "--version").strip(),
        "cluster": "fault cluster (SLURM_CONF=/etc/slurm-faults/slurm.conf), partition faults, 2 nodes x 2 CPUs",
        "n": N_TRIALS, "k": CONCURRENCY, "t": SECONDS, "modes": modes, "repeats": args.repeats,
        "variants": {name: VARIANTS[name] for name in variants},
        "minutes": round((time.monotonic() - started) / 60, 1),
        "summary": rows,
        **outcome,
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(f"written {args.json.relative_to(REPO) if args.json.is_relative_to(REPO) else args.json}")


if __name__ == "__main__":
    raise SystemExit(main())
