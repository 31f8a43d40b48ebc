"""One launcher per study: a lock held for as long as the launcher process lives.

Two launchers on one study (a relaunch while a ``--detach`` launcher is alive, the same command
in two terminals) would each keep ``max_concurrent`` trials in flight and each fill the budget.
The lock is the storage's own (``StorageRef.launcher_lock``, ``hpo.locks``), so that it is released
the moment its holder dies, with no expiry to wait for: a PostgreSQL session advisory lock (MySQL:
``GET_LOCK``) on a connection of its own, or ``flock`` on a file beside the journal or SQLite file.
A dead launcher's PostgreSQL session is ended by TCP keepalives within about half a minute when
its node is lost.

A database outage ends the lock's session: the launcher takes the lock again before its next
submission, and stops (its trials keep running) if another launcher took the study meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

from hpo import executors
from hpo.errors import LaunchError, NotReadyError
from hpo.locks import Lock
from hpo.outages import OUTAGE_TOLERANCE_S, with_retries
from hpo.storage import StorageRef, mask


def holder_description() -> str:
    """Who this launcher is, as another launcher is told: pid, host, its job if it runs in one."""
    executor = executors.here()
    job = executor.current_job()
    return f"pid {os.getpid()} on {socket.gethostname()}" + (
        f", {executor.queue_name} job {job}" if job else ""
    )


class StudyBusy(NotReadyError):
    """Another live launcher holds the study."""


class Lease:
    """The study's launcher lock, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, storage: StorageRef, study_name: str) -> None:
        self.storage = storage
        self.study_name = study_name
        self._lock: Lock | None = None

    def _try_acquire(self, tolerance_s: float = OUTAGE_TOLERANCE_S) -> str | None:
        """Take the lock; None on success, else who holds it."""
        if self._lock is None:
            self._lock = self.storage.launcher_lock(self.study_name, holder_description())
        # A file's lock raises nothing that is waited for: only a database's outages are.
        return with_retries(
            self._lock.take, "take the launcher lock", tolerance_s=tolerance_s, where=mask(str(self.storage))
        )

    def acquire(self) -> None:
        holder = self._try_acquire(tolerance_s=0)  # at launch, a database that is down is said at once
        if holder is not None:
            raise StudyBusy(
                f"study {self.study_name!r} is being launched by {holder}",
                "wait for that launcher (`hpo status` follows the study) or stop it with `hpo cancel`",
            )

    def confirm(self) -> None:
        """Before a submission: still the holder? After a database outage the lock's session is
        gone; take the lock again, or stop if another launcher took the study meanwhile."""
        if self._lock is None or self._lock.still_held():
            return
        holder = self._try_acquire()
        if holder is not None:
            raise LaunchError(
                f"study {self.study_name!r} was taken over by {holder} while this launcher's lock "
                "session was gone (a database outage, or this launcher frozen or cut off past the "
                "server's keepalives); this launcher stops before it submits again (the trials in "
                "flight run on, watched by that launcher)"
            )

    def held_by_another(self) -> str | None:
        """Who holds the study's lock, without keeping it (for `hpo cancel`); None if nobody."""
        holder = self._try_acquire(tolerance_s=0)
        self.release()
        return holder

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()


@contextlib.contextmanager
def held(storage: StorageRef, study_name: str) -> Iterator[Lease]:
    """The study's lease for the duration of a launch; :class:`StudyBusy` if another has it."""
    lease = Lease(storage, study_name)
    lease.acquire()
    try:
        yield lease
    finally:
        lease.release()
