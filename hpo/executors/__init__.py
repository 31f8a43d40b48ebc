"""Where a study's jobs run: executors behind the protocol of ``base.Executor``, found as plugins.

Each executor registers under the ``hpo.executors`` entry-point group with the name a study file
gives it (``resources.executor``): the built-in ones in this project's pyproject.toml (``local``
here, ``slurm`` in ``hpo.slurm``), another scheduler's in its own package, which edits no file of
this one. The dispatch modes, the views and the trial code reach an executor by name through
:func:`get` and never compare names; an executor is imported only once a study asks for it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from typing import TYPE_CHECKING

from hpo.executors.base import ENV_EXECUTOR, Executor, Log

if TYPE_CHECKING:
    from hpo.config import StudySpec

GROUP = "hpo.executors"
"""The entry-point group executors register under: ``<name> = "<module>:<class>"``."""

__all__ = ["GROUP", "Executor", "executor_class", "get", "here", "names", "queued"]


@functools.cache
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    found = {point.name: point for point in importlib.metadata.entry_points(group=GROUP)}
    if not found:  # the built-in ones are registered by installing this project
        raise RuntimeError(
            f"no executor is registered under {GROUP!r}: install the project (pip install -e .)"
        )
    return found


def names() -> tuple[str, ...]:
    """The executor names a study file may give: every installed executor's."""
    return tuple(sorted(_entry_points()))


@functools.cache
def executor_class(name: str) -> type[Executor]:
    """The executor registered as ``name`` (its module imported now)."""
    cls: type[Executor] = _entry_points()[name].load()
    if getattr(cls, "name", None) != name:
        raise RuntimeError(
            f"the executor registered as {name!r} ({cls!r}) names itself {getattr(cls, 'name', None)!r}"
        )
    return cls


def get(name: str, log: Log | None = None) -> Executor:
    """A fresh executor of this name (its own view of its jobs' states)."""
    return executor_class(name)(log=log)


def queued(spec: StudySpec) -> list[tuple[Executor, list[str]]]:
    """The study's jobs in each executor's queue, found by their names (a job no trial holds yet:
    a worker, a pending detached launcher): ``hpo cancel`` and ``hpo delete`` ask every executor
    this same way."""
    found = []
    for executor in (get(name) for name in names()):
        jobs = executor.queued_jobs(spec)
        if jobs:
            found.append((executor, jobs))
    return found


def here() -> Executor:
    """The executor that started this process (submitit names it in the job's environment); the
    local one outside any job."""
    name = os.environ.get(ENV_EXECUTOR, "")
    return get(name if name in _entry_points() else "local")
