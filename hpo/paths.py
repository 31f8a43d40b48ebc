"""Folders the service creates, private to their owner, and where a trial's files go.

A study's workdir holds submitit's pickles (code that a job runs), checkpoints and logs: on a
shared cluster, nobody else may read or replace them.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
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


def why_not_creatable(path: Path) -> str | None:
    """Why the folder ``path`` could not be created by :func:`private_dir` (None: it can be, or it
    exists and is writable). Creates nothing that stays: a throw-away folder made and removed in
    the nearest existing ancestor tells what mkdir would say there (also as root, on /proc...)."""
    missing = False
    folder = path
    while True:
        try:
            mode = os.stat(folder).st_mode
        except (FileNotFoundError, NotADirectoryError):
            # NotADirectoryError: some ancestor is a file; the loop reaches it and says so.
            missing = True
            if folder.parent == folder:
                return f"{folder} does not exist"
            folder = folder.parent
            continue
        except OSError as err:
            return f"{folder}: {err.strerror or err}"
        except ValueError:
            return "contains a NUL character"
        break
    if not stat.S_ISDIR(mode):
        return f"{folder} is a file, not a folder"
    if not missing:
        return None if os.access(folder, os.W_OK | os.X_OK) else f"{folder} is not writable"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hpo-check-", dir=folder))
    except OSError as err:
        return f"mkdir in {folder} fails: {err.strerror or err}"
    return None


NOT_WRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
"""How a write that permissions refuse fails: a mode or an ACL, or (refusing root too) a read-only
mount or an immutable file. The machine's state, not a wrong path: exit 3, where a path that cannot
exist (under /proc, a file in the way) is bad input."""


def denied(err: OSError) -> str:
    """The reason of a refused write as a message reads it: ``read-only file system``."""
    return (err.strerror or str(err)).lower()


def why_not_writable(path: Path) -> tuple[Path, str] | None:
    """Whether permissions (a mode, a read-only mount, an immutable folder) keep the folder ``path``
    from being written, or created where it is missing: the folder that refuses (``path`` or its
    nearest existing one) and why, or None. Other problems are :func:`why_not_creatable`'s. Only
    a refusal is probed, with a throw-away folder made and removed: ``access`` says no but not why."""
    folder = path
    while True:
        try:
            mode = os.stat(folder).st_mode
        except (FileNotFoundError, NotADirectoryError):
            if folder.parent == folder:
                return None
            folder = folder.parent
            continue
        except PermissionError as err:  # a folder above it that this user may not enter
            return folder, denied(err)
        except (OSError, ValueError):
            return None
        break
    if not stat.S_ISDIR(mode) or os.access(folder, os.W_OK | os.X_OK):
        return None
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hpo-check-", dir=folder))
    except OSError as err:
        return (folder, denied(err)) if err.errno in NOT_WRITABLE else None
    return None


def why_not_writable_file(path: Path) -> str | None:
    """Why the existing file ``path`` cannot be appended to for want of permission, or None
    (opened for appending and closed: nothing written)."""
    if os.access(path, os.W_OK):
        return None
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as err:
        return denied(err) if err.errno in NOT_WRITABLE else None
    return None


def trial_dir(spec: StudySpec, trial_key: int | str) -> Path:
    """A trial's folder under the study's workdir (its checkpoint, its Ray Train output).

    Per study and storage: the same study file launched on the embedded journal and then on
    PostgreSQL numbers its trials from 0 in each, and trial 0 of one must not resume from the
    finished checkpoint of trial 0 of the other. (A storage URL spelled differently on a relaunch
    names another folder: its running trials then start their epochs again, nothing worse.)"""
    storage = hashlib.sha256(str(spec.study.storage or "").encode()).hexdigest()[:8]
    return spec.workdir / "trials" / f"{spec.study.name}-{storage}" / str(trial_key)


def checkpoint_dir(spec: StudySpec, trial_key: int | str) -> Path:
    """Where a trial's checkpoint lives: the same across requeues, and copied for a retry."""
    return trial_dir(spec, trial_key) / "checkpoint"


def tensorboard_dir(spec: StudySpec, trial_key: int | str) -> Path:
    """A trial's TensorBoard event files: under workdir, so ``tensorboard --logdir <workdir>`` shows
    every trial of every study there, each run named by its study and trial."""
    return trial_dir(spec, trial_key) / "tensorboard"


def profile_dir(spec: StudySpec, trial_key: int | str) -> Path:
    """A profiled trial's torch.profiler trace, one file per rank."""
    return trial_dir(spec, trial_key) / "profile"
