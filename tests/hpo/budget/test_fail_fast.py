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

from hpo import failures, record, requeue, tally
from hpo.budget import failing
from hpo.config.schema import build_spec
from tests.hpo.helpers import (
    fault_line,
    final_sacct_states,
    load_trials,
    run_hpo,
    score_study,
    start_hpo,
    write_study,
)

# A training script with its own options; prints "epoch N score X" per epoch. The trials listed in
# --flaky fail on purpose, each its own way (transient faults: their retries, the same x under
# another trial number, succeed).
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
marker = f"failed-once-{args.x}"
if trial in flaky and not os.path.exists(marker):
    print("loading data", flush=True)
    open(marker, "w").close()
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
    # The user's baseline, enqueued: it runs first, so the mistake fails it.
    document, study_file = _study(tmp_path, command, pattern, enqueue=[{"x": 1.7}])

    proc = run_hpo("launch", str(study_file), timeout=600)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    [error] = proc.stderr.strip().splitlines()[-1:]
    assert error.startswith("hpo launch: error: trials 0 and 1 failed the same way") and cause in error, error
    key = "objective.metric_pattern" if case == "pattern" else "objective.command"
    assert f"{key} in {study_file}" in error or f"{key} read no number" in error, error
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
    trials = load_trials(document)
    states = [t.state.name for t in trials]
    assert states.count("COMPLETE") == 6 and states.count("FAIL") == 2, states
    # The baseline the mistake failed runs after the fix, first, and the launcher says so.
    assert (
        "1 enqueued configuration(s) that a set-up mistake failed on an earlier launch (trial 0)"
        in fixed.stdout
    )
    [rerun] = [t for t in trials if t.user_attrs.get(record.ATTR_RERUN_OF) == 0]
    assert (rerun.number, rerun.params["x"], rerun.state.name) == (2, 1.7, "COMPLETE")
    assert "last launch stopped" not in run_hpo("status", str(study_file)).stdout


def test_workers_stop_pulling_trials_once_the_first_fail_the_same_way(tmp_path: Path) -> None:
    document, study_file = _study(tmp_path, ["--x", "{x}", "--hidden-size", "16"], n_trials=20)
    document["resources"]["executor"] = "local"

    proc = run_hpo("launch", str(write_study(study_file, document)), "--workers", "2", timeout=300)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "failed the same way" in proc.stderr.strip().splitlines()[-1], proc.stderr
    trials = load_trials(document)
    # Each worker checks before it asks, and after a first failure no rerun changes waits for the
    # other's trial (before: 3 or 4 trials). Only a worker that starts after the other's first trial
    # has failed can add one.
    assert 2 <= len(trials) <= 3 and {t.state.name for t in trials} == {"FAIL"}, len(trials)


@pytest.mark.slow
def test_a_transient_failure_among_successes_is_retried_and_the_study_runs_on(
    tmp_path: Path, local_cluster: str
) -> None:
    # Trial 0 (the study's first) and trial 3 fail, in two ways; their retries succeed. Trial 3 is
    # a new one when trial 0's retry was queued before trial 1 ended (number 2), else the retry.
    document, study_file = _study(tmp_path, ["--x", "{x}", "--flaky", "0,3"], n_trials=4)

    proc = run_hpo("launch", str(study_file), timeout=600)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document)
    first_runs = [t.number for t in trials if "retry_of" not in t.user_attrs]
    failed = [t.number for t in trials if t.state.name == "FAIL"]
    retried = sorted(t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs)
    expected = [n for n in (0, 3) if n in first_runs]
    assert failed == retried == expected, [(t.number, t.state.name, t.user_attrs) for t in trials]
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
        ("the command was killed by SIGKILL; last output line: 'epoch 2'", "killed"),
        ("the command was killed by SIGTERM; last output line: 'epoch 2'", "cluster"),
    ],
)
def test_a_fail_reason_is_classified(reason: str, kind: str) -> None:
    failure = failures.classify(reason)
    assert failure.kind == kind
    assert failure.permanent == (kind not in ("other", "cluster", "killed"))


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
    # A failure that may be transient: a trial and its retry are one parameter set; a third set,
    # spread over the range, stops (the parameters do not decide it).
    flaky = [
        _failed(0, 1.0, FLAKY.format(3)),
        _failed(1, 5.0, FLAKY.format(5)),
        _failed(2, 1.0, FLAKY.format(3)),
    ]
    assert failing.check(flaky) is None
    assert failing.check([*flaky, _failed(3, 9.0, FLAKY.format(9))]) is not None
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
    assert requeue.queue_retries(study, max_retries=1) == [1]


# --- failures that depend on the parameters are the trials' own ------------------------------------

LR = optuna.distributions.FloatDistribution(0.01, 1.0, log=True)
CRASH = "the command exited with status 1: RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"


def _failed_at(
    number: int, lr: float, reason: str, curve: dict[int, float] | None = None
) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL,
        params={"lr": lr, "x": 0.5 + number / 10},
        distributions={"lr": LR, "x": optuna.distributions.FloatDistribution(0.0, 1.0)},
        user_attrs={record.ATTR_FAIL_REASON: reason},
        intermediate_values=curve or {},
    )
    trial.number = number
    return trial


@pytest.mark.fast
def test_failures_only_some_parameters_cause_never_stop_the_study() -> None:
    # The same crash at three learning rates above 0.5 (the top 15% of the log range): confined.
    high = [_failed_at(i, lr, CRASH) for i, lr in enumerate((0.558, 0.865, 0.547))]
    assert failing.confined(high) and failing.check(high) is None
    # Spread over the range, the same crash is the set-up's.
    spread = [_failed_at(i, lr, CRASH) for i, lr in enumerate((0.02, 0.9, 0.1))]
    assert not failing.confined(spread) and failing.check(spread) is not None
    # A script that exits 0 without its metric line for high learning rates only.
    silent = "no metric reported; last output line: 'done'"
    assert failing.check([_failed_at(i, lr, silent) for i, lr in enumerate((0.7, 0.95))]) is None
    # A usage error fails whatever the parameters: two confined ones still stop.
    assert (
        failing.check([_failed_at(i, lr, USAGE.format(16)) for i, lr in enumerate((0.7, 0.95))]) is not None
    )
    # Failures after the trials reported (the set-up worked), and the program's own "loss is nan".
    after = [_failed_at(i, lr, CRASH, {1: 0.5, 2: 0.6}) for i, lr in enumerate((0.02, 0.9, 0.1))]
    nan = "the command exited with status 1: RuntimeError: loss is nan"
    assert failing.check(after) is None
    assert failing.check([_failed_at(i, lr, nan) for i, lr in enumerate((0.02, 0.9, 0.1))]) is None
    assert not failing.suspect([_failed_at(0, 0.9, nan)])


BATCH = optuna.distributions.CategoricalDistribution([512, 32, 128, 64])


def _failed_with(number: int, params: dict[str, Any], reason: str, **attrs: Any) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL,
        params=params,
        distributions={"lr": LR, "batch_size": BATCH},
        user_attrs={record.ATTR_FAIL_REASON: reason, **attrs},
    )
    trial.number = number
    return trial


def _out_of_memory(
    number: int, params: dict[str, Any], batch: optuna.distributions.BaseDistribution = BATCH
) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        value=0.0,
        params=params,
        distributions={"lr": LR, "batch_size": batch},
        user_attrs={record.ATTR_FAIL_REASON: "CUDA out of memory", record.ATTR_INFEASIBLE: True},
    )
    trial.number = number
    return trial


@pytest.mark.fast
def test_a_failure_only_one_categorical_value_causes_never_stops_the_study() -> None:
    # The same crash at three learning rates spread over the range, all at batch size 512.
    at_512 = [_failed_with(i, {"lr": lr, "batch_size": 512}, CRASH) for i, lr in enumerate((0.02, 0.9, 0.1))]
    assert failing.confined(at_512) and failing.check(at_512) is None
    # At two batch sizes it is no longer one value's doing.
    mixed = [*at_512[:2], _failed_with(2, {"lr": 0.1, "batch_size": 32}, CRASH)]
    assert not failing.confined(mixed) and failing.check(mixed) is not None
    # A categorical of words: one value is confined, two are not.
    words = optuna.distributions.CategoricalDistribution(["sgd", "adamw"])

    def crashed(number: int, lr: float, optimizer: str) -> optuna.trial.FrozenTrial:
        trial = optuna.trial.create_trial(
            state=optuna.trial.TrialState.FAIL,
            params={"lr": lr, "optimizer": optimizer},
            distributions={"lr": LR, "optimizer": words},
            user_attrs={record.ATTR_FAIL_REASON: CRASH},
        )
        trial.number = number
        return trial

    assert failing.confined([crashed(0, 0.02, "sgd"), crashed(1, 0.9, "sgd"), crashed(2, 0.1, "sgd")])
    assert not failing.confined([crashed(0, 0.02, "sgd"), crashed(1, 0.9, "adamw"), crashed(2, 0.1, "sgd")])


@pytest.mark.fast
def test_every_trial_killed_or_out_of_memory_stops_the_study_unless_the_parameters_explain_it() -> None:
    # A memory limit too small for any configuration: SIGKILLed at every batch size and lr.
    killed = "the command was killed by SIGKILL; last output line: 'epoch {}'"
    spread = [(0.02, 512), (0.9, 32), (0.1, 128)]
    kills = [
        _failed_with(i, {"lr": lr, "batch_size": b}, killed.format(i)) for i, (lr, b) in enumerate(spread)
    ]
    # Retried (a neighbour's memory may have done it), but two parameter sets decide, as a memory
    # limit too small for every configuration must not spend the budget and its retries.
    assert failing.check(kills[:1]) is None and failing.suspect(kills[:1])
    verdict = failing.check(kills[:2])
    assert verdict is not None and verdict.failure.kind == "killed" and verdict.trials == [0, 1]
    # Out of memory (told infeasible) at every batch size: the same.
    ooms = [_out_of_memory(i, {"lr": lr, "batch_size": b}) for i, (lr, b) in enumerate(spread)]
    verdict = failing.check(ooms)
    assert verdict is not None and verdict.failure.kind == "out of memory" and verdict.trials == [0, 1]
    # Only at the two largest batch sizes, read by value whatever the order of the choices (by list
    # position 512 and 256 lie apart): the parameters' doing, never a verdict.
    batches = optuna.distributions.CategoricalDistribution([512, 16, 256, 32, 128, 64, 8])
    large = []
    for number, (lr, size) in enumerate(zip((0.02, 0.9, 0.1, 0.3), (512, 256, 512, 256), strict=True)):
        large.append(_out_of_memory(number, {"lr": lr, "batch_size": size}, batches))
    assert failing.confined(large) and failing.check(large) is None
    # A success first: later kills are the trials' own.
    done = optuna.trial.create_trial(
        value=0.5, params={"lr": 0.1, "batch_size": 32}, distributions={"lr": LR, "batch_size": BATCH}
    )
    assert failing.check([done, *kills]) is None


@pytest.mark.fast
def test_a_study_that_ever_succeeded_is_never_stopped_by_fail_fast() -> None:
    study = optuna.create_study()
    study.add_trial(_complete(0, 1.0))
    mistakes = [_failed(1, 1.0, USAGE.format(16)), _failed(2, 2.0, USAGE.format(32))]
    assert failing.check(mistakes) is not None  # a launch that saw no success itself...
    assert failing.check(mistakes, study) is None  # ...of a study that had one: the trials' own
    # A diverged trial is neither a success nor a set-up mistake.
    diverged = optuna.create_study()
    trial = diverged.ask({"x": optuna.distributions.FloatDistribution(0.0, 10.0)})
    record.tell_diverged(diverged, trial, "diverged at step 1: score=nan", 1)
    [frozen] = diverged.get_trials()
    assert record.shown_state(frozen) == "DIVERGED" and not requeue.queue_retries(diverged, max_retries=2)
    assert failing.check([frozen, *mistakes], diverged) is not None


@pytest.mark.fast
def test_a_queued_retry_of_a_failure_no_rerun_changes_is_closed_not_run() -> None:
    # A retry of "loss is nan" queued by an earlier launch (which retried it as a transient failure).
    study = optuna.create_study()
    space = {"x": optuna.distributions.FloatDistribution(0.0, 10.0)}
    nan = "the command exited with status 1: RuntimeError: loss is nan"
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.FAIL, params={"x": 9.0}, distributions=space,
            user_attrs={record.ATTR_FAIL_REASON: nan},
        )
    )  # fmt: skip
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.WAITING, params={"x": 9.0}, distributions=space,
            user_attrs={record.ATTR_RETRY_OF: 0},
            system_attrs={record.SYSTEM_ATTR_FAILED_TRIAL: 0, record.SYSTEM_ATTR_RETRY_HISTORY: [0]},
        )
    )  # fmt: skip
    assert requeue.queue_retries(study, max_retries=3) == []
    retry = study.get_trials()[1]
    assert retry.state.name == "FAIL" and retry.user_attrs[record.ATTR_NOT_RUN], retry.user_attrs
    assert [t.number for t in tally.counted_trials(study)] == [0]


# lr above 0.5 (15% of the log range) fails, before any report: "loss is nan" (the program's
# words for a divergence), or a crash that says nothing of the parameters.
LR_SCRIPT = r"""
import argparse, sys
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--wd", type=float, required=True)
parser.add_argument("--message", required=True)
args = parser.parse_args()
if args.lr > 0.5:
    sys.exit(args.message)
for epoch in range(1, 3):
    print(f"epoch {epoch} score {1 - abs(args.lr - 0.1) - args.wd * epoch:.4f}", flush=True)
"""


@pytest.mark.slow
def test_failures_above_some_learning_rate_never_stop_a_study_over_twelve_seeds(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LR_SCRIPT)
    messages = ["RuntimeError: loss is nan", "RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"]
    documents = []
    for seed in range(12):
        document = score_study(
            tmp_path,
            f"lr-{seed}-{uuid.uuid4().hex[:6]}",
            {
                "command": [
                    "{python}",
                    "train.py",
                    "--lr",
                    "{lr}",
                    "--wd",
                    "{wd}",
                    "--message",
                    messages[seed % 2],
                ],
                "metric_pattern": PATTERN,
                "steps": 2,
            },
            # Fail fast decides before a study's first success: 4 trials, all in flight, cover it.
            n_trials=4,
            max_concurrent=4,
            max_retries=0,
            sampler={"name": "tpe", "seed": seed},
            workdir=str(tmp_path / f"work-{seed}"),
        )
        document["search_space"] = {
            "lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True},
            "wd": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True},
        }
        documents.append(document)
    # Four launches at a time: each mostly waits on its trials' processes.
    outputs: list[tuple[int, str]] = []
    for first in range(0, 12, 4):
        launchers = [
            start_hpo("launch", str(write_study(tmp_path / f"study-{seed}.yaml", documents[seed])))
            for seed in range(first, first + 4)
        ]
        outputs += [(launcher.wait(timeout=600), launcher.communicate()[0]) for launcher in launchers]
    outcomes = []
    for seed, (document, (returncode, output)) in enumerate(zip(documents, outputs, strict=True)):
        trials = load_trials(document)
        failed = [t for t in trials if t.params["lr"] > 0.5]
        outcomes.append((seed, returncode, len(trials), len(failed)))
        assert returncode == 0, (seed, output[-3000:])
        assert "failed the same way" not in output
        assert len(trials) == 4, (seed, [(t.number, t.state.name) for t in trials])  # the whole budget
        assert all(t.state.name in ("COMPLETE", "PRUNED") for t in trials if t.params["lr"] <= 0.5)
        # "loss is nan" is a divergence (DIVERGED, the sampler learns from it); the crash a failure.
        shown = {record.shown_state(t) for t in failed}
        assert shown <= ({"DIVERGED"} if seed % 2 == 0 else {"FAIL"}), (seed, shown)
    print(f"\nseed, exit status, trials, trials with lr > 0.5: {outcomes}")
    # The rule was put to the test: studies met failures, some more than one.
    assert sum(1 for *_, failed in outcomes if failed) >= 3 and max(f for *_, f in outcomes) >= 2, outcomes
