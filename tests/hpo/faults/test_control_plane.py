"""Slurm's own daemons going away under a running study, on the local cluster with PostgreSQL:
slurmctld stopped for 20 s (a controller restart: every sbatch and squeue fails), slurmdbd
stopped for longer than the launcher's patience with jobs sacct does not know.

Each test runs on the fault cluster (``fault_cluster``: a Slurm of its own, nodes f1 and f2), so the
tests beside it on the local cluster see nothing of the outage. The trials are a small Python function (no torch: a job starts in a second), long enough to be running
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

from tests.hpo.conftest import FAULTS_RUN
from tests.hpo.helpers import (
    check_budget_counted_from_sacct,
    check_budget_met_once,
    fault_line,
    final_sacct_states,
    launch_in_background,
    load_trials,
    score_study,
    sleeping_objective,
    stored_steps,
    wait_for_trials,
    write_study,
)

pytestmark = pytest.mark.slow


def _study(
    tmp_path: Path, name: str, n_trials: int, steps: int, step_s: float
) -> tuple[dict[str, Any], Path]:
    (tmp_path / "my_objective.py").write_text(sleeping_objective(steps, step_s))
    document = score_study(
        tmp_path,
        f"{name}-{uuid.uuid4().hex[:6]}",
        {"steps": steps, "function": "my_objective:objective"},
        n_trials=n_trials,
        max_concurrent=2,
        budget=1.0,  # CPU-hours: never reached here, counted all the same
    )
    document["resources"] = {"executor": "slurm", "time": "10m"}
    return document, write_study(tmp_path / "study.yaml", document)


@contextmanager
def _daemon_stopped(name: str, answers: list[str]) -> Iterator[None]:
    """Stop a Slurm daemon (SIGTERM, as a restart does) and start it again however the test ends;
    back once ``answers`` (a command) succeeds."""
    pid = int((FAULTS_RUN / f"{name}.pid").read_text())
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
    trials = load_trials(document, storage)
    assert all(t.state.name == "COMPLETE" for t in trials), [(t.number, t.user_attrs) for t in trials]
    for trial in trials:
        assert stored_steps(storage, trial._trial_id) == list(range(1, steps + 1))
    # A slurmdbd back from an outage learns of the jobs from slurmctld a while later.
    states = final_sacct_states([t.user_attrs["job_id"] for t in trials], timeout=180)
    assert set(states.values()) == {"COMPLETED"}, states
    check_budget_met_once(document, storage, n_trials)  # one sacct job per trial, the budget exactly


def test_slurmctld_away_keeps_the_launcher_and_loses_no_trial(
    tmp_path: Path, fault_cluster: str, fresh_database: str
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
        # Away 20 s, fixed: the fault itself. The running trials (9 s) end meanwhile, so the launcher's
        # next sbatch meets the outage and backs off (5 s, then 10 s) at least twice.
        time.sleep(20)
    back = time.monotonic()
    output = launcher.communicate(timeout=600)[0]
    recovery_s = time.monotonic() - back

    assert launcher.returncode == 0, output
    assert "Slurm controller unreachable" in output and "sbatch again in" in output, output
    assert "never submitted" not in output, output
    _check_nothing_lost_or_doubled(document, fresh_database, 6, steps)
    check_budget_counted_from_sacct(document, study_file, fresh_database)
    fault_line(
        f"slurmctld stopped for {back - away:.0f} s mid-study (every sbatch and squeue fails)",
        "the launcher waits with backoff, submits again once it answers; 6 of 6 COMPLETE, one job each",
        0,
        recovery_s,
    )


def test_slurmdbd_away_longer_than_the_launchers_patience_fails_no_running_trial(
    tmp_path: Path, fault_cluster: str, fresh_database: str
) -> None:
    """sacct cannot answer, so it knows none of the jobs submitted meanwhile (UNKNOWN). The
    launcher used to take such a job as ended after 300 s and fail its running trial; squeue
    (slurmctld) still lists it. The 300 s are 6 s here (HPO_UNKNOWN_GRACE_S), and the trials run
    15 s each, all of them with slurmdbd away: the same path, 50 times quicker."""
    steps = 6
    document, study_file = _study(tmp_path, "dbd-away", n_trials=4, steps=steps, step_s=2.5)
    with _daemon_stopped("slurmdbd", ["sacctmgr", "-n", "show", "cluster"]):
        away = time.monotonic()
        launcher = launch_in_background(study_file, fresh_database, HPO_UNKNOWN_GRACE_S="6")
        output = launcher.communicate(timeout=600)[0]
        away_s = time.monotonic() - away

    assert launcher.returncode == 0, output
    assert "sacct has not known job" in output and "taken as running" in output, output
    assert "without telling a result" not in output, output
    assert output.count("Bypassing sacct error") <= 2, output  # submitit's warning, once per 10 min
    _check_nothing_lost_or_doubled(document, fresh_database, 4, steps)
    check_budget_counted_from_sacct(document, study_file, fresh_database)
    fault_line(
        f"slurmdbd stopped for {away_s:.0f} s, the whole study (sacct knows none of its jobs; "
        "the launcher's 300 s patience shortened to 6 s)",
        "squeue vouches for the running jobs; 4 of 4 COMPLETE, none failed, one job each",
        0,
        None,
    )


def _node_of(job_id: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def _set_node(node: str, state: str) -> None:
    """DRAIN or DOWN (with a reason, as an administrator gives), or RESUME: refused by Slurm for a
    node that came back by itself meanwhile (ReturnToService=2 here), which is fine."""
    reason = [] if state == "RESUME" else ["Reason=hpo-test"]
    subprocess.run(
        ["scontrol", "update", f"NodeName={node}", f"State={state}", *reason],
        check=state != "RESUME", capture_output=True, timeout=60,
    )  # fmt: skip


def test_a_node_drained_and_a_node_set_down_mid_trial_lose_no_trial(
    tmp_path: Path, fault_cluster: str, fresh_database: str
) -> None:
    """An administrator drains one node (its job runs to its end, nothing new starts there) and
    sets the other DOWN (its job is killed, and Slurm requeues it: trial jobs are requeueable)
    while each runs a trial; the down node comes back 6 s later, as after a repair."""
    steps = 8
    document, study_file = _study(tmp_path, "drain-down", n_trials=4, steps=steps, step_s=1.5)
    document["resources"]["cpus_per_task"] = 2  # a whole node each: one trial on f1, one on f2
    document["study"]["budget"] = 2.0  # two whole nodes, each trial charged its limit until one ends
    write_study(study_file, document)
    launcher = launch_in_background(study_file, fresh_database)
    trials = wait_for_trials(
        document,
        fresh_database,
        launcher,
        lambda trials: sum(1 for t in trials if t.state.name == "RUNNING" and t.intermediate_values) == 2,
        timeout=180,
    )
    jobs = {
        _node_of(t.user_attrs["job_id"]): t.user_attrs["job_id"] for t in trials if t.state.name == "RUNNING"
    }
    assert sorted(jobs) == ["f1", "f2"], jobs  # one trial on each node
    hit = time.monotonic()
    try:
        _set_node("f1", "DRAIN")
        _set_node("f2", "DOWN")
        # 6 s, fixed: the drained node's trial runs on meanwhile (its 12 s run began before), and
        # nothing new may start on either node.
        time.sleep(6)
        assert _node_of(jobs["f1"]) in ("", "f1")
        _set_node("f2", "RESUME")
        output = launcher.communicate(timeout=600)[0]
    finally:
        for node in ("f1", "f2"):
            subprocess.run(
                ["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True, timeout=60
            )
    recovery_s = time.monotonic() - hit

    assert launcher.returncode == 0, output
    check_budget_met_once(document, fresh_database, 4)  # a requeue keeps its job; a retry is its own trial
    finished = load_trials(document, fresh_database)
    retried = {t.user_attrs["retry_of"] for t in finished if "retry_of" in t.user_attrs}
    for trial in finished:
        if trial.number not in retried:
            assert trial.state.name == "COMPLETE"
            assert stored_steps(fresh_database, trial._trial_id) == list(range(1, steps + 1))
    final_sacct_states([t.user_attrs["job_id"] for t in finished], timeout=180)
    check_budget_counted_from_sacct(document, study_file, fresh_database)
    down_trial = next(t for t in finished if t.user_attrs.get("job_id") == jobs["f2"])
    what = (
        "failed and was retried"
        if retried
        else f"was requeued by Slurm ({down_trial.user_attrs.get('restarts', 0)} restart)"
    )
    fault_line(
        "node f1 drained and node f2 set DOWN while each ran a trial (f2 resumed 6 s later)",
        f"f1's trial ran to its end; f2's {what}, and completed; 4 of 4 COMPLETE",
        0,
        recovery_s,
    )
