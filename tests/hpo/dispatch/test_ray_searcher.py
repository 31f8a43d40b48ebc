"""The Ray backend's searcher as Tune keeps it: Tune pickles the searcher into its experiment state
at the end of a run, in a driver where Ray may have replaced the builtin print."""

from __future__ import annotations

import builtins
import pickle
from pathlib import Path

import optuna
import pytest

from hpo import outages
from hpo.budget import admission
from hpo.dispatch.ray.optuna_search import _Gate

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`


def test_the_searchers_gate_pickles_after_ray_replaced_print(monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen on the local cluster: a Ray job whose trials all completed ended FAILED with "Can't
    # pickle <built-in function print>: it's not the same object as builtins.print".
    log = builtins.print

    def ask(study: object) -> admission.Admission:
        log("compute budget reached")
        return admission.Admission(False, admission.BUDGET, "compute budget reached")

    gate = _Gate(ask)
    monkeypatch.setattr(builtins, "print", lambda *args, **kwargs: None)
    restored = pickle.loads(pickle.dumps(gate))
    # What a restored gate would say: nothing stops it (a relaunch builds a new one with its rules).
    assert restored.ask(None).open


def test_the_searchers_database_storage_pickles_after_ray_replaced_print(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Seen on the local cluster: two Ray studies at once, one Ray job FAILED at Tune's experiment
    # checkpoint, which pickles the searcher's study and its storage (its log, the builtin print).
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    tolerant = outages.OutageTolerantStorage(optuna.storages.RDBStorage(url), where=url)
    assert tolerant.log is builtins.print
    monkeypatch.setattr(builtins, "print", lambda *args, **kwargs: None)
    restored = pickle.loads(pickle.dumps(tolerant))
    assert restored.log is builtins.print and restored.tolerance_s == tolerant.tolerance_s
    assert restored.get_all_studies() == []  # a working storage


def test_the_searcher_stores_each_epoch_once_whether_tune_stops_the_trial_or_it_runs_out(
    tmp_path: Path,
) -> None:
    # Seen in a Ray job's log: Optuna's "The reported value is ignored because this `step=3` is
    # already reported" for every trial that ran all its epochs. Tune hands such a trial's last
    # result to on_trial_result and again to on_trial_complete; a trial its scheduler stops at an
    # epoch has that epoch in on_trial_complete alone.
    import warnings

    from hpo.config import load_study
    from hpo.dispatch.ray.optuna_search import study_search
    from hpo.storage import StorageRef, open_storage
    from tests.hpo.helpers import study_document, write_study

    document = study_document("searcher", tmp_path / "work")
    document["study"]["storage"] = f"sqlite:///{tmp_path / 'db.sqlite'}"
    spec = load_study(write_study(tmp_path / "study.yaml", document))
    storage = open_storage(StorageRef("rdb", document["study"]["storage"]), create=True, tolerance_s=0)
    optuna.create_study(study_name="searcher", storage=storage, direction="maximize")
    searcher = study_search(spec, storage, epochs=3, job_id="local-1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna's warning on a step stored twice fails the test
        for trial_id in ("ran-out", "stopped"):
            assert searcher.suggest(trial_id) is not None
        for epoch, value in ((1, 0.1), (2, 0.2), (3, 0.3)):
            searcher.on_trial_result("ran-out", {"val_accuracy": value, "training_iteration": epoch})
        searcher.on_trial_complete("ran-out", {"val_accuracy": 0.3, "training_iteration": 3})
        searcher.on_trial_result("stopped", {"val_accuracy": 0.05, "training_iteration": 1})
        searcher.on_trial_complete("stopped", {"val_accuracy": 0.07, "training_iteration": 2})
    ran_out, stopped = optuna.load_study(study_name="searcher", storage=storage).get_trials()
    assert (ran_out.state.name, ran_out.intermediate_values) == ("COMPLETE", {1: 0.1, 2: 0.2, 3: 0.3})
    assert (stopped.state.name, stopped.intermediate_values) == ("PRUNED", {1: 0.05, 2: 0.07})
