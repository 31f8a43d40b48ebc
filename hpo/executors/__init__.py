"""Where a study's jobs run: one executor per module, behind the protocol of ``base.Executor``.

``REGISTRY`` maps the study file's ``resources.executor`` names to them (``hpo.config`` holds the
same names, and a test holds the two equal). A new executor (another scheduler) is one module
here implementing the protocol, listed in ``REGISTRY``; the dispatch modes, the views and the
trial code reach it by name and never compare names.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hpo.executors.base import ENV_EXECUTOR, Executor, Log
from hpo.executors.local import LocalExecutor
from hpo.executors.slurm import SlurmExecutor

if TYPE_CHECKING:
    from hpo.config import StudySpec

REGISTRY: dict[str, type[Executor]] = {cls.name: cls for cls in (SlurmExecutor, LocalExecutor)}

__all__ = ["REGISTRY", "Executor", "get", "here", "on_slurm", "queued"]


def get(name: str, log: Log | None = None) -> Executor:
    """A fresh executor of this name (its own view of its jobs' states)."""
    return REGISTRY[name](log=log)


def queued(spec: StudySpec) -> list[tuple[Executor, list[str]]]:
    """The study's jobs in each executor's queue, found by their names (a job no trial holds yet:
    a worker, a pending detached launcher): ``hpo cancel`` and ``hpo delete`` ask every executor
    this same way."""
    found = []
    for executor in (cls() for cls in REGISTRY.values()):
        jobs = executor.queued_jobs(spec)
        if jobs:
            found.append((executor, jobs))
    return found


def on_slurm(log: Log | None = None) -> Executor:
    """The Slurm executor: the one that runs a launcher (``--detach``) and a Ray allocation."""
    return SlurmExecutor(log=log)


def here() -> Executor:
    """The executor that started this process (submitit names it in the job's environment); the
    local one outside any job."""
    return REGISTRY.get(os.environ.get(ENV_EXECUTOR, ""), LocalExecutor)()
