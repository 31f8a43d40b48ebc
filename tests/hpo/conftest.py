"""Fixtures of the service's tests: the real local Slurm cluster and PostgreSQL.

The cluster is brought up by ``deploy/local-cluster/up.sh`` (idempotent; the test command runs it
first). A test that needs it fails, never skips, when it cannot come up. The helpers the tests
share are in helpers.py.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import shared_lock
from tests.hpo.helpers import REPO


@pytest.fixture(scope="session")
def local_cluster() -> str:
    """Bring up (or find up) the three-node Slurm and PostgreSQL; return the database URL."""
    # Shared: up.sh would start again the slurmd that a fault test beside has just killed.
    with shared_lock("cluster", fcntl.LOCK_SH):
        proc = subprocess.run(
            ["bash", str(REPO / "deploy/local-cluster/up.sh")], capture_output=True, text=True, timeout=900
        )
    assert proc.returncode == 0, f"deploy/local-cluster/up.sh failed:\n{proc.stderr[-3000:]}"
    assert shutil.which("sbatch") and shutil.which("sacct")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture
def fresh_database(local_cluster: str) -> Iterator[str]:
    """A new, empty PostgreSQL database owned by the service's role, dropped afterwards."""
    name = f"hpo_test_{uuid.uuid4().hex[:12]}"
    admin = local_cluster.rsplit("/", 1)[0] + "/postgres"
    subprocess.run(["psql", "-X", "-w", "-q", admin, "-c", f"CREATE DATABASE {name}"], check=True, timeout=60)
    yield local_cluster.rsplit("/", 1)[0] + f"/{name}"
    subprocess.run(
        ["psql", "-X", "-w", "-q", admin, "-c", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"], timeout=60
    )
