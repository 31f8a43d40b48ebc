"""What every executor's jobs share: submitit's folders, names and logs.

submitit lays out each job the same way whatever runs it (``jobs/<id>/<id>_submitted.pkl``, the
tasks' logs, their results): the study's job folder, the names that find its jobs in a queue, the
logs and the one line that says why a job failed are read here for every executor.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from submitit.core.utils import JobPaths

if TYPE_CHECKING:
    from hpo.config import StudySpec

SUBMIT_MODULE = "submitit.core._submit"
"""What a submitit job runs: the job's pickle unpickled and called."""


def process_started_at() -> float | None:
    """When this process started, as a Unix time to the kernel's tick (Linux's /proc; None
    elsewhere). A one-process job execs Python in its batch script, so this is when the job's node
    started the script: what a job's start costs before Python runs."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    started_after_boot_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    return time.time() - (uptime_s - started_after_boot_s)


def jobs_folder(spec: StudySpec) -> Path:
    return spec.workdir / "jobs"


def remove_unnamed_folder(folder: Path) -> None:
    """submitit writes a submission under ``<folder>/%j`` before the job has an id, and leaves that
    folder behind, literally named ``%j``: removed once empty."""
    with contextlib.suppress(OSError):
        (folder / "%j").rmdir()


JOB_ROLES = ("", "worker", "launcher", "ray")
"""The kinds of a study's jobs: trials (no role), ``--workers``, ``--detach``, the Ray allocation."""


def job_name(spec: StudySpec, role: str = "") -> str:
    """The job name of a study's jobs of one role (see :data:`JOB_ROLES`). `hpo cancel`
    finds by these names the jobs whose ids no trial holds yet, so no name of one study may be a
    name of another: the role follows a ``:``, which no study name contains (study ``pc``'s Ray job
    is ``hpo-pc:ray``, study ``pc-ray``'s trials ``hpo-pc-ray``)."""
    assert ":" not in spec.study.name and role in JOB_ROLES
    return f"hpo-{spec.study.name}" + (f":{role}" if role else "")


def error_line(spec: StudySpec, job_id: str, tasks: int, slot: int | None = None) -> str:
    """The most telling line of a job's task logs: the last exception line of the first task that
    has one, else the last line of rank 0's log (read directly: submitit's ``exception()`` waits
    up to 15 s per task for a result that a killed job never writes). ``slot``: the log of that
    member of a packed job."""

    last = ""
    for task in range(max(1, tasks)):
        path = job_log(spec, job_id, task, slot)
        try:
            lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            continue
        errors = [line for line in lines if _EXCEPTION_LINE.match(line)]
        if errors:
            return errors[-1]
        if task == 0 and lines:
            last = lines[-1]
    return last


def job_log(
    spec: StudySpec, job_id: str, task: int = 0, slot: int | None = None, stderr: bool = True
) -> Path:
    """A job's log of task ``task``, or the own log of member ``slot`` of a packed job."""
    paths = JobPaths(jobs_folder(spec) / "%j", job_id, task)
    if slot is not None:
        return member_log(Path(paths.stderr).parent, job_id, slot, stderr)
    return Path(paths.stderr if stderr else paths.stdout)


def member_log(folder: Path, job_id: str, slot: int, stderr: bool) -> Path:
    """A packed job member's own output, beside submitit's logs of the job (``hpo.trial.packing``)."""
    return folder / f"{job_id}_slot{slot}_log.{'err' if stderr else 'out'}"


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|slurmstepd: error)\b")
