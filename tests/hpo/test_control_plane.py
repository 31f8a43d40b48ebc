"""Slurm's own daemons going away under a running study, on the local cluster with PostgreSQL:
slurmctld stopped for a minute (a controller restart: every sbatch and squeue fails), slurmdbd
stopped for longer than the launcher's patience with jobs sacct does not know.

Each test holds the cluster alone (``injects_fault``): a test beside would see the same outage. The
trials are a small Python function (no torch: a job starts in a second), long enough to be running
while the daemon is away. Nothing may be lost or run twice: one Slurm job per trial in sacct, each
trial's curve stored once, the launcher's exit 0.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.hpo.conftest import (
    fault_line,
    final_sacct_states,
    launch_in_background,
    load_trials,
    score_study,
    wait_for_trials,
    write_study,
)
from tests.hpo.test_faults import check_budget_met_once, stored_steps

pytestmark = [pytest.mark.slow, pytest.mark.injects_fault]

OBJECTIVE = """
import time

def objective(params, trial):
    for step in range(1, {steps} + 1):
        time.sleep({step_s})
        if trial.report(step, params["x"] * step):
            return None
    return params["x"] * {steps}
"""


def _study(
    tmp_path: Path, name: str, n_trials: int, steps: int, step_s: float
) -> tuple[dict[str, Any], Path]:
    (tmp_path / "my_objective.py").write_text(OBJECTIVE.format(steps=steps, step_s=step_s))
    document = score_study(
        tmp_path,
        f"{name}-{uuid.uuid4().hex[:6]}",
        {"steps": steps, "function": "my_objective:objective"},
        n_trials=n_trials,
        max_concurrent=2,
    )
    document["resources"] = {"executor": "slurm", "time": "10m"}
    return document, write_study(tmp_path / "study.yaml", document)


@contextmanager
def _daemon_stopped(name: str, answers: list[str]) -> Iterator[None]:
    """Stop a Slurm daemon (SIGTERM, as a restart does) and start it again however the test ends;
    back once ``answers`` (a command) succeeds."""
    pid = int(Path(f"/run/slurm/{name}.pid").read_text())
    subprocess.run(["kill", "-TERM", str(pid)], check=True)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"{name} did not stop"
        time.sleep(0.5)
    try:
        yield
    finally:
        subprocess.run([name], check=True, timeout=120)
        deadline = time.monotonic() + 120
        while subprocess.run(answers, capture_output=True, timeout=60).returncode != 0:
            assert time.monotonic() < deadline, f"{name} does not answer after its restart"
            time.sleep(1)


def _check_nothing_lost_or_doubled(document: dict[str, Any], storage: str, n_trials: int, steps: int) -> None:
    check_budget_met_once(document, storage, n_trials)  # one sacct job per trial, the budget exactly
    trials = load_trials(document, storage)
    assert all(t.state.name == "COMPLETE" for t in trials), [(t.number, t.user_attrs) for t in trials]
    for trial in trials:
        assert stored_steps(storage, trial._trial_id) == list(range(1, steps + 1))
    states = final_sacct_states([t.user_attrs["job_id"] for t in trials])
    assert set(states.values()) == {"COMPLETED"}, states


def test_slurmctld_away_for_a_minute_keeps_the_launcher_and_loses_no_trial(
    tmp_path: Path, fresh_database: str
) -> None:
    steps = 6
    document, study_file = _study(tmp_path, "ctld-away", n_trials=6, steps=steps, step_s=1.5)
    launcher = launch_in_background(study_file, fresh_database)
    wait_for_trials(
        document,
        fresh_database,
        launcher,
        lambda trials: sum(1 for t in trials if t.intermediate_values) >= 2,
        timeout=180,
    )
    with _daemon_stopped("slurmctld", ["scontrol", "ping"]):
        away = time.monotonic()
        time.sleep(60)  # the running trials end meanwhile: the next sbatch meets the outage
    back = time.monotonic()
    output = launcher.communicate(timeout=600)[0]
    recovery_s = time.monotonic() - back

    assert launcher.returncode == 0, output
    assert "Slurm controller unreachable" in output and "sbatch again in" in output, output
    assert "never submitted" not in output, output
    _check_nothing_lost_or_doubled(document, fresh_database, 6, steps)
    fault_line(
        f"slurmctld stopped for {back - away:.0f} s mid-study (every sbatch and squeue fails)",
        "the launcher waits with backoff, submits again once it answers; 6 of 6 COMPLETE, one job each",
        0,
        recovery_s,
    )


def test_slurmdbd_away_longer_than_the_launchers_patience_fails_no_running_trial(
    tmp_path: Path, fresh_database: str
) -> None:
    """sacct cannot answer, so it knows none of the jobs submitted meanwhile (UNKNOWN). The
    launcher used to take such a job as ended after 300 s and fail its running trial; squeue
    (slurmctld) still lists it. The 300 s are 15 s here (HPO_UNKNOWN_GRACE_S), and the trials run
    30 s each, all of them with slurmdbd away: the same path, 20 times quicker."""
    steps = 6
    document, study_file = _study(tmp_path, "dbd-away", n_trials=4, steps=steps, step_s=5)
    with _daemon_stopped("slurmdbd", ["sacctmgr", "-n", "show", "cluster"]):
        away = time.monotonic()
        launcher = launch_in_background(study_file, fresh_database, HPO_UNKNOWN_GRACE_S="15")
        output = launcher.communicate(timeout=600)[0]
        away_s = time.monotonic() - away

    assert launcher.returncode == 0, output
    assert "sacct does not know job" in output and "taken as running" in output, output
    assert "without telling a result" not in output, output
    assert output.count("Bypassing sacct error") <= 2, output  # submitit's warning, once per 10 min
    _check_nothing_lost_or_doubled(document, fresh_database, 4, steps)
    fault_line(
        f"slurmdbd stopped for {away_s:.0f} s, the whole study (sacct knows none of its jobs; "
        "the launcher's 300 s patience shortened to 15 s)",
        "squeue vouches for the running jobs; 4 of 4 COMPLETE, none failed, one job each",
        0,
        None,
    )
