"""The local executor: each job a process on this machine, started by submitit's LocalExecutor,
watched by its pid after a relaunch (no Popen handle then), stopped with SIGINT."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hpo.executors.base import Log
from hpo.slurm import executors

if TYPE_CHECKING:
    from hpo.config import StudySpec
    from hpo.slurm.accounting import Usage


class LocalExecutor:
    name: ClassVar[str] = "local"
    measured_cost: ClassVar[bool] = False
    outlives_trial: ClassVar[bool] = False
    on_this_machine: ClassVar[bool] = True
    queue_name: ClassVar[str] = "this machine"
    site_limited: ClassVar[bool] = False

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
        return executors.local_executor(spec, time_min)

    def job(self, spec: StudySpec, job_id: str) -> None:
        return None  # a relaunch has no handle on the process: watched by its pid

    def ended(self, job_id: str, job: Any | None) -> bool:
        if job is None:
            return not executors.local_process_alive(job_id)
        return bool(job.done())

    def end_state(self, job: Any | None) -> str:
        return "exited"

    def killed_for_memory(self, job: Any | None) -> bool:
        return False

    def still_queued(self, job_id: str, job: Any | None, max_age_s: float | None) -> bool:
        return False

    def cancel(self, spec: StudySpec, job_id: str) -> None:
        if executors.local_process_alive(job_id):
            os.kill(int(job_id), signal.SIGINT)  # submitit's local controller forwards it to the tasks

    def log(
        self, spec: StudySpec, job_id: str, task: int = 0, slot: int | None = None, stderr: bool = True
    ) -> Path:
        return executors.job_log(spec, job_id, task, slot, stderr)

    def cost(self, job_ids: Iterable[str], since: datetime | None = None) -> dict[str, Usage]:
        return {}  # nothing measures a local process's use: its elapsed time is the estimate

    def queued_jobs(self, spec: StudySpec) -> list[str]:
        return []

    def check_ready(self, spec: StudySpec) -> None:
        return None

    def interrupted_line(self, numbers: str) -> str:
        return f"launcher stopped while trials {numbers} ran; `hpo launch` again resumes the study"

    def dry_run_lines(self, spec: StudySpec) -> list[str]:
        start = executors.local_job_command()
        if spec.resources.packed:
            return [f"# each job of up to {spec.resources.trials_per_gpu} trials runs as a local process that "
                    f"starts each trial in a process of its own: {start}, then -m hpo.trial.packing <member> per trial"]  # fmt: skip
        return [f"# each trial runs as a local process: {start}"]

    def identity(self) -> tuple[str, str]:
        return os.environ.get("SUBMITIT_LOCAL_JOB_ID", str(os.getpid())), socket.gethostname()

    def rank(self) -> int:
        return 0  # a multi-process local trial's rank comes from submitit's own variables

    def allocation(self, spec: StudySpec, share: int) -> tuple[float, float]:
        res = spec.resources  # cpus_per_task is already one packed trial's own
        return res.gpus_per_node * res.nodes / share, res.cpus_per_task * res.world_size

    def job_ending(self) -> bool:
        return False
