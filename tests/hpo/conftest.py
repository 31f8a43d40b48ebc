"""Fixtures of the service's tests: the real local Slurm cluster and PostgreSQL.

The cluster is brought up by ``deploy/local-cluster/up.sh`` (idempotent; the test command runs it
first). A test that needs it fails, never skips, when it cannot come up. The helpers the tests
share are in helpers.py.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LOCKS, holding_the_cluster, shared_lock
from tests.hpo.helpers import REPO, forget_database_reader


@pytest.fixture(scope="session")
def _cluster_started(request: pytest.FixtureRequest) -> str:
    """Bring up (or find up) the Slurm clusters and PostgreSQL once per run; the database URL.

    One worker runs up.sh, the first to need the cluster, before any test of the cluster has started;
    the others take its answer. up.sh run later, beside a test, would start again a daemon that
    the test has stopped (slurmctld, a node's slurmd)."""
    run = getattr(request.config, "workerinput", {}).get("testrunuid", str(os.getpid()))
    answer = LOCKS / f"cluster-up-{run}"
    with shared_lock("cluster-up", fcntl.LOCK_EX):
        if not answer.exists():
            with holding_the_cluster():
                proc = subprocess.run(
                    ["bash", str(REPO / "deploy/local-cluster/up.sh")],
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
            assert proc.returncode == 0, f"deploy/local-cluster/up.sh failed:\n{proc.stderr[-3000:]}"
            answer.write_text(proc.stdout.strip().splitlines()[-1])
    assert shutil.which("sbatch") and shutil.which("sacct")
    return answer.read_text()


@pytest.fixture
def local_cluster(_cluster_started: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """The running Slurm cluster and PostgreSQL (their database URL), held for this test.

    The cluster is held here, in the one fixture that hands it out, so a test holds it however it
    asks (in its signature, through another fixture, or `request.getfixturevalue` mid-test): its
    Slurm commands run, where the guards of tests/conftest.py refuse those of a test that did not."""
    with holding_the_cluster():
        yield _cluster_started


def _psql(server: str, *statements: str) -> None:
    commands = [arg for statement in statements for arg in ("-c", statement)]
    subprocess.run(["psql", "-X", "-w", "-q", f"{server}/postgres", *commands], check=True, timeout=60)


def _drop_database(server: str, name: str) -> None:
    """DROP ... WITH (FORCE), which ends the sessions a test left. PostgreSQL 15 refuses it while an
    autovacuum worker is on the database (a process of no role the service's may signal); the worker
    is done within a second on a test's database, so the drop is tried again meanwhile."""
    for _ in range(20):
        proc = subprocess.run(
            ["psql", "-X", "-w", "-q", f"{server}/postgres", "-c", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if proc.returncode == 0 or "pg_signal_backend" not in proc.stderr:
            break
        time.sleep(0.5)
    assert proc.returncode == 0, proc.stderr


def _new_database(server: str, template: str | None = None) -> Iterator[str]:
    name = f"hpo_test_{uuid.uuid4().hex[:12]}"
    _psql(server, f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    yield f"{server}/{name}"
    forget_database_reader(f"{server}/{name}")
    _drop_database(server, name)


@pytest.fixture(scope="session")
def _database_template(_cluster_started: str) -> str:
    """A database holding Optuna's schema and nothing else, which each test's database copies: a
    copy takes 0.2 s, the schema's creation by the launcher 1 to 2 s (and it is not their subject).
    One per Optuna version, made once for every worker and every run; it is built under another
    name and renamed once whole, so a run stopped midway leaves no half-made template."""
    import optuna

    server = _cluster_started.rsplit("/", 1)[0]
    template = "hpo_test_template_optuna_" + optuna.__version__.replace(".", "_")
    with shared_lock("database-template", fcntl.LOCK_EX), holding_the_cluster():
        listed = subprocess.run(
            ["psql", "-X", "-w", "-A", "-t", f"{server}/postgres", "-c",
             f"SELECT count(*) FROM pg_database WHERE datname = '{template}'"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()  # fmt: skip
        if listed != "1":
            partial = f"{template}_partial"
            _drop_database(server, partial)
            _psql(server, f"CREATE DATABASE {partial}")
            storage = optuna.storages.RDBStorage(f"{server}/{partial}")
            storage.engine.dispose()  # no session may stay on a database that is copied
            _psql(server, f"ALTER DATABASE {partial} RENAME TO {template}")
    return template


@pytest.fixture
def fresh_database(local_cluster: str, _database_template: str) -> Iterator[str]:
    """A new PostgreSQL database owned by the service's role, holding Optuna's schema and no study;
    dropped afterwards."""
    yield from _new_database(local_cluster.rsplit("/", 1)[0], _database_template)


@pytest.fixture
def empty_database(local_cluster: str) -> Iterator[str]:
    """A new PostgreSQL database without even Optuna's schema, for a test of what creates it."""
    yield from _new_database(local_cluster.rsplit("/", 1)[0])


MYSQL_PASSFILE = Path("/etc/hpo/local-cluster.mysql")
"""The local cluster's MariaDB password of user hpo (deploy/local-cluster/up.sh), root-only."""


@pytest.fixture
def fresh_mysql_database(local_cluster: str) -> Iterator[str]:
    """A new, empty database on the local cluster's MariaDB (slurmdbd's server), dropped afterwards.
    Its URL carries the password, as a user's may: the service moves it to ``MYSQL_PWD``."""
    import pymysql

    password = MYSQL_PASSFILE.read_text().strip()
    name = f"hpo_test_{uuid.uuid4().hex[:12]}"
    admin = pymysql.connect(host="127.0.0.1", port=3306, user="hpo", password=password, autocommit=True)
    try:
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        yield f"mysql://hpo:{password}@127.0.0.1:3306/{name}"
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")
    finally:
        admin.close()


FAULTS_CONF = "/etc/slurm-faults/slurm.conf"
FAULTS_RUN = Path("/run/slurm-faults")
"""The fault cluster's configuration and pid files (deploy/local-cluster/faults.sh)."""


@pytest.fixture
def fault_cluster(local_cluster: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The fault cluster: a Slurm of its own on this host (its slurmctld, slurmdbd and two nodes,
    f1 and f2, in partition `faults`), for a test that stops one of them; the other tests go on
    beside it on the local cluster. Held alone, one such test at a time. SLURM_CONF points this
    test's Slurm commands, and the launchers it starts (and so their jobs), at it. Yields the
    database URL: PostgreSQL is the local cluster's."""
    with shared_lock("fault-cluster", fcntl.LOCK_EX):
        monkeypatch.setenv("SLURM_CONF", FAULTS_CONF)
        yield local_cluster
