"""Where a study lives: the embedded default (an Optuna journal file) or a database server.

The embedded default is Optuna's journal storage on a file in the study's workdir: an append-only
log guarded by a file lock, so several trial processes on one machine write to it at once without
SQLite's "database is locked". PostgreSQL (or MySQL) is for the shared case: trial jobs on many
nodes, several launchers, optuna-dashboard from a login node.

Passwords never travel in URLs: a URL is stripped of its password, which goes to ``PGPASSWORD``
(inherited by local trial processes and by Slurm jobs, which receive the submitter's
environment), and every URL the service prints is masked. ``~/.pgpass`` works as it does for psql.
"""

from __future__ import annotations

import importlib.util
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import optuna
from optuna.storages.journal import JournalFileBackend
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
)

from hpo.errors import NotReadyError, StudyFileError, one_line
from hpo.paths import private_dir

T = TypeVar("T")

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from hpo.config import StudySpec

JOURNAL_PREFIX = "journal:"
RDB_SCHEMES = ("postgresql", "postgres", "mysql", "sqlite")
_PASSWORD_ENV = {"postgresql": "PGPASSWORD", "mysql": "MYSQL_PWD"}


@dataclass(frozen=True)
class StorageRef:
    """A storage location without secrets: safe to pickle into a job and to print."""

    kind: Literal["journal", "rdb"]
    target: str
    """The journal file's absolute path, or a SQLAlchemy URL without password."""

    def __str__(self) -> str:
        return f"{JOURNAL_PREFIX}{self.target}" if self.kind == "journal" else self.target


def resolve_storage(spec: StudySpec, url: str | None, source: str) -> StorageRef:
    """Turn the study's storage setting (or ``--storage``) into a :class:`StorageRef`.

    A password found in the URL is moved to the environment variable its driver reads.
    """
    if not url:
        return StorageRef("journal", str(spec.workdir / "optuna.journal"))
    if url.startswith(JOURNAL_PREFIX):
        path = url[len(JOURNAL_PREFIX) :].removeprefix("//")
        if not path:
            raise StudyFileError(f"{source}: study.storage: journal: needs a file path, got {url!r}")
        return StorageRef("journal", str(Path(path).expanduser().absolute()))

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StudyFileError(f"{source}: study.storage: not a storage URL: {mask(url)!r}") from None
    scheme = parsed.get_backend_name()
    if scheme == "postgres":
        parsed = parsed.set(drivername="postgresql")
        scheme = "postgresql"
    if scheme not in RDB_SCHEMES:
        raise StudyFileError(
            f"{source}: study.storage: unsupported scheme {scheme!r}; use postgresql://, mysql://, "
            "sqlite:/// or journal:PATH"
        )
    driver = parsed.get_driver_name()
    if scheme == "postgresql" and "+" in parsed.drivername and importlib.util.find_spec(driver) is None:
        # Optuna's documentation writes postgresql+psycopg2://; the service installs psycopg 3, which
        # a plain postgresql:// URL reaches. Same server, same database: only the client differs.
        parsed = parsed.set(drivername="postgresql")
    if scheme == "sqlite" and parsed.database not in (None, "", ":memory:"):
        parsed = parsed.set(database=str(Path(parsed.database).expanduser().absolute()))
    if parsed.password:
        env_name = _PASSWORD_ENV.get(scheme)
        if env_name is None:
            raise StudyFileError(f"{source}: study.storage: {scheme} URLs take no password")
        os.environ[env_name] = str(parsed.password)
        parsed = parsed._replace(password=None)  # URL.set() ignores None: it would keep the password
    return StorageRef("rdb", parsed.render_as_string(hide_password=False))


def has_password(url: str) -> bool:
    if url.startswith(JOURNAL_PREFIX):
        return False

    try:
        return make_url(url).password is not None
    except ArgumentError:
        return False


def mask(url: str) -> str:
    """The URL with any password replaced by ``***``."""
    if url.startswith(JOURNAL_PREFIX):
        return url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url.split("@")[-1] if "@" in url else url


def open_storage(ref: StorageRef, *, create: bool) -> BaseStorage:
    """Connect to the storage. ``create=True`` (the launcher) creates the schema; trial
    processes pass ``create=False`` so that many of them starting at once run no DDL."""

    if ref.kind == "journal":
        path = Path(ref.target)
        if create:
            private_dir(path.parent)
        elif not path.exists():
            raise FileNotFoundError(f"journal storage {path} does not exist")

        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    engine_kwargs: dict[str, object] = {"pool_pre_ping": True}
    if not ref.target.startswith("sqlite"):
        # A process (trial, launcher, worker) keeps one connection: 64 trials and their launcher
        # stay under PostgreSQL's default max_connections of 100. Optuna needs a second one at
        # moments (creating the schema: with none, a crowd of processes deadlocks); such overflow
        # connections close when returned. connect_timeout bounds the wait on a dead host.
        engine_kwargs.update(pool_size=1, max_overflow=2, pool_recycle=3600)
        if ref.target.startswith("postgresql"):
            engine_kwargs["connect_args"] = {"connect_timeout": 10}
    return optuna.storages.RDBStorage(
        ref.target,
        engine_kwargs=engine_kwargs,
        skip_table_creation=not create,
        skip_compatibility_check=not create,
    )


def _create_schema_with_retries(ref: StorageRef, attempts: int = 8) -> BaseStorage:
    """Processes creating the schema of a fresh database at once: one's CREATE TABLE, or its insert
    of the schema version (which Optuna wraps in StorageInternalError), fails on another's; a retry
    then finds them and goes on. The random wait spreads the retries of a crowd."""

    for attempt in range(attempts):
        try:
            return open_storage(ref, create=True)
        except (IntegrityError, ProgrammingError, optuna.exceptions.StorageInternalError):
            if attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0.1, 0.3) * (attempt + 1))
    raise AssertionError("unreachable")


def check_reachable(ref: StorageRef, source: str) -> BaseStorage:
    """Open the storage for the launcher, creating its schema; a failure is a one-line error."""
    try:
        return _create_schema_with_retries(ref)
    except Exception as err:  # the drivers raise many types; all mean "cannot use this storage"
        raise NotReadyError(
            f"{source}: study.storage: cannot open {mask(str(ref))}: {one_line(getattr(err, 'orig', None) or err, name=False)}",
            "start the database server, or name another with --storage URL",
        ) from None


OUTAGE_TOLERANCE_S = 600.0
"""How long a trial process or the launcher waits for an unreachable database before failing."""


def is_transient(err: BaseException) -> bool:
    """Whether an error means "the database cannot be reached right now" (a restart, a network
    cut) rather than a wrong request. Optuna's RDB storage wraps SQLAlchemy's errors."""

    if isinstance(err, optuna.exceptions.StorageInternalError):
        err = err.__cause__ or err
    if not isinstance(err, DBAPIError):
        return False
    text = str(err.orig).lower()
    if any(marker in text for marker in _PERMANENT):
        return False  # the server answers, and says no: waiting will not change it
    return isinstance(err, OperationalError | InterfaceError) or bool(err.connection_invalidated)


# Connection errors that a restart does not cure (libpq's wording).
_PERMANENT = ("does not exist", "authentication failed", "no password supplied", "permission denied")


def with_retries(
    call: Callable[[], T],
    what: str,
    log: Callable[[str], None] = print,
    tolerance_s: float = OUTAGE_TOLERANCE_S,
) -> T:
    """Run ``call``; while the database is unreachable, retry with backoff (0.5 s doubling to
    30 s) for up to ``tolerance_s``. SQLAlchemy's pre-ping replaces the dead pooled connections."""
    delay = 0.5
    give_up = time.monotonic() + tolerance_s
    while True:
        try:
            return call()
        except Exception as err:
            if not is_transient(err) or time.monotonic() + delay > give_up:
                raise
            cause = one_line(getattr(err, "__cause__", None) or err, name=False)
            log(f"storage unreachable during {what} ({cause}); retrying in {delay:.1f} s")
            time.sleep(delay)
            delay = min(2 * delay, 30.0)
