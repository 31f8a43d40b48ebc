"""``hpo cancel``: the study stopped now (a later launch continues it), its launchers told, its jobs cancelled and its
running trials failed as cancelled (a writer: the views only read)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import optuna

from hpo import executors, record, study_record
from hpo.dispatch.lease import Lease
from hpo.executors import jobs

if TYPE_CHECKING:
    from hpo.config import StudySpec
    from hpo.storage import StorageRef

CANCEL_WAIT_S = 300.0
"""How long `hpo cancel` waits for a live launcher to confirm it submits nothing more, and then
for Slurm to show the study's jobs gone."""


def cancel(spec: StudySpec, ref: StorageRef, study: optuna.Study) -> list[str]:
    """Stop the study now: once this returns, no launcher or worker submits or starts
    another trial, no job of the study is left in Slurm's queue, and nothing stays RUNNING.

    The order matters: the flag first (launchers and workers read it before every submission or
    trial); then the live launcher's confirmation, so that a submission under way when the flag
    was set has stored its job id or been closed; then every job, those the trials hold and those
    found in the queue by the study's job names (a job submitted but not yet recorded)."""

    # The launcher that holds the study is read before the flag is stored and again after: one
    # killed in between (or while the cancel waits) is named as gone, not left unsaid, and one that
    # took the study in between (it saw no flag yet) is waited for like any other.
    before = Lease(ref, spec.study.name).held_by_another()
    requested = time.time()
    study_record.request_cancel(study, requested)
    try:
        holder = Lease(ref, spec.study.name).held_by_another() or before
        return _cancel_requested(spec, ref, study, requested, holder)
    finally:  # a launch is refused until now (and for CANCEL_STALE_S if this process is killed)
        study_record.end_cancel(study, requested)


def _cancel_requested(
    spec: StudySpec, ref: StorageRef, study: optuna.Study, requested: float, holder: str | None
) -> list[str]:
    lines = []
    ray_job = study_record.ray_job(study)
    if ray_job:  # the one allocation of a Ray-backed study holds all its trials and its driver
        executors.get(study_record.ray_job_executor(study)).cancel(spec, str(ray_job))
        lines.append(f"Ray job {ray_job}: cancelled")
    if holder is not None:
        deadline = time.monotonic() + CANCEL_WAIT_S
        while (
            study_record.cancel_seen_at(study) < requested and Lease(ref, spec.study.name).held_by_another()
        ):
            if time.monotonic() > deadline:
                lines.append(f"the launcher ({holder}) did not confirm within {CANCEL_WAIT_S:.0f} s; "
                             "cancelling what is stored and queued")  # fmt: skip
                break
            time.sleep(0.5)
        else:
            confirmed = study_record.cancel_seen_at(study) >= requested
            lines.append(f"launcher ({holder}): " + ("submits no more trials" if confirmed else "gone"))
    # The trials first, then their jobs: a trial process stopped by the cancel would otherwise tell
    # its own end first (a KeyboardInterrupt), and the cancel would neither name it nor own it.
    held: dict[str, executors.Executor] = {}
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        mode, name = record.dispatch_mode(trial), record.executor_name(trial)
        job_id = trial.user_attrs.get(record.ATTR_JOB_ID)
        in_ray = mode == record.DispatchMode.RAY  # its allocation: cancelled above
        # Raises if the trial ended on its own meanwhile: then its state stands.
        with record.unless_told_meanwhile():
            record.fail(study, trial, record.REASON_CANCELLED)
            shown = record.DispatchMode.RAY.value if in_ray else name or (mode and mode.value)
            lines.append(f"trial {trial.number}: cancelled {shown} job {job_id or '-'}")
        if job_id is not None and not in_ray:  # a packed job: once
            # A trial that did not record its executor (an old worker's): the study's own.
            held[str(job_id)] = executors.get(name if name in executors.names() else spec.resources.executor)
    for job_id, executor in held.items():
        executor.cancel(spec, job_id)
    lines += _cancel_queued(spec, set(held))
    return lines or ["no running trial; launchers and workers of this study take no new trial"]


def _cancel_queued(spec: StudySpec, cancelled: set[str]) -> list[str]:
    """Cancel the study's jobs still in an executor's queue (workers, a pending detached launcher,
    a job no trial holds yet), found by their names, and wait until the queue shows none."""
    lines = []
    names = ", ".join(jobs.job_name(spec, role) for role in jobs.JOB_ROLES)
    for executor, queued in executors.queued(spec):
        for job_id in queued:
            if job_id not in cancelled:
                executor.cancel(spec, job_id)
                lines.append(
                    f"{executor.queue_name} job {job_id}: cancelled (found by its name, one of {names})"
                )
        deadline = time.monotonic() + CANCEL_WAIT_S
        while queued:
            if time.monotonic() > deadline:
                lines.append(
                    f"still in {executor.queue_name}'s queue after {CANCEL_WAIT_S:.0f} s: {', '.join(queued)}"
                )
                break
            time.sleep(0.5)
            queued = executor.queued_jobs(spec)
    return lines
