"""Folders the service creates, private to their owner, and where a trial's files go.

A study's workdir holds submitit's pickles (code that a job runs), checkpoints and logs: on a
shared cluster, nobody else may read or replace them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpo.config import StudySpec


def private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parent with mode 0700 (``mkdir(parents=True, mode=...)``
    gives the mode to the last folder only); an existing folder is left as it is."""
    for folder in [*reversed(path.parents), path]:
        if not folder.exists():
            folder.mkdir(mode=0o700, exist_ok=True)
    return path


def trial_dir(spec: StudySpec, trial_key: int | str) -> Path:
    """A trial's folder under the study's workdir (its checkpoint, its Ray Train output)."""
    return spec.workdir / "trials" / str(trial_key)


def checkpoint_dir(spec: StudySpec, trial_key: int | str) -> Path:
    """Where a trial's checkpoint lives: the same across requeues, and copied for a retry."""
    return trial_dir(spec, trial_key) / "checkpoint"
