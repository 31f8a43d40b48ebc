"""One launcher per study: a lock held for as long as the launcher process lives.

Two launchers on one study (a relaunch while a ``--detach`` launcher is alive, the same command
in two terminals) would each keep ``max_concurrent`` trials in flight and each fill the budget.
The lock is the storage's own, so that it is released the moment its holder dies, with no expiry
to wait for: a PostgreSQL session advisory lock (MySQL: ``GET_LOCK``) on a connection of its own,
or ``flock`` on a file beside the journal or SQLite file. A dead launcher's PostgreSQL session is
ended by TCP keepalives within about half a minute when its node is lost.

A database outage ends the lock's session: the launcher takes the lock again before its next
submission, and stops (its trials keep running) if another launcher took the study meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy

from hpo.errors import LaunchError, NotReadyError
from hpo.paths import private_dir
from hpo.storage import OUTAGE_TOLERANCE_S, StorageRef, mask, with_retries


def holder_description() -> str:
    """Who this launcher is, as another launcher is told: pid, host, Slurm job if any."""
    job = os.environ.get("SLURM_JOB_ID")
    return f"pid {os.getpid()} on {socket.gethostname()}" + (f", Slurm job {job}" if job else "")


class StudyBusy(NotReadyError):
    """Another live launcher holds the study."""


class Lease:
    """The study's launcher lock, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, storage: StorageRef, study_name: str) -> None:
        self.storage = storage
        self.study_name = study_name
        self.key = f"hpo-launcher:{study_name}"
        self._file: Any = None
        self._connection: sqlalchemy.Connection | None = None
        self._engine: sqlalchemy.Engine | None = None

    # --- the file lock (journal and SQLite) -------------------------------------------------
    def _lock_path(self) -> Path:
        if self.storage.kind == "journal":
            base = Path(self.storage.target)
        else:
            base = Path(str(sqlalchemy.make_url(self.storage.target).database))
        digest = hashlib.sha256(self.study_name.encode()).hexdigest()[:12]
        return base.with_name(f"{base.name}.launcher-{digest}.lock")

    def _acquire_file(self) -> str | None:
        path = self._lock_path()
        private_dir(path.parent)
        handle = open(path, "a+")  # noqa: SIM115 - held open for as long as the lock
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another launcher"
            handle.close()
            return holder
        handle.seek(0)
        handle.truncate()
        handle.write(f"{holder_description()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._file = handle
        return None

    # --- the database lock (PostgreSQL, MySQL) ----------------------------------------------
    def _is_postgresql(self) -> bool:
        return self.storage.target.startswith("postgresql")

    def _lock_number(self) -> int:
        # PostgreSQL's advisory locks take a signed 64-bit key.
        return int.from_bytes(hashlib.sha256(self.key.encode()).digest()[:8], "big", signed=True)

    def _connect(self) -> sqlalchemy.Connection:
        if self._engine is None:
            connect_args: dict[str, Any] = {}
            if self._is_postgresql():
                # The holder's name, for the launcher that is refused (pg_stat_activity), and
                # the lock's connection timeout.
                connect_args = {"application_name": holder_description()[:63], "connect_timeout": 10}
            self._engine = sqlalchemy.create_engine(
                self.storage.target, poolclass=sqlalchemy.pool.NullPool, connect_args=connect_args
            )
        connection = self._engine.connect()
        if self._is_postgresql():
            # Keepalives from the server's side: a lost node's session (and its lock) ends in
            # about 30 s instead of the kernel's two hours.
            for setting, value in (("idle", 15), ("interval", 5), ("count", 3)):
                connection.exec_driver_sql(f"SET tcp_keepalives_{setting} = {value}")
        return connection

    def _acquire_database(self) -> str | None:
        connection = self._connect()
        if self._is_postgresql():
            got = connection.exec_driver_sql(f"SELECT pg_try_advisory_lock({self._lock_number()})").scalar()
        else:
            got = connection.exec_driver_sql("SELECT GET_LOCK(%s, 0)", (self.key[:64],)).scalar()
        connection.commit()  # the lock is the session's, not the transaction's
        if got:
            self._connection = connection
            return None
        try:
            return self._database_holder(connection)
        finally:
            connection.close()

    def _database_holder(self, connection: sqlalchemy.Connection) -> str:
        if not self._is_postgresql():
            holder = connection.exec_driver_sql("SELECT IS_USED_LOCK(%s)", (self.key[:64],)).scalar()
            return f"the launcher on database connection {holder}"
        number = self._lock_number()
        row = connection.exec_driver_sql(
            "SELECT a.application_name, a.backend_start FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
            f"AND l.classid = {(number >> 32) & 0xFFFFFFFF} AND l.objid = {number & 0xFFFFFFFF}"
        ).first()
        if row is None:
            return "another launcher"
        since = row[1].astimezone().strftime("%Y-%m-%d %H:%M:%S") if row[1] else "?"
        return f"{row[0] or 'another launcher'}, since {since}"

    # --- the lease ----------------------------------------------------------------------------
    def _try_acquire(self, tolerance_s: float = OUTAGE_TOLERANCE_S) -> str | None:
        """Take the lock; None on success, else who holds it."""
        if self.storage.kind == "journal" or self.storage.target.startswith("sqlite"):
            return self._acquire_file()
        return with_retries(
            self._acquire_database,
            "take the launcher lock",
            tolerance_s=tolerance_s,
            where=mask(str(self.storage)),
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
        if self._connection is None:
            return  # a file lock lasts as long as this process
        try:
            self._connection.exec_driver_sql("SELECT 1")
            return
        except sqlalchemy.exc.DBAPIError:
            with contextlib.suppress(Exception):
                self._connection.close()
            self._connection = None
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
        if self._file is not None:
            self._file.close()  # closing the descriptor drops the flock
            self._file = None
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.close()  # ending the session drops its advisory lock
            self._connection = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


@contextlib.contextmanager
def held(storage: StorageRef, study_name: str) -> Iterator[Lease]:
    """The study's lease for the duration of a launch; :class:`StudyBusy` if another has it."""
    lease = Lease(storage, study_name)
    lease.acquire()
    try:
        yield lease
    finally:
        lease.release()
