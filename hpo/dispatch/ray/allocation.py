"""``hpo launch --backend ray``: the study's Ray allocation, one Slurm job holding a Ray cluster,
submitted and followed to its end (or, with the local executor, a Ray instance in this process)."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

from submitit.core.utils import pickle_load

from hpo import executors, record, search, study_record, tally
from hpo.budget import admission
from hpo.dispatch import lease
from hpo.dispatch.common import open_study, refuse_during_cancel, refuse_live_jobs_of_other_modes
from hpo.dispatch.ray import driver
from hpo.dispatch.ray.cluster import RayClusterTask, cpus_per_trial, gpus_per_node, slots_per_node
from hpo.errors import LaunchError, one_line
from hpo.executors import jobs
from hpo.paths import private_dir
from hpo.storage import StorageRef, check_reachable, mask
from hpo.trial.objective import Objective

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudySpec


def run_on_ray(
    spec: StudySpec,
    storage: StorageRef,
    executor: str,
    objective: Objective | None = None,
    log: Any = print,
    allow_space_change: bool = False,
) -> optuna.Study:
    """Run the study's remaining trials with Ray Tune; returns the study once the run has ended."""
    private_dir(spec.workdir)  # logs, checkpoints, the cluster's token: the owner's only
    if executors.get(executor).on_this_machine:  # Ray started here, in this process
        with lease.held(storage, spec.study.name):
            driver.run(spec, storage, objective=objective, log=log, allow_space_change=allow_space_change)
        return search.load(spec, check_reachable(storage, spec.source), create=False)
    study, _, _ = open_study(spec, storage, reseed=False, allow_space_change=allow_space_change)
    with lease.held(storage, spec.study.name):
        refuse_during_cancel(spec, study)
        refuse_live_jobs_of_other_modes(spec, study, record.DispatchMode.RAY)
        return _launch_in_allocation(spec, storage, study, objective, executor, log)


def _launch_in_allocation(
    spec: StudySpec,
    storage: StorageRef,
    study: optuna.Study,
    objective: Objective | None,
    executor: str,
    log: Any,
) -> optuna.Study:
    job_id = study_record.ray_job(study)
    probe = executors.get(study_record.ray_job_executor(study) if job_id else executor, log)
    job = probe.job(spec, str(job_id)) if job_id else None
    if job is not None and not probe.ended(str(job_id), job):
        log(f"the study's Ray job {job_id} is still running: following it")
    else:
        remaining = admission.trials_left(spec, study)
        if remaining == 0 or _closed_before_submission(spec, study, log):
            return study
        probe = executors.get(executor, log)
        job = _submit(spec, storage, objective, remaining, probe, log)
        study_record.set_ray_job(study, str(job.job_id), probe.name)
    _follow(spec, study, job, probe, log)
    return study


def _closed_before_submission(spec: StudySpec, study: optuna.Study, log: Any) -> bool:
    """Whether the launch's admission (``hpo.budget.admission``: the timeout, fail fast, the stop
    rules, the compute budget) already ends the study, as the allocation's driver would find at its
    first ask: then no allocation is queued for it to find that. The gate says why, and stores a
    verdict as a launcher does."""
    started = time.time()
    deadline = None if spec.study.timeout_min is None else started + 60 * spec.study.timeout_min
    gate = admission.Gate(
        spec, study, started=started, deadline=deadline, log=log, ray_jobs=study_record.ray_jobs(study)
    )
    if not gate.ask([], 0).final:
        return False
    log("no Ray job submitted")
    return True


def allocation_spec(spec: StudySpec, remaining: int) -> tuple[StudySpec, int]:
    """The Ray allocation as a study whose one task per node holds that node's share of the
    concurrent trials, and its time limit in minutes: enough for ``remaining`` trials in waves of
    ``max_concurrent`` (or ``resources.worker_time``), at most a day."""
    slots = slots_per_node(spec)
    node_resources = dataclasses.replace(
        spec.resources,
        tasks_per_node=1,
        cpus_per_task=cpus_per_trial(spec) * slots,
        gpus_per_node=gpus_per_node(spec),
        trials_per_gpu=1,  # the allocation is one job of Ray's; Ray packs the trials
    )
    waves = math.ceil(remaining / spec.study.max_concurrent)
    time_min = spec.resources.worker_time_min or min(24 * 60, spec.resources.time_min * waves + 10)
    return dataclasses.replace(spec, resources=node_resources), time_min


def _submit(
    spec: StudySpec,
    storage: StorageRef,
    objective: Objective | None,
    remaining: int,
    slurm: executors.Executor,
    log: Any,
) -> Any:
    allocation, time_min = allocation_spec(spec, remaining)
    time_min = slurm.job_time_limit(spec, time_min, "the Ray job", log)
    executor = slurm.submitter(allocation, job_name=jobs.job_name(spec, "ray"), time_min=time_min)
    try:
        task = RayClusterTask(spec, storage, objective)
        job = slurm.submit_with_retries(lambda: executor.submit(task), log, time.sleep, lambda: None)
    except Exception as err:
        raise LaunchError(f"Ray job submission failed: {one_line(err, last=True, name=False)}") from None
    log(f"Ray job {job.job_id} submitted: {spec.resources.nodes} nodes, {slots_per_node(spec)} trials per node, "
        f"{time_min} min; storage {mask(str(storage))}")  # fmt: skip
    return job


def _follow(spec: StudySpec, study: optuna.Study, job: Any, probe: executors.Executor, log: Any) -> None:
    """Print the trials as they end until the Ray job has ended; fail loudly if it failed."""
    seen = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
    while True:
        ended = probe.ended(str(job.job_id), job)
        for trial in study.get_trials(deepcopy=False):
            if trial.state.is_finished() and trial.number not in seen:
                seen.add(trial.number)
                value = tally.metric_value(trial)
                shown = tally.format_value(value)
                log(f"trial {trial.number} {trial.state.name}: {spec.study.metric}={shown} "
                    f"after {len(trial.intermediate_values)} epochs")  # fmt: skip
        if ended:
            break
        time.sleep(1.0)
    if job.paths.result_pickle.exists():
        outcome, value = pickle_load(job.paths.result_pickle)
        if outcome == "success":
            return
        raise LaunchError(
            f"Ray job {job.job_id} failed: {one_line(value, last=True, name=False) if str(value).strip() else outcome}"
        )
    detail = jobs.error_line(spec, str(job.job_id), spec.resources.nodes)
    raise LaunchError(
        f"Ray job {job.job_id} ended {probe.end_state(job)}" + (f": {detail}" if detail else "")
    )
