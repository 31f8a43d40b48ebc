"""The report's PNGs, rendered and looked at: no two labels of a figure overlap and none is cut off
at its edge (log-scale axes, six parameters side by side, the slice plot's colour bar), and the
importances say how many trials they come from."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import matplotlib
import optuna
import pytest

from hpo.config.schema import build_spec
from hpo.observe import report
from tests.hpo.helpers import score_study

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`

matplotlib.use("Agg")

SPACE = {
    "lr": {"type": "float", "low": 1e-3, "high": 1.0, "log": True},
    "weight_decay": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True},
    "div_factor": {"type": "float", "low": 5.0, "high": 50.0, "log": True},
    "final_div_factor": {"type": "float", "low": 10.0, "high": 1e4, "log": True},
    "pct_start": {"type": "float", "low": 0.1, "high": 0.5},
    "batch_size": {"type": "categorical", "choices": [64, 128, 256]},
}


def _study(tmp_path: Path, trials: int) -> tuple[Any, optuna.Study]:
    document = score_study(tmp_path, "figures", {"function": "m:f"})
    document["search_space"] = SPACE
    spec = build_spec(document, "figures.yaml")
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    from hpo import search

    space = search.distributions(spec)
    for _ in range(trials):
        trial = study.ask(space)
        p = trial.params
        study.tell(trial, 0.9 - abs(math.log10(p["lr"]) + 1) / 10 - p["pct_start"] / 10)
    return spec, study


def _texts(figure: Any) -> list[tuple[str, Any]]:
    """Every visible, non-empty text of the figure with its box on the canvas."""
    renderer = figure.canvas.get_renderer()
    found = [*figure.texts]
    for axes in figure.axes:
        found += [
            axes.title,
            axes._left_title,
            axes._right_title,
            axes.xaxis.label,
            axes.yaxis.label,
            *axes.texts,
        ]
        for axis in (axes.xaxis, axes.yaxis):
            # The ticks drawn (within the view limits), as matplotlib itself picks them.
            for tick in axis._update_ticks():
                found += [label for label in (tick.label1, tick.label2) if label.get_visible()]
    drawn: list[tuple[str, Any]] = []
    for text in found:
        if text.get_visible() and text.get_text().strip():
            box = text.get_window_extent(renderer)
            # Twin axes (one per parameter) draw the same x labels in the same place: one text.
            same = any(
                t == text.get_text()
                and max(abs(a - b) for a, b in zip(b.extents, box.extents, strict=True)) <= 3
                for t, b in drawn
            )
            if not same:
                drawn.append((text.get_text(), box))
    return drawn


def _problems(figure: Any) -> list[str]:
    figure.canvas.draw()
    width, height = figure.canvas.get_width_height()
    texts = _texts(figure)
    problems = [
        f"{text!r} cut off at the edge"
        for text, box in texts
        if box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1 or box.y1 > height + 1
    ]
    for (a, box_a), (b, box_b) in itertools.combinations(texts, 2):
        overlap_x = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        overlap_y = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        if overlap_x > 1 and overlap_y > 1:
            problems.append(f"{a!r} overlaps {b!r}")
    return problems


@pytest.mark.parametrize(
    "name", ["optimization_history", "parallel_coordinate", "param_importances", "slice"]
)
def test_no_label_of_a_report_figure_overlaps_another_or_is_cut_off(tmp_path: Path, name: str) -> None:
    import matplotlib.pyplot as plt

    spec, study = _study(tmp_path, trials=9)
    plots = report._plots(spec, study, study.get_trials())
    with report._quiet_experimental():
        drawn = plots[name][1]()
    figure = (drawn.flat[0] if hasattr(drawn, "flat") else drawn).figure
    report.tidy(figure, name)
    try:
        assert _problems(figure) == []
    finally:
        figure.savefig(tmp_path / f"{name}.png")  # kept beside the test's other files, to look at
        plt.close(figure)


def test_importances_say_how_many_trials_they_come_from(tmp_path: Path) -> None:
    for trials, caution in ((9, True), (40, False)):
        _, study = _study(tmp_path, trials)
        title = report.importance_title(study.get_trials())
        assert f"over {trials} completed trials" in title, title
        assert ("uncertain" in title) == caution, title
