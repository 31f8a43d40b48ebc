"""``hpo report``: a study as a static HTML page, a CSV, a summary.json and PNG plots.

The HTML page carries plotly.js inline, so it opens offline (a laptop that copied the folder from
the cluster). Optuna's own visualization module draws the plots (plotly for the page, matplotlib
for the PNGs); only the learning curves are drawn here, because Optuna's intermediate-values plot
does not tell pruned trials from the others.
"""

from __future__ import annotations

import contextlib
import html
import json
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna import visualization as vis
from optuna.visualization import matplotlib as vis_mpl

from hpo import record, search, tally
from hpo.budget.cost import StudyCost, study_cost
from hpo.errors import LaunchError, StudyFileError, optional_extra
from hpo.observe import documents, views
from hpo.paths import private_dir

if TYPE_CHECKING:
    from hpo.config import StudySpec

_STATE_COLORS = {"COMPLETE": "#1f77b4", "PRUNED": "#d62728", "FAIL": "#7f7f7f", "RUNNING": "#2ca02c"}


def write_report(spec: StudySpec, study: optuna.Study, out: Path) -> list[Path]:
    """Write the report into ``out``; return the files written."""
    # The report's own extra: imported here, so that the rest of hpo runs without it.
    with optional_extra("hpo report", "pip install 'slurm-hpo[report]'"):
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
        import plotly  # noqa: F401
    trials = tally.own_trials(study)
    if not trials:
        raise LaunchError(f"study {spec.study.name!r} has no trial yet: nothing to report")
    try:
        out = private_dir(out)
    except OSError as err:
        raise StudyFileError(f"--out: cannot create {out}: {err.strerror}") from None
    cost = study_cost(spec, trials)
    best_lines = _best_lines(spec, study)
    written = [
        _write_csv(study, out / "trials.csv"),
        _write_summary(spec, study, trials, cost, out / "summary.json"),
    ]
    plots = _plots(spec, study, trials)
    images: list[Path] = []
    with _quiet_experimental():
        for name, (_, draw_png) in plots.items():
            path = _write_png(draw_png, out / f"{name}.png")
            if path is not None:
                images.append(path)
    page = _html_page(spec, study, trials, cost, best_lines, plots)
    (out / "index.html").write_text(page)
    return [out / "index.html", *written, *images]


# --- plots ----------------------------------------------------------------------------------
# Each plot: a title and (plotly figure maker, matplotlib PNG maker); makers raise when the study
# cannot have that plot yet (one completed trial has no parameter importances).
Plot = tuple[Callable[[], Any], Callable[[], Any]]


def _plots(spec: StudySpec, study: optuna.Study, trials: list[optuna.trial.FrozenTrial]) -> dict[str, Plot]:

    # A multi-objective study's plots are of its metric (its first objective), plus the front.
    target: Any = (lambda t: t.values[0]) if spec.study.also_minimize else None
    names = search.objective_names(spec)
    plots: dict[str, Plot] = {}
    if spec.study.also_minimize:
        plots["pareto_front"] = (
            lambda: vis.plot_pareto_front(study, target_names=names),
            lambda: vis_mpl.plot_pareto_front(study, target_names=names),
        )
    return plots | {
        "optimization_history": (
            lambda: vis.plot_optimization_history(study, target=target, target_name=spec.study.metric),
            lambda: vis_mpl.plot_optimization_history(study, target=target, target_name=spec.study.metric),
        ),
        "learning_curves": (
            lambda: _learning_curves_plotly(spec, trials),
            lambda: _learning_curves_matplotlib(spec, trials),
        ),
        "parallel_coordinate": (
            lambda: vis.plot_parallel_coordinate(study, target=target, target_name=spec.study.metric),
            lambda: vis_mpl.plot_parallel_coordinate(study, target=target, target_name=spec.study.metric),
        ),
        "param_importances": (
            lambda: vis.plot_param_importances(
                study, target=target, target_name=spec.study.metric
            ).update_layout(title=importance_title(trials)),
            lambda: _titled(
                vis_mpl.plot_param_importances(study, target=target, target_name=spec.study.metric),
                importance_title(trials),
            ),
        ),
        "slice": (
            lambda: vis.plot_slice(study, target=target, target_name=spec.study.metric),
            lambda: vis_mpl.plot_slice(study, target=target, target_name=spec.study.metric),
        ),
    }


FEW_FOR_IMPORTANCES = 30
"""Below this many completed trials, an importance ranking is shown as uncertain: Optuna's default
evaluator (PED-ANOVA) compares the parameter densities of the best trials with all of them, and
with few trials the best ones are a handful: another seed of the same study ranks differently."""


def importance_title(trials: list[optuna.trial.FrozenTrial]) -> str:
    """Where the importances come from: Optuna's default evaluator, over how many completed trials."""
    complete = sum(1 for t in trials if t.state.name == "COMPLETE")
    caution = ": few, an uncertain ranking" if complete < FEW_FOR_IMPORTANCES else ""
    return f"Parameter importances, Optuna's PED-ANOVA\nover {complete} completed trials{caution}"


def _titled(axes: Any, title: str) -> Any:
    """Optuna's own title replaced (it says nothing of the trials behind the bars)."""
    for where in ("left", "center", "right"):
        axes.set_title("", loc=where)
    axes.set_title(title, fontsize=10)
    return axes


_TITLES = {
    "pareto_front": "Pareto front",
    "optimization_history": "Optimization history",
    "learning_curves": "Learning curves (pruned trials in red, ending in x)",
    "parallel_coordinate": "Parallel coordinates",
    "param_importances": "Parameter importances",
    "slice": "Slices",
}


def _curves(
    trials: list[optuna.trial.FrozenTrial],
) -> Iterator[tuple[optuna.trial.FrozenTrial, list[int], list[float]]]:
    for t in trials:
        values = tally.curve(t)
        if values:
            steps = sorted(values)
            yield t, steps, [values[s] for s in steps]


def _learning_curves_plotly(spec: StudySpec, trials: list[optuna.trial.FrozenTrial]) -> Any:
    import plotly.graph_objects as go

    figure = go.Figure()
    for t, steps, values in _curves(trials):
        pruned = t.state.name == "PRUNED"
        color = _STATE_COLORS.get(t.state.name, "#9467bd")
        figure.add_trace(
            go.Scatter(
                x=steps,
                y=values,
                mode="lines+markers",
                name=f"trial {t.number} ({record.shown_state(t)})",
                line={"color": color, "dash": "dot" if pruned else "solid"},
                marker={"symbol": ["circle"] * (len(steps) - 1) + ["x" if pruned else "circle"], "size": 8},
            )
        )
    figure.update_layout(xaxis_title="epoch", yaxis_title=spec.study.metric)
    return figure


def _learning_curves_matplotlib(spec: StudySpec, trials: list[optuna.trial.FrozenTrial]) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    _, axes = plt.subplots(figsize=(8, 5))
    for t, steps, values in _curves(trials):
        pruned = t.state.name == "PRUNED"
        color = _STATE_COLORS.get(t.state.name, "#9467bd")
        axes.plot(steps, values, color=color, linestyle=":" if pruned else "-", marker="o", markersize=3)
        if pruned:
            axes.plot(steps[-1], values[-1], color=color, marker="x", markersize=9)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs
    axes.set_xlabel("epoch")
    axes.set_ylabel(spec.study.metric)
    axes.set_title("Learning curves (pruned: red, x)")
    return axes


@contextlib.contextmanager
def _quiet_experimental() -> Iterator[None]:

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # Few trials make degenerate axes and equal importances; the plots say as much.
        warnings.simplefilter("ignore", UserWarning)
        yield


def _write_png(draw: Callable[[], Any], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")  # no display on a login or compute node
    import matplotlib.pyplot as plt

    try:
        drawn = draw()
    except (ValueError, RuntimeError):
        return None  # not enough trials for this plot yet; the page says so
    axes = drawn.flat[0] if hasattr(drawn, "flat") else drawn  # plot_slice gives one axes per parameter
    figure = axes.figure
    tidy(figure, path.stem)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def tidy(figure: Any, name: str) -> None:
    """Optuna's matplotlib plots, readable: on log axes only the decades are labelled (the
    2x10^1 3x10^1 minor labels run into each other), each parameter's axis gets room, and the
    slice plot's colour bar sits beside its panels instead of over one."""
    from matplotlib.ticker import LogLocator, NullFormatter

    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            axis.set_minor_formatter(NullFormatter())
            if axis.get_scale() == "log":
                axis.set_major_locator(LogLocator(base=10, numticks=4))
    if name == "slice":
        panels = [a for a in figure.axes if a.get_label() != "<colorbar>"]
        width = max(4.0, 2.6 * len(panels))
        figure.set_size_inches(width, 4.0)
        with warnings.catch_warnings():  # the colour bar's axes: tight_layout leaves it be, as wanted
            warnings.simplefilter("ignore", UserWarning)
            figure.tight_layout(rect=(0, 0, 1 - 0.9 / width, 1))
        for bar in (a for a in figure.axes if a.get_label() == "<colorbar>"):
            bar.set_position((1 - 0.7 / width, 0.15, 0.15 / width, 0.7))
        return
    if name == "parallel_coordinate":
        # One twin axis per parameter: enough width for each one's tick labels.
        figure.set_size_inches(max(6.4, 1.6 * len(figure.axes)), 5.0)
        main = figure.axes[0]
        for label in main.get_xticklabels():
            label.set_rotation(30)
            label.set_horizontalalignment("right")
        for twin in figure.axes[1:]:  # each twin would print the parameter names again
            if twin.get_label() != "<colorbar>":
                twin.tick_params(axis="x", labelbottom=False)
    figure.tight_layout()


# --- files ----------------------------------------------------------------------------------
def _write_csv(study: optuna.Study, path: Path) -> Path:
    frame = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "duration",
                                          "datetime_start", "datetime_complete", "intermediate_values"))  # fmt: skip
    # The other metrics of the user's objective, each at the trial's last step, in columns of their own.
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    frame["state"] = [record.shown_state(trials[n]) for n in frame["number"]]  # not Optuna's PRUNED
    for name in sorted({name for t in trials.values() for name in t.user_attrs.get(record.ATTR_METRICS, {})}):
        frame[f"metric_{name}"] = [tally.other_metric(trials[n], name) for n in frame["number"]]
    frame.to_csv(path, index=False)
    return path


def _best_lines(spec: StudySpec, study: optuna.Study) -> list[str]:
    try:
        return views.best_lines(spec, study)
    except LaunchError as err:  # no completed trial yet
        return [str(err)]


def _write_summary(
    spec: StudySpec,
    study: optuna.Study,
    trials: list[optuna.trial.FrozenTrial],
    cost: StudyCost,
    path: Path,
) -> Path:
    path.write_text(json.dumps(documents.summary(spec, study, trials, cost), indent=2) + "\n")
    return path


def _html_page(
    spec: StudySpec,
    study: optuna.Study,
    trials: list[optuna.trial.FrozenTrial],
    cost: StudyCost,
    best_lines: list[str],
    plots: dict[str, Plot],
) -> str:
    counts = Counter(record.shown_state(t) for t in trials)
    sections = []
    plotly_included = False
    with _quiet_experimental():
        for name, (make_figure, _) in plots.items():
            try:
                figure = make_figure()
            except (ValueError, RuntimeError) as err:
                body = f"<p class='note'>not available: {html.escape(str(err))}</p>"
            else:
                # plotly.js once, inline: the page works without network.
                body = figure.to_html(full_html=False, include_plotlyjs=not plotly_included)
                plotly_included = True
            sections.append(f"<h2 id='{name}'>{_TITLES[name]}</h2>\n{body}")
    status = "\n".join(views.status_lines(spec, study, cost))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Study {html.escape(spec.study.name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}pre{{background:#f4f4f4;padding:1em;overflow-x:auto}}.note{{color:#777}}</style>
</head><body>
<h1>Study {html.escape(spec.study.name)}</h1>
<p>{len(trials)} of {spec.study.n_trials} trials: {html.escape(", ".join(f"{counts[s]} {s}" for s in sorted(counts)))}.
Metric: {html.escape(spec.study.metric)} ({html.escape(str(spec.study.direction))}).</p>
<h2 id="best">Best configuration</h2>
<pre>{html.escape(chr(10).join(best_lines))}</pre>
<h2 id="cost">Cost</h2>
<p>{"<br>".join(html.escape(line) for line in [views.cost_line(cost), *views.ending_lines(spec, study, cost)])}</p>
<h2 id="inside">Inside the trials</h2>
<p>{html.escape(" ".join(views.input_lines(spec, trials)) or "no trial measured its steps (the built-in trainer does)")}</p>
{chr(10).join(sections)}
<h2 id="trials">Trials</h2>
<pre>{html.escape(status)}</pre>
<p>All trials: <a href="trials.csv">trials.csv</a>; figures: <a href="summary.json">summary.json</a>.</p>
</body></html>
"""
