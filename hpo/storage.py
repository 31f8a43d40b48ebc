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

import hashlib
import importlib.util
import os
import random
import re
import sys
import time
import types
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from hpo import locks
from hpo.errors import NotReadyError, StudyFileError, one_line
from hpo.journal import SafeJournalBackend, cannot_write, repair
from hpo.paths import NOT_WRITABLE, denied, private_dir
from hpo.rdb import rdb_storage_class

T = TypeVar("T")

# SQLAlchemy (and Optuna's RDB storage, which imports it) is imported where a database URL is
# handled: a fifth of a second of CPU that every process of a journal study (each trial's job, each
# `hpo` command) would otherwise spend for nothing.
if TYPE_CHECKING:
    from optuna.study._frozen import FrozenStudy  # Optuna exports no public name for it
    from sqlalchemy.engine import URL

    from hpo.config import StudySpec

JOURNAL_PREFIX = "journal:"
DEFAULT_JOURNAL = "optuna.journal"
"""The embedded default's file, in the study's workdir."""
RDB_SCHEMES = ("postgresql", "postgres", "mysql", "sqlite")
_PASSWORD_ENV = {"postgresql": "PGPASSWORD", "mysql": "MYSQL_PWD"}
OUTAGE_TOLERANCE_S = 600.0
"""How long a trial process or the launcher waits for an unreachable database before failing."""


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
    return OutageTolerantStorage(_open_rdb(ref, create=create), log, tolerance_s)


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
        engine_kwargs.update(pool_size=1, max_overflow=2, pool_recycle=3600)
        if ref.target.startswith("postgresql"):
            engine_kwargs["connect_args"] = {"connect_timeout": 10}
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
        return OutageTolerantStorage(_create_schema_with_retries(ref), log)
    except Exception as err:  # the drivers raise many types; all mean "cannot use this storage"
        raise NotReadyError(
            f"{source}: study.storage: cannot open {mask(str(ref))}: {one_line(getattr(err, 'orig', None) or err, name=False)}",
            "start the database server, or name another with --storage URL",
        ) from None


def log_outages_to(storage: BaseStorage, log: Callable[[str], None]) -> None:
    """Say a database's outages through ``log`` from now on (a journal has none to say)."""
    if isinstance(storage, OutageTolerantStorage):
        storage.log = log


class DatabaseUnreachable(NotReadyError):
    """The database server did not answer for as long as the caller was willing to wait."""


def is_transient(err: BaseException) -> bool:
    """Whether an error means "the database cannot be reached right now" (a restart, a network
    cut, a connection dropped mid-commit) rather than a wrong request. Optuna wraps SQLAlchemy's
    errors (``StorageInternalError``) and a rollback on a dead connection raises over the first
    error, so the whole chain of causes is read."""

    if isinstance(err, DatabaseUnreachable):
        return False  # waited for already, as long as the policy allows
    exc = _sqlalchemy_exc()
    if exc is None:
        return False  # no database was ever opened in this process
    seen: set[int] = set()
    found = False
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, exc.DBAPIError):
            if any(marker in str(cause.orig).lower() for marker in _PERMANENT):
                return False  # the server answers, and says no: waiting will not change it
            found = (
                found
                or isinstance(cause, exc.OperationalError | exc.InterfaceError)
                or bool(cause.connection_invalidated)
            )
        elif isinstance(cause, exc.PendingRollbackError | exc.ResourceClosedError):
            found = True  # the session outlived its connection
        cause = cause.__cause__ or cause.__context__
    return found


def _sqlalchemy_exc() -> types.ModuleType | None:
    """SQLAlchemy's exceptions if it is loaded: a process that has not imported it has no
    database error to tell apart."""
    return sys.modules.get("sqlalchemy.exc")


# Errors that a restart does not cure: libpq's wording, then SQLite's (a read-only file or folder,
# a damaged file; "database is locked" is another writer's commit, and is waited out).
_PERMANENT = (
    "does not exist", "authentication failed", "no password supplied", "permission denied",
    "readonly database", "unable to open database file", "malformed", "database or disk is full",
)  # fmt: skip


def driver_line(err: BaseException) -> str:
    """The database driver's own line for an error, under Optuna's and SQLAlchemy's wrappers
    (Optuna's says "invalid data in the commit" whatever the cause)."""
    exc = _sqlalchemy_exc()
    cause: BaseException | None = err
    while cause is not None and exc is not None:
        if isinstance(cause, exc.DBAPIError):
            return one_line(cause.orig or cause, name=False)
        cause = cause.__cause__ or cause.__context__
    return one_line(err, name=False)


def with_retries(
    call: Callable[[], T],
    what: str,
    log: Callable[[str], None] = print,
    tolerance_s: float = OUTAGE_TOLERANCE_S,
    where: str = "the database",
) -> T:
    """Run ``call``; while the database is unreachable, retry with backoff (0.5 s doubling to
    30 s) for up to ``tolerance_s``, then raise :class:`DatabaseUnreachable`. SQLAlchemy's
    pre-ping replaces the dead pooled connections."""
    delay = 0.5
    give_up = time.monotonic() + tolerance_s
    while True:
        try:
            return call()
        except Exception as err:
            if not is_transient(err):
                raise
            cause = driver_line(err)
            if time.monotonic() + delay > give_up:
                waited = f" (waited {tolerance_s:.0f} s)" if tolerance_s > 0 else ""
                raise DatabaseUnreachable(
                    f"cannot reach {where} during {what}{waited}: {cause}",
                    "start the database server, or name another with --storage URL",
                ) from err
            log(f"storage unreachable during {what} ({cause}); retrying in {delay:.1f} s")
            time.sleep(delay)
            delay = min(2 * delay, 30.0)


class OutageTolerantStorage(BaseStorage):
    """A database server's Optuna storage whose every call goes through one outage policy
    (:func:`with_retries`): the launcher, the workers and the trial processes wait out a restart
    at whatever moment it comes, and a view (``tolerance_s=0``) says at once that the server is
    unreachable, with the server and the driver's reason.

    Retrying is safe because Optuna's writes are upserts, except two: a state change that
    committed before its connection dropped is recognised on the retry (the trial already holds
    it), and a trial created by a commit whose answer was lost stays RUNNING with nothing on it,
    which the launcher fails as never submitted (``record.fail_unclaimed``)."""

    def __init__(
        self,
        inner: optuna.storages.RDBStorage,
        log: Callable[[str], None] = print,
        tolerance_s: float = OUTAGE_TOLERANCE_S,
    ) -> None:
        # Optuna's cache of finished trials, as optuna.create_study gives an RDBStorage.
        self._inner = optuna.storages._CachedStorage(inner)
        self._where = mask(inner.url)
        self.log = log
        self.tolerance_s = tolerance_s

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its searcher's study, this storage with it. The builtin print is pickled by
        # its name, which fails where Ray has replaced it in a driver (and fails the Ray job): a
        # copy goes without it and prints all the same.
        state = self.__dict__.copy()
        if isinstance(self.log, types.BuiltinFunctionType):
            state["log"] = None
        # The database storage travels as the state Optuna pickles of it (its URL and engine
        # settings) and is opened again through rdb_storage_class: unpickled as an RDBStorage,
        # it would open before anything in the process replaced Optuna's version manager.
        state["_inner"] = self._inner._backend.__getstate__()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        inner_state = state.pop("_inner")
        self.__dict__.update(state)
        if self.log is None:
            self.log = print
        rdb_class = rdb_storage_class()
        inner = rdb_class.__new__(rdb_class)
        inner.__setstate__(inner_state)
        self._inner = optuna.storages._CachedStorage(inner)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        return with_retries(call, what, self.log, self.tolerance_s, self._where)

    # Studies.
    def create_new_study(self, directions: Sequence[StudyDirection], study_name: str | None = None) -> int:
        return self._call("create_new_study", lambda: self._inner.create_new_study(directions, study_name))

    def delete_study(self, study_id: int) -> None:
        self._call("delete_study", lambda: self._inner.delete_study(study_id))

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call("set_study_user_attr", lambda: self._inner.set_study_user_attr(study_id, key, value))

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call("set_study_system_attr", lambda: self._inner.set_study_system_attr(study_id, key, value))

    def get_study_id_from_name(self, study_name: str) -> int:
        return self._call("get_study_id_from_name", lambda: self._inner.get_study_id_from_name(study_name))

    def get_study_name_from_id(self, study_id: int) -> str:
        return self._call("get_study_name_from_id", lambda: self._inner.get_study_name_from_id(study_id))

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self._call("get_study_directions", lambda: self._inner.get_study_directions(study_id))

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self._call("get_study_user_attrs", lambda: self._inner.get_study_user_attrs(study_id))

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self._call("get_study_system_attrs", lambda: self._inner.get_study_system_attrs(study_id))

    def get_all_studies(self) -> list[FrozenStudy]:
        return self._call("get_all_studies", self._inner.get_all_studies)

    # Trials.
    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        return self._call("create_new_trial", lambda: self._inner.create_new_trial(study_id, template_trial))

    def set_trial_param(
        self, trial_id: int, param_name: str, param_value_internal: float, distribution: BaseDistribution
    ) -> None:
        self._call(
            "set_trial_param",
            lambda: self._inner.set_trial_param(trial_id, param_name, param_value_internal, distribution),
        )

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self._call(
            "get_trial_id_from_study_id_trial_number",
            lambda: self._inner.get_trial_id_from_study_id_trial_number(study_id, trial_number),
        )

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        attempts = 0

        def change() -> bool:
            nonlocal attempts
            attempts += 1
            try:
                return self._inner.set_trial_state_values(trial_id, state, values)
            except optuna.exceptions.UpdateFinishedTrialError:
                if attempts > 1 and self._inner.get_trial(trial_id).state == state:
                    return True  # the attempt cut off by the outage had committed
                raise

        return self._call("set_trial_state_values", change)

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        self._call(
            "set_trial_intermediate_value",
            lambda: self._inner.set_trial_intermediate_value(trial_id, step, intermediate_value),
        )

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._call("set_trial_user_attr", lambda: self._inner.set_trial_user_attr(trial_id, key, value))

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._call("set_trial_system_attr", lambda: self._inner.set_trial_system_attr(trial_id, key, value))

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._call("get_trial", lambda: self._inner.get_trial(trial_id))

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        return self._call("get_all_trials", lambda: self._inner.get_all_trials(study_id, deepcopy, states))

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return self._call("get_best_trial", lambda: self._inner.get_best_trial(study_id))

    def check_trial_is_updatable(self, trial_id: int, trial_state: TrialState) -> None:
        self._inner.check_trial_is_updatable(trial_id, trial_state)

    def remove_session(self) -> None:
        self._inner.remove_session()
