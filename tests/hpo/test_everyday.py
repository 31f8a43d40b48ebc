"""What a researcher meets in the first week of use, beyond launching: a script that reports more
steps than the study file says is told so, in the launcher's output and in `hpo status`; `hpo logs
-f` follows a running trial's output, locally and as a Slurm job."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.hpo.helpers import (
    HPO,
    REPO,
    load_trials,
    run_hpo,
    score_study,
    start_hpo,
    wait_for_trials,
    write_study,
)

# Reports "step N score X" for 3 steps.
SCRIPT = r"""
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float, required=True)
args = parser.parse_args()
for step in range(1, 4):
    print(f"step {step} score {args.x * step}", flush=True)
"""


def test_a_script_reporting_more_steps_than_objective_steps_is_warned_about(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    document = score_study(
        tmp_path,
        "steps-mismatch",
        {
            "command": ["{python}", "train.py", "--x", "{x}"],
            "metric_pattern": r"^step (?P<step>\d+) score (?P<value>\S+)$",
            "steps": 2,
        },
        n_trials=2,
    )
    study_file = write_study(tmp_path / "study.yaml", document)

    launched = run_hpo("launch", str(study_file))
    status = run_hpo("status", str(study_file))

    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert sorted(p.name for p in (tmp_path / "work" / "jobs").iterdir()) == sorted(
        t.user_attrs["job_id"] for t in load_trials(document)
    )  # one folder per job, none named "%j"
    warnings = [line for line in launched.stdout.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, launched.stdout  # once per trial
    assert warnings[0].endswith(
        f"reported steps up to 3, {study_file}: objective.steps says 2: the pruner takes "
        "objective.steps for a full run's last step; set it to 3"
    ), warnings
    assert (
        f"warning: {study_file}: objective.steps is 2, but trial 0 reported up to step 3, trial 1 "
        "reported up to step 3" in status.stdout
    ), status.stdout


# Prints "tick N <unix time>" once a second for 6 s, then its metric.
TICKING = r"""
import time
for n in range(1, 7):
    print(f"tick {n} {time.time():.3f}", flush=True)
    time.sleep(1)
print("step 1 score 1.0", flush=True)
"""


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_logs_follow_prints_a_running_trials_new_lines_as_they_come(
    tmp_path: Path, executor: str, request: pytest.FixtureRequest
) -> None:
    if executor == "slurm":
        request.getfixturevalue("local_cluster")
    (tmp_path / "tick.py").write_text(TICKING)
    document = score_study(
        tmp_path,
        f"follow-{executor}",
        {"command": ["{python}", "tick.py"], "metric_pattern": r"^step (?P<step>\d+) score (?P<value>\S+)$"},
        n_trials=1,
    )
    document["resources"]["executor"] = executor
    study_file = write_study(tmp_path / "study.yaml", document)
    launcher = start_hpo("launch", str(study_file))
    wait_for_trials(document, None, launcher, lambda trials: bool(trials), timeout=120)

    follower = subprocess.Popen(
        [HPO, "logs", str(study_file), "0", "-f"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert follower.stdout is not None
    delays = []
    for line in follower.stdout:
        if line.startswith("tick "):
            delays.append(time.time() - float(line.split()[2]))
    assert follower.wait(timeout=60) == 0
    launcher.communicate(timeout=120)

    # Lines written while it followed came within a few seconds; those before it started, at once.
    assert len(delays) == 6, delays
    assert min(delays) < 3.0, delays
    assert line == "[trial 0 COMPLETE]\n", line


# Prints its loss beside its score; through the trial API, it reports its accuracy beside the value.
TWO_METRICS = r"""
import argparse, os
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float, required=True)
args = parser.parse_args()
api = os.environ.get("USE_API") == "1"
if api:
    from hpo import trial
for step in range(1, 4):
    score, loss = args.x * step, 1.0 / (args.x * step)
    if api:
        trial.report(step, score, acc=score / 10, loss=loss)
    else:
        print(f"step {step} loss {loss:.6f} score {score:.6f}", flush=True)
"""


@pytest.mark.parametrize("form", ["pattern", "trial API"])
def test_every_metric_a_command_reports_is_kept_and_shown(tmp_path: Path, form: str) -> None:
    (tmp_path / "train.py").write_text(TWO_METRICS)
    objective = {
        "command": ["{python}", "train.py", "--x", "{x}"],
        "steps": 3,
        "env": {"USE_API": "1" if form == "trial API" else "0"},
        **(
            {"metric_pattern": r"^step (?P<step>\d+) loss (?P<loss>\S+) score (?P<value>\S+)$"}
            if form == "pattern"
            else {}
        ),
    }
    document = score_study(tmp_path, f"metrics-{form.replace(' ', '-')}", objective, n_trials=2)
    study_file = write_study(tmp_path / "study.yaml", document)
    assert run_hpo("launch", str(study_file)).returncode == 0

    trials = load_trials(document)
    for trial in trials:
        x = trial.params["x"]
        assert trial.user_attrs["metrics"]["loss"] == pytest.approx(
            {str(s): 1.0 / (x * s) for s in (1, 2, 3)}, rel=1e-5
        )
        assert trial.intermediate_values == pytest.approx({s: x * s for s in (1, 2, 3)}, rel=1e-5)
    status = run_hpo("status", str(study_file)).stdout.splitlines()
    header = status[1].split()
    assert (
        header[:5] == ["#", "state", "epoch", "score", *(["acc"] if form == "trial API" else []), "loss"][:5]
    ), status
    row = status[2].split()
    assert float(row[header.index("loss")]) == pytest.approx(1.0 / (3 * trials[0].params["x"]), rel=1e-3)
    report = run_hpo("report", str(study_file), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    csv = (tmp_path / "report" / "trials.csv").read_text().splitlines()
    assert "metric_loss" in csv[0].split(","), csv[0]
