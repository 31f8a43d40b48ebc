"""Where a study lives: the embedded default (an Optuna journal file) or a database server.

The embedded default is Optuna's journal storage on a file in the study's workdir: an append-only
log guarded by a file lock, so several trial processes on one machine write to it at once without
SQLite's "database is locked". PostgreSQL (or MySQL) is for the shared case: trial jobs on many
nodes, several launchers, optuna-dashboard from a login node.

Passwords never travel in URLs: a URL is stripped of its password, which goes to ``PGPASSWORD``
(``MYSQL_PWD`` for MySQL, inherited by local trial processes and by Slurm jobs, which receive the submitter's
environment), and every URL the service prints is masked. ``~/.pgpass`` works as it does for psql.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import optuna
from optuna.storages import BaseStorage

from hpo import locks
from hpo.errors import NotReadyError, StudyFileError, one_line
from hpo.journal import SafeJournalBackend, cannot_write, repair
from hpo.outages import OUTAGE_TOLERANCE_S, OutageTolerantStorage
from hpo.paths import NOT_WRITABLE, denied, private_dir
from hpo.rdb import connect_args, rdb_storage_class

# SQLAlchemy (and Optuna's RDB storage, which imports it) is imported where a database URL is
# handled: a fifth of a second of CPU that every process of a journal study (each trial's job, each
# `hpo` command) would otherwise spend for nothing.
if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from hpo.config import StudySpec

JOURNAL_PREFIX = "journal:"
DEFAULT_JOURNAL = "optuna.journal"
"""The embedded default's file, in the study's workdir."""
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

    @classmethod
    def parse(cls, text: str) -> StorageRef:
        """The inverse of ``str()`` (a recorded launch's storage)."""
        if text.startswith(JOURNAL_PREFIX):
            return cls("journal", text[len(JOURNAL_PREFIX) :])
        return cls("rdb", text)

    # What differs between the kinds, asked here so that no other module tests which kind it is.
    @property
    def journal_file(self) -> Path | None:
        """The embedded journal's file; None for a database."""
        return Path(self.target) if self.kind == "journal" else None

    @property
    def missing(self) -> bool:
        """Whether the storage certainly holds no study: a journal file not written yet (a
        database is asked)."""
        return self.kind == "journal" and not Path(self.target).exists()

    def launcher_lock(self, study_name: str, holder: str) -> locks.Lock:
        """The study's launcher lock (``hpo.dispatch.lease``), the storage's own: ``flock`` on a
        file beside the journal or SQLite file, else the database server's session lock."""
        if self.kind == "journal" or self.target.startswith("sqlite"):
            base = Path(self.target if self.kind == "journal" else _sqlite_file(self.target))
            digest = hashlib.sha256(study_name.encode()).hexdigest()[:12]
            return locks.FileLock(base.with_name(f"{base.name}.launcher-{digest}.lock"), holder)
        key = f"hpo-launcher:{study_name}"
        if self.target.startswith("postgresql"):
            return locks.AdvisoryLock(self.target, key, holder)
        return locks.NamedLock(self.target, key, holder)


def _sqlite_file(url: str) -> str:
    from sqlalchemy.engine import make_url

    return str(make_url(url).database)


def journal_file(setting: str | None) -> Path | None:
    """The journal file a study's storage setting names (``journal:PATH``, the path as written);
    None for a database URL or no setting (see :func:`resolve_storage`)."""
    if setting and setting.startswith(JOURNAL_PREFIX):
        return Path(setting[len(JOURNAL_PREFIX) :])
    return None


def storage_file(setting: str | None) -> tuple[Path, str] | None:
    """The file a study's storage setting names and what it is (``journal``, ``database file``):
    a journal's, or a SQLite database's (the path as written). The launcher checks it as it checks
    a journal: writable with its folder (SQLite writes its rollback journal beside it), and not on
    a shared filesystem. None for a database server or no setting."""
    if (journal := journal_file(setting)) is not None:
        return journal, "journal"
    if setting and setting.startswith("sqlite:"):
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            database = make_url(setting).database
        except ArgumentError:
            return None  # not a URL: resolving the storage says so, naming the key
        if database not in (None, "", ":memory:"):
            return Path(database), "database file"
    return None


def default_storage(workdir: Path) -> StorageRef:
    """The embedded default: a journal file in the study's workdir."""
    return StorageRef("journal", str(workdir / DEFAULT_JOURNAL))


def resolve_storage(spec: StudySpec, url: str | None, source: str) -> StorageRef:
    """Turn the study's storage setting (or ``--storage``) into a :class:`StorageRef`.

    A password found in the URL is moved to the environment variable its driver reads.
    """
    if not url:
        return default_storage(spec.workdir)
    return resolve_url(url, source)


def resolve_url(url: str, source: str) -> StorageRef:
    """A storage URL (``journal:PATH`` or a database URL) as a :class:`StorageRef`; see
    :func:`resolve_storage`."""
    if url.startswith(JOURNAL_PREFIX):
        path = url[len(JOURNAL_PREFIX) :].removeprefix("//")
        if not path:
            raise StudyFileError(f"{source}: study.storage: journal: needs a file path, got {url!r}")
        return StorageRef("journal", str(Path(path).expanduser().absolute()))

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

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
    if scheme == "mysql" and "+" not in parsed.drivername:
        # SQLAlchemy's default MySQL driver (mysqlclient) needs a C client library to build; the
        # service installs PyMySQL (the mysql extra), which the same server answers.
        parsed = parsed.set(drivername="mysql+pymysql")
    if scheme == "sqlite" and parsed.database not in (None, "", ":memory:"):
        parsed = parsed.set(database=str(Path(parsed.database).expanduser().absolute()))
    password = _url_password(parsed)
    if password is not None:
        env_name = _PASSWORD_ENV.get(scheme)
        if env_name is None:
            raise StudyFileError(f"{source}: study.storage: {scheme} URLs take no password")
        os.environ[env_name] = password
        # URL.set() ignores None: it would keep the password.
        parsed = parsed._replace(password=None).difference_update_query(["password"])
    if scheme == "postgresql" and not os.environ.get("PGPASSWORD"):  # else libpq reads no file
        _check_passfile(parsed, source)
    return StorageRef("rdb", parsed.render_as_string(hide_password=False))


def _url_password(parsed: URL) -> str | None:
    """The password a URL carries, in either form libpq (and SQLAlchemy's drivers) accept:
    ``user:password@host`` or ``?password=...``."""
    if parsed.password is not None:
        return str(parsed.password)
    value = parsed.query.get("password")
    if value is None:
        return None
    return value if isinstance(value, str) else value[-1]


def _check_passfile(parsed: URL, source: str) -> None:
    """libpq ignores a password file that others can read (with only a warning on stderr, then
    "no password supplied"): say which file and why before anything starts."""
    named = parsed.query.get("passfile")
    if named is not None:
        path, key = (
            Path(named if isinstance(named, str) else named[-1]).expanduser(),
            "study.storage: passfile",
        )
    elif os.environ.get("PGPASSFILE"):
        path, key = Path(os.environ["PGPASSFILE"]).expanduser(), "PGPASSFILE"
    else:
        path, key = Path.home() / ".pgpass", "~/.pgpass"
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & 0o077:
        raise StudyFileError(
            f"{source}: {key}: {path} can be read by others (mode {mode & 0o777:o}), so libpq ignores it: "
            f"chmod 600 {path}"
        )


def has_password(url: str) -> bool:
    """Whether a URL carries a password, as ``user:password@`` or ``?password=``."""
    if url.startswith(JOURNAL_PREFIX):
        return False
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return _url_password(make_url(url)) is not None
    except ArgumentError:
        return bool(_QUERY_PASSWORD.search(url))


# A password in a query string, however it is spelled (URL-encoded key included).
_QUERY_PASSWORD = re.compile(r"(?i)((?:^|[?&;\s])(?:password|%70assword)=)[^&;\s]*")


def mask(url: str) -> str:
    """The URL with any password, in either form, replaced by ``***``."""
    if url.startswith(JOURNAL_PREFIX):
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        url = url.split("@")[-1] if "@" in url else url
        return _QUERY_PASSWORD.sub(r"\1***", url)
    if "password" not in parsed.query:
        return parsed.render_as_string(hide_password=True)
    shown = parsed.difference_update_query(["password"]).render_as_string(hide_password=True)
    return shown + ("&" if "?" in shown else "?") + "password=***"


def open_storage(
    ref: StorageRef,
    *,
    create: bool,
    log: Callable[[str], None] = print,
    tolerance_s: float = OUTAGE_TOLERANCE_S,
) -> BaseStorage:
    """Connect to the storage. ``create=True`` (the launcher) creates the schema; trial
    processes pass ``create=False`` so that many of them starting at once run no DDL. A database
    server's storage waits out outages up to ``tolerance_s`` (:class:`OutageTolerantStorage`),
    saying so through ``log``; a view passes 0 to answer at once."""

    if ref.kind == "journal":
        try:
            return _open_journal(Path(ref.target), create=create, log=log)
        except OSError as err:
            # Creating the journal or its folder, or mending it: the launcher's pre-flight check
            # says so first, naming the study file's key; this is the same line past that check.
            if err.errno not in NOT_WRITABLE:
                raise
            raise cannot_write(ref.target, denied(err)) from None
    return OutageTolerantStorage(_open_rdb(ref, create=create), log, tolerance_s, where=mask(ref.target))


def _open_journal(path: Path, *, create: bool, log: Callable[[str], None]) -> BaseStorage:
    if create:
        private_dir(path.parent)
    elif not path.exists():
        raise FileNotFoundError(f"journal storage {path} does not exist")
    try:
        return optuna.storages.JournalStorage(SafeJournalBackend(str(path)))
    except ValueError:  # an invalid line (JSONDecodeError is one): an older writer's damage
        if repair(str(path)):  # none left: another process mended it a moment ago
            log(f"journal {path}: damaged lines mended (each set aside whole in {path}.partial)")
        return optuna.storages.JournalStorage(SafeJournalBackend(str(path)))


def _open_rdb(ref: StorageRef, *, create: bool) -> optuna.storages.RDBStorage:
    engine_kwargs: dict[str, object] = {"pool_pre_ping": True}
    if not ref.target.startswith("sqlite"):
        # A process (trial, launcher, worker) keeps one connection: 64 trials and their launcher
        # stay under PostgreSQL's default max_connections of 100. Optuna needs a second one at
        # moments (creating the schema: with none, a crowd of processes deadlocks); such overflow
        # connections close when returned. connect_timeout bounds the wait on a dead host.
        engine_kwargs.update(
            pool_size=1, max_overflow=2, pool_recycle=3600, connect_args=connect_args(ref.target)
        )
    storage = rdb_storage_class()(
        ref.target,
        engine_kwargs=engine_kwargs,
        skip_table_creation=not create,
        skip_compatibility_check=not create,
    )
    if not create:
        # Optuna's open queried the database (its version tables, now asked on demand): a server
        # that does not answer is still found here, where the callers name the study file's key.
        # The connection stays in the pool for the first query.
        with storage.engine.connect():
            pass
    return storage


def _create_schema_with_retries(ref: StorageRef, attempts: int = 8) -> optuna.storages.RDBStorage:
    """Processes creating the schema of a fresh database at once: one's CREATE TABLE, or its insert
    of the schema version (which Optuna wraps in StorageInternalError), fails on another's; a retry
    then finds them and goes on. The random wait spreads the retries of a crowd."""

    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(attempts):
        try:
            return _open_rdb(ref, create=True)
        except (IntegrityError, ProgrammingError, optuna.exceptions.StorageInternalError):
            if attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0.1, 0.3) * (attempt + 1))
    raise AssertionError("unreachable")


def check_reachable(ref: StorageRef, source: str, log: Callable[[str], None] = print) -> BaseStorage:
    """Open the storage for the launcher, creating its schema; a failure is a one-line error."""
    if ref.kind == "journal":
        return open_storage(ref, create=True)
    try:
        return OutageTolerantStorage(_create_schema_with_retries(ref), log, where=mask(ref.target))
    except Exception as err:  # the drivers raise many types; all mean "cannot use this storage"
        raise NotReadyError(
            f"{source}: study.storage: cannot open {mask(str(ref))}: {one_line(getattr(err, 'orig', None) or err, name=False)}",
            "start the database server, or name another with --storage URL",
        ) from None


def log_outages_to(storage: BaseStorage, log: Callable[[str], None]) -> None:
    """Say a database's outages through ``log`` from now on (a journal has none to say)."""
    if isinstance(storage, OutageTolerantStorage):
        storage.log = log
