"""The fidelity measurement's arithmetic (bench/fidelity.py), on tables built by hand whose answer
is known: a prefix that ranks nothing and a complete short run that ranks everything."""

from __future__ import annotations

from typing import Any

import pytest

from bench.fidelity import measure, top_kept

pytestmark = pytest.mark.fast


def _table() -> dict[str, Any]:
    # 30 configurations over 9 epochs: mid-schedule every run reads the same except for a
    # reversed order (the high learning rate's noise); the complete 3-epoch runs end in the
    # order of the full runs.
    configs = [{"number": n, "val_acc": [0.5 - n / 100] * 3 + [0.1 + n / 100] * 6} for n in range(30)]
    short = [{"of": n, "val_acc": [0.2, 0.2, 0.05 + n / 100]} for n in range(30)]
    repeats = [{"of": n, "val_acc": [0.1 + n / 100 + 0.001]} for n in range(5)]
    return {"task": "hand", "metric": "val_acc", "direction": "maximize", "epochs": 9, "configs": configs,
            "repeats": repeats, "short": {"3": short}}  # fmt: skip


def test_a_prefix_that_reverses_the_order_scores_minus_one_and_a_faithful_short_run_one() -> None:
    measured = measure(_table())
    [row] = measured["lengths"]
    assert row["epochs"] == 3 and row["share_of_full"] == pytest.approx(0.333, abs=1e-3)
    # At epoch 3 the prefix still reads its mid-schedule value; the short run has ended its schedule.
    assert row["prefix"] == {"spearman": -1.0, "top_kept": 0.0}
    assert row["complete"] == {"spearman": 1.0, "top_kept": 1.0}
    assert measured["noise_ceiling_spearman"] == 1.0


def test_top_kept_is_the_share_of_the_best_tenth_inside_the_cheap_best_third() -> None:
    full = [float(n) for n in range(30)]  # best tenth (maximize): 27, 28, 29
    assert top_kept(full, full, maximize=True) == 1.0
    assert top_kept([-v for v in full], full, maximize=True) == 0.0
    cheap = full[:]
    cheap[29] = -1.0  # the best one ranked last: 2 of 3 kept
    assert top_kept(cheap, full, maximize=True) == pytest.approx(2 / 3)
    assert top_kept([-v for v in full], [-v for v in full], maximize=False) == 1.0
