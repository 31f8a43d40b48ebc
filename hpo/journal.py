"""The embedded journal file, made safe against a crash mid-write and a full disk.

Optuna's journal is an append-only file of JSON lines. Its reader skips an incomplete last line
(a process killed mid-write, a write cut short by a full disk or quota), but its writer appends
straight after it: the partial line and the next record become one invalid line in the middle of
the file, and from then on the study cannot be opened at all. :class:`SafeJournalBackend` closes
that hole, under the journal's lock, before every append:

- an incomplete last record is cut off and set aside in ``<journal>.partial`` (a record without its
  end was never read by anyone, so nothing readable is lost), with a one-line note;
- a write that fails (``ENOSPC``, ``EDQUOT``, an I/O error) is undone to the last whole record, and
  raises :class:`JournalWriteError`: one line with the file and the free space, exit 3, and a
  journal that still opens once space is freed;
- a journal (or its folder) that permissions refuse, a read-only mount included, is one line too,
  naming it and the fix, exit 3 (the launcher checks before anything starts: ``hpo.dispatch.preflight``).

A journal damaged by a writer without these guards (an invalid line in the middle) is repaired by
:func:`repair` the first time the service opens it: the readable record at the end of such a line is
kept, the cut-off part before it set aside.

Shared filesystems: the lock is Optuna's symlink lock (``symlink(2)`` is atomic on NFSv3+ and on
GPFS/Spectrum Scale, where ``fcntl`` locks are unreliable or slow), with Optuna's 30 s grace period
after which a lock whose holder died is broken.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

from hpo.errors import NotReadyError
from hpo.paths import NOT_WRITABLE, denied

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"
"""Where cut-off bytes are set aside, beside the journal: kept for a post-mortem, never read."""

RECORD_START = b'{"op_code":'
"""How every record of Optuna's journal begins; inside a JSON string it is escaped, so in a damaged
line it marks where a whole record starts."""

_TAIL_CHUNK = 1 << 16


class JournalWriteError(NotReadyError):
    """An append to the journal failed (full disk, quota, I/O error; or permissions refuse it: see
    :func:`cannot_write`); the journal was left whole."""


WRITABLE_HINT = "make it writable, or name another with --storage or study.storage"


def cannot_write(
    path: str | Path, reason: str, hint: str = WRITABLE_HINT, where: str = "", what: str = "journal"
) -> JournalWriteError:
    """The one line for a journal (or, ``what``, a SQLite database file) that permissions keep the
    service from writing (exit 3): its file or its folder (the lock is a symlink made beside it).
    ``where``: the study file and key."""
    return JournalWriteError(f"{where}cannot write the study's {what} {path}: {reason}", hint)


class SafeJournalBackend(JournalFileBackend):
    """Optuna's journal file backend whose appends never leave, or write after, a partial record."""

    def __init__(self, file_path: str) -> None:
        self.lock = JournalFileSymlinkLock(file_path)
        super().__init__(file_path, lock_obj=self.lock)
        self.path = file_path

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode()
        with _held(self.lock, self.path):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
            except OSError as err:
                if err.errno not in NOT_WRITABLE:
                    raise
                raise cannot_write(self.path, denied(err)) from None  # made read-only under the study
            try:
                whole, kept = _mend_last_line(fd, self.path)
                try:
                    view = memoryview(kept + data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                except OSError as err:
                    os.ftruncate(fd, whole)  # back to the last whole record: the journal still opens
                    if kept:  # the space just freed held it: it fits again
                        with contextlib.suppress(OSError):
                            os.write(fd, kept)
                    raise _write_error(self.path, err) from None
            finally:
                os.close(fd)


class _held:
    """The journal's lock as a context manager; a lock that cannot be made (the symlink needs an
    inode: a full disk) is the same one-line error as a failed write."""

    def __init__(self, lock: JournalFileSymlinkLock, path: str) -> None:
        self.lock, self.path = lock, path

    def __enter__(self) -> None:
        try:
            self.lock.acquire()
        except OSError as err:
            raise _write_error(self.path, err) from None

    def __exit__(self, *exc: object) -> None:
        try:
            self.lock.release()
        except RuntimeError:  # Optuna broke the lock after its 30 s grace: this write was slower
            log.warning("hpo: journal %s: its lock was taken over after a stall of 30 s or more", self.path)


def _write_error(path: str, err: OSError) -> JournalWriteError:
    if err.errno in NOT_WRITABLE:  # made read-only under a running study: no space to free
        return cannot_write(path, denied(err))
    try:
        free = f"{shutil.disk_usage(Path(path).parent).free / 1024:.0f} KiB free there"
    except OSError:
        free = "free space unknown"
    what = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}.get(
        err.errno or 0, err.strerror or str(err)
    )
    return JournalWriteError(
        f"{path}: cannot append to the study's journal: {what} ({free}); the journal is left whole",
        "free space on that filesystem (or raise the quota), then run hpo launch again: the study resumes",
    )


def _mend_last_line(fd: int, path: str) -> tuple[int, bytes]:
    """Cut an incomplete or invalid last line off the open journal. Returns the size of the
    journal's whole records, and the whole record the cut line ended with (a line written after a
    partial record by an unguarded writer), to be written again first; the rest is set aside."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0, b""
    start = 0
    end = size - 1  # the last line's own newline is not where it starts
    while end > 0:
        chunk_start = max(0, end - _TAIL_CHUNK)
        cut = os.pread(fd, end - chunk_start, chunk_start).rfind(b"\n")
        if cut >= 0:
            start = chunk_start + cut + 1
            break
        end = chunk_start
    line = os.pread(fd, size - start, start)
    if line.endswith(b"\n") and _parses(line):
        return size, b""
    kept = _whole_records(line) if line.endswith(b"\n") else b""
    what = "a damaged last line (its whole records kept)" if kept else "an incomplete last record"
    _keep_aside(path, line.rstrip(b"\n"), what)
    os.ftruncate(fd, start)
    return start, kept


def _keep_aside(path: str, dropped: bytes, what: str) -> None:
    aside = path + PARTIAL_SUFFIX
    try:
        with open(aside, "ab") as out:
            out.write(dropped + b"\n")
        where = f"set aside in {aside}"
    except OSError as err:  # a full disk: the bytes were unreadable anyway
        where = f"dropped ({err.strerror} writing {aside})"
    log.warning(
        "hpo: journal %s: %s (%d bytes, cut off by a crash or a full disk) %s",
        path,
        what,
        len(dropped),
        where,
    )


def repair(path: str) -> int:
    """Mend a journal with invalid lines (written after a partial record by an unguarded writer):
    each such line keeps the whole record it ends with, and its cut-off start is set aside.
    Returns the number of lines mended; a journal without damage is left untouched."""
    lock = JournalFileSymlinkLock(path)
    with _held(lock, path):
        # Lines end at "\n" only, as Optuna reads them (a record may hold a raw "\r").
        pieces = Path(path).read_bytes().split(b"\n")
        lines = [piece + b"\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
        mended = 0
        for number, line in enumerate(lines):
            if not line.endswith(b"\n") or _parses(line):
                continue  # a partial last line is the next append's to set aside
            kept = _whole_records(line)
            _keep_aside(path, line.rstrip(b"\n"), f"a damaged line {number + 1} (its whole records kept)")
            lines[number] = kept
            mended += 1
        if mended:
            # Written beside and renamed over: a failure half-way leaves the damaged file, not a worse one.
            temporary = path + ".repair"
            try:
                with open(temporary, "wb") as out:
                    out.writelines(lines)
                    out.flush()
                    os.fsync(out.fileno())
                os.chmod(temporary, os.stat(path).st_mode & 0o7777)
                os.replace(temporary, path)
            except OSError as err:
                Path(temporary).unlink(missing_ok=True)
                raise _write_error(path, err) from None
        return mended


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _whole_records(line: bytes) -> bytes:
    """The whole records in a damaged line, one per line: after a cut-off record (a partial write
    followed by the next append), or run together (``...}{{"op_code":...``, as writes on a shared
    filesystem have been seen to leave: Optuna #5138). Nothing if none is whole."""
    decoder = json.JSONDecoder()
    text = line.decode("utf-8", errors="replace")
    marker = RECORD_START.decode()
    kept = []
    start = text.find(marker)
    while start >= 0:
        try:
            record, end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find(marker, start + 1)
            continue
        if isinstance(record, dict):
            kept.append(text[start:end] + "\n")
        start = text.find(marker, end)
    return "".join(kept).encode()


SHARED_FILESYSTEMS = (
    "nfs",
    "nfs4",
    "gpfs",
    "lustre",
    "beegfs",
    "cifs",
    "smb3",
    "ceph",
    "glusterfs",
    "fuse.sshfs",
)
"""Filesystem types whose clients cache: appends from processes on several nodes can be lost or
run together, whatever the lock (Optuna #5138)."""


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (its longest mount point in /proc/mounts)."""
    best, kind = "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    target = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def shared_filesystem_warning(path: Path, what: str = "journal") -> str | None:
    """A warning for a journal (or, ``what``, a SQLite database file) that trials on several nodes
    would write over a shared filesystem."""
    kind = filesystem_type(path.parent)
    if kind not in SHARED_FILESYSTEMS:
        return None
    risk = (
        "append to it through client caches that can lose or run together writes (the service "
        "mends what it can read when it opens the journal)"
        if what == "journal"
        # SQLite's own documentation: its file locks are unreliable over network filesystems.
        else "write it under file locks that network filesystems do not keep reliably, which can "
        "corrupt the database"
    )
    return (
        f"study.storage: the {what} {path} is on {kind}, a shared filesystem: trial jobs on several "
        f"nodes {risk}; for trials on many nodes use PostgreSQL (deploy/postgresql/README.md)"
    )
