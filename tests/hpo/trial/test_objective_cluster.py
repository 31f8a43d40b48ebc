"""The user's own training code on the local Slurm cluster, with PostgreSQL and with Ray: the
unchanged example script (examples/dlojz/train.py), the trial API under a 2-task DDP job and a
requeue, and a command objective on the Ray backend inside one Slurm job."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from hpo.tally import format_value
from tests.hpo.helpers import (
    final_sacct_states,
    launch_in_background,
    load_trials,
    processes_with,
    run_hpo,
    wait_for_trials,
    write_study,
)
from trainer.yamlfile import load_yaml_mapping

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "dlojz"

pytestmark = pytest.mark.slow

GOOD = {"lr": 0.05, "wd": 5e-4, "batch_size": 64, "pct_start": 0.3}
BAD = {"lr": 0.001, "wd": 5e-4, "batch_size": 128, "pct_start": 0.3}


def _example(study_file: str, tmp_path: Path, **study: Any) -> dict[str, Any]:
    document = load_yaml_mapping(EXAMPLE / study_file)
    document["study"].update(
        name=f"{document['study']['name']}-{uuid.uuid4().hex[:6]}", workdir=str(tmp_path / "work"), **study
    )
    document["objective"]["cwd"] = str(EXAMPLE)  # the study file is written under tmp_path
    return document


def test_the_unchanged_example_script_is_tuned_on_slurm_with_postgresql(
    tmp_path: Path, fresh_database: str, fashion_mnist_root: str
) -> None:
    document = _example(
        "study.yaml",
        tmp_path,
        n_trials=6,
        max_concurrent=2,
        # Two good guesses report first; the bad ones then fall below them at epoch 1 and are pruned.
        enqueue=[GOOD, {**GOOD, "lr": 0.1}, BAD, {**BAD, "lr": 0.002}],
    )
    document["resources"]["executor"] = "slurm"
    study_file = write_study(tmp_path / "study.yaml", document)

    proc = run_hpo("launch", str(study_file), "--storage", fresh_database)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document, fresh_database)
    states = [t.state.name for t in trials]
    assert len(trials) == 6 and set(states) <= {"COMPLETE", "PRUNED"}, proc.stdout
    assert "PRUNED" in states and "COMPLETE" in states, states
    for trial in trials:
        steps = sorted(trial.intermediate_values)
        assert steps == list(range(1, len(steps) + 1)), trial.intermediate_values  # its printed epochs
        assert len(steps) == 4 if trial.state.name == "COMPLETE" else len(steps) < 4
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    assert all(
        s == "COMPLETED" for s in final_sacct_states([t.user_attrs["job_id"] for t in pruned]).values()
    )
    # No process of any trial is left: the commands name their checkpoint folders under tmp_path.
    assert processes_with(str(tmp_path / "work" / "trials")) == []

    best = run_hpo("best", str(study_file), "--storage", fresh_database)
    assert best.returncode == 0, best.stderr
    best_trial = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert best.stdout.startswith(
        f"best trial {best_trial.number}: val_acc={format_value(best_trial.value)} "
    ), best.stdout
    command = best.stdout.splitlines()[-1].strip()
    assert command.startswith(f"cd {EXAMPLE} && env OMP_NUM_THREADS=") and " train.py --lr " in command, (
        best.stdout
    )
    rerun = subprocess.run(command, shell=True, cwd=EXAMPLE, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    last = rerun.stdout.splitlines()[-1]
    assert re.search(rf"val_acc {best_trial.value:.4f} ", last), (last, best_trial.value)


def test_a_trial_api_script_as_a_2_task_ddp_job_stops_every_rank_together_and_resumes_after_a_requeue(
    tmp_path: Path, fresh_database: str, fashion_mnist_root: str
) -> None:
    document = _example(
        "study_trial_api.yaml",
        tmp_path,
        n_trials=2,
        max_concurrent=1,
        pruner={"name": "threshold", "options": {"lower": 0.5}},  # a run below 0.5 at epoch 1 stops
        enqueue=[
            {"lr": 1.0e-4, "wd": 1.0e-4, "batch_size": 64, "epochs": 8},
            {"lr": 0.05, "wd": 5.0e-4, "batch_size": 64, "epochs": 8},
        ],
    )
    document["search_space"]["epochs"] = {"type": "categorical", "choices": [8]}  # long enough to requeue
    document["search_space"]["lr"]["low"] = 1.0e-5  # room for a run that learns nothing in an epoch
    document["objective"]["steps"] = 8
    study_file = write_study(tmp_path / "study.yaml", document)
    launcher = launch_in_background(study_file, fresh_database)

    # Trial 1 (the good one) has reported its first epoch: requeue its job, as a preemption would.
    [*_, running] = wait_for_trials(
        document,
        fresh_database,
        launcher,
        lambda trials: (
            len(trials) == 2 and trials[1].state.name == "RUNNING" and bool(trials[1].intermediate_values)
        ),
        timeout=300,
    )
    job_id = running.user_attrs["job_id"]
    subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=60)
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == 0, output

    pruned, resumed = load_trials(document, fresh_database)
    assert pruned.state.name == "PRUNED" and sorted(pruned.intermediate_values) == [1], output
    assert resumed.state.name == "COMPLETE" and sorted(resumed.intermediate_values) == list(range(1, 9)), (
        output
    )
    assert resumed.user_attrs["job_id"] == job_id and resumed.user_attrs.get("restarts") == 1, (
        resumed.user_attrs
    )
    logs = {path.name: path.read_text() for path in (tmp_path / "work" / "jobs").rglob("*_log.out")}
    pruned_logs = [text for name, text in logs.items() if name.startswith(pruned.user_attrs["job_id"] + "_")]
    # Both ranks of the pruned trial ran, and both stopped after the same epoch: rank 0's decision.
    assert len(pruned_logs) == 2, sorted(logs)
    stops = sorted(re.findall(r"rank (\d): stopped by the study after epoch (\d+)", "".join(pruned_logs)))
    assert stops == [("0", "1"), ("1", "1")], pruned_logs
    # Rank 0 alone reports (its job log shows each report it passed on; rank 1's shows none).
    rank_logs = {
        int(name.split("_")[1]): text for name, text in logs.items() if name.startswith(job_id + "_")
    }
    assert sorted(rank_logs) == [0, 1], sorted(logs)
    assert re.findall(r"^hpo: report of step (\d+)", rank_logs[0], re.M)[-1] == "8", rank_logs[0]
    assert "hpo: report of step" not in rank_logs[1], rank_logs[1]
    # The requeued run went on from the checkpoint of the first, on both ranks.
    resumed_from = dict(
        re.findall(r"rank (\d): resumed from epoch (\d+)", resumed_logs := rank_logs[0] + rank_logs[1])
    )
    assert set(resumed_from) == {"0", "1"} and len(set(resumed_from.values())) == 1, resumed_logs
    assert int(resumed_from["0"]) >= 1, resumed_logs
    assert processes_with(str(tmp_path / "work" / "trials")) == []


@pytest.mark.ray_ports  # one Ray test at a time
def test_a_command_objective_runs_on_the_ray_backend_inside_one_slurm_job(
    tmp_path: Path, fault_cluster: str, fresh_database: str, fashion_mnist_root: str
) -> None:
    # On the fault cluster (nodes f1 and f2): a job of every node of the local cluster would keep the
    # other tests' jobs waiting.
    document = _example("study.yaml", tmp_path, backend="ray", n_trials=4, enqueue=[GOOD, BAD])
    document["resources"].update(executor="slurm", nodes=2)
    study_file = write_study(tmp_path / "study.yaml", document)

    proc = run_hpo("launch", str(study_file), "--storage", fresh_database)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document, fresh_database)
    assert len(trials) == 4 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}, proc.stdout
    [job_id] = {t.user_attrs["job_id"] for t in trials}  # all in the one Ray job
    deadline = time.monotonic() + 120  # the allocation is stopping Ray when the launcher returns
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, f"Ray job {job_id} still in squeue"
        time.sleep(1)
    assert final_sacct_states([job_id]) == {job_id: "COMPLETED"}
    good = trials[0]
    assert good.state.name == "COMPLETE" and sorted(good.intermediate_values) == [1, 2, 3, 4]
    assert good.value == good.intermediate_values[4]
    assert processes_with(str(tmp_path / "work" / "trials")) == []
