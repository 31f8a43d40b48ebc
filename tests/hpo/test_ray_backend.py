"""The Ray backend on a local Ray instance: real trainer trials, ASHA, results in the Optuna storage."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hpo.conftest import BAD, GOOD, load_trials, run_hpo, study_document, write_study

pytestmark = pytest.mark.slow


def test_local_ray_backend_runs_a_study_with_asha_into_the_optuna_storage(
    tmp_path: Path, fashion_mnist_root: str
) -> None:
    document = study_document(
        "ray-study",
        tmp_path / "work",
        study={"backend": "ray", "n_trials": 6, "enqueue": [GOOD, {**GOOD, "lr": 0.2}, BAD]},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document)
    states = [t.state.name for t in trials]
    assert len(trials) == 6 and set(states) <= {"COMPLETE", "PRUNED"}, states
    # ASHA (the study's successive_halving) stopped some trials; the others ran all 3 epochs.
    assert "PRUNED" in states and "COMPLETE" in states, states
    for trial in trials:
        epochs = sorted(trial.intermediate_values)
        assert epochs == list(range(1, len(epochs) + 1)), trial.intermediate_values
        assert trial.user_attrs["executor"] == "ray"
        assert trial.user_attrs["epochs_completed"] == len(epochs)
        assert len(epochs) == 3 if trial.state.name == "COMPLETE" else len(epochs) < 3
    status = run_hpo("status", str(study_file))
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("study ray-study: 6 of 6 trials;")

    # Launched again, the study is complete: nothing runs twice.
    again = run_hpo("launch", str(study_file))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "6 of 6 trials stored" in again.stdout
    assert len(load_trials(document)) == 6
