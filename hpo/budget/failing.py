"""Fail fast: end a launch whose first trials all fail the same way, before the budget is spent on a
mistake in the set-up (a flag the script does not know, a metric pattern that never matches, a
module missing on the nodes). On a cluster each of those trials is a job that waited in the queue.

The rule reads the trials a launch saw end, in order. Once one of them succeeded (complete or
pruned), or any trial of the study ever did, failures are the trials' own and the study goes on.
Until then, the launch stops when one failure (``hpo.failures``: the reason with its numbers
blanked) has ended trials of ``PERMANENT_REPEATS`` different parameter sets if no rerun can change
it, or of ``OTHER_REPEATS`` if it might be transient (a retry repeats its trial's parameters: it
does not count twice). A failure that may come from some parameters only (no metric line, a
crash, a SIGKILL, running out of memory) counts only while its trials spread over the space
(``confined``): a memory limit too small for any configuration stops the study, one too small for
the largest batch does not. Never counted: trials a cluster fault ended (a node lost, a
preemption), trials that diverged, and trials that failed after they reported (the set-up worked
for them).

A stopped launch exits non-zero with the failure and what to change. The trials it stopped on are
kept (FAIL, with their reasons) but leave the trial budget whole: the launch after the fix has
every trial of ``n_trials`` to run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import optuna

from hpo import failures, record, study_record, tally

if TYPE_CHECKING:
    from hpo.config import StudySpec

PERMANENT_REPEATS = 2
OTHER_REPEATS = 3


@dataclasses.dataclass(frozen=True)
class Verdict:
    failure: failures.Failure
    trials: list[int]
    """The failed trials of that failure, in the order they ended."""
    reason: str
    """The last one's fail reason, as stored."""

    def line(self, spec: StudySpec) -> str:
        """One line: the trials, the failure and what to change."""
        # Ascending, as users read trial lists; which ended first is the scheduler's accident.
        ordered = sorted(self.trials)
        numbers = ", ".join(str(n) for n in ordered[:-1]) + f" and {ordered[-1]}"
        hint = failures.hint(self.failure.kind, str(spec.source), self.trials[-1])
        return (
            f"trials {numbers} failed the same way and none succeeded: {self.reason} "
            f"(hint: {hint}; then hpo launch again: these trials leave the budget whole)"
        )


def check(ended: Sequence[optuna.trial.FrozenTrial], study: optuna.Study | None = None) -> Verdict | None:
    """The verdict on the trials a launch saw end (in order), or None to go on. With ``study``,
    a study that has ever had a success (an earlier launch's included) is never stopped."""
    if study is not None and any(_succeeded(t) for t in tally.own_trials(study)):
        return None
    groups: dict[str, list[optuna.trial.FrozenTrial]] = {}
    for trial in ended:
        if _succeeded(trial):
            return None
        failure = _failure(trial)
        if failure is None or not failure.may_be_set_up:
            continue
        reason = str(trial.user_attrs.get(record.ATTR_FAIL_REASON, ""))
        same = groups.setdefault(failure.signature, [])
        same.append(trial)
        parameter_sets = {tuple(sorted((k, repr(v)) for k, v in t.params.items())) for t in same}
        needed = PERMANENT_REPEATS if _decided_by_two(failure) else OTHER_REPEATS
        if len(parameter_sets) < needed:
            continue
        if failure.may_depend_on_parameters and confined(same):
            continue  # e.g. all above some learning rate: the parameters' doing, as far as can be told
        return Verdict(failure, [t.number for t in same], reason)
    return None


def _decided_by_two(failure: failures.Failure) -> bool:
    """Two parameter sets failing so decide: no rerun changes it, or the program was killed or ran
    out of memory (a rerun may not fail, but a study whose every trial does must not wait for a
    third: ``confined`` keeps the failures that the parameters explain)."""
    return failure.permanent or failure.kind in (failures.KILLED, failures.OUT_OF_MEMORY)


def _failure(trial: optuna.trial.FrozenTrial) -> failures.Failure | None:
    """How the trial failed, where the set-up may be the cause; None where it is not (diverged,
    cancelled, closed unrun, or it reported before it failed: the set-up worked for it)."""
    if tally.curve(trial):
        return None
    if trial.state == optuna.trial.TrialState.COMPLETE and trial.user_attrs.get(record.ATTR_INFEASIBLE):
        return failures.Failure(failures.OUT_OF_MEMORY, "out of memory")
    if trial.state != optuna.trial.TrialState.FAIL or not tally.ran_and_failed(trial):
        return None
    return failures.classify(str(trial.user_attrs.get(record.ATTR_FAIL_REASON, "")))


CONFINED_SHARE = 1 / 3
"""A dimension confines failures whose values all lie in its lowest or its highest third (on the
log scale where the space is): three trials of a set-up mistake land so in one dimension with
probability 2/27, failures that only some parameters cause (an lr above some value) always."""


def confined(trials: Sequence[optuna.trial.FrozenTrial]) -> bool:
    """The failed trials' parameters all lie at one end of some dimension of the space: a numeric
    range, a categorical of numbers by rank (a crash only batch sizes 256 and 512 cause), or hold
    the one value of a categorical of words. Only values the sampler drew are evidence: where an
    enqueued configuration (the user's, the portfolio's, a retry's) fixed them, their place was
    chosen, and the learned portfolio's entries share high weight decays."""
    for name, distribution in trials[-1].distributions.items():
        if any(name not in t.params for t in trials):
            continue
        drawn = [t for t in trials if name not in (t.system_attrs.get("fixed_params") or {})]
        if len(drawn) < 2:
            continue  # no two drawn values: nothing said about this dimension
        if isinstance(distribution, optuna.distributions.CategoricalDistribution):
            choices = distribution.choices
            if len(choices) < 2:
                continue
            if not all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices):
                if len({repr(t.params[name]) for t in drawn}) == 1:
                    return True  # one value of a categorical of words
                continue
            # Numbers (batch sizes): by rank in value order, as a numeric range.
            ranks = sorted(float(c) for c in choices if isinstance(c, int | float))
            positions = [ranks.index(float(t.params[name])) / (len(ranks) - 1) for t in drawn]
        elif isinstance(
            distribution, optuna.distributions.FloatDistribution | optuna.distributions.IntDistribution
        ):
            if distribution.high <= distribution.low:
                continue
            positions = [_position(float(t.params[name]), distribution) for t in drawn]
        else:
            continue
        if max(positions) < CONFINED_SHARE or min(positions) > 1 - CONFINED_SHARE:
            return True
    return False


def _position(
    value: float, distribution: optuna.distributions.FloatDistribution | optuna.distributions.IntDistribution
) -> float:
    """Where ``value`` lies in the distribution's range, 0 to 1 (log-scaled for a log range)."""
    low, high = float(distribution.low), float(distribution.high)
    if distribution.log:
        value, low, high = math.log(value), math.log(low), math.log(high)
    return (value - low) / (high - low)


def _succeeded(trial: optuna.trial.FrozenTrial) -> bool:
    """Completed with a feasible value, or pruned (not diverged): the set-up works."""
    if trial.state == optuna.trial.TrialState.PRUNED:
        return not record.is_diverged(trial)
    return trial.state == optuna.trial.TrialState.COMPLETE and not trial.user_attrs.get(
        record.ATTR_INFEASIBLE
    )


def suspect(ended: Sequence[optuna.trial.FrozenTrial]) -> bool:
    """No trial of the launch has succeeded yet and one failed in a way no rerun changes: the
    next trial of another parameter set decides. The launcher then waits for the trials in flight
    before it submits more, so that a set-up error costs 2 trials, not 2 plus those submitted
    meanwhile."""
    if any(_succeeded(t) for t in ended):
        return False
    for trial in ended:
        failure = _failure(trial)
        if failure is not None and _decided_by_two(failure) and failure.may_be_set_up:
            return True
    return False


def end(study: optuna.Study, spec: StudySpec, verdict: Verdict, cut_short: Sequence[int] = ()) -> str:
    """Store the verdict on the study (``hpo status`` shows it; ``--workers`` jobs stop on it) and
    take its trials, and those the launch cut short, out of the trial budget; returns its line."""
    line = verdict.line(spec)
    stopped = [*verdict.trials, *cut_short]
    study_record.store_set_up_failures(study, stopped)
    # Their retries queued before the verdict (a kill may be a neighbour's: retried) run no more.
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
        history = record.retry_history(trial)
        if history and history[-1] in stopped:
            record.close_waiting_not_run(
                study, trial, f"not run: retry of trial {history[-1]}, which the launch stopped on"
            )
    study_record.store_stopped(study, line, verdict.trials[-1], "the rest of the budget", kind="failing")
    return line
