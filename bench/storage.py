"""Storage scale: ask/report/tell throughput and errors against the number of worker processes.

W processes (1, 4, 16, 64) hammer one study at once, each looping ask -> 3 x report -> tell for
the same wall time, on each storage side by side:

- journal: Optuna's journal file with its file lock, which is this service's embedded default;
- sqlite: Optuna's RDB storage on a SQLite file (what users often start with);
- postgresql: the local cluster's PostgreSQL, through this service's pool settings;
- grpc: Optuna's gRPC storage proxy (one server process) in front of the same PostgreSQL.

Every process first imports and connects, then all start together; a process counts the trials
it finished and the exceptions it met (each exception costs that trial, the loop goes on). The
table gives trials/s (each trial is 5 storage writes and the reads they imply), errors, and the
ratio to the journal's figure at the same W.

    python -m bench.storage              # W = 1, 4, 16, 64; 20 s per cell
    python -m bench.storage --quick      # W = 1, 4, 16; 5 s per cell
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

STORAGES = ("journal", "sqlite", "postgresql", "grpc")

_WORKER = """
import json, sys, time, warnings
import optuna
warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
from optuna.distributions import FloatDistribution
sys.path.insert(0, sys.argv[4])
from bench.storage import open_backend
optuna.logging.set_verbosity(optuna.logging.ERROR)
kind, target, name = sys.argv[1], sys.argv[2], sys.argv[3]
study = optuna.load_study(study_name=name, storage=open_backend(kind, target))
space = {"x": FloatDistribution(0.0, 1.0)}
print("ready", flush=True)
duration = float(sys.stdin.readline())
trials = errors = 0
first_error = ""
deadline = time.monotonic() + duration
while time.monotonic() < deadline:
    try:
        trial = study.ask(space)
        for step in range(3):
            trial.report(trial.params["x"] * step, step)
        study.tell(trial, trial.params["x"])
        trials += 1
    except Exception as err:
        errors += 1
        first_error = first_error or f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
print(json.dumps({"trials": trials, "errors": errors, "first_error": first_error}), flush=True)
"""


def open_backend(kind: str, target: str) -> Any:
    """The Optuna storage a worker (or the set-up) uses for ``kind``."""
    import optuna

    if kind == "journal":
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(target))
    if kind == "grpc":
        import warnings

        host, port = target.rsplit(":", 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.GrpcStorageProxy(host=host, port=int(port))
    if kind == "postgresql":
        # The service's own engine settings (pool, pre-ping, schema-race retry).
        from hpo.storage import StorageRef, open_storage

        return open_storage(StorageRef("rdb", target), create=False)
    return optuna.storages.RDBStorage(target, skip_table_creation=True, skip_compatibility_check=True)


def prepare(kind: str, folder: Path, pg_admin: str) -> tuple[str, subprocess.Popen[bytes] | None, str]:
    """Create an empty storage of ``kind``: its target, a server process if any, and a clean-up."""
    import optuna

    if kind == "journal":
        return str(folder / "journal.log"), None, ""
    if kind == "sqlite":
        url = f"sqlite:///{folder / 'study.db'}"
        optuna.storages.RDBStorage(url)  # creates the schema once
        return url, None, ""
    database = f"hpo_bench_{uuid.uuid4().hex[:10]}"
    subprocess.run(["psql", "-X", "-w", "-q", pg_admin, "-c", f"CREATE DATABASE {database}"], check=True)
    url = pg_admin.rsplit("/", 1)[0] + f"/{database}"
    optuna.storages.RDBStorage(url)
    if kind == "postgresql":
        return url, None, database
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, optuna; optuna.storages.run_grpc_proxy_server("
         "optuna.storages.RDBStorage(sys.argv[1]), host='127.0.0.1', port=int(sys.argv[2]))",
         url, str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError("the gRPC proxy did not start")
        time.sleep(0.2)
    return f"127.0.0.1:{port}", server, database


def run_cell(kind: str, workers: int, seconds: float, folder: Path, pg_admin: str) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    target, server, database = prepare(kind, folder, pg_admin)
    name = f"bench-{kind}-{workers}"
    try:
        optuna.create_study(study_name=name, storage=open_backend(kind, target))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _WORKER, kind, target, name, str(REPO)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=(folder / f"worker-{index}.err").open("w"),  # a pipe nobody reads could fill
                text=True,
                env=env,
            )
            for index in range(workers)
        ]
        start_errors = 0
        for proc in procs:  # all imported and connected before any starts
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                start_errors += 1
        started = time.monotonic()
        for proc in procs:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.write(f"{seconds}\n")
                proc.stdin.flush()
        results: list[dict[str, Any]] = []
        for proc in procs:
            out, _ = proc.communicate(timeout=seconds + 300)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            results.append(
                json.loads(lines[-1])
                if lines
                else {"trials": 0, "errors": 1, "first_error": f"worker exited {proc.returncode}"}
            )
        wall = time.monotonic() - started
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        if database:
            subprocess.run(["psql", "-X", "-w", "-q", pg_admin, "-c",
                            f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"], check=False)  # fmt: skip
    trials = sum(r["trials"] for r in results)
    errors = sum(r["errors"] for r in results) + start_errors
    first = next((r["first_error"] for r in results if r["first_error"]), "")
    return {"storage": kind, "workers": workers, "seconds": round(wall, 2), "trials": trials,
            "trials_per_s": round(trials / wall, 2), "errors": errors, "first_error": str(first)[:160]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="W = 1, 4, 16; 5 s per cell")
    parser.add_argument("--workers", type=int, nargs="+", help="worker counts (default 1 4 16 64)")
    parser.add_argument("--seconds", type=float, help="wall time per cell (default 20, quick 5)")
    parser.add_argument("--storages", nargs="+", choices=STORAGES, default=list(STORAGES))
    parser.add_argument("--postgresql", default="postgresql://hpo@127.0.0.1:5432/postgres",
                        help="an admin URL of the server (databases are created and dropped)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    workers = args.workers or ([1, 4, 16] if args.quick else [1, 4, 16, 64])
    seconds = args.seconds or (5.0 if args.quick else 20.0)

    rows = []
    with tempfile.TemporaryDirectory(prefix="hpo-bench-storage-") as tmp:
        for count in workers:
            for kind in args.storages:
                folder = Path(tmp) / f"{kind}-{count}"
                folder.mkdir()
                row = run_cell(kind, count, seconds, folder, args.postgresql)
                rows.append(row)
                print(f"  {kind:<10} W={count:<3} {row['trials_per_s']:>8.1f} trials/s  {row['errors']} errors"
                      + (f"  ({row['first_error']})" if row["errors"] else ""), flush=True)  # fmt: skip
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def print_table(rows: list[dict[str, Any]]) -> None:
    journal = {r["workers"]: r["trials_per_s"] for r in rows if r["storage"] == "journal"}
    print(f"\n{'storage':<11}{'workers':>8}{'trials/s':>10}{'x journal':>11}{'errors':>8}")
    for r in rows:
        base = journal.get(r["workers"])
        ratio = f"{r['trials_per_s'] / base:.2f}" if base else "-"
        print(f"{r['storage']:<11}{r['workers']:>8}{r['trials_per_s']:>10.1f}{ratio:>11}{r['errors']:>8}")


if __name__ == "__main__":
    sys.exit(main())
