"""Where each study file's study was launched: its storage and workdir, kept per user, so that the
commands after ``hpo launch`` find the study from any folder without repeating ``--storage``.

A study file's default storage is a journal under its workdir, ``runs/<name>`` relative to the
folder the command runs in, and ``--storage`` names another: both depend on how the command was
typed. ``hpo launch`` records what it used, keyed by the study file's absolute path and the study's
name, in ``$XDG_STATE_HOME/hpo/launches.json`` (``~/.local/state/hpo/launches.json``; mode 600;
no password is ever in a stored URL), once that storage has opened: a launch on one that cannot be
(a server down, a mistyped ``--storage``) leaves the last launch that worked in place. A later
command on the same file that names neither a storage nor a workdir (``--storage``, ``--set
study.storage=...``, ``--set study.workdir=...``, or the file's own keys) uses the recorded ones,
and says so when they differ from its folder's defaults: a relaunch from another folder resumes the
study instead of starting a second copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def registry_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hpo" / "launches.json"


def _key(study_file: Path, study_name: str) -> str:
    return f"{study_file.expanduser().resolve()}#{study_name}"


def recorded(study_file: Path, study_name: str) -> dict[str, Any] | None:
    """The storage and workdir the last launch of this file's study used, or None."""
    entry = _read().get(_key(study_file, study_name))
    return dict(entry) if isinstance(entry, dict) else None


def record(study_file: Path, study_name: str, storage: str, workdir: Path) -> None:
    """Remember the storage (no password: the caller's URL has none) and workdir of a launch; called
    once that storage has opened, so that an entry always names one that worked."""
    with _locked():
        # Entries of study files that no longer exist (a deleted folder) are dropped.
        entries = {k: v for k, v in _read().items() if Path(k.rpartition("#")[0]).exists()}
        entries[_key(study_file, study_name)] = {
            "storage": storage,
            "workdir": str(workdir),
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        _write(entries)


def entries() -> list[dict[str, Any]]:
    """Every recorded launch: its storage, workdir and time."""
    return [dict(entry) for entry in _read().values() if isinstance(entry, dict)]


def forget(study_file: Path, study_name: str) -> None:
    with _locked():
        entries = _read()
        if entries.pop(_key(study_file, study_name), None) is not None:
            _write(entries)


def _write(entries: dict[str, Any]) -> None:
    """Written whole, then renamed (under the lock): a reader never sees half a file."""
    path = registry_path()
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, prefix=".launches-") as out:
        json.dump(entries, out, indent=1, sort_keys=True)
    os.chmod(out.name, 0o600)
    os.replace(out.name, path)


def _read() -> dict[str, Any]:
    try:
        entries = json.loads(registry_path().read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: nothing recorded (a launch writes it anew)
    return entries if isinstance(entries, dict) else {}


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    path = registry_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
