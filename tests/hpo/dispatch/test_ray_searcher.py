"""The Ray backend's searcher as Tune keeps it: Tune pickles the searcher into its experiment state
at the end of a run, in a driver where Ray may have replaced the builtin print."""

from __future__ import annotations

import builtins
import pickle

import pytest

from hpo.budget import admission
from hpo.dispatch.ray.optuna_search import _Gate


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
