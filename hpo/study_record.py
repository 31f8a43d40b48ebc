"""The study's own record: what the service keeps on a study beside its trials (the
definition its values are read by, cancel requests, Ray allocations, the compute budget spent,
why it stopped, the trials a launch stopped on), and the only code that reads or writes it.

Trial attributes, and Optuna's private storage API, are ``hpo.record``'s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import optuna

STUDY_ATTR_DEFINITION = "hpo_definition"
"""What gives the study's values their meaning (hpo.search.definition): a relaunch is checked
against it."""
STUDY_ATTR_ENQUEUED = "hpo_enqueued"
"""Set once the study file's enqueued parameter sets were added: a relaunch adds them no second time."""
STUDY_ATTR_WARM_STARTED_FROM = "hpo_warm_started_from"
"""The studies a warm start imported trials from."""
STUDY_ATTR_CANCEL_REQUESTED_AT = "hpo_cancel_requested_at"
"""When `hpo cancel` last ran (unix time): launchers and workers started before it take no trial."""
STUDY_ATTR_CANCEL_SEEN_AT = "hpo_cancel_seen_at"
"""The cancel request a launcher has seen and obeys: it submits nothing more."""
STUDY_ATTR_CANCEL_ENDED_AT = "hpo_cancel_ended_at"
"""The cancel request whose `hpo cancel` has returned: until then no launch starts on the study."""
CANCEL_STALE_S = 900.0
"""A cancel request older than this no longer holds launches back (its `hpo cancel` was killed)."""
STUDY_ATTR_RAY_JOB = "hpo_ray_job"
"""The Slurm job id of a Ray-backed study's latest allocation."""
STUDY_ATTR_RAY_JOB_EXECUTOR = "hpo_ray_job_executor"
"""The executor that runs it (studies whose allocations predate the attribute: Slurm's)."""
STUDY_ATTR_RAY_JOBS = "hpo_ray_jobs"
"""Every Slurm allocation the Ray-backed study ran in (its compute budget counts their hours)."""
STUDY_ATTR_SPENT_HOURS = "hpo_spent_hours"
"""The study's compute budget spent, as the launcher last measured it (GPU- or CPU-hours)."""
STUDY_ATTR_STOPPED = "hpo_stopped"
"""Why the study stopped before its budget (a stop rule, or a launch whose first trials failed the
same way), with what that saved."""
STUDY_ATTR_SET_UP_FAILURES = "hpo_set_up_failures"
"""The trials a launch stopped on (``hpo.budget.failing``) and those it cut short: kept, but not
counted in the trial budget (the launch after the fix runs every trial of ``n_trials``)."""


def stored_definition(study: optuna.Study) -> dict[str, Any] | None:
    value = study.user_attrs.get(STUDY_ATTR_DEFINITION)
    return dict(value) if isinstance(value, dict) else None


def store_definition(study: optuna.Study, definition: dict[str, Any]) -> None:
    study.set_user_attr(STUDY_ATTR_DEFINITION, definition)


def request_cancel(study: optuna.Study, at_unix: float) -> None:
    study.set_user_attr(STUDY_ATTR_CANCEL_REQUESTED_AT, at_unix)


def acknowledge_cancel(study: optuna.Study, requested_at: float) -> None:
    study.set_user_attr(STUDY_ATTR_CANCEL_SEEN_AT, requested_at)


def end_cancel(study: optuna.Study, requested_at: float) -> None:
    study.set_user_attr(STUDY_ATTR_CANCEL_ENDED_AT, requested_at)


def cancel_under_way(study: optuna.Study) -> float:
    """The request time of an `hpo cancel` that has not returned yet; 0 if none. A launch then
    would run beside it: it is refused, and one already running obeys it whenever it began."""
    requested = cancel_requested_at(study)
    ended = float(study.user_attrs.get(STUDY_ATTR_CANCEL_ENDED_AT, 0.0))
    return requested if requested > ended and time.time() - requested < CANCEL_STALE_S else 0.0


def cancel_seen_at(study: optuna.Study) -> float:
    """The cancel request (unix time) that a launcher has confirmed it obeys; 0 if none."""
    return float(study.user_attrs.get(STUDY_ATTR_CANCEL_SEEN_AT, 0.0))


def set_ray_job(study: optuna.Study, job_id: str, executor: str) -> None:
    study.set_user_attr(STUDY_ATTR_RAY_JOB, job_id)
    study.set_user_attr(STUDY_ATTR_RAY_JOB_EXECUTOR, executor)
    jobs = ray_jobs(study)
    if job_id not in jobs:
        study.set_user_attr(STUDY_ATTR_RAY_JOBS, [*jobs, job_id])


def ray_jobs(study: optuna.Study) -> list[str]:
    """Every Ray allocation the study ran in (its compute budget counts their hours)."""
    jobs = [str(j) for j in study.user_attrs.get(STUDY_ATTR_RAY_JOBS, [])]
    latest = ray_job(study)  # a study whose launches predate the list has this one only
    return jobs if latest is None or latest in jobs else [*jobs, latest]


def ray_job(study: optuna.Study) -> str | None:
    job = study.user_attrs.get(STUDY_ATTR_RAY_JOB)
    return str(job) if job else None


def ray_job_executor(study: optuna.Study) -> str:
    """The executor of the study's latest Ray allocation."""
    return str(study.user_attrs.get(STUDY_ATTR_RAY_JOB_EXECUTOR) or "slurm")


def set_up_failures(study: optuna.Study) -> list[int]:
    return [int(n) for n in study.user_attrs.get(STUDY_ATTR_SET_UP_FAILURES, [])]


def store_set_up_failures(study: optuna.Study, numbers: Sequence[int]) -> None:
    known = set_up_failures(study)
    study.set_user_attr(STUDY_ATTR_SET_UP_FAILURES, [*known, *(n for n in numbers if n not in known)])


def stopped(study: optuna.Study) -> dict[str, Any] | None:
    """Why a stop rule ended the study (``reason``, ``at_trial``, ``saved``), or None."""
    value = study.user_attrs.get(STUDY_ATTR_STOPPED)
    return dict(value) if value else None


def store_stopped(study: optuna.Study, reason: str, at_trial: int, saved: str, kind: str = "rule") -> None:
    """``kind``: "rule" (a stop rule ended the study) or "failing" (``hpo.budget.failing`` ended a
    launch; the next launch clears it)."""
    study.set_user_attr(
        STUDY_ATTR_STOPPED,
        {
            "reason": reason,
            "at_trial": at_trial,
            "saved": saved,
            "at": datetime.now(timezone.utc).timestamp(),
            "kind": kind,
        },
    )


def clear_failing_stop(study: optuna.Study) -> None:
    """A new launch of a study an earlier one stopped as failing: that verdict no longer stands."""
    stop = stopped(study)
    if stop and stop.get("kind") == "failing":
        study.set_user_attr(STUDY_ATTR_STOPPED, None)


def spent_hours(study: optuna.Study) -> float | None:
    value = study.user_attrs.get(STUDY_ATTR_SPENT_HOURS)
    return None if value is None else float(value)


def store_spent_hours(study: optuna.Study, hours: float) -> None:
    study.set_user_attr(STUDY_ATTR_SPENT_HOURS, round(hours, 6))


def cancel_requested_at(study: optuna.Study) -> float:
    """When `hpo cancel` last ran on the study (unix time; 0 if never): launchers and workers
    started before it take no new trial."""
    return float(study.user_attrs.get(STUDY_ATTR_CANCEL_REQUESTED_AT, 0.0))


def enqueue_first_trials(study: optuna.Study, first: Sequence[dict[str, Any]]) -> int:
    """Enqueue ``first`` (the study file's enqueue, then its starting portfolio:
    ``hpo.portfolio.first_trials``) once per study: a relaunch must not enqueue them again."""
    if not first or study.user_attrs.get(STUDY_ATTR_ENQUEUED):
        return 0
    for params in first:
        study.enqueue_trial(params, skip_if_exists=True)
    study.set_user_attr(STUDY_ATTR_ENQUEUED, True)
    return len(first)
