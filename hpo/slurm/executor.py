"""The Slurm executor: jobs submitted with sbatch through submitit, watched through sacct and
squeue (``hpo.slurm.jobs``), their cost from sacct. Registered like any executor plugin, under the
``hpo.executors`` entry-point group (pyproject.toml)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hpo.errors import LaunchError, NotReadyError
from hpo.executors import jobs
from hpo.executors.base import JobShape, Log, SiteRoom
from hpo.journal import shared_filesystem_warning
from hpo.slurm import accounting, preflight, site
from hpo.slurm import jobs as slurm_jobs
from hpo.slurm.settings import SlurmSettings
from hpo.storage import storage_file

if TYPE_CHECKING:
    from hpo.budget.usage import Usage
    from hpo.config import StudySpec

T = TypeVar("T")


class SlurmExecutor:
    name: ClassVar[str] = "slurm"
    measured_cost: ClassVar[bool] = True
    outlives_trial: ClassVar[bool] = True
    on_this_machine: ClassVar[bool] = False
    queue_name: ClassVar[str] = "Slurm"
    settings: ClassVar[type[Any] | None] = SlurmSettings
    former_keys: ClassVar[tuple[str, ...]] = ("partition", "account", "qos", "constraint", "sbatch")

    def __init__(self, log: Log | None = None) -> None:
        self._log = log

    @functools.cached_property
    def states(self) -> slurm_jobs.SlurmStates:
        """One sacct for all the launch's jobs every few seconds, one squeue for the queue; made
        on the launcher's first question (a job asking who it is needs none)."""
        return slurm_jobs.SlurmStates(log=self._log)

    def submitter(
        self,
        spec: StudySpec,
        *,
        job_name: str,
        array_parallelism: int | None = None,
        time_min: int | None = None,
        direct: bool = False,
    ) -> Any:
        return slurm_jobs.slurm_executor(spec, job_name, array_parallelism, time_min, direct)

    def submit_with_retries(
        self,
        submit: Callable[[], T],
        log: Log,
        pause: Callable[[float], None],
        still_wanted: Callable[[], None],
    ) -> T:
        return slurm_jobs.submit_when_controller_answers(submit, log, pause, still_wanted=still_wanted)

    def job(self, spec: StudySpec, job_id: str) -> Any:
        return slurm_jobs.slurm_job(spec, job_id)

    def ended(self, job_id: str, job: Any | None) -> bool:
        return job is not None and self.states.ended(job)

    def end_state(self, job: Any | None) -> str:
        return "UNKNOWN" if job is None else self.states.state(job)

    def killed_for_memory(self, job: Any | None) -> bool:
        return job is not None and self.states.state(job) == "OUT_OF_MEMORY"

    def still_queued(self, job_id: str, job: Any | None, max_age_s: float | None) -> bool:
        if max_age_s is None:
            return job is not None and not self.states.ended(job)
        # squeue cannot tell (None): the place is not held on a guess.
        return bool(self.states.queued(job_id, max_age_s))

    def cancel(self, spec: StudySpec, job_id: str) -> None:
        try:
            slurm_jobs.slurm_job(spec, job_id).cancel(check=False)
        except OSError as err:
            raise LaunchError(f"cannot cancel Slurm job {job_id}: {err}") from None

    def log(
        self, spec: StudySpec, job_id: str, task: int = 0, slot: int | None = None, stderr: bool = True
    ) -> Path:
        return jobs.job_log(spec, job_id, task, slot, stderr)

    def cost(self, job_ids: Iterable[str], since: datetime | None = None) -> dict[str, Usage]:
        return accounting.sacct_usage(job_ids, since=since)

    def queued_jobs(self, spec: StudySpec) -> list[str]:
        return slurm_jobs.queued_jobs(spec)

    def preflight(self, spec: StudySpec, shape: JobShape) -> None:
        if shutil.which("sbatch") is None:
            raise NotReadyError(
                f"{spec.source}: resources.executor: slurm, but there is no sbatch on this machine",
                "run on a Slurm login node, or use executor: local (--executor local)",
            )
        stored = storage_file(spec.study.storage)  # read by jobs on other nodes
        if stored is not None and (warning := shared_filesystem_warning(*stored)) is not None:
            spec.warnings.append(warning)
        preflight.check_partition_capacity(spec, shape)
        preflight.check_qos_wall(spec)

    def site_room(self, spec: StudySpec, wanted_jobs: int, job_array: bool) -> SiteRoom:
        return site.room(spec, wanted_jobs, job_array)

    def job_time_limit(self, spec: StudySpec, wanted_min: int, what: str, log: Log) -> int:
        return site.job_time_min(spec, wanted_min, what, log)

    def interrupted_line(self, numbers: str) -> str:
        return (f"launcher stopped; trials {numbers} keep running as Slurm jobs: `hpo launch` again "
                "re-attaches to them, `hpo cancel` stops them")  # fmt: skip

    def dry_run_lines(self, spec: StudySpec) -> list[str]:
        k = spec.resources.trials_per_gpu
        what = f"job of up to {k} trials at once" if spec.resources.packed else "trial job"
        return [
            f"# sbatch script of each {what} (submitted by submitit; folder {jobs.jobs_folder(spec)})",
            slurm_jobs.render_sbatch(spec, jobs.job_name(spec), direct=True).rstrip(),
        ]

    def identity(self) -> tuple[str, str]:
        job_id = self.current_job()
        assert job_id is not None, "identity() is asked in a Slurm job"
        return job_id, os.environ.get("SLURM_JOB_NODELIST", "")

    def node(self) -> str:
        return os.environ.get("SLURMD_NODENAME") or socket.gethostname()

    def current_job(self) -> str | None:
        array = os.environ.get("SLURM_ARRAY_JOB_ID")
        if array:
            return f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        return os.environ.get("SLURM_JOB_ID")

    def rank(self) -> int:
        return int(os.environ.get("SLURM_PROCID", "0"))  # the trainer reads srun's variables itself

    def restart_count(self) -> int:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)

    def leave_step(self) -> None:
        for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"):
            os.environ.pop(name, None)

    def allocation(self, spec: StudySpec, share: int) -> tuple[float, float]:
        nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or 1)
        gpus = int(os.environ.get("SLURM_GPUS_ON_NODE") or 0)
        cpus = int(os.environ.get("SLURM_CPUS_ON_NODE") or 0)
        return gpus * nodes / share, cpus * nodes / share

    def job_ending(self) -> bool:
        """Slurm's state of this job is no longer RUNNING; Slurm unreachable: True (the caller then
        waits for Slurm's signal as it would for an ending job)."""
        if "SLURM_JOB_ID" not in os.environ:
            return False
        try:
            shown = subprocess.run(
                ["scontrol", "show", "job", "--oneliner", os.environ["SLURM_JOB_ID"]],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired):
            return True
        state = re.search(r"\bJobState=(\S+)", shown.stdout)
        return state is None or state.group(1) != "RUNNING"
