"""submitit's side of the FIFO queue: an executor that submits its jobs' scripts to the queue, the
job handle and state watcher that read the queue's records, and the environment a job runs in
(found by submitit through the ``submitit`` entry points, as any submitit plugin is)."""

from __future__ import annotations

import re
import shlex
import sys
import typing as tp
from pathlib import Path

from submitit.core import core, job_environment, utils

from hpo_fifo import queue


class FifoInfoWatcher(core.InfoWatcher):
    """States from the queue's own records (no command to run)."""

    def _make_command(self) -> list[str] | None:
        return None

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        record = queue.job(job_id)
        return "UNKNOWN" if record is None else str(record["state"])

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        return self.get_state(job_id) not in (*queue.ACTIVE, "UNKNOWN")


class FifoJob(core.Job[tp.Any]):
    watcher = FifoInfoWatcher()

    def cancel(self, check: bool = True) -> None:
        queue.cancel(self.job_id)


class FifoJobEnvironment(job_environment.JobEnvironment):
    _env: tp.ClassVar[dict[str, str]] = {
        "job_id": queue.JOB_ID_ENV,
        "num_tasks": "FIFO_NTASKS",
        "num_nodes": "FIFO_NNODES",
        "node": "FIFO_NODEID",
        "global_rank": "FIFO_GLOBAL_RANK",
        "local_rank": "FIFO_LOCAL_RANK",
    }

    @classmethod
    def name(cls) -> str:
        return "fifo"

    def _requeue(self, countdown: int) -> None:
        raise utils.UncompletedJobError("the FIFO queue does not requeue jobs")


class FifoSubmitit(core.PicklingExecutor):
    """Each job one process on this machine, started by the queue's daemon in submission order."""

    job_class = FifoJob

    def __init__(self, folder: str | Path, python: str | None = None) -> None:
        super().__init__(folder)
        self.python = python or sys.executable
        self.parameters = {"job_name": "submitit", "cpus": 1, "timeout_min": None, "setup": []}
        self._throttling = 0.0

    @classmethod
    def name(cls) -> str:
        return "fifo"

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return {"job_name", "cpus", "timeout_min", "setup"}

    def _internal_update_parameters(self, **kwargs: tp.Any) -> None:
        unknown = set(kwargs) - self._valid_parameters()
        if unknown:
            raise ValueError(f"unknown parameters of the FIFO queue: {sorted(unknown)}")
        self.parameters.update(kwargs)

    def _num_tasks(self) -> int:
        return 1

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        folder = shlex.quote(str(self.folder))
        setup = "\n".join(self.parameters["setup"])
        # The job's id is the queue's, known once it starts: the logs take it then (submitit's layout).
        return f"""#!/bin/bash
export SUBMITIT_EXECUTOR=fifo SUBMITIT_FOLDER={folder} FIFO_NTASKS=1 FIFO_NNODES=1 FIFO_NODEID=0 FIFO_GLOBAL_RANK=0 FIFO_LOCAL_RANK=0
folder={folder}
folder="${{folder//%j/$FIFO_JOB_ID}}"
mkdir -p "$folder"
exec >>"$folder/${{FIFO_JOB_ID}}_0_log.out" 2>>"$folder/${{FIFO_JOB_ID}}_0_log.err"
{setup}
exec {shlex.quote(self.python)} -u -m submitit.core._submit {folder}
"""

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        limit = self.parameters["timeout_min"]
        return [
            sys.executable, "-m", "hpo_fifo.queue", "submit", str(submission_file_path),
            "--name", str(self.parameters["job_name"]), "--cpus", str(self.parameters["cpus"]),
            *(["--time-min", str(limit)] if limit else []),
        ]  # fmt: skip

    @staticmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str:
        text = string.decode() if isinstance(string, bytes) else string
        found = re.search(r"Submitted fifo job (\d+)", text)
        if found is None:
            raise utils.FailedSubmissionError(f"the FIFO queue said: {text!r}")
        return found.group(1)
