"""Fail fast: end a launch whose first trials all fail the same way, before the budget is spent on a
mistake in the set-up (a flag the script does not know, a metric pattern that never matches, a
module missing on the nodes). On a cluster each of those trials is a job that waited in the queue.

The rule reads the trials a launch saw end, in order. Once one of them succeeded (complete or
pruned), failures are the trials' own and the study goes on as before. Until then, the launch
stops when one failure (``hpo.failures``: the reason with its numbers blanked) has ended trials of
``PERMANENT_REPEATS`` different parameter sets if no rerun can change it, or of ``OTHER_REPEATS``
if it might be transient (a retry repeats its trial's parameters: it does not count twice).
Trials a cluster fault ended (a node lost, a preemption) never count.

A stopped launch exits non-zero with the failure and what to change. The trials it stopped on are
kept (FAIL, with their reasons) but leave the trial budget whole: the launch after the fix has
every trial of ``n_trials`` to run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import optuna

from hpo import failures, record, study_record

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


def check(ended: Sequence[optuna.trial.FrozenTrial]) -> Verdict | None:
    """The verdict on the trials a launch saw end (in order), or None to go on."""
    groups: dict[str, list[optuna.trial.FrozenTrial]] = {}
    for trial in ended:
        if trial.state == optuna.trial.TrialState.PRUNED:
            return None
        if trial.state == optuna.trial.TrialState.COMPLETE:
            if trial.user_attrs.get(record.ATTR_INFEASIBLE):
                continue  # out of memory: the parameters' fault, neither a success nor a set-up error
            return None
        reason = str(trial.user_attrs.get(record.ATTR_FAIL_REASON, ""))
        if trial.state != optuna.trial.TrialState.FAIL or not record.ran_and_failed(trial):
            continue
        failure = failures.classify(reason)
        if failure.kind == failures.CLUSTER:
            continue
        same = groups.setdefault(failure.signature, [])
        same.append(trial)
        parameter_sets = {tuple(sorted((k, repr(v)) for k, v in t.params.items())) for t in same}
        needed = PERMANENT_REPEATS if failure.permanent else OTHER_REPEATS
        if len(parameter_sets) >= needed:
            return Verdict(failure, [t.number for t in same], reason)
    return None


def suspect(ended: Sequence[optuna.trial.FrozenTrial]) -> bool:
    """No trial of the launch has succeeded yet and one failed in a way no rerun changes: the
    next trial of another parameter set decides. The launcher then waits for the trials in flight
    before it submits more, so that a set-up error costs 2 trials, not 2 plus those submitted
    meanwhile."""
    if any(
        t.state == optuna.trial.TrialState.PRUNED
        or (t.state == optuna.trial.TrialState.COMPLETE and not t.user_attrs.get(record.ATTR_INFEASIBLE))
        for t in ended
    ):
        return False
    return any(
        record.ran_and_failed(t)
        and failures.classify(str(t.user_attrs.get(record.ATTR_FAIL_REASON, ""))).permanent
        for t in ended
    )


def end(study: optuna.Study, spec: StudySpec, verdict: Verdict, cut_short: Sequence[int] = ()) -> str:
    """Store the verdict on the study (``hpo status`` shows it; ``--workers`` jobs stop on it) and
    take its trials, and those the launch cut short, out of the trial budget; returns its line."""
    line = verdict.line(spec)
    study_record.store_set_up_failures(study, [*verdict.trials, *cut_short])
    study_record.store_stopped(study, line, verdict.trials[-1], "the rest of the budget", kind="failing")
    return line
