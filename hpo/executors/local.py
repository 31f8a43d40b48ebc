"""The local executor: each job a process on this machine, started by submitit's LocalExecutor,
watched by its pid after a relaunch (no Popen handle then), stopped with SIGINT."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import submitit

from hpo.executors import jobs
from hpo.executors.base import JobShape, Log, SiteRoom
from hpo.executors.this_machine import check_runs_here
from hpo.paths import private_dir

if TYPE_CHECKING:
    from hpo.budget.usage import Usage
    from hpo.config import StudySpec

T = TypeVar("T")

LOCAL_SIGNAL_DELAY_S = 3
"""How long before a local trial's time limit its process is told to checkpoint and requeue."""


def local_executor(spec: StudySpec, time_min: int | None = None) -> Any:
    """A submitit LocalExecutor whose processes get the study's per-trial resources (``time_min``
    overrides the time limit, for --workers jobs that run many trials)."""
    folder = private_dir(jobs.jobs_folder(spec))  # submitit's pickles are code
    res = spec.resources
    local = submitit.LocalExecutor(folder=folder / "%j", python=res.python or sys.executable)
    local.update_parameters(
        timeout_min=time_min or res.time_min,
        # submitit's local default signals 30 s before the limit, which a short local trial
        # takes as its limit (an epoch of 40 s in a 1 min trial would requeue until it fails);
        # the trainer checkpoints every epoch, so the signal only needs time to requeue.
        signal_delay_s=LOCAL_SIGNAL_DELAY_S,
        tasks_per_node=res.tasks_per_node,
        gpus_per_node=res.gpus_per_node,
        setup=list(res.setup),
    )
    return local


def local_job_command() -> str:
    """How a local job starts (``hpo launch --dry-run`` shows it)."""
    return f"{sys.executable} -m {jobs.SUBMIT_MODULE} <job folder>"


def local_process_alive(job_id: str) -> bool:
    """Whether the local executor's controller process with this pid still runs (after a relaunch
    there is no Popen handle to poll)."""
    try:
        pid = int(job_id)
        os.kill(pid, 0)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (ValueError, OSError):
        return False
    return b"submitit" in cmdline


class LocalExecutor:
    name: ClassVar[str] = "local"
    measured_cost: ClassVar[bool] = False
    outlives_trial: ClassVar[bool] = False
    on_this_machine: ClassVar[bool] = True
    queue_name: ClassVar[str] = "this machine"
    settings: ClassVar[type[Any] | None] = None
    former_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, log: Log | None = None) -> None:
        pass

    def submitter(
        self,
        spec: StudySpec,
        *,
        job_name: str,
        array_parallelism: int | None = None,
        time_min: int | None = None,
        direct: bool = False,
    ) -> Any:
        return local_executor(spec, time_min)

    def submit_with_retries(
        self,
        submit: Callable[[], T],
        log: Log,
        pause: Callable[[float], None],
        still_wanted: Callable[[], None],
    ) -> T:
        return submit()  # a process starts or fails: there is no queue to wait for

    def job(self, spec: StudySpec, job_id: str) -> None:
        return None  # a relaunch has no handle on the process: watched by its pid

    def ended(self, job_id: str, job: Any | None) -> bool:
        if job is None:
            return not local_process_alive(job_id)
        return bool(job.done())

    def end_state(self, job: Any | None) -> str:
        return "exited"

    def killed_for_memory(self, job: Any | None) -> bool:
        return False

    def still_queued(self, job_id: str, job: Any | None, max_age_s: float | None) -> bool:
        return False

    def cancel(self, spec: StudySpec, job_id: str) -> None:
        if local_process_alive(job_id):
            os.kill(int(job_id), signal.SIGINT)  # submitit's local controller forwards it to the tasks

    def log(
        self, spec: StudySpec, job_id: str, task: int = 0, slot: int | None = None, stderr: bool = True
    ) -> Path:
        return jobs.job_log(spec, job_id, task, slot, stderr)

    def cost(self, job_ids: Iterable[str], since: datetime | None = None) -> dict[str, Usage]:
        return {}  # nothing measures a local process's use: its elapsed time is the estimate

    def queued_jobs(self, spec: StudySpec) -> list[str]:
        return []

    def preflight(self, spec: StudySpec, shape: JobShape) -> None:
        check_runs_here(spec)

    def site_room(self, spec: StudySpec, wanted_jobs: int, job_array: bool) -> SiteRoom:
        return SiteRoom(wanted_jobs, "", False)  # this machine's cores are the only limit

    def job_time_limit(self, spec: StudySpec, wanted_min: int, what: str, log: Log) -> int:
        return wanted_min

    def interrupted_line(self, numbers: str) -> str:
        return f"launcher stopped while trials {numbers} ran; `hpo launch` again resumes the study"

    def dry_run_lines(self, spec: StudySpec) -> list[str]:
        start = local_job_command()
        if spec.resources.packed:
            return [f"# each job of up to {spec.resources.trials_per_gpu} trials runs as a local process that "
                    f"starts each trial in a process of its own: {start}, then -m hpo.trial.packing <member> per trial"]  # fmt: skip
        return [f"# each trial runs as a local process: {start}"]

    def identity(self) -> tuple[str, str]:
        return self.current_job() or str(os.getpid()), socket.gethostname()

    def node(self) -> str:
        return socket.gethostname()

    def current_job(self) -> str | None:
        return os.environ.get("SUBMITIT_LOCAL_JOB_ID")

    def rank(self) -> int:
        """submitit's local variables, which the trainer does not read, as torchrun's."""
        if os.environ.get("SUBMITIT_LOCAL_NTASKS", "1") == "1":
            return 0
        dist_env = submitit.helpers.TorchDistributedEnvironment()
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.update(
            RANK=str(dist_env.rank),
            WORLD_SIZE=str(dist_env.world_size),
            LOCAL_RANK=str(dist_env.local_rank),
            MASTER_PORT=str(dist_env.master_port),
        )
        return dist_env.rank

    def restart_count(self) -> int:
        return 0  # submitit's local executor counts none in the job's environment

    def leave_step(self) -> None:
        return None  # a local Ray starts in the launcher's own process, in no job step

    def allocation(self, spec: StudySpec, share: int) -> tuple[float, float]:
        res = spec.resources  # cpus_per_task is already one packed trial's own
        return res.gpus_per_node * res.nodes / share, res.cpus_per_task * res.world_size

    def job_ending(self) -> bool:
        return False
