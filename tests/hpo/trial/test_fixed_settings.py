"""``objective.fixed`` reaches the user's code however it reads its parameters: substituted into the
command's argv, and in ``hpo.trial.params()`` (under the sampled parameters) for a command and for a
function; it stays out of the study's search-space parameters, and `hpo best`'s printed command
gives it again. Trials are local processes of a script in the standard library (a second each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.hpo.helpers import load_trials, run_hpo, score_study, write_study

# Reports its epochs as the score: the value the study stores says which epochs the script saw
# (its own default, 99, when objective.fixed does not reach it).
API_SCRIPT = r"""
from hpo import trial
params = trial.params({"epochs": 99, "x": 0.0})
for step in range(1, 3):
    print(f"step {step} epochs {params['epochs']} x {params['x']!r}", flush=True)
    trial.report(step, float(params["epochs"]))
"""
FUNCTION_MODULE = r"""
from hpo import trial as api

def objective(params, trial):
    seen = trial.params({"epochs": 99})
    assert api.params({"epochs": 99}) == seen  # the module's functions read the same trial
    for step in range(1, 3):
        trial.report(step, float(seen["epochs"]))
    return float(seen["epochs"])
"""


@pytest.mark.parametrize("kind", ["command", "function"])
def test_fixed_values_reach_the_trial_api_and_stay_out_of_the_searched_params(
    tmp_path: Path, kind: str
) -> None:
    (tmp_path / "train.py").write_text(API_SCRIPT)
    (tmp_path / "my_objective.py").write_text(FUNCTION_MODULE)
    objective: dict[str, Any] = (
        {"command": ["{python}", "train.py"]} if kind == "command" else {"function": "my_objective:objective"}
    )
    document = score_study(
        tmp_path,
        f"fixed-{kind}",
        {**objective, "steps": 2, "fixed": {"epochs": 4}},
        n_trials=1,
        enqueue=[{"x": 1.25}],
    )
    study_file = write_study(tmp_path / "study.yaml", document)

    proc = run_hpo("launch", str(study_file), timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    [trial] = load_trials(document)
    assert trial.state.name == "COMPLETE", trial.user_attrs
    assert trial.intermediate_values == {1: 4.0, 2: 4.0} and trial.value == 4.0  # not the default 99
    assert trial.params == {"x": 1.25}  # a fixed value is no search-space parameter of the study
    best = run_hpo("best", str(study_file))
    assert best.returncode == 0, best.stderr
    assert "params: x=1.25" in best.stdout.splitlines(), best.stdout  # the best's params: the searched ones
    if kind == "function":
        return
    # The printed command, run by hand outside the service, sees the same values as the trial.
    lines = best.stdout.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.startswith("run it (")]
    rerun = subprocess.run(
        ["bash", "-c", lines[at + 1].strip()],
        cwd="/",
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert rerun.stdout.splitlines() == ["step 1 epochs 4 x 1.25", "step 2 epochs 4 x 1.25"], rerun.stdout
