"""The storages' own locks, each released the moment its holder dies: ``flock`` on a file (beside a
journal or SQLite file), a PostgreSQL session advisory lock, MySQL's ``GET_LOCK``, the last two on
a connection of their own. ``hpo.storage`` picks the one a storage has
(``StorageRef.launcher_lock``); ``hpo.dispatch.lease`` holds one per study for its launcher.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hpo.paths import private_dir
from hpo.rdb import connect_args

if TYPE_CHECKING:
    import sqlalchemy  # imported where a database lock connects: a journal study needs none


class Lock(Protocol):
    """A named lock of a storage, taken without waiting."""

    def take(self) -> str | None:
        """Take the lock: None on success, else who holds it."""

    def still_held(self) -> bool:
        """False when the lock's session is gone (a database outage): take it again."""

    def release(self) -> None:
        """Let the lock go (nothing if not held)."""


class FileLock:
    """``flock`` on a file, which says its holder to a process that is refused."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = path
        self.holder = holder
        self._file: Any = None

    def take(self) -> str | None:
        private_dir(self.path.parent)
        handle = open(self.path, "a+")  # noqa: SIM115 - held open for as long as the lock
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another launcher"
            handle.close()
            return holder
        handle.seek(0)
        handle.truncate()
        handle.write(f"{self.holder}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._file = handle
        return None

    def still_held(self) -> bool:
        return True  # a file lock lasts as long as this process

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor drops the flock
            self._file = None


class _SessionLock:
    """A database server's lock held by a session: the connection is kept for as long as it."""

    def __init__(self, url: str, key: str, holder: str) -> None:
        self.url = url
        self.key = key
        self.holder = holder
        self.connect_args = connect_args(url)
        self._connection: sqlalchemy.Connection | None = None
        self._engine: sqlalchemy.Engine | None = None

    def _connect(self) -> sqlalchemy.Connection:
        import sqlalchemy

        if self._engine is None:
            self._engine = sqlalchemy.create_engine(
                self.url, poolclass=sqlalchemy.pool.NullPool, connect_args=self.connect_args
            )
        return self._engine.connect()

    def _try(self, connection: sqlalchemy.Connection) -> bool:
        raise NotImplementedError

    def _holder(self, connection: sqlalchemy.Connection) -> str:
        raise NotImplementedError

    def take(self) -> str | None:
        connection = self._connect()
        got = self._try(connection)
        connection.commit()  # the lock is the session's, not the transaction's
        if got:
            self._connection = connection
            return None
        try:
            return self._holder(connection)
        finally:
            connection.close()

    def still_held(self) -> bool:
        if self._connection is None:
            return True  # not taken: nothing to lose
        from sqlalchemy.exc import DBAPIError

        try:
            self._connection.exec_driver_sql("SELECT 1")
            return True
        except DBAPIError:
            with contextlib.suppress(Exception):
                self._connection.close()
            self._connection = None
            return False

    def release(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.close()  # ending the session drops its lock
            self._connection = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


class AdvisoryLock(_SessionLock):
    """PostgreSQL's session advisory lock; its holder is named in ``pg_stat_activity``. A dead
    holder's session is ended by TCP keepalives within about half a minute when its node is lost."""

    def __init__(self, url: str, key: str, holder: str) -> None:
        super().__init__(url, key, holder)
        # The holder's name, for the process that is refused (pg_stat_activity), and the lock's
        # connection timeout.
        self.connect_args["application_name"] = holder[:63]

    def _number(self) -> int:
        # PostgreSQL's advisory locks take a signed 64-bit key.
        return int.from_bytes(hashlib.sha256(self.key.encode()).digest()[:8], "big", signed=True)

    def _connect(self) -> sqlalchemy.Connection:
        connection = super()._connect()
        # Keepalives from the server's side: a lost node's session (and its lock) ends in about
        # 30 s instead of the kernel's two hours.
        for setting, value in (("idle", 15), ("interval", 5), ("count", 3)):
            connection.exec_driver_sql(f"SET tcp_keepalives_{setting} = {value}")
        return connection

    def _try(self, connection: sqlalchemy.Connection) -> bool:
        return bool(connection.exec_driver_sql(f"SELECT pg_try_advisory_lock({self._number()})").scalar())

    def _holder(self, connection: sqlalchemy.Connection) -> str:
        number = self._number()
        row = connection.exec_driver_sql(
            "SELECT a.application_name, a.backend_start FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
            f"AND l.classid = {(number >> 32) & 0xFFFFFFFF} AND l.objid = {number & 0xFFFFFFFF}"
        ).first()
        if row is None:
            return "another launcher"
        since = row[1].astimezone().strftime("%Y-%m-%d %H:%M:%S") if row[1] else "?"
        return f"{row[0] or 'another launcher'}, since {since}"


class NamedLock(_SessionLock):
    """MySQL's (and MariaDB's) ``GET_LOCK``. MySQL keeps no name of a session that another session
    can read (PostgreSQL's ``application_name``), so the holder writes its own name into a table of
    the database once it has the lock, and a refused launcher reads it there: a row left by a
    holder that died is overwritten by the next one to take the lock."""

    TABLE = "hpo_launcher_locks"

    @property
    def _name(self) -> str:
        # GET_LOCK takes names of at most 64 characters: a long study name keeps its own lock.
        if len(self.key) <= 64:
            return self.key
        return f"{self.key[:51]}~{hashlib.sha256(self.key.encode()).hexdigest()[:12]}"

    def _try(self, connection: sqlalchemy.Connection) -> bool:
        from sqlalchemy.exc import DBAPIError

        if not connection.exec_driver_sql("SELECT GET_LOCK(%s, 0)", (self._name,)).scalar():
            return False
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            connection.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {self.TABLE} (name VARCHAR(64) PRIMARY KEY, holder VARCHAR(255) NOT NULL)"
            )
            connection.exec_driver_sql(
                f"REPLACE INTO {self.TABLE} (name, holder) VALUES (%s, %s)",
                (self._name, f"{self.holder[:200]}, since {since}"),
            )
        except DBAPIError:  # a user who may not create tables: the lock holds, unnamed
            connection.rollback()
        return True

    def _holder(self, connection: sqlalchemy.Connection) -> str:
        from sqlalchemy.exc import DBAPIError

        try:
            row = connection.exec_driver_sql(
                f"SELECT holder FROM {self.TABLE} WHERE name = %s", (self._name,)
            ).first()
        except DBAPIError:  # no table yet: the holder took the lock a moment ago
            row = None
        if row is not None:
            return str(row[0])
        connection_id = connection.exec_driver_sql("SELECT IS_USED_LOCK(%s)", (self._name,)).scalar()
        return f"the launcher on database connection {connection_id}"
