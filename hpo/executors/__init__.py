"""Where a study's jobs run: one executor per module, behind the protocol of ``base.Executor``.

``REGISTRY`` maps the study file's ``resources.executor`` names to them (``hpo.config`` holds the
same names, and a test holds the two equal). A new executor (another scheduler) is one module
here implementing the protocol, listed in ``REGISTRY``; the dispatch modes, the views and the
trial code reach it by name and never compare names.
"""

from __future__ import annotations

import os

from hpo.executors.base import ENV_EXECUTOR, Executor, Log
from hpo.executors.local import LocalExecutor
from hpo.executors.slurm import SlurmExecutor

REGISTRY: dict[str, type[Executor]] = {cls.name: cls for cls in (SlurmExecutor, LocalExecutor)}

__all__ = ["REGISTRY", "Executor", "get", "here", "on_slurm"]


def get(name: str, log: Log | None = None) -> Executor:
    """A fresh executor of this name (its own view of its jobs' states)."""
    return REGISTRY[name](log=log)


def on_slurm(log: Log | None = None) -> Executor:
    """The Slurm executor: the one that runs a launcher (``--detach``) and a Ray allocation."""
    return SlurmExecutor(log=log)


def here() -> Executor:
    """The executor that started this process (submitit names it in the job's environment); the
    local one outside any job."""
    return REGISTRY.get(os.environ.get(ENV_EXECUTOR, ""), LocalExecutor)()
