"""Real faults injected into real studies on the local Slurm cluster and PostgreSQL: a requeued
trial job, a trial job cancelled behind the service's back, a launcher killed (and a detached one
requeued), many processes starting at once on a fresh database, a node lost.

The lost node runs on the fault cluster (its own Slurm: the local cluster's tests go on beside it).
The requeue runs the real trainer (its checkpoint resumed end to end); the other faults run the
torch-free stand-in of helpers.py, whose subject is the same service code at a sixth of the CPU.

Each test prints a ``FAULT`` line (what was injected, what the study did, trials lost, time to
recover): the figures of the fault table in docs/faults.md come from these lines.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.hpo.conftest import FAULTS_RUN
from tests.hpo.helpers import (
    FINISHED,
    GOOD,
    REPO,
    check_budget_met_once,
    fault_line,
    kill_job_processes,
    launch_in_background,
    load_trials,
    release_hold_at,
    run_hpo,
    stand_in_study,
    stored_steps,
    study_document,
    trials_or_none,
    wait_for_trials,
    write_study,
)

pytestmark = pytest.mark.slow


def one_trial_study(folder: Path, name: str, epochs: int, trainer: bool = False) -> dict[str, Any]:
    """One trial of the known-good configuration, as a Slurm job, long enough to be hit mid-run:
    the epochs left after the first outlast Slurm's KillWait (3 s here), during which a job that
    is being requeued or cancelled still runs (submitit ignores the SIGTERM) and could finish.
    The real trainer if ``trainer``, else the stand-in (2 s epochs)."""
    study = {"n_trials": 1, "max_concurrent": 1, "enqueue": [GOOD], "pruner": {"name": "none"}}
    if not trainer:
        return stand_in_study(
            folder, name, epochs=epochs, epoch_s=2.0, study=study, resources={"executor": "slurm"}
        )
    document = study_document(name, folder / "work", study=study, resources={"executor": "slurm"})
    document["trainer"].update(epochs=epochs, max_steps_per_epoch=120)
    return document


def job_log(document: dict[str, Any], job_id: str) -> str:
    """Rank 0's stdout and stderr, every run of the job included."""
    folder = Path(document["study"]["workdir"]) / "jobs" / job_id
    return "".join((folder / f"{job_id}_0_log.{kind}").read_text() for kind in ("out", "err"))


def resumed_from(trial: Any, log: str) -> int:
    """The epoch a trial resumed after: the trainer stores it, the stand-in prints it."""
    if "resumed_from_epoch" in trial.user_attrs:
        return int(trial.user_attrs["resumed_from_epoch"])
    found = re.findall(rf"trial {trial.number}: resumed from epoch (\d+)", log)
    assert found, log[-3000:]
    return int(found[-1])


@dataclasses.dataclass
class Resumed:
    """A one-trial study that a fault hit mid-trial, after the study ended."""

    trial: Any
    job_id: str
    node: str
    """Where the trial ran when the fault hit."""
    reported_before: int
    """The last epoch stored before the fault."""
    resumed_from: int
    """The epoch the trial resumed after."""
    recovery_s: float
    """From the fault until the trial's job ran again."""
    log: str


def one_trial_through(
    fault: Callable[[str, str], None],
    name: str,
    tmp_path: Path,
    storage: str,
    epochs: int = 8,
    trainer: bool = False,
) -> Resumed:
    """Run one trial as a Slurm job; once it has stored an epoch, ``fault(job_id, node)``; wait
    until the job runs again (its ``restarts`` attribute) and the launcher ends."""
    document = one_trial_study(tmp_path, name, epochs=epochs, trainer=trainer)
    launcher = launch_in_background(write_study(tmp_path / "study.yaml", document), storage)
    [trial] = wait_for_trials(
        document, storage, launcher, lambda trials: bool(trials and trials[0].intermediate_values)
    )
    job_id, node, before = (
        trial.user_attrs["job_id"],
        trial.user_attrs["nodes"],
        max(trial.intermediate_values),
    )
    hit = time.monotonic()
    fault(job_id, node)
    wait_for_trials(
        document, storage, launcher, lambda trials: trials[0].user_attrs.get("restarts", 0) >= 1, timeout=600
    )
    recovery_s = time.monotonic() - hit
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == 0, output
    trials = load_trials(document, storage)
    assert [t.state.name for t in trials] == ["COMPLETE"], [
        (t.number, t.state.name, t.user_attrs) for t in trials
    ]
    # The same trial in the same job, every epoch stored once, at most the epoch in progress redone.
    [trial] = trials
    assert trial.user_attrs["job_id"] == job_id and trial.user_attrs["restarts"] == 1
    assert stored_steps(storage, trial._trial_id) == list(range(1, epochs + 1))
    log = job_log(document, job_id)
    resumed = resumed_from(trial, log)
    assert max(1, before - 1) <= resumed < epochs
    return Resumed(trial, job_id, node, before, resumed, recovery_s, log)


def test_a_requeued_trial_job_resumes_the_same_trial_from_its_last_epoch(
    tmp_path: Path, fresh_database: str, fashion_mnist_root: str
) -> None:
    def requeue(job_id: str, node: str) -> None:
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)

    run = one_trial_through(requeue, "requeue-study", tmp_path, fresh_database, trainer=True)
    assert "DUE TO JOB REQUEUE" in run.log and run.log.count("rank 0 reporting to study") == 2, run.log[
        -3000:
    ]
    fault_line(
        "`scontrol requeue` of a running trial job",
        f"same job ran again, same trial 0 resumed after epoch {run.resumed_from}, COMPLETE",
        0,
        run.recovery_s,
    )


def test_a_trial_signalled_before_its_time_limit_checkpoints_and_requeues_itself(
    tmp_path: Path, fresh_database: str
) -> None:
    """USR2 is what Slurm sends 90 s before the time limit (--signal=USR2@90), and what a
    preemption with a grace time sends: submitit calls the task's checkpoint() and requeues."""

    def time_limit_near(job_id: str, node: str) -> None:
        subprocess.run(["scancel", "--full", "--signal=USR2", job_id], check=True, timeout=30)

    run = one_trial_through(time_limit_near, "timelimit-study", tmp_path, fresh_database)
    assert "Caught signal SIGUSR2" in run.log, run.log[-3000:]
    assert "trial 0 requeued; it resumes from its last checkpoint" in run.log, run.log[-3000:]
    fault_line(
        "USR2 to a running trial job (Slurm's signal before the time limit, or a preemption)",
        f"submitit requeued the job; trial 0 resumed after epoch {run.resumed_from}, COMPLETE",
        0,
        run.recovery_s,
    )


def test_a_trial_cancelled_outside_the_service_is_retried_with_the_same_parameters(
    tmp_path: Path, fresh_database: str
) -> None:
    document = one_trial_study(tmp_path, "scancel-study", epochs=8)
    study_file = write_study(tmp_path / "study.yaml", document)
    launcher = launch_in_background(study_file, fresh_database)
    [trial] = wait_for_trials(
        document, fresh_database, launcher, lambda trials: bool(trials and trials[0].intermediate_values)
    )
    job_id = trial.user_attrs["job_id"]
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    cancelled = time.monotonic()
    wait_for_trials(
        document,
        fresh_database,
        launcher,
        lambda trials: (
            len(trials) == 2 and trials[1].state.name == "RUNNING" and "job_id" in trials[1].user_attrs
        ),
    )
    recovered = time.monotonic() - cancelled
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == 0, output

    failed, retry = load_trials(document, fresh_database)
    assert failed.state.name == "FAIL"
    assert failed.user_attrs["fail_reason"].startswith(f"job {job_id} CANCELLED without telling a result")
    assert f"trial 0 FAIL: job {job_id} CANCELLED" in output
    assert "trial 0 failed: queued a retry with the same parameters" in output
    assert retry.state.name == "COMPLETE" and retry.params == failed.params
    assert retry.user_attrs["retry_of"] == 0 and retry.system_attrs["retry_history"] == [0]
    assert retry.user_attrs["job_id"] != job_id
    # The retry starts from the failed trial's checkpoint and keeps its reported epochs.
    assert sorted(retry.intermediate_values) == list(range(1, 9))
    assert resumed_from(retry, job_log(document, retry.user_attrs["job_id"])) >= 1
    status = run_hpo("status", str(study_file), "--storage", fresh_database)
    assert re.search(r"^1 +COMPLETE .*\(retry of 0\)$", status.stdout, re.M), status.stdout
    fault_line(
        "`scancel` of a running trial job",
        "trial failed with the Slurm state, retried once with the same parameters from its checkpoint",
        0,
        recovered,
    )


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "kill-9"])
def test_relaunch_after_the_launcher_stops_finishes_the_budget_exactly(
    stop: signal.Signals, tmp_path: Path, fresh_database: str
) -> None:
    name = f"resume-{uuid.uuid4().hex[:8]}"  # sacct below is queried by job name
    # Trials of 3 epochs of 3 s; the ones running when the launcher stops wait after their first
    # epoch (the `hold` file) until the relaunch has re-attached one: on a busy machine, the stop
    # and the relaunch's start can outlast any fixed trial length. None is pruned: a bad one pruned
    # at its first epoch ends before its hold.
    document = stand_in_study(
        tmp_path, name, epochs=3, epoch_s=3.0, hold_after=1, study={"n_trials": 6, "pruner": {"name": "none"}}
    )
    hold = tmp_path / "hold"
    study_file = write_study(tmp_path / "study.yaml", document)
    launcher = launch_in_background(study_file, fresh_database, "--executor", "slurm")
    # Stop it once a trial has finished and another has just been submitted.
    wait_for_trials(
        document,
        fresh_database,
        launcher,
        lambda trials: (
            any(t.state.name in FINISHED for t in trials)
            and any(
                t.state.name == "RUNNING" and "job_id" in t.user_attrs and not t.intermediate_values
                for t in trials
            )
        ),
    )
    hold.touch()
    launcher.send_signal(stop)
    output = launcher.communicate(timeout=60)[0]
    if stop == signal.SIGINT:
        assert launcher.returncode == 130, output
        assert "keep running as Slurm jobs" in output
    else:
        assert launcher.returncode == -signal.SIGKILL, output
    running_at_stop = {t.number for t in load_trials(document, fresh_database) if t.state.name == "RUNNING"}
    if stop == signal.SIGKILL:
        # Relaunched in another mode meanwhile (--workers, the Ray backend): refused in one line
        # naming the per-trial jobs that still run, none of their trials failed.
        for mode in (["--workers", "2"], ["--backend", "ray"]):
            other = run_hpo(
                "launch", str(study_file), "--storage", fresh_database, "--executor", "slurm", *mode
            )
            assert other.returncode == 3, other.stdout + other.stderr
            assert re.search(r"another launch mode \(slurm job \d+ \(per_trial\): trial", other.stderr), (
                other.stderr
            )
        states = {t.number: t.state.name for t in load_trials(document, fresh_database)}
        assert all(states[n] in ("RUNNING", *FINISHED) for n in running_at_stop), states

    relaunched = time.monotonic()
    again = launch_in_background(study_file, fresh_database, "--executor", "slurm")
    first_lines = release_hold_at(again, "re-attached", hold)  # the first re-attached trial: recovered
    recovered = time.monotonic() - relaunched
    output = first_lines + again.communicate(timeout=900)[0]
    assert again.returncode == 0, output
    reattached = {int(n) for n in re.findall(r"trial (\d+) re-attached", output)}
    assert reattached and reattached <= running_at_stop, (running_at_stop, output)
    check_budget_met_once(document, fresh_database, 6)
    fault_line(
        f"launcher stopped by {stop.name} mid-study, then relaunched",
        f"the relaunch re-attached {len(reattached)} running trial job(s), met the budget of 6, "
        "submitted no duplicate Slurm job",
        0,
        recovered,
    )


def test_workers_on_slurm_left_by_a_killed_launcher_refuse_a_relaunch_in_another_mode(
    tmp_path: Path, fresh_database: str
) -> None:
    """`--workers` jobs on Slurm run on after their launcher is killed: a per-trial or Ray relaunch
    would run beside them past max_concurrent, so each is refused in one line naming the worker
    jobs (array tasks), and none of their trials fails; `hpo cancel` then ends them, by number."""
    name = f"workers-mode-{uuid.uuid4().hex[:6]}"
    document = stand_in_study(
        tmp_path,
        name,
        epochs=3,
        epoch_s=1.0,
        hold_after=1,
        study={"n_trials": 4, "max_concurrent": 2, "pruner": {"name": "none"}},
    )
    hold = tmp_path / "hold"
    hold.touch()  # the workers' trials wait after their first epoch until the end of the test
    study_file = write_study(tmp_path / "study.yaml", document)
    launcher = launch_in_background(study_file, fresh_database, "--executor", "slurm", "--workers", "2")
    try:
        wait_for_trials(
            document,
            fresh_database,
            launcher,
            lambda trials: sum(1 for t in trials if t.state.name == "RUNNING" and t.intermediate_values) == 2,
        )
        launcher.kill()
        launcher.communicate(timeout=60)
        for mode in ([], ["--backend", "ray"]):
            other = run_hpo(
                "launch", str(study_file), "--storage", fresh_database, "--executor", "slurm", *mode
            )
            assert other.returncode == 3, other.stdout + other.stderr
            [refusal] = other.stderr.strip().splitlines()
            assert re.search(r"another launch mode \(slurm job \d+_\d+ \(workers\): trial \d+", refusal), (
                refusal
            )
        trials = load_trials(document, fresh_database)
        running = sorted(t.number for t in trials if t.state.name == "RUNNING")
        assert len(running) == 2 and "FAIL" not in {t.state.name for t in trials}, [
            (t.number, t.state.name) for t in trials
        ]
    finally:  # the worker jobs must not outlive the test, holding the nodes, whatever failed
        # Cancelled while their trials still hold: released first, they would end and the
        # workers take the next ones.
        cancel = run_hpo("cancel", str(study_file), "--storage", fresh_database)
        hold.unlink(missing_ok=True)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    for number in running:
        assert re.search(rf"^trial {number}: cancelled slurm job \d+_\d+$", cancel.stdout, re.M), (
            cancel.stdout
        )


_START_AT_ONCE = """
import sys, time
from hpo import config as studyfile, record, search
from hpo import storage as storage_lib
spec = studyfile.load_study(sys.argv[1])
ref = storage_lib.resolve_storage(spec, sys.argv[2], "--storage")
while time.time() < float(sys.argv[3]):
    time.sleep(0.005)
study = search.load(spec, storage_lib.check_reachable(ref, spec.source), create=True)
trial = study.ask(search.distributions(spec))
study.tell(trial, 0.5)
print("ok", trial.number)
"""


def test_sixteen_processes_starting_at_once_on_a_fresh_database_never_fail(
    tmp_path: Path, empty_database: str
) -> None:
    document = study_document("crowd-study", tmp_path / "work", study={"enqueue": []})
    study_file = write_study(tmp_path / "study.yaml", document)
    start_at = str(time.time() + 8)  # all imports done: they create the schema at the same instant
    command = [sys.executable, "-c", _START_AT_ONCE, str(study_file), empty_database, start_at]
    procs = [
        subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(16)
    ]
    results = [(proc.communicate(timeout=120), proc.returncode) for proc in procs]
    failures = [err for (out, err), code in results if code != 0]
    assert not failures, failures[0][-3000:]
    assert all(out.startswith("ok") for (out, _), _ in results)
    trials = load_trials(document, empty_database)
    assert sorted(t.number for t in trials) == list(range(16))
    assert all(t.state.name == "COMPLETE" for t in trials)
    fault_line("16 processes creating the schema and the study at once", "16 of 16 told their trial", 0, None)


def test_a_detached_launcher_requeued_mid_study_finishes_the_budget_exactly(
    tmp_path: Path, fresh_database: str
) -> None:
    name = f"detach-{uuid.uuid4().hex[:8]}"
    document = stand_in_study(tmp_path, name, epochs=3, epoch_s=2.0, study={"n_trials": 4})
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file), "--executor", "slurm", "--storage", fresh_database, "--detach")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    launcher_job = re.search(r"launcher submitted as Slurm job (\d+)", proc.stdout)
    assert launcher_job, proc.stdout
    job_id = launcher_job.group(1)
    log = Path(re.search(r"its log: (\S+)", proc.stdout).group(1))  # type: ignore[union-attr]

    def launcher_state() -> str:
        sacct = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return (sacct.stdout.split() or ["PENDING"])[0]  # not in sacct yet: just submitted

    def read_log() -> str:
        return log.read_text() if log.exists() else f"({log} not written yet)"

    def both_logs() -> str:  # the launcher's stderr too: an error's line goes there
        err = log.with_suffix(".err")
        return read_log() + f"\n--- {err.name}:\n" + (err.read_text() if err.exists() else "(none)")

    deadline = time.monotonic() + 300
    while True:  # requeue the launcher's job once a trial has finished and another runs
        trials = trials_or_none(document, fresh_database) or []
        if any(t.state.name in FINISHED for t in trials) and any(t.state.name == "RUNNING" for t in trials):
            break
        assert time.monotonic() < deadline and launcher_state() in ("PENDING", "RUNNING"), read_log()
        time.sleep(1)
    subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
    requeued = time.monotonic()
    recovered = None
    deadline = time.monotonic() + 900
    while launcher_state() not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        assert time.monotonic() < deadline, read_log()
        if recovered is None and "detached launcher (restart 1)" in read_log():
            recovered = time.monotonic() - requeued
        time.sleep(1)
    output = log.read_text()
    assert launcher_state() == "COMPLETED", both_logs()
    assert "detached launcher (restart 0)" in output and "detached launcher (restart 1)" in output, (
        both_logs()
    )
    # Stopped by the requeue (Slurm's SIGTERM), the first run said which trials keep running.
    assert "keep running as Slurm jobs" in output, both_logs()
    check_budget_met_once(document, fresh_database, 4)
    fault_line(
        "`scontrol requeue` of a detached launcher's job (`hpo launch --detach`)",
        "the job ran again and resumed the study (trial jobs ran on meanwhile); budget of 4 met exactly",
        0,
        recovered,
    )


def _node_state(node: str) -> str:
    return subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%t"], capture_output=True, text=True
    ).stdout.strip()


def power_off(node: str, job_id: str) -> None:
    """What a node failure does to an emulated node of the fault cluster: its slurmd and the job's
    processes on it die."""
    pid = int((FAULTS_RUN / f"slurmd-{node}.pid").read_text())
    subprocess.run(["kill", "-9", str(pid)], check=True)
    kill_job_processes(job_id)


def power_on(node: str) -> None:
    subprocess.run(["slurmd", "-N", node], check=True, timeout=60)
    deadline = time.monotonic() + 120
    while _node_state(node).rstrip("*") not in ("idle", "mix", "alloc"):
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False, capture_output=True
        )
        assert time.monotonic() < deadline, f"{node} did not come back: {_node_state(node)}"
        time.sleep(2)


def test_a_trial_on_a_lost_node_resumes_on_the_other_node(
    tmp_path: Path, fault_cluster: str, fresh_database: str
) -> None:
    """On the fault cluster (its nodes f1 and f2: the local cluster's tests go on beside it), Slurm
    declares the node DOWN after SlurmdTimeout and ends the job NODE_FAIL. Then either
    Slurm requeues it (trial jobs are requeueable) and the same trial resumes on the node left,
    or, if Slurm neither requeues it nor lists it within the launcher's grace, the launcher fails
    the trial and its retry runs there. Nothing is lost, and no run of a failed trial goes on
    beside its retry (sacct may show NODE_FAIL long after the requeue: squeue decides)."""
    document = one_trial_study(tmp_path, "node-loss-study", epochs=8)
    # The launcher's grace for Slurm's requeue, 90 s by default, is 30 s here.
    launcher = launch_in_background(
        write_study(tmp_path / "study.yaml", document), fresh_database, HPO_REQUEUE_GRACE_S="30"
    )
    [trial] = wait_for_trials(
        document, fresh_database, launcher, lambda trials: bool(trials and trials[0].intermediate_values)
    )
    job_id, node = trial.user_attrs["job_id"], trial.user_attrs["nodes"]
    hit = time.monotonic()
    power_off(node, job_id)
    try:
        wait_for_trials(
            document,
            fresh_database,
            launcher,
            lambda trials: (
                trials[0].user_attrs.get("restarts", 0) >= 1
                or (len(trials) > 1 and "nodes" in trials[1].user_attrs)
            ),
            timeout=600,
        )
        recovery_s = time.monotonic() - hit
        output = launcher.communicate(timeout=600)[0]
    finally:
        power_on(node)
    assert launcher.returncode == 0, output
    trials = load_trials(document, fresh_database)
    done = trials[-1]
    assert done.state.name == "COMPLETE" and done.user_attrs["nodes"] != node, output
    resumed = resumed_from(done, job_log(document, done.user_attrs["job_id"]))
    assert 1 <= resumed < 8, output
    assert stored_steps(fresh_database, done._trial_id) == list(range(1, 9))
    # No run of the first job went on training a trial the launcher had failed meanwhile.
    assert "UpdateFinishedTrialError" not in job_log(document, job_id), output
    if len(trials) == 1:  # requeued by Slurm: the same trial in the same job
        assert done.user_attrs["job_id"] == job_id and done.user_attrs["restarts"] == 1
        what = "Slurm requeued the job after NODE_FAIL; trial 0 resumed"
    else:  # failed by the launcher, retried from its checkpoint
        [failed, _] = trials
        assert failed.state.name == "FAIL" and "NODE_FAIL" in failed.user_attrs["fail_reason"]
        assert done.user_attrs["retry_of"] == 0 and done.params == failed.params
        what = (
            "the launcher failed trial 0 (NODE_FAIL, no requeue within its grace of 30 s); its retry resumed"
        )
    fault_line(
        f"node {node} lost mid-trial (its slurmd and the job's processes killed)",
        f"{what} on {done.user_attrs['nodes']} after epoch {resumed}, COMPLETE",
        0,
        recovery_s,
    )
