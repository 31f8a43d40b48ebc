"""Fail fast: a launch whose first trials fail the same way stops, says why in one line and exits
non-zero, without retrying what no rerun changes; a study whose failures differ runs on; and
``hpo launch --check`` shows a command's first report (or its mistake) before anything is queued.

The studies run a small argparse script (standard library only) as Slurm jobs on the local cluster,
the way a user's own training script runs.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo import failures, record
from hpo.budget import failing
from hpo.config.schema import build_spec
from tests.hpo.helpers import fault_line, final_sacct_states, load_trials, run_hpo, score_study, write_study

# A training script with its own options; prints "epoch N score X" per epoch. The trials listed in
# --flaky fail on purpose, each its own way (transient faults: their retries succeed).
SCRIPT = r"""
import argparse, os, sys, time
parser = argparse.ArgumentParser(prog="train.py")
parser.add_argument("--x", type=float, required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--flaky", default="")
args = parser.parse_args()
faults = ["OSError: [Errno 5] Input/output error: /scratch/data", "RuntimeError: NCCL watchdog timeout"]
flaky = [n for n in args.flaky.split(",") if n]
trial = os.environ.get("HPO_TRIAL_NUMBER", "")
if trial in flaky:
    print("loading data", flush=True)
    sys.exit(faults[flaky.index(trial) % 2])
for epoch in range(1, args.epochs + 1):
    time.sleep(0.2)
    print(f"epoch {epoch} score {args.x * epoch:.4f}", flush=True)
"""
PATTERN = r"^epoch (?P<step>\d+) score (?P<value>[0-9.]+)$"


def _study(
    tmp_path: Path, command: list[str], pattern: str = PATTERN, **study: Any
) -> tuple[dict[str, Any], Path]:
    (tmp_path / "train.py").write_text(SCRIPT)
    settings: dict[str, Any] = {"n_trials": 6, "max_concurrent": 2, "max_retries": 1, **study}
    document = score_study(
        tmp_path,
        f"ff-{uuid.uuid4().hex[:6]}",
        {"command": ["{python}", "train.py", *command], "metric_pattern": pattern, "steps": 3},
        **settings,
    )
    document["resources"] = {"executor": "slurm", "time": "5m", "cpus_per_task": 1}
    return document, write_study(tmp_path / "study.yaml", document)


def _study_jobs(document: dict[str, Any], expected: int) -> dict[str, str]:
    """Every Slurm job of the study's trials (sacct, by the study's job name), once sacct lists
    ``expected`` of them (slurmdbd records a job a moment after the controller runs it) or 60 s."""
    deadline = time.monotonic() + 60
    while True:
        proc = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "--name", f"hpo-{document['study']['name']}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        jobs = dict(line.split("|", 1) for line in proc.stdout.splitlines() if "|" in line)
        if len(jobs) >= expected or time.monotonic() > deadline:
            return final_sacct_states(list(jobs)) if jobs else {}
        time.sleep(1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "command", "pattern", "cause"),
    [
        # A flag the script does not know: argparse's usage error, exit status 2.
        ("usage", ["--x", "{x}", "--hidden-size", "16"], PATTERN, "unrecognized arguments: --hidden-size 16"),
        # The script prints "epoch 1 score 0.9"; the pattern expects "val_acc=".
        ("pattern", ["--x", "{x}"], r"val_acc=(?P<value>[0-9.]+)", "no metric reported"),
    ],
)
def test_a_launch_whose_first_trials_fail_the_same_way_stops_after_two(
    tmp_path: Path, local_cluster: str, case: str, command: list[str], pattern: str, cause: str
) -> None:
    document, study_file = _study(tmp_path, command, pattern)

    proc = run_hpo("launch", str(study_file), timeout=600)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    [error] = proc.stderr.strip().splitlines()[-1:]
    assert error.startswith("hpo launch: error: trials 0 and 1 failed the same way") and cause in error, error
    key = "objective.metric_pattern" if case == "pattern" else "objective.command"
    assert f"{key} in {study_file}" in error or f"{key} matched" in error, error
    trials = load_trials(document)
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"], [(t.number, t.state.name) for t in trials]
    assert not any("retry_of" in t.user_attrs for t in trials)  # not retried: no rerun changes it
    assert "not retried: no rerun changes it" in proc.stdout
    jobs = _study_jobs(document, expected=2)
    assert len(jobs) == 2, jobs  # two jobs queued in all, not 4 (each failure and its retry) or 12

    # `hpo status` says why the launch stopped; the fixed study file runs the whole budget.
    status = run_hpo("status", str(study_file))
    assert "last launch stopped: trials 0 and 1 failed the same way" in status.stdout, status.stdout
    fault_line(
        f"{case} mistake in a study of 6 trials, 2 in flight (Slurm jobs)",
        f"stopped after trials 0 and 1, {len(jobs)} Slurm jobs, exit 1: {error}",
        0,
        None,
    )
    if case != "usage":
        return  # the relaunch of a fixed file is the same for both mistakes: run once
    document["objective"]["command"] = ["{python}", "train.py", "--x", "{x}"]
    document["objective"]["metric_pattern"] = PATTERN
    fixed = run_hpo("launch", str(write_study(study_file, document)), timeout=600)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    states = [t.state.name for t in load_trials(document)]
    assert states.count("COMPLETE") == 6 and states.count("FAIL") == 2, states
    assert "last launch stopped" not in run_hpo("status", str(study_file)).stdout


def test_workers_stop_pulling_trials_once_the_first_fail_the_same_way(tmp_path: Path) -> None:
    document, study_file = _study(tmp_path, ["--x", "{x}", "--hidden-size", "16"], n_trials=20)
    document["resources"]["executor"] = "local"

    proc = run_hpo("launch", str(write_study(study_file, document)), "--workers", "2", timeout=300)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "failed the same way" in proc.stderr.strip().splitlines()[-1], proc.stderr
    trials = load_trials(document)
    # Each worker checks before it asks: a worker may start one trial while the other's fails.
    assert 2 <= len(trials) <= 4 and {t.state.name for t in trials} == {"FAIL"}, len(trials)


@pytest.mark.slow
def test_a_transient_failure_among_successes_is_retried_and_the_study_runs_on(
    tmp_path: Path, local_cluster: str
) -> None:
    # Trial 0 (the study's first) and trial 3 fail, in two ways; their retries succeed.
    document, study_file = _study(tmp_path, ["--x", "{x}", "--flaky", "0,3"], n_trials=4)

    proc = run_hpo("launch", str(study_file), timeout=600)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document)
    failed = [t.number for t in trials if t.state.name == "FAIL"]
    retried = sorted(t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs)
    assert failed == [0, 3] and retried == [0, 3], [(t.number, t.state.name, t.user_attrs) for t in trials]
    assert sum(t.state.name == "COMPLETE" for t in trials) == 4
    assert "failed the same way" not in proc.stdout + proc.stderr


def test_check_runs_the_command_to_its_first_report_and_names_the_key_of_a_mistake(tmp_path: Path) -> None:
    document, study_file = _study(tmp_path, ["--x", "{x}"], enqueue=[{"x": 1.5}])
    document["resources"]["executor"] = "local"

    good = run_hpo("launch", str(write_study(study_file, document)), "--check", timeout=120)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "check: first report after" in good.stdout and "score=1.5 at step 1" in good.stdout, good.stdout
    assert "epoch 2" not in good.stdout  # stopped at its first report

    document["objective"]["command"] = ["{python}", "train.py", "--x", "{x}", "--hidden-size", "16"]
    usage = run_hpo("launch", str(write_study(study_file, document)), "--check", timeout=120)
    document["objective"]["command"] = ["{python}", "train.py", "--x", "{x}"]
    document["objective"]["metric_pattern"] = r"val_acc=(?P<value>[0-9.]+)"
    silent = run_hpo("launch", str(write_study(study_file, document)), "--check", timeout=120)

    for proc, key, cause in (
        (usage, "objective.command", "unrecognized arguments: --hidden-size 16"),
        (silent, "objective.metric_pattern", "no metric reported"),
    ):
        assert proc.returncode == 2, proc.stdout + proc.stderr
        [line] = proc.stderr.strip().splitlines()[-1:]
        assert line.startswith(f"hpo launch: error: {study_file}: {key}: --check: ") and cause in line, line
    assert not (Path(document["study"]["workdir"]) / "optuna.journal").exists()  # nothing stored


# --- the rule and the classification, as pure functions ------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        (
            "the command exited with status 2: train.py: error: unrecognized arguments: --hidden-size 16",
            "usage",
        ),
        ("the command exited with status 2: usage: train.py [-h] --x X", "usage"),
        ("no metric reported; last output line: 'epoch 3 score 1.2'", "no metric"),
        ("cannot run 'trian.py' in /home/u: No such file or directory", "not found"),
        ("the command exited with status 127: bash: torchrun: command not found", "not found"),
        (
            "the command exited with status 2: python: can't open file '/w/train.py': [Errno 2] No such file",
            "not found",
        ),
        ("the command exited with status 1: ModuleNotFoundError: No module named 'timm'", "program"),
        ("job 812 FAILED without telling a result: ModuleNotFoundError: No module named 'hpo'", "program"),
        ("FileNotFoundError: [Errno 2] No such file or directory: 'data.csv'", "not found"),
        ("my.module:fit returned None and reported nothing", "program"),
        ("the command exited with status 1: RuntimeError: NCCL timeout", "other"),
        ("the command exited with status 1: OSError: [Errno 5] Input/output error", "other"),
        ("job 812 NODE_FAIL without telling a result", "cluster"),
        (
            "job 950 FAILED without telling a result: slurmstepd-n3: error: *** STEP 950.0 ON n3 FAILED "
            "(non-zero exit code or other failure mode) ***",
            "other",
        ),
        ("the command exited with status 1: RuntimeError: loss: error: nan at step 3", "other"),
        (
            "the command exited with status 2: train.py: error: argument --lr: invalid float value: 'x'",
            "usage",
        ),
        ("the command exited with status 1: rsync: unknown option -- z", "usage"),
        ("job 812_3 PREEMPTED without telling a result: slurmstepd: error: *** JOB CANCELLED", "cluster"),
        ("the command was killed by SIGKILL; last output line: 'epoch 2'", "cluster"),
    ],
)
def test_a_fail_reason_is_classified(reason: str, kind: str) -> None:
    failure = failures.classify(reason)
    assert failure.kind == kind
    assert failure.permanent == (kind not in ("other", "cluster"))


def _failed(number: int, x: float, reason: str, **attrs: Any) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL,
        params={"x": x},
        distributions={"x": optuna.distributions.FloatDistribution(0.0, 10.0)},
        user_attrs={record.ATTR_FAIL_REASON: reason, **attrs},
    )
    trial.number = number
    return trial


def _complete(number: int, x: float) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        value=1.0, params={"x": x}, distributions={"x": optuna.distributions.FloatDistribution(0.0, 10.0)}
    )
    trial.number = number
    return trial


USAGE = "the command exited with status 2: train.py: error: unrecognized arguments: --hidden-size {}"
FLAKY = "the command exited with status 1: RuntimeError: CUDA error: uncorrectable ECC error at step {}"


@pytest.mark.fast
def test_the_rule_stops_on_two_permanent_or_three_other_failures_before_any_success(tmp_path: Path) -> None:
    # Two parameter sets, one usage error (the numbers in it differ): stop.
    verdict = failing.check([_failed(0, 1.0, USAGE.format(16)), _failed(1, 2.0, USAGE.format(32))])
    assert verdict is not None and verdict.trials == [0, 1] and verdict.failure.kind == "usage"
    # Trials end in the order the scheduler lets them; the line names them in ascending order.
    late_first = failing.check([_failed(1, 2.0, USAGE.format(32)), _failed(0, 1.0, USAGE.format(16))])
    spec = build_spec(score_study(tmp_path, "order", {"command": ["true"]}), str(tmp_path / "study.yaml"))
    assert late_first is not None and late_first.line(spec).startswith("trials 0 and 1 failed the same way")
    # A failure that may be transient: a trial and its retry are one parameter set; a third set stops.
    flaky = [
        _failed(0, 1.0, FLAKY.format(3)),
        _failed(1, 2.0, FLAKY.format(5)),
        _failed(2, 1.0, FLAKY.format(3)),
    ]
    assert failing.check(flaky) is None
    assert failing.check([*flaky, _failed(3, 3.0, FLAKY.format(9))]) is not None
    # A success first: later failures are the trials' own.
    assert (
        failing.check([_complete(0, 1.0), _failed(1, 1.0, USAGE.format(1)), _failed(2, 2.0, USAGE.format(2))])
        is None
    )
    # Different failures, cluster faults, cancelled or unrun trials: no verdict.
    assert (
        failing.check(
            [_failed(0, 1.0, USAGE.format(1)), _failed(1, 2.0, "no metric reported; last output line: ''")]
        )
        is None
    )
    node = "job {} NODE_FAIL without telling a result"
    assert failing.check([_failed(i, float(i), node.format(800 + i)) for i in range(4)]) is None
    cancelled = [_failed(i, float(i), record.REASON_CANCELLED) for i in range(3)]
    unrun = [_failed(i, float(i), "never submitted: x", **{record.ATTR_NOT_RUN: True}) for i in range(3)]
    assert failing.check(cancelled) is None and failing.check(unrun) is None


@pytest.mark.fast
def test_after_a_first_failure_no_rerun_changes_the_launcher_waits_for_the_next_verdict() -> None:
    assert failing.suspect([_failed(0, 1.0, USAGE.format(16))])
    assert not failing.suspect([_failed(0, 1.0, FLAKY.format(1))])  # may be transient: no wait
    assert not failing.suspect([_failed(0, 1.0, USAGE.format(16)), _complete(1, 2.0)])
    assert not failing.suspect([])


@pytest.mark.fast
def test_a_failure_no_rerun_changes_is_not_retried(tmp_path: Path) -> None:
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    for number, reason in enumerate((USAGE.format(16), FLAKY.format(1))):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 10.0)})
        record.fail(study, trial, reason)
        assert trial.number == number
    assert record.queue_retries(study, max_retries=1) == [1]
