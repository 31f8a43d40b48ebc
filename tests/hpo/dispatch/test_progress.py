"""The launcher's progress line, on studies built with Optuna's own API (no training needed)."""

from __future__ import annotations

import time
from pathlib import Path

import optuna

from hpo.config import load_study
from hpo.dispatch.progress import Progress
from tests.hpo.helpers import study_document, write_study


def _study_with(complete: int) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    dist = optuna.distributions.FloatDistribution(0.001, 1.0, log=True)
    for value in range(complete):
        study.add_trial(
            optuna.trial.create_trial(params={"lr": 0.1}, distributions={"lr": dist}, value=0.5 + value / 100)
        )
    return study


def test_a_finished_study_shows_no_time_left_even_before_its_timeout(tmp_path: Path) -> None:
    document = study_document("progress", tmp_path / "w", study={"n_trials": 4, "timeout": "30m"})
    spec = load_study(write_study(tmp_path / "s.yaml", document))
    deadline = time.time() + 1800
    running = Progress(spec, _study_with(2), deadline, lambda line: None).line()
    assert "progress: 2/4 done" in running and "left" in running, running
    finished = Progress(spec, _study_with(4), deadline, lambda line: None).line()
    assert "progress: 4/4 done" in finished and "left" not in finished, finished


def test_a_study_stopped_early_shows_the_time_left_of_its_running_trials_only(tmp_path: Path) -> None:
    document = study_document("progress", tmp_path / "w", study={"n_trials": 10, "timeout": "30m"})
    spec = load_study(write_study(tmp_path / "s.yaml", document))
    study = _study_with(2)
    progress = Progress(spec, study, time.time() + 1800, lambda line: None)
    progress.closed = True  # a stop rule met: 8 trials of the budget will not run
    assert "left" not in progress.line(), progress.line()
    study.ask()  # one trial still running when the rule was met: it finishes
    assert "1 running" in (line := progress.line()) and "left" in line, line
