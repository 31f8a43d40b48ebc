"""Admission, the one answer to "may this study start another trial": its rules in their order, what
holds and what closes, a worker's view, and the launchers' gate. Studies in memory, their trials
built with ``optuna.trial.create_trial``: no cluster, no database."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo import record, study_record, tally
from hpo.budget import admission, compute
from hpo.config.schema import build_spec
from tests.hpo.helpers import score_study

pytestmark = pytest.mark.fast

X = optuna.distributions.FloatDistribution(0.5, 2.0)
USAGE = "the command exited with status 2: train.py: error: unrecognized arguments: --hidden-size {}"
FLAKY = "the command exited with status 1: RuntimeError: CUDA error: uncorrectable ECC error at step {}"


def _spec(tmp_path: Path, **study: Any) -> Any:
    document = score_study(tmp_path, "admission", {"command": ["true"]}, **study)
    return build_spec(document, str(tmp_path / "study.yaml"))


def _failed(number: int, x: float, reason: str) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL,
        params={"x": x},
        distributions={"x": X},
        user_attrs={record.ATTR_FAIL_REASON: reason},
    )
    trial.number = number
    return trial


def _complete(number: int, value: float) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(value=value, params={"x": 1.0}, distributions={"x": X})
    trial.number = number
    return trial


def _spending(
    spent: float, *, limit: float = 1.0, per_trial: float = 0.3, running: int = 0, known: bool = True
) -> compute.Spending:
    return compute.Spending("CPU-hours", limit, spent, 0.0, per_trial, False, running, known)


MISTAKES = [_failed(0, 0.6, USAGE.format(16)), _failed(1, 1.9, USAGE.format(32))]


def test_the_first_rule_that_closes_answers_in_the_order_users_see(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    now = time.time()
    study = optuna.create_study()
    study_record.request_cancel(study, now - 1)
    spent = _spending(0.9)
    everything = {"ended": MISTAKES, "spending": spent, "now": now, "started": now - 10}

    answer = admission.decide(study, spec, deadline=now - 1, **everything)
    assert (answer.open, answer.kind) == (False, admission.DEADLINE)
    answer = admission.decide(study, spec, **everything)
    assert answer.kind == admission.CANCELLED and answer.cancel_requested_at == now - 1
    # A cancel still under way (its `hpo cancel` has not returned) holds a launch begun meanwhile;
    # one that has returned, from before this launch, is not its own.
    assert admission.decide(study, spec, **{**everything, "started": now}).kind == admission.CANCELLED
    study_record.end_cancel(study, now - 1)
    answer = admission.decide(study, spec, **{**everything, "started": now})
    assert answer.kind == admission.FAILING and answer.failing_verdict is not None
    assert answer.reason.startswith("trials 0 and 1 failed the same way and none succeeded: ")
    # A study that ever succeeded (an earlier launch's trial): its failures are the trials' own.
    succeeded = optuna.create_study()
    succeeded.add_trial(_complete(0, 1.0))
    assert admission.decide(succeeded, spec, ended=MISTAKES, now=now, started=now).open
    no_fail_fast = _spec(tmp_path, fail_fast=False)
    answer = admission.decide(study, no_fail_fast, **{**everything, "started": now})
    assert answer.kind == admission.BUDGET
    assert answer.reason.startswith("compute budget reached: 0.9 of 1 CPU-hours spent [estimate]"), answer
    assert answer.reason.endswith("; one more trial would cost ~0.3")
    assert admission.decide(study, no_fail_fast, now=now, started=now).open


def test_a_first_failure_no_rerun_changes_holds_until_the_next_trial_ends(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    study = optuna.create_study()
    now = time.time()
    first = [MISTAKES[0]]
    since = admission.suspicion(spec, first, running=1, since=None)
    assert since == 1
    held = admission.decide(study, spec, now=now, started=now, ended=first, running=1, suspect_since=since)
    assert held.holds and not held.open and not held.final
    # Nothing in flight: nothing to wait for. A failure a rerun may change: no wait either.
    assert admission.suspicion(spec, first, running=0, since=None) is None
    assert admission.suspicion(spec, [_failed(0, 0.6, FLAKY.format(1))], running=1, since=None) is None
    # The next trial ended another way: the study goes on.
    both = [*first, _failed(1, 1.9, FLAKY.format(2))]
    since = admission.suspicion(spec, both, running=1, since=since)
    assert admission.decide(
        study, spec, now=now, started=now, ended=both, running=1, suspect_since=since
    ).open
    # A rule that closes after a hold still answers: the budget spent is no reason to wait.
    answer = admission.decide(
        study, spec, now=now, started=now, ended=first, running=1, suspect_since=1, spending=_spending(1.0)
    )
    assert answer.kind == admission.BUDGET
    assert not admission.decide(study, _spec(tmp_path, fail_fast=False), now=now, started=now,
                                ended=first, running=1, suspect_since=1).holds  # fmt: skip


def test_the_budget_holds_while_no_trial_has_said_what_one_costs(tmp_path: Path) -> None:
    spec = _spec(tmp_path, budget=1.0)
    study = optuna.create_study()
    now = time.time()

    def ask(spending: compute.Spending) -> admission.Admission:
        return admission.decide(study, spec, now=now, started=now, spending=spending)

    assert ask(_spending(0.5, per_trial=0.9, running=1, known=False)).holds
    assert ask(_spending(0.5, per_trial=0.9, running=0, known=False)).open  # the first trial starts
    assert ask(_spending(0.2)).open
    closed = ask(_spending(0.8))
    assert closed.final and closed.kind == admission.BUDGET
    measured: list[int] = []

    def measure() -> compute.Spending:
        measured.append(1)
        return _spending(0.8)

    study_record.request_cancel(study, now)
    assert admission.decide(study, spec, now=now, started=now, spending=measure).kind == admission.CANCELLED
    assert not measured  # an earlier rule closed: no sacct for nothing


def test_a_launcher_judges_the_stop_rules_and_a_worker_obeys_the_stored_verdict(tmp_path: Path) -> None:
    spec = _spec(tmp_path, stop={"patience": 2, "min_trials": 2})
    study = optuna.create_study(direction="maximize")
    for number, value in enumerate((1.0, 0.9, 0.8)):
        study.add_trial(_complete(number, value))
    now = time.time()
    answer = admission.decide(study, spec, now=now, started=now - 10)
    assert answer.kind == admission.STOP_RULE and answer.stop_verdict is not None
    assert answer.reason == "no improvement larger than 0 in the last 2 finished trials (best 1)"
    assert admission.decide(study, spec, now=now, started=now - 10, judge=False).open  # nothing new ended
    # A worker judges no stop rule (its launcher stores the verdict) ...
    assert admission.decide(study, spec, now=now, started=now - 10, role=admission.WORKER).open
    study_record.store_stopped(study, answer.reason, 2, "1 of 20 trials not run")
    worker = admission.decide(study, spec, now=time.time(), started=now - 10, role=admission.WORKER)
    assert (worker.kind, worker.reason) == (admission.STOP_RULE, f"stop rule met ({answer.reason})")
    # ... of its own launch: a verdict stored before it started is an earlier launch's.
    assert admission.decide(study, spec, now=time.time(), started=time.time() + 1, role=admission.WORKER).open


def test_a_worker_takes_no_trial_its_job_has_no_time_left_for(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    study = optuna.create_study()
    now = time.time()

    def ask(left_s: float) -> admission.Admission:
        return admission.decide(
            study, spec, now=now, started=now, role=admission.WORKER, job_end=now + left_s, longest_trial_s=30
        )

    assert ask(100).open  # 1.2 x 30 s + 60 s = 96 s
    closed = ask(90)
    assert (closed.kind, closed.reason) == (admission.JOB_TIME, "90 s left, the longest trial took 30 s")


def test_the_gate_stores_a_verdict_and_says_each_reason_once(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    study = optuna.create_study()
    for trial in MISTAKES:
        study.add_trial(trial)
    started = time.time() - 1
    lines: list[str] = []
    gate = admission.Gate(spec, study, started=started, deadline=None, log=lines.append)
    assert gate.ask([], running=2).open
    cut: list[int] = []

    def cut_short() -> list[int]:  # the launcher ends its trials in flight
        cut.append(7)
        return [7]

    ended = tally.own_trials(study)
    first = gate.ask(ended, running=1, cut_short=cut_short)
    again = gate.ask(ended, running=1, cut_short=cut_short)
    assert first.kind == again.kind == admission.FAILING and cut == [7]  # cut once
    assert len(lines) == 1 and lines[0].startswith("stopping: trials 0 and 1 failed the same way"), lines
    assert gate.failing == admission.failing_line(study, started) == lines[0].removeprefix("stopping: ")
    assert admission.failing_line(study, time.time() + 1) is None  # not a later launch's
    assert study_record.set_up_failures(study) == [0, 1, 7]
    # `hpo cancel` now: acknowledged, and said once.
    study_record.request_cancel(study, time.time())
    assert gate.ask(ended, running=0).kind == admission.CANCELLED and gate.cancelled()
    assert study_record.cancel_seen_at(study) == study_record.cancel_requested_at(study)
    assert lines[1:] == ["hpo cancel: submitting no more trials"]
