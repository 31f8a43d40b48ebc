"""The compute budget (study.budget) on the local Slurm cluster with PostgreSQL: the launcher stops
submitting once the hours spent plus what is in flight would pass it, ends within one trial's cost
of it (checked against sacct), and a relaunch submits nothing more and says so."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.hpo.helpers import (
    final_sacct_states,
    load_trials,
    run_hpo,
    sacct_cpu_hours,
    stand_in_study,
    write_study,
)

pytestmark = pytest.mark.slow

BUDGET_CPU_H = 0.02
"""About ten of these trials' jobs (7 to 10 s each on one CPU, python's start included).

The trials are the torch-free stand-in of helpers.py: a job that sleeps is charged by Slurm as one
that computes, so the budget's arithmetic is the same as the trainer's at a fifth of the CPU."""


def test_a_cpu_hour_budget_ends_the_study_within_one_trial_of_it(tmp_path: Path, fresh_database: str) -> None:
    name = f"budget-{uuid.uuid4().hex[:6]}"
    document = stand_in_study(
        tmp_path,
        name,
        epochs=3,
        epoch_s=2.0,
        study={"n_trials": 40, "enqueue": [], "pruner": {"name": "none"}, "budget": BUDGET_CPU_H},
        resources={"executor": "slurm", "time": "10m"},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    first = run_hpo("launch", str(study_file), "--storage", fresh_database)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "compute budget reached: " in first.stdout, first.stdout
    trials = load_trials(document, fresh_database)
    assert 3 <= len(trials) < 40, len(trials)
    # Until a trial has finished, each is charged its 10-minute limit (0.167 CPU-h, over the
    # budget): the second slot stays empty until the first trial has shown what one costs.
    assert trials[1].datetime_start >= trials[0].datetime_complete, (trials[0], trials[1])
    job_ids = [str(t.user_attrs["job_id"]) for t in trials]
    assert set(final_sacct_states(job_ids).values()) == {"COMPLETED"}
    # What Slurm's accounting says the study used: within one trial's cost of the budget.
    spent = sacct_cpu_hours(name)
    assert sorted(spent) == sorted(job_ids)
    one_trial = max(spent.values())
    total = sum(spent.values())
    assert BUDGET_CPU_H - one_trial <= total <= BUDGET_CPU_H + one_trial, (total, one_trial, spent)
    print(
        f"\nbudget {BUDGET_CPU_H} CPU-h: {len(trials)} trials, {total:.4f} CPU-h by sacct (one trial <= {one_trial:.4f})"
    )

    status = run_hpo("status", str(study_file), "--storage", fresh_database)
    assert status.returncode == 0, status.stderr
    [line] = [line for line in status.stdout.splitlines() if line.startswith("budget: ")]
    assert f"of {BUDGET_CPU_H:.3g} CPU-hours spent" in line and " left" in line, line

    # Relaunched: nothing more is submitted, and it says why.
    again = run_hpo("launch", str(study_file), "--storage", fresh_database)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "compute budget reached: " in again.stdout and "submitted as" not in again.stdout, again.stdout
    assert len(load_trials(document, fresh_database)) == len(trials)
    assert sorted(sacct_cpu_hours(name)) == sorted(job_ids)


def test_workers_stop_taking_trials_at_the_budget(tmp_path: Path) -> None:
    """--workers: each worker asks the budget before it takes a trial; the launcher submits no
    further workers once it is reached."""
    document = stand_in_study(
        tmp_path,
        "budget-workers",
        epochs=3,
        epoch_s=2.5,
        study={"n_trials": 40, "enqueue": [], "pruner": {"name": "none"}, "budget": 0.004},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file), "--workers", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document)
    # A worker waits while the trials running are the only measure of what one costs (as the
    # launcher does): with ~9 s trials, the second may never start (9 + 9 s > 14.4 s).
    assert 1 <= len(trials) < 40, len(trials)
    assert all(t.state.name == "COMPLETE" for t in trials)
    # Estimates here (local processes): each trial's elapsed time x its one CPU.
    spent = sum(float(t.user_attrs["elapsed_s"]) for t in trials) / 3600
    one_trial = max(float(t.user_attrs["elapsed_s"]) for t in trials) / 3600
    # Two workers decide at once: each may start one trial past what the other already counts.
    assert spent <= 0.004 + 2 * one_trial, (spent, one_trial)
    status = run_hpo("status", str(study_file))
    assert "budget: " in status.stdout, status.stdout
