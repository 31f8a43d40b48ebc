"""Failed trials queued to run again: retries of the failures a rerun may change
(``queue_retries``), and, once the study file is fixed, the enqueued configurations a set-up
mistake failed (``rerun_set_up_failures``). Each is a WAITING trial with the failed one's
parameters, so that a launch in any mode runs it first."""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from hpo import failures, record, study_record, tally


def queue_retries(study: optuna.Study, max_retries: int) -> list[int]:
    """Queue a retry of every FAIL trial that has none yet and has retries left; returns the
    numbers of the trials retried."""

    trials = study.get_trials(deepcopy=False)
    _close_hopeless_retries(study, trials)
    already = tally.retried_numbers(trials)
    cancelled_at = study_record.cancel_requested_at(study)
    retried = []
    for trial in trials:
        if trial.state != optuna.trial.TrialState.FAIL or trial.number in already:
            continue
        ended = trial.datetime_complete
        if cancelled_at and (ended is None or ended.timestamp() >= cancelled_at):
            # Failed once hpo cancel had begun: its job was most likely the cancel's scancel, seen
            # by the launcher before the cancel wrote its reason. A cancel is final.
            continue
        if (
            trial.user_attrs.get(record.ATTR_SURPLUS)
            or trial.user_attrs.get(record.ATTR_NOT_RUN)
            or not trial.params
        ):
            continue  # closed unrun, or failed before it had parameters: nothing to repeat
        reason = str(trial.user_attrs.get(record.ATTR_FAIL_REASON, ""))
        if reason.startswith(record.NOT_RETRIED_PREFIXES) or failures.classify(reason).permanent:
            continue  # no rerun can change it (hpo.failures)
        history = [*record.retry_history(trial), trial.number]
        if len(history) > max_retries:
            continue
        study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState.WAITING,
                params=dict(trial.params),
                distributions=dict(trial.distributions),
                user_attrs={
                    record.ATTR_RETRY_OF: trial.number,
                    # A multi-objective trial's curve, as intermediate values are for the others.
                    **(
                        {record.ATTR_EPOCH_VALUES: trial.user_attrs[record.ATTR_EPOCH_VALUES]}
                        if record.ATTR_EPOCH_VALUES in trial.user_attrs
                        else {}
                    ),
                },
                system_attrs={
                    record.SYSTEM_ATTR_FAILED_TRIAL: history[0],
                    record.SYSTEM_ATTR_RETRY_HISTORY: history,
                },
                intermediate_values=dict(trial.intermediate_values),
            )
        )
        retried.append(trial.number)
    return retried


def rerun_set_up_failures(study: optuna.Study) -> list[int]:
    """Enqueue again, once, each enqueued configuration (the study file's ``enqueue``, the starting
    portfolio's) whose trial a set-up mistake failed or cut short (``hpo.budget.failing``): they
    run first, so fail fast lands on them, and the launch after the fix must not skip them. Returns
    the numbers of the trials whose configurations run again."""
    set_up = set(study_record.set_up_failures(study))
    if not set_up:
        return []
    trials = study.get_trials(deepcopy=False)
    done = {t.user_attrs.get(record.ATTR_RERUN_OF) for t in trials}
    again = []
    for trial in trials:
        fixed = trial.system_attrs.get("fixed_params")  # Optuna's mark of an enqueued trial
        if trial.number in set_up and fixed and trial.number not in done:
            study.enqueue_trial(dict(fixed), user_attrs={record.ATTR_RERUN_OF: trial.number})
            again.append(trial.number)
    return again


def _close_hopeless_retries(study: optuna.Study, trials: Sequence[optuna.trial.FrozenTrial]) -> None:
    """Close the queued retries of failures that no rerun changes (a retry queued before its
    failure was known as such, by an earlier launch): a relaunch does not run them first."""
    reasons = {t.number: str(t.user_attrs.get(record.ATTR_FAIL_REASON, "")) for t in trials}
    for trial in trials:
        history = record.retry_history(trial)
        if trial.state != optuna.trial.TrialState.WAITING or not history:
            continue
        reason = reasons.get(history[-1], "")
        if reason and failures.classify(reason).permanent:
            record.close_waiting_not_run(
                study, trial, f"not run: retry of trial {history[-1]}, which no rerun changes"
            )
