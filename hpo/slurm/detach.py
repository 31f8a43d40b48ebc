"""``hpo launch --detach``: the launcher itself as a small CPU Slurm job.

Login nodes kill long-running processes, and a study runs for hours. The detached launcher is the
same ``hpo launch`` run inside a one-task job of the study's ``launcher`` section. Shortly before
its time limit Slurm signals it (submitit's ``--signal=USR2@90``) and submitit requeues the job;
the requeued run resumes the study like any relaunch (trial jobs keep running meanwhile and are
re-attached by their stored job ids). A preemption or node failure requeues it too (``--requeue``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import submitit
from submitit.core.utils import JobPaths

from hpo import joblog
from hpo.executors import jobs
from hpo.paths import private_dir
from hpo.slurm import jobs as slurm_jobs

if TYPE_CHECKING:
    from hpo.config import StudySpec

log = logging.getLogger(__name__)

# What submitit's job environment reads while the job runs (its signal handler needs the job id
# and the rank): kept when the launcher's own SLURM_* variables are dropped.
_SUBMITIT_NEEDS = {
    "SLURM_CONF", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID",
    "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_RESTART_COUNT",
}  # fmt: skip


@dataclasses.dataclass
class DetachedLaunch:
    """The task of the launcher's job: the same launch command, minus --detach (``hpo.commands``
    hands it over as a callable, so this module does not import the commands)."""

    launch: Callable[[], int]
    argv: list[str]
    workdir: str

    def __call__(self) -> int:
        joblog.to_stdout()
        # The trial jobs this launcher submits inherit its environment: the launcher job's own
        # SLURM_* settings (its CPUs, memory, task count) must not become theirs.
        for name in [n for n in os.environ if n.startswith("SLURM_") and n not in _SUBMITIT_NEEDS]:
            del os.environ[name]
        os.chdir(self.workdir)
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        log.info(f"detached launcher (restart {restarts}): hpo {' '.join(self.argv)}")
        status = self.launch()
        if status != 0:
            raise SystemExit(status)
        return status

    def checkpoint(self) -> Any:
        """Requeue at the time limit: the next run resumes the study from the storage."""

        return submitit.helpers.DelayedSubmission(self)


def submit(spec: StudySpec, launch: Callable[[], int], argv: list[str]) -> str:
    """Submit the launcher's job; returns its job id."""

    folder = private_dir(jobs.jobs_folder(spec) / "launcher")  # submitit's pickles are code
    # A study that runs for days goes through many time limits: each is one requeue.
    executor = submitit.SlurmExecutor(
        folder=folder / "%j", python=spec.resources.python or sys.executable, max_num_timeout=1000
    )
    params = launcher_parameters(spec)
    executor.update_parameters(**params)
    job = executor.submit(DetachedLaunch(launch, argv, str(Path.cwd())))
    jobs.remove_unnamed_folder(folder)
    return str(job.job_id)


def launcher_parameters(spec: StudySpec) -> dict[str, Any]:
    """The launcher job's Slurm parameters: one task on one node, the study file's ``launcher``
    section, no GPU."""
    launcher = spec.launcher
    params: dict[str, Any] = {
        "job_name": jobs.job_name(spec, "launcher"),
        "time": launcher.time_min,
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": launcher.cpus_per_task,
        "setup": list(spec.resources.setup),
        "additional_parameters": {"requeue": True, **launcher.sbatch},
    }
    for key in ("partition", "account", "qos"):
        value = getattr(launcher, key)
        if value is not None:
            params[key] = value
    return params


def render_sbatch(spec: StudySpec) -> str:
    """The launcher job's sbatch script (compared with a reference file by the tests)."""
    return slurm_jobs.sbatch_text(spec, launcher_parameters(spec), jobs.jobs_folder(spec) / "launcher" / "%j")


def log_path(spec: StudySpec, job_id: str) -> Path:

    return Path(JobPaths(jobs.jobs_folder(spec) / "launcher" / "%j", job_id, 0).stdout)
