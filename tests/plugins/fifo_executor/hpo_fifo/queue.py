"""A first-in-first-out job queue on this machine: a spool folder and one daemon.

``submit`` writes a job (a shell script) into the spool as PENDING and starts the daemon if none
runs; the daemon starts pending jobs in the order they came while fewer than ``slots`` run, each
as a process group of its own, and records how each ended (COMPLETED, FAILED, CANCELLED, TIMEOUT)
with its start and end times. ``cancel`` ends a pending job at once and asks the daemon to stop a
running one. Every change happens under one lock on the spool. The daemon leaves once the queue
has been empty for a while; the next submission starts another.

Command line: ``python -m hpo_fifo.queue submit|cancel|show|serve``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SPOOL_ENV = "HPO_FIFO_SPOOL"
SLOTS_ENV = "HPO_FIFO_SLOTS"
JOB_ID_ENV = "FIFO_JOB_ID"
ACTIVE = ("PENDING", "RUNNING")
POLL_S = 0.1
IDLE_EXIT_S = 30.0
KILL_WAIT_S = 3.0
"""From SIGTERM to SIGKILL when a running job is cancelled or reaches its time limit."""


def spool() -> Path:
    folder = Path(os.environ.get(SPOOL_ENV) or Path.home() / ".cache" / "hpo-fifo")
    (folder / "jobs").mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    with open(folder / "lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _path(folder: Path, job_id: str) -> Path:
    return folder / "jobs" / f"{job_id}.json"


def _write(folder: Path, job: dict[str, Any]) -> None:
    temporary = _path(folder, job["id"]).with_suffix(".tmp")
    temporary.write_text(json.dumps(job))
    temporary.replace(_path(folder, job["id"]))


def job(job_id: str) -> dict[str, Any] | None:
    """The queue's record of a job; None for a job it never had."""
    try:
        record: dict[str, Any] = json.loads(_path(spool(), job_id).read_text())
    except (OSError, ValueError):
        return None
    return record


def jobs() -> list[dict[str, Any]]:
    """Every job the spool holds, oldest first."""
    found = [json.loads(p.read_text()) for p in (spool() / "jobs").glob("*.json")]
    return sorted(found, key=lambda j: int(j["id"]))


def submit(script: Path, name: str, cpus: int = 1, time_min: float | None = None) -> str:
    folder = spool()
    with _locked(folder):
        counter = folder / "last_id"
        job_id = str(int(counter.read_text() or 0) + 1 if counter.exists() else 1)
        counter.write_text(job_id)
        kept = folder / "jobs" / f"{job_id}.sh"  # the queue's own copy, as sbatch keeps one
        kept.write_text(script.read_text())
        _write(folder, {
            "id": job_id, "name": name, "script": str(kept), "cpus": cpus,
            "time_limit_s": None if time_min is None else time_min * 60, "state": "PENDING",
            "submitted": time.time(), "started": None, "ended": None, "pid": None, "exit": None,
            "cancel": False,
        })  # fmt: skip
    _ensure_daemon(folder)
    return job_id


def cancel(job_id: str) -> None:
    folder = spool()
    with _locked(folder):
        record = job(job_id)
        if record is None or record["state"] not in ACTIVE:
            return
        if record["state"] == "PENDING":
            record.update(state="CANCELLED", ended=time.time())
        else:
            record["cancel"] = True  # the daemon stops its process group
        _write(folder, record)


def _ensure_daemon(folder: Path) -> None:
    """Start the daemon unless one holds the daemon lock; two starting at once: one leaves."""
    with open(folder / "daemon.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # one runs
    subprocess.Popen(
        [sys.executable, "-m", "hpo_fifo.queue", "serve", str(folder)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=open(folder / "daemon.log", "a"),  # noqa: SIM115 (the daemon's, kept open by it)
        stderr=subprocess.STDOUT,
        env={**os.environ, SPOOL_ENV: str(folder)},
    )


class _Daemon:
    def __init__(self, folder: Path, slots: int) -> None:
        self.folder, self.slots = folder, slots
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.signalled: dict[str, float] = {}

    def step(self) -> bool:
        """One pass over the queue; whether any job is pending or running."""
        with _locked(self.folder):
            records = jobs()
            for record in records:
                if record["state"] == "RUNNING":
                    self._watch(record)
            running = sum(1 for r in records if r["state"] == "RUNNING")
            for record in records:
                if record["state"] == "PENDING" and running < self.slots:
                    self._start(record)
                    running += 1
            return any(r["state"] in ACTIVE for r in records)

    def _start(self, record: dict[str, Any]) -> None:
        env = {**os.environ, JOB_ID_ENV: record["id"], SPOOL_ENV: str(self.folder)}
        process = subprocess.Popen(["bash", record["script"]], env=env, start_new_session=True)
        self.processes[record["id"]] = process
        record.update(state="RUNNING", started=time.time(), pid=process.pid)
        _write(self.folder, record)

    def _watch(self, record: dict[str, Any]) -> None:
        process = self.processes.get(record["id"])
        if process is None:  # started by a daemon that died: nothing can tell how it ended
            record.update(state="FAILED", ended=time.time(), exit=None)
            _write(self.folder, record)
            return
        limit = record["time_limit_s"]
        over = limit is not None and time.time() - record["started"] > limit
        if (record["cancel"] or over) and process.poll() is None:
            first = self.signalled.setdefault(record["id"], time.monotonic())
            late = time.monotonic() - first > KILL_WAIT_S
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL if late else signal.SIGTERM)
            if over:
                record["timed_out"] = True
                _write(self.folder, record)
        code = process.poll()
        if code is None:
            return
        del self.processes[record["id"]]
        state = "COMPLETED" if code == 0 else "FAILED"
        if record["cancel"]:
            state = "CANCELLED"
        elif record.get("timed_out"):
            state = "TIMEOUT"
        record.update(state=state, ended=time.time(), exit=code)
        _write(self.folder, record)


def serve(folder: Path) -> None:
    with open(folder / "daemon.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another daemon serves this spool
        daemon = _Daemon(folder, int(os.environ.get(SLOTS_ENV, "2")))
        idle_since = time.monotonic()
        while True:
            if daemon.step():
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_EXIT_S:
                return
            time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hpo_fifo.queue")
    commands = parser.add_subparsers(dest="command", required=True)
    submitting = commands.add_parser("submit")
    submitting.add_argument("script", type=Path)
    submitting.add_argument("--name", default="job")
    submitting.add_argument("--cpus", type=int, default=1)
    submitting.add_argument("--time-min", type=float)
    commands.add_parser("cancel").add_argument("job_id")
    commands.add_parser("show").add_argument("job_id")
    commands.add_parser("serve").add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "submit":
        print(f"Submitted fifo job {submit(args.script.resolve(), args.name, args.cpus, args.time_min)}")
    elif args.command == "cancel":
        cancel(args.job_id)
    elif args.command == "show":
        print(json.dumps(job(args.job_id)))
    else:
        serve(args.folder)


if __name__ == "__main__":
    main()
