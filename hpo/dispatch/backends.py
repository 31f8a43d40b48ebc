"""``hpo launch``: the study's remaining trials on its backend, then a summary. On the Optuna
backend, trials are kept in flight until the budget is met, as per-trial jobs or as ``--workers``;
on the Ray backend, Ray Tune runs them (``hpo.dispatch.ray.allocation``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import optuna

from hpo import executors, portfolio, study_record, tally, warm_start
from hpo.budget import admission
from hpo.dispatch import lease
from hpo.dispatch.common import (
    LaunchOptions,
    LaunchSummary,
    Log,
    open_study,
    queue_retries,
    refuse_during_cancel,
    rerun_set_up_failures,
    summarize,
)
from hpo.dispatch.per_trial import PerTrialDispatcher
from hpo.dispatch.progress import Progress
from hpo.dispatch.ray.allocation import run_on_ray
from hpo.dispatch.workers import WorkerDispatcher
from hpo.executors import jobs
from hpo.paths import private_dir
from hpo.storage import StorageRef, log_outages_to, mask

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from hpo.config import StudySpec

__all__ = ["LaunchOptions", "LaunchSummary", "launch", "summarize"]


def launch(spec: StudySpec, storage: StorageRef, options: LaunchOptions, log: Log = print) -> LaunchSummary:
    if spec.study.on_ray:
        started = time.time()
        study = run_on_ray(
            spec, storage, options.executor, log=log, allow_space_change=options.allow_space_change
        )
        return summarize(study, spec, since=started)
    private_dir(spec.workdir)  # logs, checkpoints, submitit's pickles: the owner's only
    study, backend, planned = open_study(spec, storage, allow_space_change=options.allow_space_change)
    with lease.held(storage, spec.study.name) as claim:
        refuse_during_cancel(spec, study)
        # Under the lease: no other launcher imports meanwhile (and apply skips what is there).
        warm_start.apply(spec, study, planned, log)
        return _launch_held(spec, storage, options, log, study, backend, claim)


def _launch_held(
    spec: StudySpec,
    storage: StorageRef,
    options: LaunchOptions,
    log: Log,
    study: optuna.Study,
    backend: BaseStorage,
    claim: lease.Lease,
) -> LaunchSummary:
    stored = len(tally.counted_trials(study))
    first = portfolio.first_trials(study, spec)
    enqueued = study_record.enqueue_first_trials(study, first)
    learned = len(first) - len(spec.study.enqueue)
    log(
        f"study {spec.study.name!r} in {mask(str(storage))}: {stored} of {spec.study.n_trials} trials stored"
        + (f", {enqueued} enqueued to run first" if enqueued else "")
        + (f" ({learned} from the learned starting portfolio)" if enqueued and learned else "")
    )
    if not stored and (said := portfolio.coverage_line(spec)):
        log(said)
    rerun_set_up_failures(study, log)
    # Failures told while no launcher watched (a trial failing after a launcher was stopped).
    queue_retries(study, spec, log)
    study_record.clear_failing_stop(study)  # an earlier launch's verdict: this one judges its own trials
    deadline = None if spec.study.timeout_min is None else time.time() + 60 * spec.study.timeout_min
    fitted = admission.fit_to_site(spec, executors.get(options.executor), options.workers, log)
    spec = fitted.spec
    progress = Progress(spec, study, deadline, log) if options.progress else None
    shown = progress.log if progress else log
    log_outages_to(backend, shown)  # outage lines go where the launcher's lines go
    dispatcher: PerTrialDispatcher | WorkerDispatcher
    try:
        if fitted.workers:
            dispatcher = WorkerDispatcher(spec, storage, study, options, shown, deadline, progress, claim)
            dispatcher.run(fitted.workers)
        else:
            dispatcher = PerTrialDispatcher(spec, storage, study, options, shown, deadline, progress, claim)
            # At the site's job limit one job more is refused: counted until gone, as asked for.
            dispatcher.hold_jobs_until_gone = (
                fitted.at_job_limit or spec.study.max_concurrent_counts == "jobs"
            )
            dispatcher.run()
    except KeyboardInterrupt:
        dispatcher.report_interrupted()
        raise
    finally:
        if progress:
            progress.close()
        jobs.remove_unnamed_folder(jobs.jobs_folder(spec))
    return summarize(study, spec, log, since=dispatcher.started)
