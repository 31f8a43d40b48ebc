"""What the site's limits on a user's jobs (``hpo.slurm.limits``) leave a study, read once per
launch: how many of its jobs may be queued at once, and the longest time limit a job may ask for.
The Slurm executor answers with these; ``hpo.budget.admission`` decides what the launch does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpo.errors import NotReadyError
from hpo.executors import jobs
from hpo.executors.base import Log, SiteRoom
from hpo.slurm import limits, settings

if TYPE_CHECKING:
    from hpo.config import StudySpec


def room(spec: StudySpec, wanted_jobs: int, job_array: bool) -> SiteRoom:
    """The jobs the QoS and association limits leave this study (``wanted_jobs`` at most), and a
    job array's size limit for ``job_array`` (--workers); refused before submission where a
    refusing limit leaves it none."""
    own = {jobs.job_name(spec), jobs.job_name(spec, "worker")}  # the jobs a launch re-adopts
    allowed, why, at_limit = wanted_jobs, "", False
    slurm = settings.of(spec)
    for limit in limits.job_limits(slurm.qos, slurm.account):
        others = limits.users_other_jobs(limit, own) or 0
        left = limit.jobs - others
        besides = f" ({others} other jobs already count against it)" if others else ""
        if left < 1 and limit.refused:
            raise NotReadyError(
                f"{spec.source}: resources: {limit.name} is {limit.jobs} and {others} jobs already count "
                "against it: Slurm would refuse this study's first job",
                "wait for some of them to end, or choose another resources.slurm.qos",
            )
        if left <= allowed:
            at_limit = at_limit or limit.refused
        if left < allowed:
            allowed, why = max(left, 1), f"{limit.name} is {limit.jobs}{besides}"
    if job_array:
        size = limits.max_array_size()
        if size is not None and allowed > size:
            allowed, why = size, f"MaxArraySize is {size} (a job array's tasks are numbered from 0)"
    return SiteRoom(allowed, why, at_limit)


def job_time_min(spec: StudySpec, wanted_min: int, what: str, log: Log) -> int:
    """A job's computed time limit (a --workers job's, the Ray allocation's) within the longest the
    site lets a job ask for, said in one line where it lowers it: a longer one is refused or pends
    forever. Never below a trial's own time (pre-flight refuses a trial longer than the limit)."""
    slurm = settings.of(spec)
    longest = limits.longest_job_min(slurm.qos, slurm.partition, slurm.account)
    if longest is None or wanted_min <= longest[0]:
        return wanted_min
    minutes = max(int(longest[0]), spec.resources.time_min)
    if minutes < wanted_min:
        log(f"{what}: time limit {wanted_min} min lowered to {minutes} min: {longest[1]}")
    return minutes
