"""Misuse that would double or lose work, on the local Slurm cluster and PostgreSQL: two launchers
on one study, `hpo cancel` while a slow sbatch is under way, a trial asked and never submitted.

Each test prints a ``FAULT`` line for the fault table (docs/faults.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.hpo.helpers import (
    HPO,
    REPO,
    check_budget_counted_from_sacct,
    check_budget_met_once,
    fault_line,
    launch_in_background,
    load_trials,
    run_hpo,
    score_study,
    sleeping_objective,
    stand_in_study,
    stored_steps,
    study_document,
    study_jobs_in_sacct,
    wait_for_trials,
    write_study,
)

pytestmark = pytest.mark.slow


def slurm_study(
    tmp_path: Path, n_trials: int, max_concurrent: int, epochs: int, epoch_s: float
) -> dict[str, Any]:
    """Trials of the torch-free stand-in (helpers.py) as Slurm jobs: the launcher is the subject."""
    name = f"misuse-{uuid.uuid4().hex[:6]}"  # its jobs are found in squeue and sacct by name
    return stand_in_study(
        tmp_path,
        name,
        epochs=epochs,
        epoch_s=epoch_s,
        study={
            "n_trials": n_trials,
            "max_concurrent": max_concurrent,
            "enqueue": [],
            "pruner": {"name": "none"},
        },
        resources={"executor": "slurm"},
    )


def queued(document: dict[str, Any]) -> list[str]:
    name = f"hpo-{document['study']['name']}"
    proc = subprocess.run(
        ["squeue", "-h", "--name", f"{name},{name}:worker,{name}:launcher", "-o", "%i %T"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def launcher(study_file: Path, storage: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [HPO, "launch", str(study_file), "--storage", storage],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


class QueueWatch(threading.Thread):
    """Polls squeue for the study's jobs whose trial is still running and keeps the largest count
    seen at once (a job whose process has left its result file is exiting: the launcher gives
    its place to the next trial)."""

    def __init__(self, document: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.document = document
        self.peak = 0
        self.polls = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            jobs = Path(self.document["study"]["workdir"]) / "jobs"
            running = [j for j in queued(self.document) if not (jobs / j / f"{j}_0_result.pkl").exists()]
            self.peak = max(self.peak, len(running))
            self.polls += 1
            time.sleep(0.3)


def test_two_launchers_started_together_run_the_budget_once(tmp_path: Path, fresh_database: str) -> None:
    document = slurm_study(tmp_path, n_trials=3, max_concurrent=2, epochs=2, epoch_s=2.0)
    study_file = write_study(tmp_path / "study.yaml", document)
    watch = QueueWatch(document)
    watch.start()
    first, second = launcher(study_file, fresh_database), launcher(study_file, fresh_database)
    outputs = {proc: proc.communicate(timeout=900)[0] for proc in (first, second)}
    watch.stop.set()
    watch.join()

    [winner] = [proc for proc in (first, second) if proc.returncode == 0]
    [refused] = [proc for proc in (first, second) if proc is not winner]
    assert refused.returncode == 3, outputs[refused]
    [line] = [line for line in outputs[refused].splitlines() if "error" in line]
    assert f"study '{document['study']['name']}' is being launched by pid {winner.pid} on " in line, line
    assert "hint: wait for that launcher" in line, line
    trials = load_trials(document, fresh_database)
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" for t in trials), [
        (t.number, t.state.name, t.user_attrs) for t in trials
    ]
    assert watch.polls > 10 and watch.peak <= 2, (watch.polls, watch.peak)
    held = [str(t.user_attrs["job_id"]) for t in trials]
    assert sorted(study_jobs_in_sacct(document, held)) == sorted(held)
    fault_line(
        "two `hpo launch` of one study started together (--n-trials 3, max_concurrent 2)",
        f"one ran the study: 3 trials, at most {watch.peak} Slurm jobs at once (squeue, {watch.polls} polls); "
        "the other exited 3 naming the launcher that holds the study",
        0,
        None,
    )


def test_a_second_launcher_is_refused_while_the_first_holds_the_study(
    tmp_path: Path, local_cluster: str
) -> None:
    """The embedded journal (a file lock) and PostgreSQL (an advisory lock), without training."""
    from hpo import config, storage
    from hpo.dispatch.lease import Lease, StudyBusy

    document = study_document("held-study", tmp_path / "work")
    study_file = write_study(tmp_path / "study.yaml", document)
    spec = config.load_study(str(study_file))
    for url in (None, local_cluster):
        ref = storage.resolve_storage(spec, url, "--storage")
        lease = Lease(ref, spec.study.name)
        lease.acquire()
        try:
            with pytest.raises(StudyBusy, match=f"being launched by pid {os.getpid()} on "):
                Lease(ref, spec.study.name).acquire()
            args = ["launch", str(study_file)] + (["--storage", url] if url else [])
            refused = run_hpo(*args, timeout=120)
            assert refused.returncode == 3, refused.stderr
            assert f"is being launched by pid {os.getpid()} on " in refused.stderr, refused.stderr
            if url:  # a detached launcher is a Slurm job: refused before it is submitted
                detached = run_hpo(*args, "--detach", "--executor", "slurm", timeout=120)
                assert detached.returncode == 3 and "is being launched by" in detached.stderr, detached.stderr
        finally:
            lease.release()
        assert Lease(ref, spec.study.name).held_by_another() is None  # released with its holder


def slow_sbatch(tmp_path: Path, delay_s: float) -> dict[str, str]:
    """A PATH whose sbatch waits ``delay_s`` before submitting, as on a busy cluster. Each call
    writes a line to ``slow-bin/calls`` as it starts and another once sbatch has returned."""
    real = shutil.which("sbatch")
    assert real
    folder = tmp_path / "slow-bin"
    folder.mkdir()
    (folder / "sbatch").write_text(
        f"#!/bin/sh\necho started >> {folder}/calls\nsleep {delay_s}\n"
        f'{real} "$@"\nstatus=$?\necho ended >> {folder}/calls\nexit $status\n'
    )
    (folder / "sbatch").chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def wait_for_every_sbatch_to_return(tmp_path: Path, timeout: float = 120) -> None:
    """Until every call of slow_sbatch's sbatch has returned: one orphaned by the launcher could
    still submit a job."""
    calls = tmp_path / "slow-bin" / "calls"
    deadline = time.monotonic() + timeout
    while (lines := calls.read_text().split()).count("started") != lines.count("ended"):
        assert time.monotonic() < deadline, lines
        time.sleep(0.2)


def test_cancel_during_a_slow_submission_is_final(tmp_path: Path, fresh_database: str) -> None:
    # Trials far longer than the cancel takes (they are cancelled, so the test does not wait them out).
    document = slurm_study(tmp_path, n_trials=6, max_concurrent=4, epochs=3, epoch_s=60.0)
    study_file = write_study(tmp_path / "study.yaml", document)
    running = launcher(study_file, fresh_database, slow_sbatch(tmp_path, 4))
    # Right after the first submission is stored: the launcher is inside the second, slow sbatch.
    wait_for_trials(
        document, fresh_database, running, lambda trials: any("job_id" in t.user_attrs for t in trials)
    )
    started = time.monotonic()
    cancel = run_hpo("cancel", str(study_file), "--storage", fresh_database, timeout=600)
    took = time.monotonic() - started
    returned = time.time()
    assert cancel.returncode == 0, cancel.stderr
    assert queued(document) == [], cancel.stdout
    output = running.communicate(timeout=300)[0]
    wait_for_every_sbatch_to_return(tmp_path)  # anything submitted late would show now
    assert queued(document) == []

    trials = load_trials(document, fresh_database)
    assert all(t.state.name == "FAIL" for t in trials), [
        (t.number, t.state.name, t.user_attrs) for t in trials
    ]
    for trial in trials:
        asked = trial.datetime_start.timestamp() if trial.datetime_start else 0
        assert asked < returned, (trial.number, trial.user_attrs)
        reason = trial.user_attrs["fail_reason"]
        assert "cancelled by hpo cancel" in reason, reason
    # Every job the study ever had was cancelled, and each is held by a trial.
    held = [str(t.user_attrs["job_id"]) for t in trials if "job_id" in t.user_attrs]
    jobs = study_jobs_in_sacct(document, held)
    assert jobs and all(state.startswith("CANCELLED") for state in jobs.values()), jobs
    assert sorted(jobs) == sorted(held), (jobs, held)
    assert "hpo cancel: submitting no more trials" in output, output
    assert "submits no more trials" in cancel.stdout, cancel.stdout
    fault_line(
        "`hpo cancel` during a submission (sbatch slowed to 4 s, max_concurrent 4)",
        f"cancel waited for the launcher's confirmation; {len(jobs)} job(s) cancelled, none submitted after it, "
        f"{len(trials)} trial(s) FAIL as cancelled",
        0,
        took,
    )


def test_a_trial_asked_but_never_submitted_is_closed_and_not_counted(
    tmp_path: Path, fresh_database: str
) -> None:
    document = slurm_study(tmp_path, n_trials=1, max_concurrent=1, epochs=1, epoch_s=1.0)
    # A submission the real sbatch refuses (the cluster enforces associations: no such account):
    # the launcher exits, its trial closed with the reason.
    document["resources"]["account"] = "nosuchaccount"
    refused = launcher(write_study(tmp_path / "study.yaml", document), fresh_database, {})
    output = refused.communicate(timeout=300)[0]
    assert refused.returncode == 1, output
    assert (
        "never submitted: submission failed: sbatch: error: Batch job submission failed: Invalid account"
        in output
    )
    del document["resources"]["account"]
    study_file = write_study(tmp_path / "study.yaml", document)
    # A launcher killed between ask and submit leaves a RUNNING trial with nothing on it.
    import optuna

    study = optuna.load_study(study_name=document["study"]["name"], storage=fresh_database)
    study.ask()
    relaunch = run_hpo("launch", str(study_file), "--storage", fresh_database)
    assert relaunch.returncode == 0, relaunch.stdout + relaunch.stderr
    trials = load_trials(document, fresh_database)
    states = [
        (t.state.name, t.user_attrs.get("not_run"), t.user_attrs.get("fail_reason", "")) for t in trials
    ]
    assert [s[:2] for s in states] == [("FAIL", True), ("FAIL", True), ("COMPLETE", None)], states
    assert "Invalid account" in states[0][2] and "never submitted" in states[1][2], states
    status = run_hpo("status", str(study_file), "--storage", fresh_database)
    assert "1 of 1 trials" in status.stdout, status.stdout
    fault_line(
        "a submission refused by sbatch (an account that does not exist); a launcher stopped between ask and submit",
        "each trial asked for it closed FAIL with its reason, not counted; the relaunch ran the budget of 1 exactly",
        0,
        None,
    )


def test_a_launcher_frozen_past_its_lease_stops_before_it_submits_again(
    tmp_path: Path, fresh_database: str
) -> None:
    """A launcher frozen (SIGSTOP: a suspended VM, a node stalled on I/O) on a host that the
    server can no longer reach: the server ends its lock session (here pg_terminate_backend does
    what its unanswered TCP keepalives do after ~30 s), a second launcher takes the study and
    re-attaches its trials; the first, thawed, must submit nothing more."""
    # The first two trials hold after their step 2 until the second launcher has re-attached them:
    # on a busy machine they would otherwise end before it starts, leaving nothing to re-attach.
    (tmp_path / "my_objective.py").write_text(sleeping_objective(6, 1.5, hold_after=2))
    (tmp_path / "hold").touch()
    document = score_study(
        tmp_path, f"fenced-{uuid.uuid4().hex[:6]}", {"steps": 6, "function": "my_objective:objective"},
        n_trials=6, max_concurrent=2, budget=1.0,
    )  # fmt: skip
    document["resources"] = {"executor": "slurm", "time": "10m"}
    study_file = write_study(tmp_path / "study.yaml", document)
    first = launch_in_background(study_file, fresh_database)
    wait_for_trials(
        document, fresh_database, first, lambda trials: sum(1 for t in trials if t.intermediate_values) >= 2
    )
    first.send_signal(signal.SIGSTOP)
    try:
        ended = subprocess.run(
            ["psql", "-X", "-w", "-A", "-t", fresh_database, "-c",
             "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
             f"WHERE application_name LIKE 'pid {first.pid} on %'"],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        assert ended.stdout.strip() == "1", ended.stdout  # its lock session, and only that
        second = launch_in_background(study_file, fresh_database)
        assert second.stdout is not None
        seen = []
        for line in second.stdout:  # until it has re-attached the held trials
            seen.append(line)
            if "re-attached" in line:
                break
        (tmp_path / "hold").unlink()
        wait_for_trials(  # the second holds the study and has submitted a trial of its own
            document,
            fresh_database,
            second,
            lambda trials: len(trials) >= 3 and "job_id" in trials[2].user_attrs,
        )
    finally:
        first.send_signal(signal.SIGCONT)
        (tmp_path / "hold").unlink(missing_ok=True)
    first_output = first.communicate(timeout=300)[0]
    second_output = "".join(seen) + second.communicate(timeout=600)[0]

    assert first.returncode == 1, first_output
    assert "was taken over by" in first_output and "stops before it submits again" in first_output
    assert second.returncode == 0, second_output
    assert "re-attached" in second_output, second_output
    submitted_by_first = first_output.count(" submitted as slurm job ")
    assert submitted_by_first == 2, first_output  # before the freeze, none after
    check_budget_met_once(document, fresh_database, 6)  # one Slurm job per trial
    check_budget_counted_from_sacct(document, study_file, fresh_database)  # both launchers' jobs
    for trial in load_trials(document, fresh_database):
        assert trial.state.name == "COMPLETE" and stored_steps(fresh_database, trial._trial_id) == list(
            range(1, 7)
        )
    fault_line(
        "a launcher frozen (SIGSTOP) past its lease: the server ended its lock session, a second launcher took the study",
        "the second re-attached its 2 trials and finished the study; the first, thawed, stopped before "
        "submitting again; 6 of 6 COMPLETE, one job each",
        0,
        None,
    )


def sacct_intervals(job_ids: list[str], timeout: float = 120) -> list[tuple[int, int]]:
    """Each job's [Submit, End) in whole seconds from sacct, read once accounting has every end:
    the span the job is the cluster's to count (pending or running), which the launcher alone
    decides; when it starts depends on the CPUs the rest of the suite leaves free."""
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID,Submit,End", "-j", ",".join(job_ids)],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        rows = [line.split("|") for line in proc.stdout.splitlines() if line]
        ended = {job: (submit, end) for job, submit, end in rows if end not in ("", "Unknown")}
        if set(job_ids) <= set(ended) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert set(job_ids) <= set(ended), (job_ids, rows)

    def seconds(stamp: str) -> int:
        return int(time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")))

    return [(seconds(ended[job][0]), seconds(ended[job][1])) for job in job_ids]


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    """The most intervals [begin, end) that hold one instant."""
    return max(sum(begin <= t < end for begin, end in intervals) for t, _ in intervals)


SLOW_EXIT_OBJECTIVE = """
import threading
import time


def objective(params, trial):
    time.sleep(0.5)
    trial.report(1, params["lr"])
    # A thread that winds down for seconds after the result (a data loader's, a logger's): the
    # job's process, and so its Slurm job, ends that much after the trial has told its value.
    threading.Thread(target=time.sleep, args=(3,)).start()
    return params["lr"]
"""


def test_max_concurrent_counting_jobs_holds_in_sacct(tmp_path: Path, fresh_database: str) -> None:
    """Trials whose jobs take 3 s to exit after their result, at most 2 at once: counting trials,
    the next ones are submitted beside the exiting jobs (more than 2 in sacct); counting jobs
    (``max_concurrent_counts: jobs``), never more than 2 of the study's jobs in sacct at once,
    pending or running."""
    (tmp_path / "slow_exit.py").write_text(SLOW_EXIT_OBJECTIVE)
    peaks = {}
    for counts in ("trials", "jobs"):
        document = study_document(f"counts-{counts}-{uuid.uuid4().hex[:6]}", tmp_path / counts)
        del document["trainer"]
        document["study"].update(n_trials=4, max_concurrent=2, max_concurrent_counts=counts, enqueue=[])
        document["study"]["pruner"] = {"name": "none"}
        document["resources"]["executor"] = "slurm"
        document["objective"] = {"function": "slow_exit:objective", "steps": 1}
        proc = launcher(write_study(tmp_path / f"{counts}.yaml", document), fresh_database)
        output = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, output
        trials = load_trials(document, fresh_database)
        assert [t.state.name for t in trials] == ["COMPLETE"] * 4, output
        intervals = sacct_intervals([str(t.user_attrs["job_id"]) for t in trials])
        peaks[counts] = (most_at_once(intervals), sorted(intervals))
    assert peaks["trials"][0] > 2 and peaks["jobs"][0] <= 2, peaks
