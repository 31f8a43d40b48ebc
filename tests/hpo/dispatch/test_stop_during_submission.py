"""A stop that lands while sbatch runs: Ctrl-C reaches the terminal's whole process group (and a
requeue or a cancel every process of a launcher's job), so sbatch dies of it too and its failure
reaches the launcher before the held signal does. That failure is the stop, not a refused job: the
launch ends as interrupted (exit 130), not with a submission error.

A real child process stands in for sbatch (the signal, not Slurm, is the subject here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

_LAUNCHER = """
import subprocess, sys
from hpo.dispatch.common import signals_deferred
try:
    with signals_deferred():
        subprocess.run(["sleep", "60"], check=True)  # the submission, killed by the same Ctrl-C
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def _child_sleep(pid: int) -> bool:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return any(
        Path(f"/proc/{child}/comm").read_text().strip() == "sleep"
        for child in children.read_text().split()
        if Path(f"/proc/{child}/comm").exists()
    )


def test_ctrl_c_while_a_submission_runs_is_an_interruption_not_an_error() -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell's foreground job
    )
    deadline = time.monotonic() + 60
    while not _child_sleep(launcher.pid):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.05)
    os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C: the launcher and its child alike
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, out + err
    assert out.strip() == "interrupted" and "CalledProcessError" not in err, out + err
