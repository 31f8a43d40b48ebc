"""A command killed by a signal that its trial's job did not send (the kernel's out-of-memory killer,
a user's kill -9) fails its trial at once, as a local process and in a Slurm job, packed or not;
killed again with the same parameters in its retry, the trial is infeasible, like an out-of-memory
error, and is not retried a third time."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hpo import record
from tests.hpo.helpers import fault_line, load_trials, run_hpo, score_study, write_study

# x above 1.5: the command is SIGKILLed at its second step (it writes the time of its death first).
SCRIPT = r"""
import argparse, os, signal, time
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float, required=True)
parser.add_argument("--deaths", required=True)
args = parser.parse_args()
for epoch in range(1, 4):
    if args.x > 1.5 and epoch == 2:
        with open(args.deaths, "a") as deaths:
            deaths.write(f"{time.time()}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    print(f"epoch {epoch} score {args.x * epoch}", flush=True)
    time.sleep(0.5)
"""


def _study(tmp_path: Path, resources: dict[str, Any]) -> tuple[dict[str, Any], Path, Path]:
    (tmp_path / "train.py").write_text(SCRIPT)
    deaths = tmp_path / "deaths.txt"
    document = score_study(
        tmp_path,
        f"kill-{uuid.uuid4().hex[:6]}",
        {
            "command": ["{python}", "train.py", "--x", "{x}", "--deaths", str(deaths)],
            "metric_pattern": r"^epoch (?P<step>\d+) score (?P<value>\S+)$",
            "steps": 3,
        },
        n_trials=2,
        max_concurrent=2,
        max_retries=3,
        enqueue=[{"x": 1.0}, {"x": 1.9}],
    )
    document["resources"] = {"time": "5m", "cpus_per_task": 1, **resources}
    return document, write_study(tmp_path / "study.yaml", document), deaths


@pytest.mark.parametrize(
    "resources",
    [
        {"executor": "local"},
        pytest.param({"executor": "slurm"}, marks=pytest.mark.slow),
        pytest.param({"executor": "slurm", "trials_per_gpu": 2}, marks=pytest.mark.slow),
    ],
    ids=["local", "slurm", "slurm-packed"],
)
def test_a_killed_command_fails_its_trial_at_once_and_twice_is_infeasible(
    tmp_path: Path, resources: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    if resources["executor"] == "slurm":
        request.getfixturevalue("local_cluster")
    document, study_file, deaths = _study(tmp_path, resources)

    proc = run_hpo("launch", str(study_file), timeout=600)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = sorted(load_trials(document), key=lambda t: t.number)
    killed = [t for t in trials if t.params["x"] == 1.9]
    # The trial and its one retry; the retry, killed again, is infeasible: no third run.
    assert len(killed) == 2, [(t.number, t.state.name, t.user_attrs) for t in trials]
    first, retry = killed
    assert first.state.name == "FAIL" and "killed by SIGKILL" in first.user_attrs[record.ATTR_FAIL_REASON]
    assert retry.user_attrs[record.ATTR_RETRY_OF] == first.number
    assert retry.user_attrs.get(record.ATTR_INFEASIBLE), retry.user_attrs
    assert "twice with these parameters" in retry.user_attrs[record.ATTR_FAIL_REASON]
    died = [float(line) for line in deaths.read_text().split()]
    assert len(died) == 2
    # Each run's trial told its end right after its command died (it waited 30 s for a signal
    # of its own before): bounded loosely here, the figure goes to the fault table.
    lags = [
        datetime.fromisoformat(t.user_attrs[record.ATTR_FINISHED_AT]).timestamp() - at
        for t, at in zip(killed, sorted(died), strict=True)
    ]
    assert all(0 <= lag < 10 for lag in lags), lags
    fault_line(
        f"the command SIGKILLed by itself, twice with the same parameters ({resources})",
        f"trial failed {lags[0]:.1f} s after the kill, its retry infeasible {lags[1]:.1f} s after, not retried again",
        0,
        max(lags),
    )


# A memory limit too small for any configuration: every run is SIGKILLed before its first report.
KILLED_AT_ONCE = r"""
import os, signal, sys, time
with open(sys.argv[1], "a") as deaths:
    deaths.write(f"{time.time()}\n")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_study_whose_every_trial_is_killed_stops_instead_of_spending_its_budget(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(KILLED_AT_ONCE)
    deaths = tmp_path / "deaths.txt"
    objective = {"command": ["{python}", "train.py", str(deaths)], "steps": 3}
    document = score_study(
        tmp_path,
        "all-killed",
        objective,
        n_trials=6,
        max_concurrent=2,
        max_retries=1,
        sampler={"name": "random", "seed": 3},
    )
    study_file = write_study(tmp_path / "study.yaml", document)

    proc = run_hpo("launch", str(study_file), timeout=600)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    [error] = proc.stderr.strip().splitlines()[-1:]
    assert "failed the same way and none succeeded: the command was killed by SIGKILL" in error, error
    runs = len(deaths.read_text().split())
    trials = load_trials(document)
    # Stopped once two parameter sets were killed, before their retries ran: not the 12 runs of 6
    # trials and their retries (before: never stopped). The retries are closed, not run.
    assert runs == 2 and [t.state.name for t in trials] == ["FAIL"] * 4, [
        (t.number, t.state.name) for t in trials
    ]
    assert [t.user_attrs.get(record.ATTR_RETRY_OF) for t in trials[2:]] == [0, 1]
    assert all(t.user_attrs.get(record.ATTR_NOT_RUN) for t in trials[2:])
    status = run_hpo("status", str(study_file))  # the budget whole for the launch after the fix
    assert status.stdout.startswith("study all-killed: 0 of 6 trials; 4 FAIL"), status.stdout
    assert "last launch stopped: trials 0 and 1 failed the same way" in status.stdout, status.stdout
    fault_line(
        "every run SIGKILLed before its first report (a memory limit too small for any configuration), "
        "6 trials, 2 in flight, 1 retry",
        f"stopped after {runs} runs ({len({t.params['x'] for t in trials})} parameter sets), exit 1: {error}",
        0,
        None,
    )
