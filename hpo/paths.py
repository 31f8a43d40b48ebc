"""Folders the service creates: private to their owner.

A study's workdir holds submitit's pickles (code that a job runs), checkpoints and logs: on a
shared cluster, nobody else may read or replace them.
"""

from __future__ import annotations

from pathlib import Path


def private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parent with mode 0700 (``mkdir(parents=True, mode=...)``
    gives the mode to the last folder only); an existing folder is left as it is."""
    for folder in [*reversed(path.parents), path]:
        if not folder.exists():
            folder.mkdir(mode=0o700, exist_ok=True)
    return path
