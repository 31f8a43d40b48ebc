"""A launch fitted inside the site's limits on a user's jobs (``hpo.slurm.limits``), read once
per launch: ``max_concurrent`` (per-trial jobs) or ``--workers`` above what a QoS or association
leaves this study is lowered to it with one line saying why; a study that no job of could be
submitted now is refused before submission."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from hpo.errors import NotReadyError
from hpo.executors import jobs
from hpo.slurm import limits

if TYPE_CHECKING:
    from hpo.config import StudySpec
    from hpo.dispatch.common import Log
    from hpo.executors import Executor


@dataclasses.dataclass(frozen=True)
class Fitted:
    spec: StudySpec
    workers: int | None
    at_job_limit: bool
    """The study fills what a refusing limit (MaxSubmitJobs) leaves it: a finished trial's job
    must leave the queue before the next is submitted."""


def fit(spec: StudySpec, executor: Executor, workers: int | None, log: Log) -> Fitted:
    if not executor.site_limited:
        return Fitted(spec, workers, False)
    per_job = spec.resources.trials_per_gpu  # trials (or workers) a job runs at once
    wanted_trials = workers or spec.study.max_concurrent
    what = f"--workers {workers}" if workers else f"study.max_concurrent {wanted_trials}"
    wanted = -(-wanted_trials // per_job)  # the jobs it takes
    own = {jobs.job_name(spec), jobs.job_name(spec, "worker")}  # the jobs a launch re-adopts
    allowed, why, at_limit = wanted, "", False
    for limit in limits.job_limits(spec.resources.qos, spec.resources.account):
        others = limits.users_other_jobs(limit, own) or 0
        room = limit.jobs - others
        besides = f" ({others} other jobs already count against it)" if others else ""
        if room < 1 and limit.refused:
            raise NotReadyError(
                f"{spec.source}: resources: {limit.name} is {limit.jobs} and {others} jobs already count "
                "against it: Slurm would refuse this study's first job",
                "wait for some of them to end, or choose another resources.qos",
            )
        if room <= allowed:
            at_limit = at_limit or limit.refused
        if room < allowed:
            allowed, why = max(room, 1), f"{limit.name} is {limit.jobs}{besides}"
    if workers:
        size = limits.max_array_size()
        if size is not None and allowed > size:
            allowed, why = size, f"MaxArraySize is {size} (a job array's tasks are numbered from 0)"
    if allowed == wanted:
        return Fitted(spec, workers, at_limit)
    packed = f" ({allowed} jobs of {per_job})" if per_job > 1 else ""
    allowed *= per_job
    log(f"{what} lowered to {allowed}{packed}: {why}")
    if workers:
        return Fitted(spec, allowed, at_limit)
    study = dataclasses.replace(spec.study, max_concurrent=allowed)
    return Fitted(dataclasses.replace(spec, study=study), workers, at_limit)


def job_time_min(spec: StudySpec, wanted_min: int, what: str, log: Log) -> int:
    """A job's computed time limit (a --workers job's, the Ray allocation's) within the longest the
    site lets a job ask for, said in one line where it lowers it: a longer one is refused or pends
    forever. Never below a trial's own time (pre-flight refuses a trial longer than the limit)."""
    res = spec.resources
    longest = limits.longest_job_min(res.qos, res.partition, res.account)
    if longest is None or wanted_min <= longest[0]:
        return wanted_min
    minutes = max(int(longest[0]), spec.resources.time_min)
    if minutes < wanted_min:
        log(f"{what}: time limit {wanted_min} min lowered to {minutes} min: {longest[1]}")
    return minutes
