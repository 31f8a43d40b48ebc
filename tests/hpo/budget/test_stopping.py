"""Stop rules: a study that stops improving ends before n_trials, says why and what it saved, and
`hpo status` shows it. The stop rules are the service's: the studies run the torch-free stand-in
(tests/hpo/helpers.py) as local processes, with the quickstart's sampler, budget and concurrency;
the quickstart study file itself is the one the bad-input cases edit."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from hpo import study_record
from hpo.budget.stopping import patience_verdict
from tests.hpo.helpers import REPO, run_hpo, stand_in_study, write_study

pytestmark = pytest.mark.slow

QUICKSTART = str(REPO / "studies/quickstart.yaml")


def quickstart(tmp_path: Path, name: str, *settings: str) -> list[str]:
    sets = [
        f"study.name={name}",
        f"study.workdir={tmp_path / name}",
        "trainer.train_fraction=0.05",
        "trainer.max_steps_per_epoch=8",
        "trainer.val_fraction=0.02",
        *settings,
    ]
    return [QUICKSTART, *(arg for s in sets for arg in ("--set", s))]


def stand_in_launch(
    tmp_path: Path, name: str, pruner: dict[str, object] | None = None, **rule: object
) -> list[str]:
    """The arguments of `hpo launch` for a 10-trial study of the stand-in, 2 in flight, TPE after 4
    random trials, with the stop rule ``rule`` (and ``pruner`` in place of the stand-in's): its
    journal is where `stored` reads it."""
    study: dict[str, object] = {
        "n_trials": 10,
        "enqueue": [],
        "sampler": {"name": "tpe", "seed": 0, "options": {"n_startup_trials": 4}},
        "stop": rule,
    }
    if pruner is not None:
        study["pruner"] = pruner
    document = stand_in_study(
        tmp_path,
        name,
        epoch_s=0.2,
        workdir=tmp_path / name,
        study=study,
    )
    return [str(write_study(tmp_path / f"{name}.yaml", document))]


def stop(**rule: object) -> list[str]:
    """``--set`` values of the study's stop section."""
    return [f"study.stop.{key}={value}" for key, value in rule.items()]


def stored(tmp_path: Path, name: str) -> optuna.Study:
    from optuna.storages.journal import JournalFileBackend

    backend = JournalFileBackend(str(tmp_path / name / "optuna.journal"))
    return optuna.load_study(study_name=name, storage=optuna.storages.JournalStorage(backend))


def test_a_patience_rule_ends_a_study_early_and_status_says_why(tmp_path: Path) -> None:
    # No gain counts as an improvement (0.5 of accuracy): the rule must end the study once its
    # three trials in a row are seen after the first four complete ones.
    # The Terminator beside it, with a noise no regret bound of 4 trials gets under: it records its
    # decision to go on at each look.
    # No pruner: min_trials counts complete trials, and with pruning the 4th may come as the 10th.
    args = stand_in_launch(
        tmp_path,
        "patience",
        pruner={"name": "none"},
        patience=3,
        min_improvement=0.5,
        min_trials=4,
        terminator=True,
        noise=0.0001,
    )
    proc = run_hpo("launch", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stop rule met after trial" in proc.stdout, proc.stdout
    assert "no improvement larger than 0.5 in the last 3 finished trials" in proc.stdout
    study = stored(tmp_path, "patience")
    trials = study.get_trials()
    assert 4 <= len(trials) < 10, len(trials)  # n_trials is 10: the trials in flight finish
    assert all(t.state.is_finished() for t in trials)
    look = study.user_attrs["hpo_terminator"]
    assert look["stop"] is False and look["regret_bound"] >= look["noise"] == 0.0001, look
    reason = study.user_attrs["hpo_stopped"]
    assert reason["saved"].startswith(f"{10 - len(trials)} of 10 trials not run, ~"), reason
    status = run_hpo("status", *args)
    assert status.returncode == 0, status.stderr
    [line] = [line for line in status.stdout.splitlines() if line.startswith("stopped after trial")]
    assert "no improvement larger than 0.5" in line and "trials not run" in line, line
    assert "Terminator" not in line  # patience ended it
    assert any(
        line.startswith("terminator after trial") and line.endswith(": go on")
        for line in status.stdout.splitlines()
    ), status.stdout
    # Relaunched with the same rule: the study has not improved since, so nothing more runs.
    again = run_hpo("launch", *args)
    assert again.returncode == 0 and "submitted" not in again.stdout, again.stdout
    assert len(stored(tmp_path, "patience").get_trials()) == len(trials)


def test_a_ray_relaunch_of_a_study_its_stop_rule_ended_queues_no_allocation(
    tmp_path: Path, local_cluster: str
) -> None:
    # The Ray allocation is one Slurm job for the whole study: queued for a driver that would find
    # the study ended at its first ask, it would hold its nodes for nothing.
    args = stand_in_launch(
        tmp_path, "ended", pruner={"name": "none"}, patience=3, min_improvement=0.5, min_trials=4
    )
    first = run_hpo("launch", *args)
    assert first.returncode == 0 and "stop rule met after trial" in first.stdout, first.stdout + first.stderr
    again = run_hpo("launch", *args, "--backend", "ray", "--executor", "slurm")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "stop rule met after trial" in again.stdout and "no Ray job submitted" in again.stdout, (
        again.stdout
    )
    assert " submitted:" not in again.stdout
    assert study_record.ray_job(stored(tmp_path, "ended")) is None


def test_the_terminator_records_its_decision_and_ends_the_study_below_the_noise(tmp_path: Path) -> None:
    # The metric's noise given as 0.5 of accuracy: any regret bound of these trials is below it,
    # so the Terminator stops the study as soon as it may look (4 complete trials). No pruner: the
    # Terminator counts complete trials only, and with pruning the 4th may come as the 10th trial.
    args = stand_in_launch(
        tmp_path, "terminator", pruner={"name": "none"}, terminator=True, noise=0.5, min_trials=4
    )
    proc = run_hpo("launch", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Optuna's Terminator: regret bound" in proc.stdout, proc.stdout
    study = stored(tmp_path, "terminator")
    look = study.user_attrs["hpo_terminator"]
    assert look["stop"] is True and look["regret_bound"] < look["noise"] == 0.5, look
    assert look["complete_trials"] >= 4 and len(study.get_trials()) < 10
    status = run_hpo("status", *args)
    assert any(
        line.startswith("terminator after trial") and line.endswith(": stop")
        for line in status.stdout.splitlines()
    ), status.stdout
    assert any(line.startswith("stopped after trial") for line in status.stdout.splitlines()), status.stdout


def test_the_patience_rule_counts_pruned_trials_as_no_improvement() -> None:
    assert patience_verdict([0.5, 0.6, 0.61, 0.6, None, 0.605], 3, 0.0, True, 4)
    assert patience_verdict([0.5, 0.6, 0.61, 0.62, None, 0.605], 3, 0.0, True, 4) is None
    # A gain no larger than min_improvement is none; minimizing reverses the sign.
    assert patience_verdict([0.5, 0.6, 0.601, 0.6, 0.602], 3, 0.005, True, 4)
    assert patience_verdict([0.5, 0.4, 0.45, 0.41, 0.42], 3, 0.0, False, 4)
    assert patience_verdict([0.5, 0.4, 0.45, 0.39, 0.42], 3, 0.0, False, 4) is None
    # Not before min_trials, nor before patience + 1 trials.
    assert patience_verdict([0.5, 0.4, 0.4, 0.4], 3, 0.0, True, 5) is None
    assert patience_verdict([0.5, 0.4, 0.4], 3, 0.0, True, 2) is None


@pytest.mark.parametrize(
    ("setting", "problem"),
    [
        ("study.stop.patience=0", "study.stop.patience: must be >= 1, got 0"),
        ("study.stop.min_improvement=-1", "study.stop.min_improvement: must be >= 0"),
        ("study.stop.min_improvement=0.1", "study.stop.min_improvement: applies with patience"),
        ("study.stop.noise=0.01", "study.stop.noise: applies to the terminator"),
        ("study.stop.min_trials=1", "study.stop.min_trials: must be >= 2"),
        ("study.stop.terminator=maybe", "study.stop.terminator:"),
        ("study.budget=0", "study.budget: must be > 0"),
        ("study.budget=-2", "study.budget: must be > 0"),
        ("study.budget=lots", "study.budget:"),
        (
            "study.stop.patience=3 --set study.also_minimize=gpu_hours --set study.pruner.name=none",
            "study.stop: a stop rule reads one metric",
        ),
        (
            "study.budget=1 --set study.backend=ray --set study.pruner.name=pbt",
            "study.budget: does not apply to pbt",
        ),
    ],
)
def test_nonsense_stop_rules_and_budgets_are_one_line_exit_2(
    tmp_path: Path, setting: str, problem: str
) -> None:
    proc = run_hpo("launch", *quickstart(tmp_path, "bad", *setting.split(" --set ")))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert QUICKSTART in line and problem in line, line
    assert not (tmp_path / "bad").exists()
