"""The Ray backend's searcher as Tune keeps it: Tune pickles the searcher into its experiment state
at the end of a run, in a driver where Ray may have replaced the builtin print."""

from __future__ import annotations

import builtins
import pickle

import pytest

from hpo.dispatch.ray.optuna_search import _Gate


def test_the_searchers_gate_pickles_after_ray_replaced_print(monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen on the local cluster: a Ray job whose trials all completed ended FAILED with "Can't
    # pickle <built-in function print>: it's not the same object as builtins.print".
    gate = _Gate(launched_at=12.5, log=builtins.print, ending=lambda study: "budget reached")
    monkeypatch.setattr(builtins, "print", lambda *args, **kwargs: None)
    restored = pickle.loads(pickle.dumps(gate))
    assert restored.launched_at == 12.5 and restored.cancel_seen is False and restored.ended == ""
    # What a restored gate would say: nothing stops it (a relaunch builds a new one with its rules).
    assert restored.ending(None) is None
    restored.log("a line")  # logs, does not fail
