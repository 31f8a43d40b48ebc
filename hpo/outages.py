"""The outage policy of a database server's storage: what an error means (the server unreachable
for now, or a request it refuses), how long the service waits out the first kind, and the storage
every database call goes through (:class:`OutageTolerantStorage`). ``hpo.storage`` opens it.
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from hpo.errors import NotReadyError, one_line
from hpo.rdb import rdb_storage_class

if TYPE_CHECKING:
    from optuna.study._frozen import FrozenStudy  # Optuna exports no public name for it

T = TypeVar("T")

OUTAGE_TOLERANCE_S = 600.0
"""How long a trial process or the launcher waits for an unreachable database before failing."""


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


# Errors that a restart does not cure: libpq's wording, then MySQL's, then SQLite's (a read-only
# file or folder, a damaged file; "database is locked" is another writer's commit, and is waited out).
_PERMANENT = (
    "does not exist", "authentication failed", "no password supplied", "permission denied",
    "access denied", "unknown database",
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
        *,
        where: str,
    ) -> None:
        """``where``: the server as messages name it (its URL, masked)."""
        # Optuna's cache of finished trials, as optuna.create_study gives an RDBStorage.
        self._inner = optuna.storages._CachedStorage(inner)
        self._where = where
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
