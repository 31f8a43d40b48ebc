"""Every kind of storage the service opens behaves as Optuna's storage contract says.

In the manner of Optuna's own storage tests (``tests/storages_tests/test_storages.py``), one set of
tests runs on each kind, opened as the service opens it: ``hpo.storage.open_storage`` on the URL a
study file names. A database's storage is then ``OutageTolerantStorage`` (the outage policy and
Optuna's cache of finished trials over ``RDBStorage``), the embedded journal Optuna's
``JournalStorage`` on the service's own backend (``SafeJournalBackend``). Studies, directions,
attributes, trials created with and without a template, parameters, state changes and what a
finished trial refuses, intermediate values (NaN and infinities included), trials filtered by
state, the best trial, trial numbers, ask and tell through ``optuna.Study``, a second handle's view,
several processes asking and telling at once on one study, and the launcher lock the service keeps
in the storage (taken once, refused naming its holder, freed when its holder is killed).

A kind is one class below: ``url`` gives its storage URL. The file kinds need nothing else and are
marked fast; PostgreSQL and MySQL (MariaDB, through PyMySQL) are the local cluster's servers, a
fresh database per test.
"""

from __future__ import annotations

import math
import multiprocessing
import pickle
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.exceptions import DuplicatedStudyError, UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from hpo.outages import OUTAGE_TOLERANCE_S, OutageTolerantStorage
from hpo.storage import open_storage, resolve_url

MIN, MAX = StudyDirection.MINIMIZE, StudyDirection.MAXIMIZE
EXAMPLE_ATTRS: dict[str, Any] = {
    "dataset": "fashion-mnist",
    "none": None,
    "number": 0.25,
    "nested": {"baseline": 0.001, "tags": ["image", "classification"]},
}
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
WORKERS = 4


def _open(url: str, *, create: bool, tolerance_s: float = 0) -> BaseStorage:
    """The storage as the service opens it; a test says at once when the server is away."""
    return open_storage(resolve_url(url, "test"), create=create, tolerance_s=tolerance_s)


def _template(state: TrialState) -> FrozenTrial:
    """A trial written whole, as a warm start imports one (COMPLETE) or Optuna enqueues one (WAITING)."""
    start = datetime(2026, 1, 2, 3, 4, 5, 678000)
    return FrozenTrial(
        number=55,  # ignored: the storage numbers the trial
        state=state,
        value=0.5 if state == TrialState.COMPLETE else None,
        datetime_start=start,
        datetime_complete=start + timedelta(minutes=3) if state.is_finished() else None,
        params={"lr": 0.1, "depth": 3, "opt": "adam"},
        distributions={
            "lr": FloatDistribution(1e-4, 1.0, log=True),
            "depth": IntDistribution(1, 8),
            "opt": CategoricalDistribution(["sgd", "adam"]),
        },
        user_attrs={"imported_from": "other:7"},
        system_attrs={"fixed_params": {"lr": 0.1}},
        intermediate_values={0: 1.0, 1: 0.7, 2: 0.5},
        trial_id=-1,  # ignored too
    )


def _ask_and_tell(url: str, study_name: str, worker: int, trials: int) -> None:
    """One process of the concurrency test: its own storage, asking and telling ``trials`` times."""
    # A trial process's storage: it waits out what the policy waits out (a locked SQLite file).
    storage = _open(url, create=False, tolerance_s=OUTAGE_TOLERANCE_S)
    # The random sampler: the storage's time, not TPE's, is what this measures.
    study = optuna.load_study(study_name=study_name, storage=storage, sampler=optuna.samplers.RandomSampler())
    for _ in range(trials):
        trial = study.ask()
        x = trial.suggest_float("x", 0.0, 1.0)
        trial.set_user_attr("worker", worker)
        trial.report(x, 0)
        study.tell(trial, x + worker)


class Conformance:
    """The tests every kind passes; a subclass names the kind (its ``url`` fixture)."""

    wrapped: bool
    """Whether the service's outage policy (``OutageTolerantStorage``) wraps this kind."""
    trials_each = 20
    """Trials each process of the concurrency test asks for."""
    whole_seconds = False
    """Whether the database keeps a trial's times to the second (a finished trial's come from the
    outage policy's cache, whole)."""

    @pytest.fixture
    def url(self) -> str:
        raise NotImplementedError

    @pytest.fixture
    def storage(self, url: str) -> BaseStorage:
        return _open(url, create=True)

    def test_it_opens_as_the_service_opens_it(self, storage: BaseStorage) -> None:
        assert isinstance(storage, OutageTolerantStorage) == self.wrapped
        assert isinstance(storage, OutageTolerantStorage | JournalStorage)

    def test_create_get_and_delete_studies(self, storage: BaseStorage) -> None:
        first = storage.create_new_study([MIN], "first")
        second = storage.create_new_study([MAX])  # a generated name
        assert first != second
        assert storage.get_study_id_from_name("first") == first
        assert storage.get_study_name_from_id(first) == "first"
        named = storage.get_study_name_from_id(second)
        assert named.startswith("no-name-")  # as Optuna names a study it is given no name for
        assert {s._study_id: s.study_name for s in storage.get_all_studies()} == {
            first: "first",
            second: named,
        }
        with pytest.raises(DuplicatedStudyError):
            storage.create_new_study([MIN], "first")
        with pytest.raises(KeyError):
            storage.get_study_id_from_name("no-such-study")
        with pytest.raises(KeyError):
            storage.get_study_name_from_id(first + second + 1)

        storage.create_new_trial(first)
        storage.delete_study(first)
        assert [s._study_id for s in storage.get_all_studies()] == [second]
        with pytest.raises(KeyError):
            storage.get_study_id_from_name("first")
        with pytest.raises(KeyError):
            storage.delete_study(first)  # twice
        again = storage.create_new_study([MIN], "first")  # the name is free again
        assert storage.get_all_trials(again) == []

    def test_directions(self, storage: BaseStorage) -> None:
        for directions in ([MIN], [MAX], [MAX, MIN, MAX]):
            study_id = storage.create_new_study(directions)
            assert storage.get_study_directions(study_id) == directions
        with pytest.raises(KeyError):
            storage.get_study_directions(study_id + 1)

    @pytest.mark.parametrize("which", ["user", "system"])
    def test_study_attributes(self, storage: BaseStorage, which: str) -> None:
        study_id = storage.create_new_study([MIN])
        other = "system" if which == "user" else "user"
        for key, value in EXAMPLE_ATTRS.items():
            getattr(storage, f"set_study_{which}_attr")(study_id, key, value)
        assert getattr(storage, f"get_study_{which}_attrs")(study_id) == EXAMPLE_ATTRS
        assert getattr(storage, f"get_study_{other}_attrs")(study_id) == {}  # kept apart
        getattr(storage, f"set_study_{which}_attr")(study_id, "dataset", "cifar10")  # overwritten
        assert getattr(storage, f"get_study_{which}_attrs")(study_id)["dataset"] == "cifar10"
        with pytest.raises(KeyError):
            getattr(storage, f"set_study_{which}_attr")(study_id + 1, "key", "value")
        with pytest.raises(KeyError):
            getattr(storage, f"get_study_{which}_attrs")(study_id + 1)

    def test_create_trials_numbered_from_zero_in_each_study(self, storage: BaseStorage) -> None:
        one, two = storage.create_new_study([MIN]), storage.create_new_study([MIN])
        before = datetime.now()
        ids = [storage.create_new_trial(one) for _ in range(3)] + [storage.create_new_trial(two)]
        assert len(set(ids)) == 4  # unique across studies
        trials = storage.get_all_trials(one)
        assert [t._trial_id for t in trials] == ids[:3]
        assert [t.number for t in trials] == [0, 1, 2]
        assert [t.number for t in storage.get_all_trials(two)] == [0]
        for trial in trials:
            assert trial.state == TrialState.RUNNING
            assert trial.params == trial.user_attrs == trial.system_attrs == trial.intermediate_values == {}
            assert trial.values is None and trial.datetime_complete is None
            assert trial.datetime_start is not None and trial.datetime_start >= before - timedelta(seconds=1)
        with pytest.raises(KeyError):
            storage.create_new_trial(max(one, two) + 1)

    @pytest.mark.parametrize("state", [TrialState.COMPLETE, TrialState.WAITING])
    def test_create_a_trial_from_a_template(self, storage: BaseStorage, state: TrialState) -> None:
        # COMPLETE: a warm start's imported trial; WAITING: an enqueued one.
        template = _template(state)
        study_id = storage.create_new_study([MIN])
        storage.create_new_trial(study_id)
        trial = storage.get_trial(storage.create_new_trial(study_id, template_trial=template))
        assert trial.number == 1
        for name in ("state", "values", "params", "distributions"):
            assert getattr(trial, name) == getattr(template, name), name
        for name in ("datetime_start", "datetime_complete"):
            kept = getattr(template, name)
            if kept is not None and self.whole_seconds and trial.state == TrialState.WAITING:
                kept = kept.replace(microsecond=0)  # read back from the database, not the cache
            assert getattr(trial, name) == kept, name
        assert trial.user_attrs == template.user_attrs
        assert trial.system_attrs == template.system_attrs
        assert trial.intermediate_values == template.intermediate_values

    def test_set_params(self, storage: BaseStorage) -> None:
        study_id = storage.create_new_study([MIN])
        trial_id = storage.create_new_trial(study_id)
        lr, depth = FloatDistribution(1e-4, 1.0, log=True), IntDistribution(1, 8)
        opt = CategoricalDistribution(["sgd", "adam", None])
        storage.set_trial_param(trial_id, "lr", 0.01, lr)
        storage.set_trial_param(trial_id, "depth", 4, depth)
        storage.set_trial_param(trial_id, "opt", opt.to_internal_repr(None), opt)
        trial = storage.get_trial(trial_id)
        assert trial.params == {"lr": 0.01, "depth": 4, "opt": None}
        assert trial.distributions == {"lr": lr, "depth": depth, "opt": opt}
        assert storage.get_trial_param(trial_id, "depth") == 4
        # Another trial of the study cannot give a parameter another kind of distribution.
        other = storage.create_new_trial(study_id)
        with pytest.raises(ValueError):
            storage.set_trial_param(other, "lr", 2, IntDistribution(1, 8))
        storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [1.0])
        with pytest.raises(UpdateFinishedTrialError):
            storage.set_trial_param(trial_id, "lr", 0.02, lr)

    @pytest.mark.parametrize("end", FINISHED)
    def test_a_trial_ends_once_and_then_refuses_every_update(
        self, storage: BaseStorage, end: TrialState
    ) -> None:
        study_id = storage.create_new_study([MIN])
        trial_id = storage.create_new_trial(study_id)
        storage.check_trial_is_updatable(trial_id, TrialState.RUNNING)
        values = [0.25] if end == TrialState.COMPLETE else None
        assert storage.set_trial_state_values(trial_id, end, values)
        trial = storage.get_trial(trial_id)
        assert trial.state == end and trial.values == values and trial.datetime_complete is not None
        with pytest.raises(UpdateFinishedTrialError):
            storage.check_trial_is_updatable(trial_id, trial.state)
        for update in (
            lambda: storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [0.5]),
            lambda: storage.set_trial_intermediate_value(trial_id, 3, 0.5),
            lambda: storage.set_trial_user_attr(trial_id, "late", True),
            lambda: storage.set_trial_system_attr(trial_id, "late", True),
        ):
            with pytest.raises(UpdateFinishedTrialError):
                update()
        assert storage.get_trial(trial_id) == trial

    def test_a_waiting_trial_is_claimed_by_one_process_only(self, storage: BaseStorage) -> None:
        study_id = storage.create_new_study([MIN])
        trial_id = storage.create_new_trial(study_id, template_trial=_template(TrialState.WAITING))
        assert storage.get_trial(trial_id).datetime_start is not None  # the template's
        assert storage.set_trial_state_values(trial_id, TrialState.RUNNING)
        assert not storage.set_trial_state_values(trial_id, TrialState.RUNNING)  # taken already
        assert storage.get_trial(trial_id).state == TrialState.RUNNING

    def test_complete_with_several_and_infinite_values(self, storage: BaseStorage) -> None:
        study_id = storage.create_new_study([MIN, MAX, MIN])
        trial_id = storage.create_new_trial(study_id)
        storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [math.inf, -math.inf, 0.5])
        assert storage.get_trial(trial_id).values == [math.inf, -math.inf, 0.5]

    @pytest.mark.parametrize("which", ["user", "system"])
    def test_trial_attributes(self, storage: BaseStorage, which: str) -> None:
        study_id = storage.create_new_study([MIN])
        trial_id = storage.create_new_trial(study_id)
        for key, value in EXAMPLE_ATTRS.items():
            getattr(storage, f"set_trial_{which}_attr")(trial_id, key, value)
        getattr(storage, f"set_trial_{which}_attr")(trial_id, "dataset", "cifar10")  # overwritten
        trial = storage.get_trial(trial_id)
        assert getattr(trial, f"{which}_attrs") == {**EXAMPLE_ATTRS, "dataset": "cifar10"}
        assert getattr(trial, "system_attrs" if which == "user" else "user_attrs") == {}
        assert storage.get_trial(storage.create_new_trial(study_id)).user_attrs == {}  # per trial

    def test_intermediate_values_nan_and_infinities_included(self, storage: BaseStorage) -> None:
        study_id = storage.create_new_study([MIN])
        trial_id = storage.create_new_trial(study_id)
        reported = {0: 1.5, 1: math.inf, 2: -math.inf, 3: math.nan, 10: 0.0}
        for step, value in reported.items():
            storage.set_trial_intermediate_value(trial_id, step, value)
        storage.set_trial_intermediate_value(trial_id, 0, 0.75)  # a step reported again
        stored = storage.get_trial(trial_id).intermediate_values
        assert sorted(stored) == [0, 1, 2, 3, 10]
        assert math.isnan(stored.pop(3))
        assert stored == {0: 0.75, 1: math.inf, 2: -math.inf, 10: 0.0}

    def test_get_all_trials_by_state(self, storage: BaseStorage) -> None:
        study_id = storage.create_new_study([MIN])
        by_state: dict[TrialState, int] = {}
        for state in TrialState:
            trial_id = storage.create_new_trial(study_id)
            if state != TrialState.RUNNING:
                storage.set_trial_state_values(
                    trial_id, state, [1.0] if state == TrialState.COMPLETE else None
                )
            by_state[state] = trial_id
        for states in [(TrialState.COMPLETE,), (TrialState.RUNNING, TrialState.WAITING), FINISHED, ()]:
            for deepcopy in (True, False):
                got = storage.get_all_trials(study_id, deepcopy=deepcopy, states=states)
                assert [t._trial_id for t in got] == [by_state[s] for s in TrialState if s in states]
        assert len(storage.get_all_trials(study_id, states=None)) == len(TrialState)
        assert storage.get_n_trials(study_id, TrialState.COMPLETE) == 1

    @pytest.mark.parametrize("direction", [MIN, MAX])
    def test_get_best_trial(self, storage: BaseStorage, direction: StudyDirection) -> None:
        study_id = storage.create_new_study([direction])
        with pytest.raises(ValueError):
            storage.get_best_trial(study_id)  # none complete
        for value in (0.5, -1.0, 2.0):
            storage.set_trial_state_values(storage.create_new_trial(study_id), TrialState.COMPLETE, [value])
        storage.set_trial_state_values(storage.create_new_trial(study_id), TrialState.PRUNED)
        storage.create_new_trial(study_id)  # running
        best = storage.get_best_trial(study_id)
        assert (best.number, best.value) == ((1, -1.0) if direction == MIN else (2, 2.0))

    def test_trial_ids_from_study_ids_and_numbers(self, storage: BaseStorage) -> None:
        one, two = storage.create_new_study([MIN]), storage.create_new_study([MIN])
        ids = {(study, n): storage.create_new_trial(study) for n in range(3) for study in (one, two)}
        for (study, number), trial_id in ids.items():
            assert storage.get_trial_id_from_study_id_trial_number(study, number) == trial_id
            assert storage.get_trial_number_from_id(trial_id) == number
        with pytest.raises(KeyError):
            storage.get_trial_id_from_study_id_trial_number(one, 3)
        with pytest.raises(KeyError):
            storage.get_trial(max(ids.values()) + 1)

    def test_ask_and_tell_through_a_study_seen_from_another_handle(
        self, url: str, storage: BaseStorage
    ) -> None:
        study = optuna.create_study(study_name="asked", storage=storage, direction="maximize")
        study.enqueue_trial({"x": 0.5})
        for _ in range(4):
            trial = study.ask()
            x = trial.suggest_float("x", 0.0, 1.0)
            trial.report(x / 2, 0)
            trial.set_user_attr("twice", 2 * x)
            study.tell(trial, x)
        pruned = study.ask()
        pruned.report(0.1, 0)
        study.tell(pruned, state=TrialState.PRUNED)
        failed = study.ask()
        study.tell(failed, math.nan)  # Optuna fails a NaN value
        running = study.ask()

        again = optuna.load_study(study_name="asked", storage=_open(url, create=False))
        trials = again.get_trials()
        assert [t.state for t in trials] == [TrialState.COMPLETE] * 4 + [
            TrialState.PRUNED,
            TrialState.FAIL,
            TrialState.RUNNING,
        ]
        assert trials[0].params == {"x": 0.5}  # the enqueued trial ran first
        for told in trials[:4]:
            x = told.params["x"]
            assert (told.value, told.user_attrs["twice"], told.intermediate_values) == (
                x,
                2 * x,
                {0: x / 2},
            )
        assert again.best_trial.number == max(trials[:4], key=lambda t: t.values[0]).number
        study.tell(running, 0.0)
        assert again.get_trials()[-1].state == TrialState.COMPLETE  # not cached as running

    def test_a_pickled_storage_reads_the_same_study(self, storage: BaseStorage) -> None:
        # Ray Tune pickles its searcher's study, this storage with it.
        study_id = storage.create_new_study([MIN], "pickled")
        storage.set_trial_state_values(storage.create_new_trial(study_id), TrialState.COMPLETE, [3.0])
        copy = pickle.loads(pickle.dumps(storage))
        assert copy.get_best_trial(copy.get_study_id_from_name("pickled")).value == 3.0

    def test_several_processes_ask_and_tell_at_once(self, url: str, storage: BaseStorage) -> None:
        """WORKERS processes, each with its own storage, ``trials_each`` trials each on one study:
        no trial number twice, no tell lost, every value the one its process told."""
        optuna.create_study(study_name="crowd", storage=storage)
        # fork: seconds, where spawn would import the service again in each process.
        context = multiprocessing.get_context("fork")
        processes = [
            context.Process(target=_ask_and_tell, args=(url, "crowd", w, self.trials_each))
            for w in range(WORKERS)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=120)
        assert [p.exitcode for p in processes] == [0] * WORKERS
        trials = optuna.load_study(study_name="crowd", storage=_open(url, create=False)).get_trials()
        assert sorted(t.number for t in trials) == list(range(WORKERS * self.trials_each))
        assert all(t.state == TrialState.COMPLETE for t in trials)
        assert all(t.value == t.params["x"] + t.user_attrs["worker"] for t in trials)
        assert all(t.intermediate_values == {0: t.params["x"]} for t in trials)
        per_worker = [sum(t.user_attrs["worker"] == w for t in trials) for w in range(WORKERS)]
        assert per_worker == [self.trials_each] * WORKERS

    def test_the_launcher_lock_is_one_holders_names_it_and_dies_with_it(self, url: str) -> None:
        """The study's launcher lock (``StorageRef.launcher_lock``, held by ``hpo.dispatch.lease``):
        taken once per study, refused to a second launcher with the holder's name, and free the
        moment its holder is killed, with no one to release it."""
        ref = resolve_url(url, "test")
        first = ref.launcher_lock("study", "launcher 1 on node-a")
        assert first.take() is None
        second = ref.launcher_lock("study", "launcher 2 on node-b")
        assert "launcher 1 on node-a" in (second.take() or ""), "a second launcher was let in"
        other = ref.launcher_lock("another study", "launcher 3")
        assert other.take() is None  # one lock per study
        assert first.still_held()
        first.release()
        other.release()
        assert second.take() is None
        second.release()

        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_THE_LOCK, url], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            assert "doomed launcher" in (ref.launcher_lock("study", "launcher 4").take() or "")
        finally:
            holder.kill()  # SIGKILL: no release, no atexit
            holder.wait(timeout=30)
        after = ref.launcher_lock("study", "launcher 5")
        # The server learns of the holder's end from its closed socket; a file lock at once.
        deadline = time.monotonic() + 30
        while (refused := after.take()) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert refused is None, f"the killed holder's lock was not freed: {refused}"
        after.release()


HOLD_THE_LOCK = """
import sys, time
from hpo.storage import resolve_url
lock = resolve_url(sys.argv[1], "test").launcher_lock("study", "doomed launcher")
assert lock.take() is None
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.fast
class TestJournal(Conformance):
    """The embedded default: a journal file in the study's workdir."""

    wrapped = False

    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        return f"journal:{tmp_path / 'workdir' / 'optuna.journal'}"


@pytest.fixture(scope="module")
def empty_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database file with Optuna's schema, made once: a copy per test costs nothing."""
    path = tmp_path_factory.mktemp("sqlite") / "empty.db"
    _open(f"sqlite:///{path}", create=True).remove_session()
    return path


@pytest.mark.fast
class TestSQLite(Conformance):
    """A database file: the outage policy's wrapper over RDBStorage, without a server."""

    wrapped = True
    trials_each = 5  # each of SQLite's commits waits for the disk: the fast layer stays fast

    @pytest.fixture
    def url(self, tmp_path: Path, empty_sqlite: Path) -> str:
        shutil.copyfile(empty_sqlite, tmp_path / "optuna.db")
        return f"sqlite:///{tmp_path / 'optuna.db'}"


class TestPostgreSQL(Conformance):
    """The shared case: the local cluster's PostgreSQL, a fresh database per test."""

    wrapped = True

    @pytest.fixture
    def url(self, fresh_database: str) -> str:
        return fresh_database


class TestMySQL(Conformance):
    """MySQL through PyMySQL: the local cluster's MariaDB, a fresh database per test. Optuna's
    tables keep times in MySQL's DATETIME, to the second."""

    wrapped = True
    whole_seconds = True

    @pytest.fixture
    def url(self, fresh_mysql_database: str) -> str:
        return fresh_mysql_database

    def test_a_refusal_is_final_where_a_server_away_is_waited_out(
        self, url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """MySQL's own refusals (a wrong password, no such database) are not outages."""
        from sqlalchemy.engine import make_url

        from hpo.outages import is_transient

        monkeypatch.delenv("MYSQL_PWD", raising=False)  # each URL below moves its password there

        def error_of(other: str) -> BaseException:
            with pytest.raises(Exception) as refused:
                _open(other, create=False)
            return refused.value

        parsed = make_url(url)
        assert not is_transient(error_of(parsed.set(password="wrong").render_as_string(hide_password=False)))
        assert not is_transient(
            error_of(parsed.set(database="hpo_none").render_as_string(hide_password=False))
        )
        assert is_transient(error_of(parsed.set(port=1).render_as_string(hide_password=False)))
