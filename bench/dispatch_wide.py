"""The wide dispatch run: K=64 trials in flight over the 16 emulated nodes of the local cluster's
partition ``wide`` (``deploy/local-cluster/wide.sh``), N=256 short trials, per-trial jobs and
``--workers``, on PostgreSQL and on the journal. What it measures, per run: trials lost or
doubled (each of the N trials COMPLETE exactly once, one Slurm job per trial for per-trial
jobs), makespan against the ideal N*t/K, the launcher's CPU time and peak memory, the most
PostgreSQL connections open at once, sbatch calls and slurmctld RPCs per minute.

Every trial's process runs on this machine's 2 cores: 64 of them starting at once queue for the
CPU, which the makespan shows; what does not depend on the cores (the counts) is the point.
"""

from __future__ import annotations

import resource
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy

from bench import scheduler_load
from bench.dispatch_study import study_file
from hpo import record
from hpo.config import load_study
from hpo.dispatch.backends import LaunchOptions, launch
from hpo.executors import jobs
from hpo.storage import resolve_storage
from hpo.trial.objective import FixedDurationObjective

REPO = Path(__file__).resolve().parents[1]


class _Peaks(threading.Thread):
    """Samples, every second, this process's resident memory and the PostgreSQL connections open
    to the study's database (the sampler's own excluded)."""

    def __init__(self, storage_url: str | None) -> None:
        super().__init__(daemon=True)
        self.engine = (
            sqlalchemy.create_engine(storage_url, poolclass=sqlalchemy.pool.NullPool) if storage_url else None
        )
        self.rss_mb = 0.0
        self.connections = 0
        self.stop = threading.Event()

    def run(self) -> None:
        # Autocommit: within one transaction PostgreSQL shows the same snapshot of its activity.
        connection = (
            self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") if self.engine else None
        )
        query = sqlalchemy.text(
            "SELECT count(*) - 1 FROM pg_stat_activity WHERE datname = current_database()"
        )
        try:
            while not self.stop.is_set():
                for line in Path("/proc/self/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.rss_mb = max(self.rss_mb, int(line.split()[1]) / 1024)
                if connection is not None:
                    self.connections = max(self.connections, int(connection.execute(query).scalar() or 0))
                time.sleep(1.0)
        finally:
            if connection is not None:
                connection.close()


def _sacct_jobs(name: str) -> list[str]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID", "--name", name, "-S", "now-3hours"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return [line for line in out.split() if line]


def run_wide(
    mode: str, storage_url: str | None, folder: Path, n: int, k: int, seconds: float
) -> dict[str, Any]:

    kind = "postgresql" if storage_url else "journal"
    name = f"bench-wide-{mode}-{kind}-{uuid.uuid4().hex[:6]}"
    spec = load_study(study_file(folder, name, n, k, ray=False, partition="wide"))
    storage = resolve_storage(spec, storage_url, spec.source)
    peaks = _Peaks(storage_url)
    scheduler_load.reset()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    peaks.start()
    started = time.monotonic()
    options = LaunchOptions(
        executor="slurm", workers=k if mode == "workers" else None,
        objective=FixedDurationObjective(seconds), progress=False,
    )  # fmt: skip
    launch(spec, storage, options, log=lambda line: None)
    makespan = time.monotonic() - started
    peaks.stop.set()
    peaks.join()
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(5.0)  # the jobs' last RPCs
    load = scheduler_load.read()
    trials = _stored_trials(name, storage_url, storage.target)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    sacct_jobs = _sacct_jobs(jobs.job_name(spec, "" if mode == "per-trial" else "worker"))
    job_ids = [str(t.user_attrs.get(record.ATTR_JOB_ID)) for t in trials]
    # Doubled: more completed trials than the budget, or (per-trial) a trial's job submitted twice.
    doubled = max(0, len(complete) - n)
    if mode == "per-trial":
        doubled += len(job_ids) - len(set(job_ids)) + max(0, len(sacct_jobs) - n)
    minutes = makespan / 60
    return {
        "mode": mode,
        "storage": kind,
        "n": n,
        "k": k,
        "t": seconds,
        "trials": len(trials),
        "lost": n - len(complete),
        "doubled": doubled,
        # Per-trial: one job per trial, every one of them a trial's; workers: K array tasks.
        "jobs": len(sacct_jobs),
        "jobs_expected": n if mode == "per-trial" else k,
        "distinct_trial_jobs": len(set(job_ids)),
        "makespan_s": round(makespan, 1),
        "ideal_s": round(n * seconds / k, 1),
        "ratio": round(makespan / (n * seconds / k), 3),
        "launcher_cpu_s": round(
            (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime), 1
        ),
        "launcher_peak_rss_mb": round(peaks.rss_mb, 0),
        "postgresql_connections_peak": peaks.connections if storage_url else None,
        "sbatch_per_min": round(load.controller["REQUEST_SUBMIT_BATCH_JOB"] / minutes, 1),
        **load.summary(n, minutes),
    }


def _stored_trials(name: str, storage_url: str | None, journal: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials from PostgreSQL or the journal file, but a surplus one."""
    if storage_url:
        trials = optuna.load_study(study_name=name, storage=storage_url).get_trials(deepcopy=False)
    else:
        backend = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
        trials = optuna.load_study(study_name=name, storage=backend).get_trials(deepcopy=False)
    # A --workers surplus trial (asked for the last slot by two workers at once) is closed unrun.
    return [t for t in trials if not t.user_attrs.get(record.ATTR_SURPLUS)]


def wide_nodes(action: str) -> None:
    subprocess.run(["bash", str(REPO / "deploy/local-cluster/wide.sh"), action], check=True, timeout=300)
