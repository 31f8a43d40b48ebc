"""Admission: may this study start another trial now, and if not, why. The one place where the rules
that stop a study are decided, for every backend: the per-trial and ``--workers`` launchers
(``hpo.dispatch.common``), the worker loop inside a ``--workers`` job (``hpo.trial.worker``) and the
Ray backend's searcher (``hpo.dispatch.ray.driver``) all ask :func:`decide`.

The rules, in the order they are asked (``RULES``); the first that closes answers:

1. the study's timeout;
2. ``hpo cancel`` since this launch started;
3. a verdict that stands: one this launch reached earlier, or, for a worker, the one its launcher
   stored on the study (a worker obeys it; only a launcher judges and stores);
4. fail fast (``failing``): the launch's first trials failed the same way. After a first failure
   that no rerun changes, it holds: no trial starts until one more running trial has ended;
5. the study's stop rules (``stopping``), judged by a launcher;
6. the compute budget (``compute``); it holds while no trial has measured what one costs;
7. a worker job's time left for one more trial.

A rule that holds says "not now": a running trial's end may open the study again. A rule that closes
after it still answers (the budget spent is no reason to wait). A new rule is one function here,
listed in ``RULES``.

Capacity is decided here too, the same way for every backend: how many of ``n_trials`` remain to
be started (:func:`trials_left`), how many more may run beside those in flight
(:func:`room_in_flight`), whether a worker's trial came past the budget (:func:`is_surplus`), and
what the site's limits on a user's jobs leave the launch (:func:`fit_to_site`, from the executor).

:func:`decide` does not write to the study (the Terminator aside: ``stopping.check`` keeps each of its
evaluations). Its callers act on the answer, each its own way; the launchers' share of that (the
cancel acknowledged to ``hpo cancel``, a verdict stored and said once, the budget said once) is
:class:`Gate`'s, so that the per-trial launcher and the Ray driver do not each keep a copy.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import optuna

from hpo import study_record, tally
from hpo.budget import compute, failing, stopping
from hpo.budget.usage import format_hours

if TYPE_CHECKING:
    from hpo.config import StudySpec
    from hpo.executors import Executor

OPEN = "open"
HOLD = "hold"
"""Not now: once a running trial ends, the answer may be another."""
DEADLINE = "deadline"
CANCELLED = "cancelled"
FAILING = "failing"
STOP_RULE = "stop rule"
BUDGET = "budget"
JOB_TIME = "job time"

LAUNCHER = "launcher"
WORKER = "worker"

JOB_TIME_MARGIN_S = 60.0
JOB_TIME_FACTOR = 1.2
"""A worker starts a trial only if its job has this many times its longest trial left, plus the margin."""


@dataclasses.dataclass(frozen=True)
class Admission:
    """The answer: ``open``, or why not (``kind``, and ``reason`` as users read it)."""

    open: bool
    kind: str
    reason: str = ""
    cancel_requested_at: float = 0.0
    """The ``hpo cancel`` request (unix time) that closed the study, for its acknowledgement."""
    failing_verdict: failing.Verdict | None = None
    """Fail fast's verdict, for ``failing.end`` to store."""
    stop_verdict: stopping.Verdict | None = None
    """The stop rules' verdict, for ``stopping.end`` to store."""

    @property
    def holds(self) -> bool:
        return self.kind == HOLD

    @property
    def final(self) -> bool:
        """No trial starts again in this launch, whatever ends."""
        return not self.open and not self.holds


ADMITTED = Admission(True, OPEN)


@dataclasses.dataclass(frozen=True)
class Question:
    """What the caller knows when it asks (see :func:`decide`)."""

    study: optuna.Study
    spec: StudySpec
    now: float
    started: float
    deadline: float | None = None
    ended: Sequence[optuna.trial.FrozenTrial] = ()
    running: int = 0
    role: str = LAUNCHER
    judge: bool = True
    verdict: Admission | None = None
    spending: compute.Spending | Callable[[], compute.Spending | None] | None = None
    suspect_since: int | None = None
    job_end: float | None = None
    longest_trial_s: float = 0.0


Rule = Callable[[Question], Admission | None]


def decide(
    study: optuna.Study,
    spec: StudySpec,
    *,
    now: float,
    started: float,
    deadline: float | None = None,
    ended: Sequence[optuna.trial.FrozenTrial] = (),
    running: int = 0,
    role: str = LAUNCHER,
    judge: bool = True,
    verdict: Admission | None = None,
    spending: compute.Spending | Callable[[], compute.Spending | None] | None = None,
    suspect_since: int | None = None,
    job_end: float | None = None,
    longest_trial_s: float = 0.0,
) -> Admission:
    """May ``study`` start another trial at ``now`` (unix time)?

    ``started``: when this launch (or, for a worker, its launcher) started: an ``hpo cancel`` or a
    stored verdict from before is not this launch's. ``deadline``: the study's timeout (unix time).
    ``ended``: this launch's trials in the order they ended (fail fast reads them); ``running``:
    its trials still running. ``role``: :data:`LAUNCHER` judges fail fast and the stop rules;
    :data:`WORKER` obeys the verdict its launcher stored and judges fail fast for itself.
    ``judge``: False skips the judging when no trial has ended since the caller last asked (the
    Terminator fits a model). ``verdict``: a final answer this launch reached earlier: it stands.
    ``spending``: the compute budget as measured (or a function that measures it, called only when
    no earlier rule closes). ``suspect_since``: see :func:`suspicion`. ``job_end``,
    ``longest_trial_s``: a worker job's end (unix time) and the longest trial it ran.
    """
    question = Question(
        study, spec, now, started, deadline, ended, running, role, judge, verdict, spending,
        suspect_since, job_end, longest_trial_s,
    )  # fmt: skip
    held: Admission | None = None
    for rule in RULES:
        answer = rule(question)
        if answer is None:
            continue
        if not answer.holds:
            return answer
        held = held or answer
    return held or ADMITTED


# --- the rules, in their order -------------------------------------------------------------------


def deadline(question: Question) -> Admission | None:
    if question.deadline is not None and question.now >= question.deadline:
        return Admission(False, DEADLINE, "the study's timeout is reached")
    return None


def cancel(question: Question) -> Admission | None:
    return cancelled(question.study, question.started)


def standing_verdict(question: Question) -> Admission | None:
    """This launch's earlier verdict; for a worker, the one its launcher stored since it started."""
    if question.verdict is not None:
        return question.verdict
    if question.role != WORKER:
        return None
    stored = stored_stop(question.study, question.started)
    if stored is None:
        return None
    kind = FAILING if stored.get("kind") == "failing" else STOP_RULE
    return Admission(False, kind, f"stop rule met ({stored['reason']})")


def fail_fast(question: Question) -> Admission | None:
    spec, ended = question.spec, question.ended
    if not spec.study.fail_fast:
        return None
    if question.judge:
        verdict = failing.check(ended, question.study)  # a study that ever succeeded: never
        if verdict is not None:
            return Admission(False, FAILING, verdict.line(spec), failing_verdict=verdict)
    if question.suspect_since is not None and question.suspect_since == len(ended) and question.running:
        return Admission(
            False, HOLD, "a first trial failed in a way no rerun changes: the next to end decides"
        )
    return None


def stop_rules(question: Question) -> Admission | None:
    if question.role != LAUNCHER or not question.judge or not question.spec.study.stop.active:
        return None
    verdict = stopping.check(question.study, question.spec)
    if verdict is None:
        return None
    return Admission(False, STOP_RULE, verdict.reason, stop_verdict=verdict)


def compute_budget(question: Question) -> Admission | None:
    spending = question.spending() if callable(question.spending) else question.spending
    if spending is None or spending.allows_another:
        return None
    if not spending.exhausted:
        return Admission(False, HOLD, "the compute budget: no trial has finished to say what one costs")
    expected = f"; one more trial would cost ~{format_hours(spending.per_trial)}" if spending.known else ""
    return Admission(False, BUDGET, f"compute budget reached: {spending.line()}{expected}")


def job_time(question: Question) -> Admission | None:
    if question.job_end is None:
        return None
    left_s = question.job_end - question.now
    if left_s >= JOB_TIME_FACTOR * question.longest_trial_s + JOB_TIME_MARGIN_S:
        return None
    return Admission(
        False, JOB_TIME, f"{left_s:.0f} s left, the longest trial took {question.longest_trial_s:.0f} s"
    )


RULES: tuple[Rule, ...] = (
    deadline,
    cancel,
    standing_verdict,
    fail_fast,
    stop_rules,
    compute_budget,
    job_time,
)


# --- what the rules read --------------------------------------------------------------------------


def cancelled(study: optuna.Study, started: float) -> Admission | None:
    """``hpo cancel`` since ``started``, or one still under way (a launch is refused while it runs:
    one begun meanwhile is cancelled with the rest); None if none."""
    requested = study_record.cancel_requested_at(study)
    if requested <= 0 or (requested < started and not study_record.cancel_under_way(study)):
        return None
    return Admission(False, CANCELLED, "hpo cancel", cancel_requested_at=requested)


def stored_stop(study: optuna.Study, since: float) -> dict[str, Any] | None:
    """The verdict stored on the study since ``since`` (a stop rule's, or fail fast's), or None."""
    stop = study_record.stopped(study)
    return stop if stop and float(stop.get("at", 0)) >= since else None


def failing_line(study: optuna.Study, since: float) -> str | None:
    """The line of the fail-fast verdict a launch that started at ``since`` stored, or None: the
    launch exits non-zero with it, whichever backend ran it."""
    stop = stored_stop(study, since)
    return str(stop["reason"]) if stop and stop.get("kind") == "failing" else None


def suspicion(
    spec: StudySpec, ended: Sequence[optuna.trial.FrozenTrial], running: int, since: int | None
) -> int | None:
    """The caller's memory for fail fast's hold: how many trials had ended when the launch began to
    wait for the next one to decide (``failing.suspect``), or None. A first failure no rerun changes
    makes the launch wait until one more trial in flight ends, so that a set-up error costs 2
    trials, not 2 plus those submitted meanwhile. Pass the answer back as ``suspect_since``."""
    if not (running and spec.study.fail_fast and failing.suspect(ended)):
        return None
    return len(ended) if since is None else since


# --- the launchers' share of acting on the answer ---------------------------------------------------


class Gate:
    """A launcher's admission over one launch: :func:`decide` with what the launcher remembers (a
    verdict is final; fail fast and the stop rules are judged again only once a trial has ended;
    the budget is measured again when a trial has ended or every ``compute.REMEASURE_S``), and the
    effects every launcher has: a cancel acknowledged to ``hpo cancel`` (which waits for that), a
    verdict stored on the study, each reason said once in the launcher's log."""

    def __init__(
        self,
        spec: StudySpec,
        study: optuna.Study,
        *,
        started: float,
        deadline: float | None,
        log: Callable[[str], None],
        cancel_line: str = "hpo cancel: submitting no more trials",
        ray_jobs: Sequence[str] = (),
    ) -> None:
        self.spec = spec
        self.study = study
        self.started = started
        self.deadline = deadline
        self.log = log
        self.cancel_line = cancel_line
        self.budget = compute.BudgetGate(spec, study, ray_jobs)
        self.verdict: Admission | None = None
        self.failing: str | None = None
        """Fail fast's line, once it stopped this launch."""
        self._judged_at = -1
        self._suspect_since: int | None = None
        self._cancel_seen_at = 0.0
        self._budget_said = False

    def ask(
        self,
        ended: Sequence[optuna.trial.FrozenTrial],
        running: int,
        cut_short: Callable[[], list[int]] = list,
    ) -> Admission:
        """``ended``: this launch's trials in the order they ended; ``running``: its trials still
        running; ``cut_short()``: ends them when fail fast stops the launch on a failure no rerun
        changes, and returns their numbers (they leave the trial budget whole too)."""
        judge = len(ended) != self._judged_at
        self._suspect_since = suspicion(self.spec, ended, running, self._suspect_since)
        answer = decide(
            self.study,
            self.spec,
            now=time.time(),
            started=self.started,
            deadline=self.deadline,
            ended=ended,
            running=running,
            judge=judge,
            verdict=self.verdict,
            spending=lambda: self.budget.spending(len(ended)),
            suspect_since=self._suspect_since,
        )
        self._judged_at = len(ended)
        self._act(answer, cut_short)
        return answer

    def cancelled(self) -> bool:
        """``hpo cancel`` since this launch (acknowledged): asked again just before a submission."""
        answer = cancelled(self.study, self.started)
        if answer is not None:
            self._act(answer, list)
        return answer is not None

    def _act(self, answer: Admission, cut_short: Callable[[], list[int]]) -> None:
        if answer.kind == CANCELLED:
            if answer.cancel_requested_at > self._cancel_seen_at:
                study_record.acknowledge_cancel(self.study, answer.cancel_requested_at)
                if not self._cancel_seen_at:
                    self.log(self.cancel_line)
                self._cancel_seen_at = answer.cancel_requested_at
        elif answer is self.verdict:
            return  # stored and said when it was reached
        elif answer.failing_verdict is not None:
            verdict = answer.failing_verdict
            cut = cut_short() if verdict.failure.permanent else []
            self.failing = failing.end(self.study, self.spec, verdict, cut)
            self.log(f"stopping: {self.failing}")
            self.verdict = answer
        elif answer.stop_verdict is not None:
            self.log(stopping.end(self.study, self.spec, answer.stop_verdict))
            self.verdict = answer
        elif answer.kind == BUDGET and not self._budget_said:
            self._budget_said = True
            self.log(f"{answer.reason}: submitting no more trials")


def trials_left(spec: StudySpec, study: optuna.Study) -> int:
    """How many of ``n_trials`` are still to be started, for every way of running trials: a retry
    takes the place of the trial it retries, an enqueued trial counts once it starts, a trial
    closed unrun or imported does not count (``hpo.tally.counted_trials``)."""
    return max(0, spec.study.n_trials - tally.started_count(study))


def room_in_flight(spec: StudySpec, in_flight: int) -> int:
    """How many more trials may run now beside the ``in_flight`` ones: ``max_concurrent``, as
    :func:`fit_to_site` left it."""
    return max(0, spec.study.max_concurrent - in_flight)


def is_surplus(spec: StudySpec, study: optuna.Study, trial: optuna.trial.BaseTrial) -> bool:
    """Whether a trial just asked is past ``n_trials``: several workers may ask at the same moment
    for the last one, and the trial numbers decide (the later ones are closed unrun)."""
    earlier = [t for t in tally.counted_trials(study) if t.number < trial.number]
    return len(earlier) >= spec.study.n_trials


@dataclasses.dataclass(frozen=True)
class Fitted:
    """A launch fitted inside what the site allows it (:func:`fit_to_site`)."""

    spec: StudySpec
    workers: int | None
    at_job_limit: bool
    """The study fills what a refusing limit (MaxSubmitJobs) leaves it: a finished trial's job
    must leave the queue before the next is submitted."""


def fit_to_site(
    spec: StudySpec, executor: Executor, workers: int | None, log: Callable[[str], None]
) -> Fitted:
    """``max_concurrent`` (per-trial jobs) or ``--workers`` above what the site's limits on a user's
    jobs leave this study (the executor's ``site_room``, read once per launch) lowered to it, with
    one line saying why; a study none of whose jobs could be submitted now is refused there."""
    per_job = spec.resources.trials_per_gpu  # trials (or workers) a job runs at once
    wanted_trials = workers or spec.study.max_concurrent
    wanted = -(-wanted_trials // per_job)  # the jobs it takes
    room = executor.site_room(spec, wanted, job_array=workers is not None)
    if room.jobs >= wanted:
        return Fitted(spec, workers, room.at_job_limit)
    what = f"--workers {workers}" if workers else f"study.max_concurrent {wanted_trials}"
    packed = f" ({room.jobs} jobs of {per_job})" if per_job > 1 else ""
    allowed = room.jobs * per_job
    log(f"{what} lowered to {allowed}{packed}: {room.why}")
    if workers:
        return Fitted(spec, allowed, room.at_job_limit)
    study = dataclasses.replace(spec.study, max_concurrent=allowed)
    return Fitted(dataclasses.replace(spec, study=study), workers, room.at_job_limit)
