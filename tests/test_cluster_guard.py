"""The rule that closes the cluster lock's hole (tests/conftest.py): a cluster command run by a test
that does not hold the cluster fails in one line; one that holds it runs the real command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import HELD, write_guards

pytestmark = pytest.mark.fast


def test_a_cluster_command_runs_only_for_a_test_that_holds_the_cluster(tmp_path: Path) -> None:
    guards, real = tmp_path / "guards", tmp_path / "real"
    real.mkdir()
    (real / "sinfo").write_text('#!/bin/sh\necho real sinfo "$@"\n')
    (real / "sinfo").chmod(0o755)
    write_guards(guards, str(real))
    env = {k: v for k, v in os.environ.items() if k != HELD} | {"PATH": f"{guards}:{real}:/usr/bin:/bin"}

    refused = subprocess.run(["sinfo", "-N"], env=env, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 97 and not refused.stdout, refused
    assert refused.stderr.strip() == (
        "sinfo run by a test that does not hold the local cluster: ask for the local_cluster fixture"
    )

    held = subprocess.run(["sinfo", "-N"], env=env | {HELD: "1"}, capture_output=True, text=True, timeout=30)
    assert held.returncode == 0 and held.stdout == "real sinfo -N\n", held
