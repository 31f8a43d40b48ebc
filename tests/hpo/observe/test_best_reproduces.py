"""`hpo best` prints a command that, pasted into a fresh shell, gives the best trial's values to the
last digit: for the trainer, for a command whose flags take the parameters, and for a script that
reads them through the trial API. Each trial runs as a local process; each printed command runs in
`bash -c` with an environment of PATH (the virtual environment first) and HOME only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.hpo.helpers import REPO, load_trials, run_hpo, score_study, study_document, write_study

FRESH_SHELL = {
    "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
    "HOME": os.environ.get("HOME", "/root"),
}
# Parameters with more digits than a rounded print keeps.
UGLY = {"lr": 0.0845913274012345, "weight_decay": 0.000123456789, "batch_size": 64}

# A small numeric training in the standard library whose result depends on every digit of x and
# on the threads it is told to use (as a BLAS reduction's order would).
ARGV_SCRIPT = r"""
import argparse, os
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float, required=True)
args = parser.parse_args()
threads = int(os.environ.get("OMP_NUM_THREADS", "8"))
value = 0.0
for step in range(1, 4):
    value = sum((args.x * step) / (k + threads) for k in range(1000))
    print(f"step {step} score {value!r}", flush=True)
"""
API_SCRIPT = r"""
import os
from hpo import trial
x = trial.params({"x": 1.0})["x"]
threads = int(os.environ.get("OMP_NUM_THREADS", "8"))
for step in range(1, 4):
    value = sum((x * step) / (k + threads) for k in range(1000))
    print(f"step {step} score {value!r}", flush=True)
    trial.report(step, value)
"""


def _printed(study_file: Path, label: str) -> str:
    """The command `hpo best` prints after ``label``: on that line (the trainer's ``train it:``) or
    on the next one (a command's ``run it (in <folder>; ...):``)."""
    best = run_hpo("best", str(study_file))
    assert best.returncode == 0, best.stderr
    lines = best.stdout.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.startswith(label)] or [None]
    assert at is not None, best.stdout
    return lines[at + 1].strip() if lines[at].endswith(":") else lines[at].removeprefix(label)


def _in_fresh_shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=FRESH_SHELL, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_the_trainers_printed_command_reproduces_the_best_trials_epochs(
    tmp_path: Path, fashion_mnist_root: str
) -> None:
    document = study_document(
        "best-trainer",
        tmp_path / "work",
        study={"n_trials": 1, "enqueue": [UGLY], "pruner": {"name": "none"}},
        trainer={"epochs": 2},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    assert run_hpo("launch", str(study_file)).returncode == 0
    [trial] = load_trials(document)

    command = _printed(study_file, "train it: ")
    assert command.startswith("OMP_NUM_THREADS=1 python -m trainer ") and repr(UGLY["lr"]) in command, command
    _in_fresh_shell(f"{command} --result-json {tmp_path}/rerun.json", REPO)

    history = json.loads((tmp_path / "rerun.json").read_text())["history"]
    assert {m["epoch"]: m["val_accuracy"] for m in history} == trial.intermediate_values


@pytest.mark.parametrize("form", ["argv", "trial API"])
def test_a_commands_printed_line_reproduces_the_best_trials_steps(tmp_path: Path, form: str) -> None:
    (tmp_path / "train.py").write_text(ARGV_SCRIPT if form == "argv" else API_SCRIPT)
    command = ["{python}", "train.py", *(["--x", "{x}"] if form == "argv" else [])]
    document: dict[str, Any] = score_study(
        tmp_path,
        f"best-{form.replace(' ', '-')}",
        {"command": command, "metric_pattern": r"^step (?P<step>\d+) score (?P<value>\S+)$", "steps": 3},
        n_trials=1,
        enqueue=[{"x": 1.2345678901234567}],
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    assert run_hpo("launch", str(study_file)).returncode == 0
    [trial] = load_trials(document)

    printed = _printed(study_file, "run it (")
    rerun = _in_fresh_shell(printed, Path("/"))  # the line says where it runs

    values = {int(line.split()[1]): float(line.split()[3]) for line in rerun.stdout.splitlines()}
    assert values == trial.intermediate_values, (printed, values, trial.intermediate_values)
