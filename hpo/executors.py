"""Submitting trial jobs with submitit: Slurm jobs or local processes, from a study's resources.

submitit does the submission, the pickling of the task, job state through sacct and the logs;
this module only maps the study file's ``resources`` section onto its parameters and re-creates
job handles from stored job ids when a launcher resumes a study.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.errors import StudyFileError

if TYPE_CHECKING:
    import submitit

    from hpo.studyfile import StudySpec

_SLURM_ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "TIMEOUT", "REVOKED", "SPECIAL_EXIT"}  # fmt: skip


def jobs_folder(spec: StudySpec) -> Path:
    return spec.workdir / "jobs"


def check_executor_available(spec: StudySpec, executor: str) -> None:
    if executor == "slurm" and shutil.which("sbatch") is None:
        raise StudyFileError(
            f"{spec.source}: resources.executor: slurm, but there is no sbatch on this machine; "
            "run on a Slurm login node, or use executor: local (--executor local)"
        )


def make_executor(
    spec: StudySpec, executor: str, *, job_name: str, array_parallelism: int | None = None
) -> Any:
    """A submitit executor whose jobs get the study's per-trial resources."""
    import submitit

    folder = jobs_folder(spec)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)  # submitit's pickles are code
    res = spec.resources
    python = res.python or sys.executable
    if executor == "local":
        local = submitit.LocalExecutor(folder=folder / "%j", python=python)
        local.update_parameters(
            timeout_min=res.time_min,
            tasks_per_node=res.tasks_per_node,
            gpus_per_node=res.gpus_per_node,
            setup=list(res.setup),
        )
        return local
    slurm = submitit.SlurmExecutor(folder=folder / "%j", python=python)
    slurm.update_parameters(**slurm_parameters(spec, job_name, array_parallelism))
    return slurm


def slurm_parameters(spec: StudySpec, job_name: str, array_parallelism: int | None = None) -> dict[str, Any]:
    res = spec.resources
    params: dict[str, Any] = {
        "job_name": job_name,
        "time": res.time_min,
        "nodes": res.nodes,
        "ntasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task,
        "setup": list(res.setup),
        # One failed rank ends the step at once instead of leaving the others in a collective
        # until the DDP timeout: GPU-hours are not spent waiting for a dead peer.
        "srun_args": ["--kill-on-bad-exit=1"],
        "additional_parameters": {key: value for key, value in res.sbatch.items()},
    }
    if res.gpus_per_node:
        params["gpus_per_node"] = res.gpus_per_node
    if res.mem_gb is not None:
        params["mem"] = f"{int(res.mem_gb * 1024)}MB"
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(res, key)
        if value is not None:
            params[key] = value
    if array_parallelism is not None:
        params["array_parallelism"] = array_parallelism
    return params


def render_sbatch(spec: StudySpec, job_name: str) -> str:
    """The sbatch script a trial job would be submitted with (for ``--dry-run``)."""
    from submitit.slurm.slurm import _make_sbatch_string

    folder = jobs_folder(spec) / "%j"
    python = spec.resources.python or sys.executable
    command = f"{python} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    # submitit renders the script at submission with this function; calling it directly works
    # where there is no srun (a SlurmExecutor refuses to exist there).
    text: str = _make_sbatch_string(command=command, folder=folder, **slurm_parameters(spec, job_name))
    return text


def slurm_job(spec: StudySpec, job_id: str) -> submitit.Job[Any]:
    import submitit

    return submitit.SlurmJob(folder=jobs_folder(spec) / "%j", job_id=job_id)


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


def slurm_state(job: Any) -> str:
    """The job's Slurm state word (``COMPLETED``, ``CANCELLED``, ...; ``UNKNOWN`` if sacct cannot tell)."""
    state = str(job.state or "UNKNOWN").split()[0]
    return state


def slurm_state_ended(state: str) -> bool:
    return state in _SLURM_ENDED
