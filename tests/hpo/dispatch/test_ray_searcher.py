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
