"""The compute budget (``study.budget``): GPU-hours, or CPU-hours where trials have no GPU.

Spent is what the study's own trials cost, earlier launches included (imported warm-start trials
cost nothing here): sacct's figures for per-trial Slurm jobs, finished or running, else each
trial's own elapsed time times what one trial gets (``hpo.slurm.accounting``). A trial still in
flight is expected to cost what the finished trials cost on average (pruned ones included, so
pruning's saving counts); a trial is submitted only if the hours spent, plus what the trials in
flight are still expected to cost, plus one more trial's expected cost stay within the budget.
The study therefore ends within about one trial's cost of its budget, below it unless trials
cost more than the earlier ones did. Until a trial has finished nothing says what one costs: each
is then charged its time limit times its resources, and a first trial always starts (while the
budget is not spent), so a wide study cannot commit many trials before it has measured one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import optuna

from hpo import executors, record, study_record, tally
from hpo.budget.cost import study_cost
from hpo.budget.usage import format_hours, trial_gpus

if TYPE_CHECKING:
    from hpo.config import StudySpec

REMEASURE_S = 10.0
"""How often a budget that holds submissions back is measured again while no trial ends
(sacct is asked at most that often)."""


@dataclasses.dataclass(frozen=True)
class Spending:
    unit: str
    limit: float
    spent: float
    """Hours the study's own trials used so far, running ones included."""
    committed: float
    """What the running trials are still expected to cost on top."""
    per_trial: float
    """The expected cost of one more trial (the finished trials' mean); before any trial has
    finished, the most one can cost: its time limit times its resources."""
    measured: bool
    """Every figure of ``spent`` came from sacct."""
    running: int = 0
    known: bool = True
    """``per_trial`` is a measured mean, not the time-limit bound of a study with no finished trial."""

    @property
    def left(self) -> float:
        return max(0.0, self.limit - self.spent)

    @property
    def allows_another(self) -> bool:
        if not self.known and self.running == 0:
            return self.spent < self.limit  # the first trial: nothing to go by, and room left
        return self.spent + self.committed + self.per_trial <= self.limit

    @property
    def exhausted(self) -> bool:
        """No trial may start, and none that ends could change that: the study is done with it.
        (While no trial has finished, the time-limit bound only holds submissions back.)"""
        return not self.allows_another and (self.known or self.running == 0)

    def line(self) -> str:
        source = "measured" if self.measured else "estimate"
        return (
            f"{format_hours(self.spent)} of {format_hours(self.limit)} "
            f"{self.unit} spent [{source}], {format_hours(self.left)} left"
        )


def measure(
    spec: StudySpec, trials: list[optuna.trial.FrozenTrial], ray_jobs: Sequence[str] = ()
) -> Spending | None:
    """The study's spending against its budget; None for a study without one. ``ray_jobs``: the
    Slurm jobs of the Ray backend's allocations, whose whole hours count (idle slots included)."""
    if spec.study.budget is None:
        return None
    if ray_jobs:
        return _ray_allocation(spec, trials, ray_jobs)
    own = [t for t in trials if tally.is_own(t) and t.state.name != "WAITING"]
    cost = study_cost(spec, own)
    finished = [
        cost.of(cost.per_trial[t.number])
        for t in own
        if t.state.is_finished() and t.number in cost.per_trial and not t.user_attrs.get(record.ATTR_NOT_RUN)
    ]
    # Before any trial has finished, each is charged the most it can cost (its time limit): a
    # study of 16 slots does not commit 16 trials to a budget of 3 before it knows what one costs.
    per_trial = sum(finished) / len(finished) if finished else time_limit_cost(spec)
    running = [t for t in own if t.state.name == "RUNNING"]
    committed = sum(
        max(0.0, per_trial - (cost.of(cost.per_trial[t.number]) if t.number in cost.per_trial else 0.0))
        for t in running
    )
    return Spending(
        cost.unit,
        spec.study.budget,
        cost.total,
        committed,
        per_trial,
        cost.measured,
        len(running),
        bool(finished),
    )


def time_limit_cost(spec: StudySpec) -> float:
    """The most one trial can cost: its job's time limit times what it gets."""
    res = spec.resources
    if res.gpus_per_node:
        return res.time_min / 60 * trial_gpus(spec)
    return res.time_min / 60 * res.cpus_per_task * spec.trial_ranks


def expected_line(spec: StudySpec) -> str:
    """What ``hpo launch --dry-run`` says the study may cost before it runs: the most (every
    trial to its time limit, ``time_limit_cost``), and the budget that caps it where one is set.
    The trials' own cost is known only once some have run (``hpo status`` then gives it)."""
    res = spec.resources
    if res.gpus_per_node:
        unit, count, kind = "GPU-hours", trial_gpus(spec), "GPU"
    else:
        unit, count, kind = "CPU-hours", res.cpus_per_task * spec.trial_ranks, "CPU"
    held = f"{count:g} {kind}{'' if count == 1 else 's'}"
    most = time_limit_cost(spec) * spec.study.n_trials
    line = (
        f"expected cost: at most {format_hours(most)} {unit} ({spec.study.n_trials} trials, "
        f"each up to its {res.time_min}-min time limit on {held}; pruned and faster trials cost less)"
    )
    if spec.study.budget is not None and spec.study.budget < most:
        line += f"; study.budget stops it at {format_hours(spec.study.budget)} {unit}"
    return line


def _ray_allocation(
    spec: StudySpec, trials: list[optuna.trial.FrozenTrial], job_ids: Sequence[str]
) -> Spending:
    """The Ray backend in Slurm allocations: sacct's hours of the allocations; a trial is expected
    to cost the allocation hours per finished trial so far, a running one half of that still."""
    assert spec.study.budget is not None
    unit = "GPU-hours" if spec.resources.gpus_per_node else "CPU-hours"
    usage = executors.get(spec.resources.executor).cost(job_ids).values()  # the allocations' executor
    if not usage:  # no accounting here (or not yet): the trials' own estimates
        estimate = measure(spec, trials)
        assert estimate is not None  # the study has a budget
        return estimate
    spent = sum(u.gpu_hours if spec.resources.gpus_per_node else u.cpu_hours for u in usage)
    own = [t for t in trials if tally.is_own(t)]
    finished = sum(1 for t in own if t.state.is_finished())
    running = sum(1 for t in own if t.state.name == "RUNNING")
    per_trial = spent / finished if finished else time_limit_cost(spec)
    committed = 0.5 * running * per_trial
    return Spending(unit, spec.study.budget, spent, committed, per_trial, True, running, bool(finished))


class BudgetGate:
    """The budget as every caller of ``hpo.budget.admission`` measures it: measured again when a
    trial has ended since, or every ``REMEASURE_S`` while none ends (sacct is asked no more often,
    however many trials a launcher keeps in flight or workers ask)."""

    def __init__(
        self, spec: StudySpec, study: optuna.Study, ray_jobs: Sequence[str] = (), keep: bool = True
    ) -> None:
        self.spec = spec
        self.study = study
        self.ray_jobs = ray_jobs
        self.keep = keep
        """Store the figure on the study for the views when a trial has ended (a launcher does; its
        workers leave that to it)."""
        self.last: Spending | None = None
        self._measured_at = float("-inf")
        self._ended_seen = -1

    def submitted(self) -> None:
        """A trial was just submitted: the next question measures again (it is in flight now)."""
        self._measured_at = float("-inf")

    def spending(self, trials_ended: int) -> Spending | None:
        """The study's spending; None without a budget. ``trials_ended``: how many trials the
        caller has seen end (a change measures again)."""
        if self.spec.study.budget is None:
            return None
        now = time.monotonic()
        if trials_ended != self._ended_seen or now - self._measured_at >= REMEASURE_S:
            self.last = measure(self.spec, self.study.get_trials(deepcopy=False), self.ray_jobs)
            assert self.last is not None
            if self.keep and trials_ended != self._ended_seen:  # for the views, not on every re-measure
                study_record.store_spent_hours(self.study, self.last.spent)
            self._ended_seen, self._measured_at = trials_ended, now
        return self.last
