"""The FIFO queue as an executor of slurm-hpo: the whole ``hpo.executors.base.Executor`` protocol,
registered under the ``hpo.executors`` entry-point group as ``fifo``."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hpo.budget.usage import Usage
from hpo.executors import jobs
from hpo.executors.base import JobShape, Log, SiteRoom
from hpo.executors.this_machine import check_runs_here
from hpo.paths import private_dir
from hpo_fifo import queue
from hpo_fifo.submitit_plugin import FifoJob, FifoSubmitit

if TYPE_CHECKING:
    from hpo.config import StudySpec

T = TypeVar("T")


class FifoExecutor:
    name: ClassVar[str] = "fifo"
    measured_cost: ClassVar[bool] = True
    outlives_trial: ClassVar[bool] = True
    on_this_machine: ClassVar[bool] = True
    queue_name: ClassVar[str] = "FIFO"
    settings: ClassVar[type[Any] | None] = None  # the queue takes no options of its own
    former_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, log: Log | None = None) -> None:
        self._log = log

    # --- the launcher's side ----------------------------------------------------------------
    def submitter(
        self,
        spec: StudySpec,
        *,
        job_name: str,
        array_parallelism: int | None = None,
        time_min: int | None = None,
        direct: bool = False,
    ) -> Any:
        res = spec.resources
        folder = private_dir(jobs.jobs_folder(spec))  # submitit's pickles are code
        submitter = FifoSubmitit(folder / "%j", python=res.python or sys.executable)
        submitter.update_parameters(
            job_name=job_name,
            cpus=res.job_cpus_per_task,
            timeout_min=time_min or res.time_min,
            setup=list(res.setup),
        )
        return submitter

    def submit_with_retries(
        self,
        submit: Callable[[], T],
        log: Log,
        pause: Callable[[float], None],
        still_wanted: Callable[[], None],
    ) -> T:
        return submit()  # the queue takes every job at once

    def job(self, spec: StudySpec, job_id: str) -> Any:
        return FifoJob(folder=jobs.jobs_folder(spec) / "%j", job_id=job_id)

    def ended(self, job_id: str, job: Any | None) -> bool:
        record = queue.job(job_id)
        return record is None or record["state"] not in queue.ACTIVE

    def end_state(self, job: Any | None) -> str:
        record = None if job is None else queue.job(str(job.job_id))
        return "UNKNOWN" if record is None else str(record["state"])

    def killed_for_memory(self, job: Any | None) -> bool:
        return False  # the queue sets no memory limit

    def still_queued(self, job_id: str, job: Any | None, max_age_s: float | None) -> bool:
        return not self.ended(job_id, job)

    def cancel(self, spec: StudySpec, job_id: str) -> None:
        queue.cancel(job_id)

    def log(
        self, spec: StudySpec, job_id: str, task: int = 0, slot: int | None = None, stderr: bool = True
    ) -> Path:
        return jobs.job_log(spec, job_id, task, slot, stderr)

    def cost(self, job_ids: Iterable[str], since: datetime | None = None) -> dict[str, Usage]:
        """The queue's own record: from the job's start to its end (or now), times its CPUs."""
        found = {}
        for job_id in set(job_ids):
            record = queue.job(job_id)
            if record is None or record["started"] is None:
                continue
            end = record["ended"] or datetime.now().timestamp()
            found[job_id] = Usage(end - record["started"], 0.0, float(record["cpus"]), measured=True)
        return found

    def queued_jobs(self, spec: StudySpec) -> list[str]:
        names = {jobs.job_name(spec, role) for role in jobs.JOB_ROLES}
        return [r["id"] for r in queue.jobs() if r["state"] in queue.ACTIVE and r["name"] in names]

    def preflight(self, spec: StudySpec, shape: JobShape) -> None:
        queue.spool()  # made here if it is not yet: a spool that cannot be made raises
        check_runs_here(spec)  # its jobs run on this machine: the service's checks for that

    def site_room(self, spec: StudySpec, wanted_jobs: int, job_array: bool) -> SiteRoom:
        return SiteRoom(wanted_jobs, "", False)  # the queue limits how many run, not how many wait

    def job_time_limit(self, spec: StudySpec, wanted_min: int, what: str, log: Log) -> int:
        return wanted_min

    def interrupted_line(self, numbers: str) -> str:
        return (f"launcher stopped; trials {numbers} keep running in the FIFO queue: `hpo launch` again "
                "re-attaches to them, `hpo cancel` stops them")  # fmt: skip

    def dry_run_lines(self, spec: StudySpec) -> list[str]:
        return [f"# each trial a job of the FIFO queue (spool {queue.spool()}), first in, first out"]

    # --- the job's side ---------------------------------------------------------------------
    def identity(self) -> tuple[str, str]:
        return os.environ[queue.JOB_ID_ENV], socket.gethostname()

    def node(self) -> str:
        return socket.gethostname()

    def current_job(self) -> str | None:
        return os.environ.get(queue.JOB_ID_ENV)

    def rank(self) -> int:
        return 0  # one process per job

    def restart_count(self) -> int:
        return 0  # the queue never requeues a job

    def leave_step(self) -> None:
        return None  # a job is one process: no step to leave

    def allocation(self, spec: StudySpec, share: int) -> tuple[float, float]:
        return 0.0, spec.resources.job_cpus_per_task / share

    def job_ending(self) -> bool:
        record = queue.job(os.environ.get(queue.JOB_ID_ENV, ""))
        return record is not None and bool(record["cancel"])
