"""`hpo launch` end to end: real trainer trials on the real Fashion-MNIST, as local processes and as
real Slurm jobs on the local cluster, with the study in a journal file or a real PostgreSQL."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import stat
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from hpo.tally import format_value
from tests.hpo.helpers import (
    GOOD,
    distinct_params,
    final_sacct_states,
    launch_in_background,
    load_trials,
    max_overlap,
    run_hpo,
    sacct_states,
    stand_in_study,
    start_hpo,
    study_document,
    wait_for_trials,
    write_study,
)

pytestmark = pytest.mark.slow

FINISHED = {"COMPLETE", "PRUNED"}


def check_finished_study(trials: list[Any], n_trials: int, direction: str = "maximize") -> None:
    states = [t.state.name for t in trials]
    assert len(trials) == n_trials, states
    assert set(states) <= FINISHED, [(t.number, t.state.name, t.user_attrs) for t in trials]
    assert "COMPLETE" in states and "PRUNED" in states, states
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    for trial in trials:
        # One intermediate value per epoch trained, from rank 0 only, never duplicated.
        epochs = sorted(trial.intermediate_values)
        assert epochs == list(range(1, len(epochs) + 1))
        assert trial.user_attrs["epochs_completed"] == len(epochs)
        assert trial.user_attrs["job_id"]
    assert all(len(t.intermediate_values) == 3 for t in complete)
    assert all(len(t.intermediate_values) < 3 for t in trials if t.state.name == "PRUNED")
    assert distinct_params(trials)
    # Never more than max_concurrent in flight, and the launcher did keep 2 in flight.
    assert max_overlap(trials) == 2


def best_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("best trial")]
    assert lines, stdout
    return lines[-1]


def test_local_executor_runs_a_study_with_pruning(tmp_path: Path, fashion_mnist_root: str) -> None:
    # Five trials: the four enqueued (two pruned) and one of TPE's; each costs seconds of torch.
    document = study_document(
        "local-study", tmp_path / "work", study={"n_trials": 5}, trainer={"test_held_out": True}
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document)
    check_finished_study(trials, 5)
    best = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert best_line(proc.stdout).startswith(f"best trial {best.number}: value={format_value(best.value)} ")
    # The trials were local processes: their "job id" is the local controller's pid, no Slurm.
    assert all(t.user_attrs["executor"] == "local" for t in trials)
    # Completed trials carry their accuracy on the held-out test images; pruned ones never got there.
    for trial in trials:
        assert ("test_accuracy" in trial.user_attrs) == (trial.state.name == "COMPLETE"), trial.user_attrs
    assert 0.5 < best.user_attrs["test_accuracy"] <= 1.0

    status = run_hpo("status", str(study_file))
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("study local-study: 5 of 5 trials;")
    best_cmd = run_hpo("best", str(study_file))
    assert best_cmd.returncode == 0, best_cmd.stderr
    assert f"best trial {best.number}:" in best_cmd.stdout
    assert f"held-out test_accuracy={format_value(best.user_attrs['test_accuracy'])} " in best_cmd.stdout
    assert "train it: OMP_NUM_THREADS=1 python -m trainer --model resnet8" in best_cmd.stdout


def test_slurm_executor_runs_trials_as_slurm_jobs_with_postgresql(
    tmp_path: Path, fresh_database: str, fashion_mnist_root: str
) -> None:
    document = study_document("slurm-study", tmp_path / "work", study={"n_trials": 5})
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file), "--executor", "slurm", "--storage", fresh_database)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document, fresh_database)
    check_finished_study(trials, 5)
    # Every trial ran as its own Slurm job, which sacct knows and which ended well.
    job_ids = [t.user_attrs["job_id"] for t in trials]
    assert len(set(job_ids)) == 5
    # (The last jobs may still be exiting when the launcher has seen their trials told.)
    assert {job_id: _wait_for_sacct(job_id) for job_id in job_ids} == dict.fromkeys(job_ids, "COMPLETED")
    assert all(t.user_attrs["nodes"] in ("n1", "n2") for t in trials)

    status = run_hpo("status", str(study_file), "--storage", fresh_database)
    assert status.returncode == 0, status.stderr
    # CPU-hours (no GPU here) per trial and for the study: exactly what sacct says of their jobs.
    sacct = subprocess.run(
        ["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,ElapsedRaw,NCPUS", "-j", ",".join(job_ids)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    cpu_hours = {
        job: int(elapsed) * int(cpus) / 3600
        for job, elapsed, cpus in (line.split("|") for line in sacct.stdout.split())
    }
    for trial in trials:
        row = re.search(
            rf"^{trial.number}\s+{trial.state.name}\s+\d\s+[\d.]+\s+{trial.user_attrs['job_id']}\s+\d+s\s+(\S+)\s",
            status.stdout,
            re.M,
        )
        assert row, status.stdout
        assert row.group(1) == f"{cpu_hours[trial.user_attrs['job_id']]:.3g}", (row.group(0), cpu_hours)
    total = re.search(
        r"^cost: (\S+) CPU-hours \(.*PRUNED.*\); pruning saved (\S+) CPU-hours \[measured\]$",
        status.stdout,
        re.M,
    )
    assert total, status.stdout
    assert total.group(1) == f"{sum(cpu_hours.values()):.3g}"
    assert float(total.group(2)) > 0  # pruned trials stopped before their 3 epochs

    # The report's figures are sacct's too.
    report = run_hpo(
        "report", str(study_file), "--out", str(tmp_path / "report"), "--storage", fresh_database
    )
    assert report.returncode == 0, report.stderr
    summary = json.loads((tmp_path / "report/summary.json").read_text())["cost"]
    assert summary["source"] == "measured" and summary["unit"] == "CPU-hours"
    assert summary["total"] == pytest.approx(sum(cpu_hours.values()))
    assert summary["per_trial"] == {
        str(t.number): pytest.approx(cpu_hours[t.user_attrs["job_id"]]) for t in trials
    }

    # A trial's Slurm output by its number.
    logs = run_hpo("logs", str(study_file), "0", "--storage", fresh_database)
    assert logs.returncode == 0 and "rank 0 reporting to study 'slurm-study', trial 0" in logs.stdout, (
        logs.stdout
    )
    assert "[trainer] epoch 1/3 train_loss " in logs.stdout, logs.stdout  # the trainer's own lines
    err = run_hpo("logs", str(study_file), "0", "--err", "--storage", fresh_database)
    job = trials[0].user_attrs["job_id"]
    assert err.returncode == 0 and err.stdout == (tmp_path / f"work/jobs/{job}/{job}_0_log.err").read_text()
    missing = run_hpo("logs", str(study_file), "99", "--storage", fresh_database)
    assert missing.returncode == 2 and "trial 99: no such trial" in missing.stderr


def test_ddp_trial_across_two_nodes_reports_from_rank_0_and_is_pruned_without_hanging(
    tmp_path: Path, fresh_database: str, fashion_mnist_root: str
) -> None:
    document = study_document(
        "ddp-study",
        tmp_path / "work",
        study={"n_trials": 1, "max_concurrent": 1, "enqueue": [GOOD],
               # Unreachable after one epoch: the trial is pruned at its first report.
               "pruner": {"name": "threshold", "options": {"lower": 0.99}}},
        resources={"executor": "slurm", "nodes": 2, "tasks_per_node": 1},
    )  # fmt: skip
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file), "--storage", fresh_database, timeout=300)
    # The only trial was pruned, so no trial completed: a runtime failure, status 1.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "trial 0 PRUNED at epoch 1" in proc.stdout
    [trial] = load_trials(document, fresh_database)
    assert trial.state.name == "PRUNED"
    assert list(trial.intermediate_values) == [1]
    job_id = trial.user_attrs["job_id"]
    assert trial.user_attrs["nodes"] == "n[1-2]"
    logs = Path(document["study"]["workdir"]) / "jobs" / job_id
    rank0, rank1 = (logs / f"{job_id}_{rank}_log.out" for rank in (0, 1))
    # Both ranks obeyed the pruning decision and exited 0 (srun --kill-on-bad-exit would fail the
    # job otherwise), long before the DDP timeout.
    assert _wait_for_sacct(job_id) == "COMPLETED"
    assert "rank 0 reporting to study" in rank0.read_text()
    assert "reporting to study" not in rank1.read_text()


def _wait_for_sacct(job_id: str, timeout: float = 60) -> str:
    return final_sacct_states([job_id], timeout).get(job_id, "")


def test_workers_on_a_fresh_postgresql_database_start_at_once_without_errors(
    tmp_path: Path, empty_database: str
) -> None:
    # Eight workers of the torch-free stand-in (helpers.py): the database's first moments are the subject.
    document = stand_in_study(
        tmp_path,
        "workers-study",
        epochs=1,
        epoch_s=0.5,
        study={"n_trials": 16, "max_concurrent": 8, "enqueue": [], "pruner": {"name": "none"}},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file), "--workers", "8", "--storage", empty_database)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document, empty_database)
    counted = [t for t in trials if not t.user_attrs.get("surplus")]
    assert len(counted) == 16
    assert all(t.state.name == "COMPLETE" for t in counted), [(t.number, t.user_attrs) for t in counted]
    # Surplus trials (several workers asking for the last slot at once) are closed unrun.
    assert all("started_at" not in t.user_attrs for t in trials if t.user_attrs.get("surplus"))
    assert distinct_params(counted)
    workers = {t.user_attrs["job_id"] for t in counted}
    assert len(workers) >= 2, workers
    logs = list((Path(document["study"]["workdir"]) / "jobs").rglob("*_log.err"))
    assert len(logs) == 8
    for log in logs:
        assert "Traceback" not in log.read_text(), log.read_text()[-2000:]


def test_a_password_in_the_study_file_reaches_no_file_log_argv_or_report(
    tmp_path: Path, fresh_database: str, monkeypatch: pytest.MonkeyPatch, fashion_mnist_root: str
) -> None:
    # The harness keeps the role's password in ~/.pgpass; here it travels the other supported
    # way, interpolated into the study file's URL from an environment variable, in the query form
    # libpq accepts besides user:password@ (both go through the same resolve_storage: unit tests).
    password = next(
        line.rsplit(":", 1)[1]
        for line in (Path.home() / ".pgpass").read_text().splitlines()
        if line.startswith("127.0.0.1:5432:*:hpo:")
    )
    monkeypatch.setenv("HPO_TEST_DB_PASSWORD", password)
    database = fresh_database.rsplit("/", 1)[1]
    document = study_document(
        "secret-study",
        tmp_path / "work",
        study={
            "storage": f"postgresql://hpo@127.0.0.1:5432/{database}?password=${{HPO_TEST_DB_PASSWORD}}",
            "n_trials": 1,
            "max_concurrent": 1,
            "enqueue": [GOOD],
        },
        resources={"executor": "slurm"},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    dry = run_hpo("launch", str(study_file), "--dry-run")
    assert dry.returncode == 0 and f"127.0.0.1:5432/{database}" in dry.stdout, dry.stdout + dry.stderr
    assert password not in dry.stdout + dry.stderr
    launcher = start_hpo("launch", str(study_file))
    argv_seen = 0
    while launcher.poll() is None:  # every process's argv while the study runs (what ps shows)
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                assert password.encode() not in cmdline.read_bytes(), cmdline
                argv_seen += 1
        time.sleep(0.5)
    output = launcher.communicate()[0]
    assert launcher.returncode == 0 and argv_seen, output
    [trial] = load_trials(document, fresh_database)
    assert trial.state.name == "COMPLETE"
    assert _wait_for_sacct(trial.user_attrs["job_id"]) == "COMPLETED"
    assert password not in output
    report = run_hpo("report", str(study_file), "--out", str(tmp_path / "work" / "report"))
    assert report.returncode == 0 and password not in report.stdout + report.stderr
    files = [path for path in (tmp_path / "work").rglob("*") if path.is_file()]
    assert any(path.name.endswith("_submitted.pkl") for path in files)
    assert any(path.name.endswith("_submission.sh") for path in files)
    assert any(path.name == "summary.json" for path in files)
    for path in files:  # job pickles, the sbatch script, logs, checkpoints, the report
        assert password.encode() not in path.read_bytes(), path
    # The workdir holds code (submitit's pickles): only its owner may enter it.
    for folder in (tmp_path / "work", tmp_path / "work" / "jobs"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    status = run_hpo("status", str(study_file))
    assert status.returncode == 0 and password not in status.stdout + status.stderr


def test_cancel_stops_a_running_study_and_leaves_nothing_running(tmp_path: Path, fresh_database: str) -> None:
    name = f"cancel-{uuid.uuid4().hex[:8]}"
    # Far longer than the test waits (the torch-free stand-in, 500 epochs of 5 s): no trial may end
    # on its own before the cancel, even when the second trial's job starts late on a busy machine.
    document = stand_in_study(
        tmp_path,
        name,
        epochs=500,
        epoch_s=5.0,
        study={"n_trials": 8, "enqueue": [], "pruner": {"name": "none"}},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    # A study whose trial jobs once had the name of this study's Ray job (hpo-NAME-ray): the
    # cancel of this study must leave its job running.
    neighbour = copy.deepcopy(document)
    neighbour["study"].update(
        name=f"{name}-ray", workdir=str(tmp_path / "neighbour"), n_trials=1, max_concurrent=1
    )  # its study file beside this one's: the same stand_in.py
    neighbour_file = write_study(tmp_path / "neighbour.yaml", neighbour)
    neighbour_launcher = launch_in_background(neighbour_file, fresh_database, "--executor", "slurm")
    launcher = launch_in_background(study_file, fresh_database, "--executor", "slurm")
    wait_for_trials(  # two trials running in their jobs
        document,
        fresh_database,
        launcher,
        lambda trials: sum(1 for t in trials if t.state.name == "RUNNING" and t.intermediate_values) == 2,
        # A job of another test that needs both nodes (a Ray cluster) may be ahead of the second
        # trial's in the queue until a running job reaches its time limit (seen: 8.5 minutes).
        timeout=660,
    )
    [running] = wait_for_trials(
        neighbour,
        fresh_database,
        neighbour_launcher,
        lambda trials: bool(trials and trials[0].intermediate_values),
    )
    proc = run_hpo("cancel", str(study_file), "--storage", fresh_database)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(re.findall(r"^trial \d+: cancelled slurm job \d+$", proc.stdout, re.M)) == 2, proc.stdout
    assert "found by its name" not in proc.stdout, proc.stdout
    neighbour_job = running.user_attrs["job_id"]
    assert sacct_states([neighbour_job])[neighbour_job] == "RUNNING"
    [still] = load_trials(neighbour, fresh_database)
    assert still.state.name == "RUNNING" and neighbour_launcher.poll() is None
    assert run_hpo("cancel", str(neighbour_file), "--storage", fresh_database).returncode == 0
    neighbour_launcher.communicate(timeout=120)
    # The launcher takes no new trial after a cancel, and ends.
    output = launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 0, output  # a cancel is no failure of the launcher
    assert "no trial completed: the study was cancelled (hpo cancel)" in output, output
    trials = load_trials(document, fresh_database)
    assert len(trials) == 2 and all(t.state.name == "FAIL" for t in trials), output
    assert all(t.user_attrs["fail_reason"] == "cancelled by hpo cancel" for t in trials)
    for trial in trials:
        assert _wait_for_sacct(trial.user_attrs["job_id"]).startswith("CANCELLED")
