"""Search strategies replayed against the recorded learning-curve table, many seeds each.

A strategy is a study's sampler and pruner (or the Ray backend's scheduler), built by the same
code that builds them from a study file (``hpo.search``, ``hpo.dispatch.ray.driver``). The replay
runs it against a recorded table (``bench/curves/TASK/table.json``) instead of training: a proposed configuration gets the
curve of the nearest recorded configuration (the parameters scaled to [0, 1], log-scaled where the
space is), epoch after epoch on a clock driven by the recorded seconds of each epoch and the
trial's measured overhead (job start-up, data, checkpoints, final test), with ``max_concurrent``
workers that each start the next trial as soon as theirs ends, as the launcher does.

Compute is charged the way ``hpo status`` charges it, the time a trial holds its allocation
(here from the launcher's ask to the trial's end, about 2 s more per trial than sacct's elapsed
time: the submission) times its CPUs, one here. Per strategy and seed:

- ``compute_to_target``: the compute spent when the best value first reached random search's
  median best (random search without pruning, ``trials`` trials, over the seeds), as a fraction
  of random search's median total compute for those trials;
- ``best_at_equal_compute``: the best value found within random search's median total compute;
- ``test_accuracy_of_best``: the held-out test accuracy of that best configuration.

    python bench/replay.py                       # every strategy, 50 seeds, 64 trials: minutes
    python bench/replay.py --seeds 5 --strategies random default
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import heapq
import itertools
import json
import math
import statistics
import sys
import time
import warnings
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import optuna

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.curve_pruner import CurvePruner  # noqa: E402
from hpo import search  # noqa: E402
from hpo.config import ParamSpec, PrunerSpec, StudySpec  # noqa: E402
from hpo.config.schema import build_spec  # noqa: E402
from hpo.config.study_section import DEFAULT_PORTFOLIO  # noqa: E402
from hpo.portfolio import position  # noqa: E402
from trainer.yamlfile import load_yaml_mapping  # noqa: E402

CURVES = REPO / "bench/curves"
CHOSEN_ON = "fmnist-resnet20-9ep"
"""The task the shipped default was chosen on: the others are held out, its figures in-sample."""
TABLE = CURVES / CHOSEN_ON / "table.json"
optuna.logging.set_verbosity(optuna.logging.WARNING)
DEFAULT_STUDY = REPO / "studies/quickstart.yaml"

# name: the study section's sampler and pruner (and backend) as a study file would write them;
# None omits the key, so that the schema's default applies. "default" is what a study file that
# names neither gets (TPE with Optuna's 10 random start-up trials, median stopping from 4/9 of the
# epochs); "old default" is the quickstart's settings before this measurement.
TPE: dict[str, Any] = {"name": "tpe"}
STRATEGIES: dict[str, dict[str, Any]] = {
    "random": {"sampler": {"name": "random"}, "pruner": {"name": "none"}},
    "tpe": {"sampler": TPE, "pruner": {"name": "none"}},
    "default": {"sampler": None, "pruner": None},
    "old default": {"sampler": {"name": "tpe", "options": {"n_startup_trials": 4}},
                    "pruner": {"name": "successive_halving", "options": {"min_resource": 1, "reduction_factor": 3}}},
    "tpe+hyperband": {"sampler": TPE, "pruner": {"name": "hyperband", "options": {"min_resource": 1, "reduction_factor": 3}}},
    "tpe+median": {"sampler": TPE, "pruner": {"name": "median"}},  # Optuna's defaults
    "ray-default": {"backend": "ray", "sampler": None, "pruner": None},  # Ray Tune's median stopping rule
    # Tune's ASHAScheduler with its own defaults (grace period 1, reduction factor 4) beside our TPE.
    "ray-asha": {"backend": "ray", "sampler": TPE, "pruner": {"name": "successive_halving"}},
    # Fidelities that respect the OneCycle schedule: no decision before a third of the epochs (the
    # warm-up ends by half of them at the quickstart space's highest pct_start), or two thirds.
    # A Fraction is of the table's epochs, rounded up (epoch 3 and 6 of 9).
    "tpe+sha-from-1/3": {"sampler": TPE, "pruner": {"name": "successive_halving", "options": {"min_resource": Fraction(1, 3), "reduction_factor": 3}}},
    "tpe+median-from-2/3": {"sampler": TPE, "pruner": {"name": "median", "options": {"n_warmup_steps": Fraction(2, 3)}}},
    # The study's own completed curves predict each trial's end; prune when confidently below the best.
    "tpe+curve": {"sampler": TPE, "pruner": {"name": "curve"}},
    "tpe+curve-z1": {"sampler": TPE, "pruner": {"name": "curve", "options": {"z": 1.0}}},
    "tpe+curve-z3": {"sampler": TPE, "pruner": {"name": "curve", "options": {"z": 3.0}}},
    "gp": {"sampler": {"name": "gp"}, "pruner": {"name": "none"}},
    "gp+median-from-2/3": {"sampler": {"name": "gp"}, "pruner": {"name": "median", "options": {"n_warmup_steps": Fraction(2, 3)}}},
    "tpe+sha": {"sampler": TPE, "pruner": {"name": "successive_halving", "options": {"min_resource": 1, "reduction_factor": 3}}},
    "random+sha": {"sampler": {"name": "random"}, "pruner": {"name": "successive_halving", "options": {"min_resource": 1, "reduction_factor": 3}}},
    "random+hyperband": {"sampler": {"name": "random"}, "pruner": {"name": "hyperband", "options": {"min_resource": 1, "reduction_factor": 3}}},
    # Fidelities that are complete schedules: successive halving whose rungs are complete OneCycle
    # runs of the table's short lengths, then the full run, each from scratch (``restarted``).
    "tpe+sha-restarts": {"sampler": TPE, "pruner": {"name": "successive_halving"}},
    "random+sha-restarts": {"sampler": {"name": "random"}, "pruner": {"name": "successive_halving"}},
    # The default before the starting portfolio: TPE, median stopping from 4/9 of the epochs.
    "tpe+median-from-4/9": {"sampler": TPE, "pruner": {"name": "median", "options": {"n_warmup_steps": Fraction(4, 9)}}},
    # The default's start (the portfolio learned from the other recorded tasks), then that pruner.
    "portfolio+median-from-4/9": {"sampler": None, "pruner": {"name": "median", "options": {"n_warmup_steps": Fraction(4, 9)}}},
}  # fmt: skip
RESTARTED = {"tpe+sha-restarts", "random+sha-restarts"}
"""Replayed on the tables that hold complete short runs only (``python bench/curves.py record-short``)."""
PORTFOLIO_SIZE = DEFAULT_PORTFOLIO
"""A study whose spec sets ``study.portfolio`` (one that names no sampler: "default") tries first
that many entries of the portfolio learned from the other recorded tasks (bench/portfolio.py),
never the shipped one, which was learned from the task scored too."""


# Stop rules measured here that no study file can name (not shipped: see bench/curve_pruner.py).
BENCH_PRUNERS: dict[str, Callable[..., optuna.pruners.BasePruner]] = {"curve": CurvePruner}
# Strategies left out of a plain run: a GP fit at every ask makes a seed take about a minute.
SLOW = {"gp", "gp+median-from-2/3"}
# Left out of a plain run too (runnable by name), to keep five tasks' replay under 30 minutes
# (bench/results/replay-all-strategies.txt has the last run with all of them): measured on the
# first three tasks, the first six never reached random's median best on a held-out task (or,
# tpe+curve, did worse than its own z3 variant everywhere); on all five, tpe+sha-from-1/3 and
# tpe+curve-z3 were behind TPE alone on 4 of 5 tasks, and ray-default is the default itself
# (the Ray backend builds no scheduler for no pruner: the same sampler, the same trials).
RETIRED = {
    "old default", "tpe+sha", "tpe+curve", "tpe+curve-z1", "random+sha", "random+hyperband",
    "tpe+sha-from-1/3", "tpe+curve-z3", "ray-default",
}  # fmt: skip

# -- the table -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Recorded:
    """One recorded configuration: its curve, the seconds of each epoch and of the rest."""

    params: dict[str, Any]
    values: list[float]
    epoch_s: list[float]
    overhead_s: float
    test_accuracy: float | None


@dataclasses.dataclass
class Table:
    metric: str
    direction: str
    epochs: int
    max_concurrent: int
    space: dict[str, dict[str, Any]]
    configs: list[Recorded]
    repeats: list[tuple[int, Recorded]] = dataclasses.field(default_factory=list)
    """(the index in ``configs`` of the configuration repeated, its run under another seed)."""
    task: str = ""
    study_file: Path = DEFAULT_STUDY
    """The study file a strategy's study is built from (its space, its objective or trainer)."""
    short: dict[int, list[Recorded | None]] = dataclasses.field(default_factory=dict)
    """By length in epochs: each configuration trained by a complete schedule that long (None
    where its run did not complete), in the order of ``configs``."""

    def __post_init__(self) -> None:
        self.params = {name: ParamSpec(**param) for name, param in self.space.items()}
        self._points = np.array([self.scaled(c.params) for c in self.configs])
        self._noise: list[NoiseGroup] | None = None

    @classmethod
    def load(cls, path: Path = TABLE) -> Table:
        data = json.loads(path.read_text())
        metric = data["metric"]

        def recorded(row: dict[str, Any]) -> Recorded:
            return Recorded(
                params=row["params"],
                values=[float(v) for v in row[metric]],
                epoch_s=[t + v for t, v in zip(row["train_s"], row["val_s"], strict=True)],
                overhead_s=float(row["overhead_s"]),
                test_accuracy=row.get("test_accuracy"),
            )

        configs = [recorded(row) for row in data["configs"]]
        index = {row["number"]: i for i, row in enumerate(data["configs"])}
        short: dict[int, list[Recorded | None]] = {}
        for length, rows in data.get("short", {}).items():
            runs: list[Recorded | None] = [None] * len(configs)
            for row in rows:
                runs[index[row["of"]]] = recorded(row)
            short[int(length)] = runs
        return cls(
            metric=metric,
            direction=data["direction"],
            epochs=int(data["epochs"]),
            max_concurrent=int(data["max_concurrent"]),
            space=data["space"],
            configs=configs,
            repeats=[(index[row["of"]], recorded(row)) for row in data.get("repeats", [])],
            task=data.get("task", path.parent.name),
            study_file=REPO / data["study_file"] if "study_file" in data else DEFAULT_STUDY,
            short=short,
        )

    def scaled(self, params: dict[str, Any]) -> list[float]:
        """The parameters in [0, 1]: log-scaled for a log or power-of-two range."""
        return [position(p, params[name]) for name, p in self.params.items()]

    @property
    def points(self) -> np.ndarray:
        """Every recorded configuration ``scaled`` (configurations x parameters, the space's order)."""
        return self._points

    def noise(self) -> list[NoiseGroup]:
        """The seed-noise residuals of the repeats (``seed_noise``), computed once."""
        if self._noise is None:
            self._noise = seed_noise(self)
        return self._noise

    def nearest(self, params: dict[str, Any], k: int = 1) -> list[tuple[float, int]]:
        distances = np.linalg.norm(self._points - np.array(self.scaled(params)), axis=1)
        order = np.argsort(distances, kind="stable")[:k]
        return [(float(distances[i]), int(i)) for i in order]


Lookup = Callable[[Table, dict[str, Any]], Recorded]


def nearest_neighbour(table: Table, params: dict[str, Any]) -> Recorded:
    """The curve of the nearest recorded configuration: a real curve, noise included."""
    return table.configs[table.nearest(params)[0][1]]


def k_nearest(table: Table, params: dict[str, Any], k: int = 3) -> Recorded:
    """A surrogate: the inverse-distance weighted mean of the k nearest curves (smoother, but it
    averages the noise away and blurs sharp optima)."""
    near = table.nearest(params, k)
    weights = np.array([1.0 / max(d, 1e-9) for d, _ in near])
    weights /= weights.sum()
    configs = [table.configs[i] for _, i in near]

    def mean(rows: list[list[float]]) -> list[float]:
        return [float(v) for v in np.average(np.array(rows), axis=0, weights=weights)]

    tests = [c.test_accuracy for c in configs]
    return Recorded(
        params=params,
        values=mean([c.values for c in configs]),
        epoch_s=mean([c.epoch_s for c in configs]),
        overhead_s=float(np.average([c.overhead_s for c in configs], weights=weights)),
        test_accuracy=None if None in tests else float(np.average(tests, weights=weights)),  # type: ignore[arg-type]
    )


@dataclasses.dataclass(frozen=True)
class NoiseGroup:
    """The residuals of one repeated configuration's runs, and the level its runs end at (their
    median last value)."""

    level: float
    residuals: list[tuple[list[float], float]]
    """(a run's curve minus the runs' median curve, its test accuracy minus theirs), scaled."""


def seed_noise(table: Table) -> list[NoiseGroup]:
    """What the training seed alone does to a run: for each repeated configuration, each run's
    curve (and test accuracy) minus the median of its runs, epoch by epoch.

    The median, not the mean: seed noise here is a small spread plus, now and then, a run that
    collapses (one of three runs at 0.10 where the others reach 0.66 and 0.71). Around the mean, a
    collapse becomes a large rise of every other run (+0.26), which, drawn for a good
    configuration, lifts its curve past anything recorded and up to the bound of the values; around
    the median it stays what it was, a fall of the one run. The residuals are scaled so that, for
    Gaussian noise, they have the spread of one run around the truth (``_median_scale``)."""
    runs: dict[int, list[Recorded]] = {}
    for index, run in table.repeats:
        runs.setdefault(index, [table.configs[index]]).append(run)
    groups = []
    for curves in runs.values():
        scale = _median_scale(len(curves))
        centre = np.median([c.values for c in curves], axis=0)
        tests = [c.test_accuracy for c in curves]
        test_centre = None if None in tests else float(np.median(tests))  # type: ignore[arg-type]
        residuals = []
        for c in curves:
            test = 0.0 if test_centre is None else scale * (c.test_accuracy - test_centre)  # type: ignore[operator]
            residuals.append(([float(v) for v in scale * (np.array(c.values) - centre)], test))
        groups.append(NoiseGroup(float(centre[-1]), residuals))
    return groups


@functools.cache
def _median_scale(n: int) -> float:
    """1 / the RMS of n standard normal draws' distances to their median (about 1.13 for n = 3,
    where one of the three is 0): residuals times this have the variance of one draw."""
    draws = np.random.default_rng(0).standard_normal((200_000, n))
    return float(1.0 / np.sqrt(((draws - np.median(draws, axis=1, keepdims=True)) ** 2).mean()))


def noisy_k_nearest(table: Table, params: dict[str, Any], k: int = 3, draw: int = 0) -> Recorded:
    """The surrogate of ``k_nearest`` plus one run's seed noise, drawn from the repeats of the
    configurations that end nearest the surrogate (``level_matched``):
    a landscape smooth between recorded points, as a new training run sees it, and a rerun of the
    same point that differs by what the training seed alone does. The weighted mean already
    carries part of its neighbours' noise (the sum of the squared weights); the residual adds the
    rest, so that one proposed configuration's curve has one run's noise. The draw depends only
    on the parameters: a replay is deterministic, and two seeds' proposals differ as draws do.
    ``draw`` other than 0 picks another run's noise for the same parameters (another training seed)."""
    surrogate = k_nearest(table, params, k)
    residuals = [r for group in level_matched(table.noise(), surrogate.values[-1]) for r in group.residuals]
    if not residuals:
        return surrogate
    near = table.nearest(params, k)
    weights = np.array([1.0 / max(d, 1e-9) for d, _ in near])
    carried = float(((weights / weights.sum()) ** 2).sum())
    digest = zlib.crc32(repr([round(x, 9) for x in table.scaled(params)]).encode())
    if draw:
        digest = zlib.crc32(f"draw {draw}".encode(), digest)
    curve, test = residuals[int(np.random.default_rng(digest).integers(len(residuals)))]
    scale = math.sqrt(max(0.0, 1.0 - carried))
    return dataclasses.replace(
        surrogate,
        values=[min(1.0, max(0.0, v + scale * r)) for v, r in zip(surrogate.values, curve, strict=True)],
        test_accuracy=None
        if surrogate.test_accuracy is None
        else min(1.0, max(0.0, surrogate.test_accuracy + scale * test)),
    )


NOISE_GROUPS = 3
"""How many repeated configurations, the nearest in level, a configuration's noise is drawn from."""


def level_matched(groups: list[NoiseGroup], level: float) -> list[NoiseGroup]:
    """The repeated configurations whose runs end nearest ``level``: the noise of a configuration
    that ends like this one. Seed noise depends on where a run ends, not on where it sits in the
    space: on the recorded tasks the configurations that end near the best move by 0.001 to 0.013
    with the seed, those that end half-way (0.47 on digits, 0.66 on the CNN task) by 0.14 to 0.34,
    and the nearest repeated configuration in the space predicts a configuration's spread no
    better than chance (rank correlation -0.32 to 0.19). Drawn from every repeat, a good curve
    got a half-way run's rise now and then and random search's best reached the bound, 1.0."""
    return sorted(groups, key=lambda g: abs(g.level - level))[:NOISE_GROUPS]


LOOKUPS: dict[str, Lookup] = {
    "nearest": nearest_neighbour,
    "3-nearest": k_nearest,
    "3-nearest+noise": noisy_k_nearest,
}


def short_run(table: Table, params: dict[str, Any], epochs: int, lookup: Lookup, full: Recorded) -> Recorded:
    """A complete run of ``epochs`` for ``params``, as ``lookup`` gives its full run (``full``):
    the nearest configuration's short run, or the weighted mean of the 3 nearest that have one,
    moved by the seed noise drawn for the full run's end (a short schedule ends annealed as the
    full one does; the table repeats no short run to draw its own)."""
    runs = table.short[epochs]
    near = [(d, i) for d, i in table.nearest(params, len(runs)) if runs[i] is not None]
    if lookup is nearest_neighbour:
        found = runs[near[0][1]]
        assert found is not None
        return found
    near = near[:3]
    weights = np.array([1.0 / max(d, 1e-9) for d, _ in near])
    chosen = [run for _, i in near if (run := runs[i]) is not None]
    shift = full.values[-1] - k_nearest(table, params).values[-1] if lookup is noisy_k_nearest else 0.0
    return Recorded(
        params=params,
        values=[min(1.0, max(0.0, float(v) + shift)) for v in np.average([c.values for c in chosen], axis=0, weights=weights)],
        epoch_s=[float(v) for v in np.average([c.epoch_s for c in chosen], axis=0, weights=weights)],
        overhead_s=float(np.average([c.overhead_s for c in chosen], weights=weights)),
        test_accuracy=None,
    )  # fmt: skip


def restarted(table: Table, params: dict[str, Any], lookup: Lookup) -> tuple[Recorded, dict[int, int]]:
    """A trial whose fidelities are complete schedules: one run of each recorded short length,
    then the full run, each from scratch in the same job (one start-up). Its curve is theirs end to
    end; it is judged at the end of each, at the step of its length: (the curve, {epoch of the
    curve: step reported})."""
    full = lookup(table, params)
    values: list[float] = []
    epoch_s: list[float] = []
    judged_at = {}
    for length in sorted(table.short):
        run = short_run(table, params, length, lookup, full)
        values += run.values
        epoch_s += run.epoch_s
        judged_at[len(values)] = length
    judged_at[len(values) + table.epochs] = table.epochs
    curve = dataclasses.replace(full, values=values + full.values, epoch_s=epoch_s + full.epoch_s)
    return curve, judged_at


# -- strategies ------------------------------------------------------------------------------


def strategy_spec(name: str, table: Table, seed: int, default_study: Path | None = None) -> StudySpec:
    """The table's study file with the strategy's sampler, pruner or backend (the pruners'
    resources are the table's epochs), built as a study file is."""
    keys = STRATEGIES[name]
    if name in RESTARTED:
        keys = {**keys, "pruner": {**keys["pruner"], "options": schedule_rungs(table)}}
    return spec_with(keys, table, seed, default_study, name)


def schedule_rungs(table: Table) -> dict[str, int]:
    """Successive halving's options whose rungs are the table's short lengths and its full one:
    they must grow by one whole factor (3, 9, 27 epochs: reduction factor 3)."""
    lengths = [*sorted(table.short), table.epochs]
    factors = {b / a for a, b in itertools.pairwise(lengths)}
    if len(lengths) < 2 or len(factors) != 1 or not (factor := factors.pop()).is_integer():
        raise ValueError(
            f"{table.task}: short runs of {lengths[:-1]} epochs are not rungs of one factor to {table.epochs}"
        )
    return {"min_resource": lengths[0], "reduction_factor": int(factor)}


def seed_range(seeds: int) -> range:
    """The samplers' seeds of a comparison. Not 0: the recording sampled at random from seed 0, so
    random search's seed 0 would propose the recorded configurations themselves."""
    return range(1, seeds + 1)


def apply_strategy(study: dict[str, Any], study_keys: dict[str, Any], seed: int, epochs: int) -> None:
    """Set a study section's keys to a strategy's (None: omitted, the default), with the seed; a
    pruner option given as a Fraction becomes that share of ``epochs``, rounded up."""
    for key, value in copy.deepcopy(study_keys).items():
        if value is None:
            study.pop(key, None)
        else:
            study[key] = value
    options = (study.get("pruner") or {}).get("options", {})
    for key, value in options.items():
        if isinstance(value, Fraction):
            options[key] = math.ceil(value * epochs)
    study["sampler"] = {**(study.get("sampler") or {}), "seed": seed}


def spec_with(
    study_keys: dict[str, Any], table: Table, seed: int, default_study: Path | None = None, name: str = ""
) -> StudySpec:
    source = default_study or table.study_file
    document = load_yaml_mapping(source)
    study = document["study"]
    apply_strategy(study, study_keys, seed, table.epochs)
    study["max_concurrent"] = table.max_concurrent
    if (study.get("pruner") or {}).get("name") == "hyperband":
        study["pruner"].setdefault("options", {}).setdefault("max_resource", table.epochs)
    if "objective" in document:  # the user's command: its steps are the pruners' resources
        document["objective"]["steps"] = table.epochs
    else:
        document["trainer"] = {**document.get("trainer", {}), "epochs": table.epochs}
    study.pop("enqueue", None)  # the hand-picked start is not part of a strategy
    candidate = study.get("pruner") or {}
    if candidate.get("name") in BENCH_PRUNERS:  # not a study file's pruner: built by build_pruner
        study["pruner"] = {"name": "none"}
    spec = build_spec(document, f"{source} ({name or study_keys})")
    if candidate.get("name") in BENCH_PRUNERS:
        # A name the schema refuses (no study file may give it), set past its check.
        spec.study.pruner = PrunerSpec(name="none", options=dict(candidate.get("options", {})))
        object.__setattr__(spec.study.pruner, "name", candidate["name"])
    return spec


def build_pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
    """The spec's Optuna pruner; a candidate of the benchmarks' own (``BENCH_PRUNERS``) by name."""
    if spec.study.backend == "ray":
        return optuna.pruners.NopPruner()  # Tune's scheduler decides (TuneStopper)
    if spec.study.pruner.name in BENCH_PRUNERS:
        return BENCH_PRUNERS[spec.study.pruner.name](**spec.study.pruner.options)
    return search.build_pruner(spec.study.pruner, spec.source)


class Stopper(Protocol):
    """What decides, after each epoch, whether a trial goes on."""

    def decide(self, trial: optuna.Trial, epoch: int, value: float, last: bool) -> bool: ...


class OptunaStopper:
    """The study's Optuna pruner, as the service's reporter asks it: report, then should_prune."""

    def decide(self, trial: optuna.Trial, epoch: int, value: float, last: bool) -> bool:
        trial.report(value, step=epoch)
        return trial.should_prune() and not last


class TuneStopper:
    """Ray Tune's scheduler as the Ray backend builds it from the same study file."""

    @dataclasses.dataclass(frozen=True)
    class _Trial:
        trial_id: str

    class _Controller:
        """What a scheduler asks of Tune's controller: no trial waits for a slot here (a trial
        starts as another ends), so the median rule never pauses one to let another run."""

        def get_live_trials(self) -> list[Any]:
            return []

    def __init__(self, spec: StudySpec, epochs: int) -> None:
        from hpo.dispatch.ray.driver import build_scheduler

        self.scheduler = build_scheduler(spec, epochs)
        self.scheduler.set_search_properties(
            spec.study.metric, "min" if spec.study.direction == "minimize" else "max"
        )
        self.metric = spec.study.metric
        self.added: set[str] = set()

    def decide(self, trial: optuna.Trial, epoch: int, value: float, last: bool) -> bool:
        trial.report(value, step=epoch)  # the Ray backend records each epoch on the Optuna trial too
        stub = self._Trial(str(trial.number))
        if stub.trial_id not in self.added:
            self.added.add(stub.trial_id)
            self.scheduler.on_trial_add(None, stub)
        action = self.scheduler.on_trial_result(
            self._Controller(), stub, {"training_iteration": epoch, self.metric: value}
        )
        return action == "STOP" and not last


def stopper_for(spec: StudySpec, table: Table) -> Stopper:
    return TuneStopper(spec, table.epochs) if spec.study.backend == "ray" else OptunaStopper()


# -- the simulation --------------------------------------------------------------------------


@dataclasses.dataclass
class TrialRun:
    number: int
    params: dict[str, Any]
    recorded: Recorded
    asked_s: float
    end_s: float = math.inf
    epochs: int = 0
    state: str = "RUNNING"
    value: float | None = None
    judged_at: dict[int, int] | None = None
    """Restarted fidelities (``restarted``): the epochs of its curve at which it reports, and the
    step each reports; None: every epoch, at its own number."""


@dataclasses.dataclass
class Replay:
    trials: list[TrialRun]
    events: list[tuple[float, int, str]]
    """(clock, trial number, what): "start", "epoch N", "COMPLETE", "PRUNED" (or "DIVERGED"), in order."""
    study: optuna.Study = dataclasses.field(repr=False, compare=False)
    """The Optuna study that was asked and told."""

    def compute_at(self, clock: float) -> float:
        """CPU-seconds charged by ``clock``: every trial's span from its ask, up to then."""
        asked = np.fromiter((t.asked_s for t in self.trials), float, len(self.trials))
        ended = np.fromiter((t.end_s for t in self.trials), float, len(self.trials))
        return float(np.clip(np.minimum(ended, clock) - asked, 0.0, None).sum())

    def total_compute(self) -> float:
        return sum(t.end_s - t.asked_s for t in self.trials)

    def progress(self, maximize: bool) -> list[tuple[float, float, TrialRun]]:
        """(compute, best value, best trial) each time the best improves."""
        best: TrialRun | None = None
        out = []
        for trial in sorted(
            (t for t in self.trials if t.state == "COMPLETE"), key=lambda t: (t.end_s, t.number)
        ):
            assert trial.value is not None
            if best is None or (trial.value > best.value if maximize else trial.value < best.value):  # type: ignore[operator]
                best = trial
                out.append((self.compute_at(trial.end_s), trial.value, trial))
        return out


TellDiverged = Callable[[optuna.Study, optuna.Trial, str | None], None]
"""How a trial whose value turned non-finite is told: (the study, the trial, the study's direction)."""


def replay(
    table: Table,
    spec: StudySpec,
    *,
    lookup: Lookup = nearest_neighbour,
    n_trials: int | None = None,
    compute_budget: float = math.inf,
    stop_when: Callable[[Replay, float], bool] | None = None,
    initial_trials: Sequence[optuna.trial.FrozenTrial] = (),
    tell_diverged: TellDiverged | None = None,
    restarts: bool = False,
    enqueue: Sequence[dict[str, Any]] = (),
) -> Replay:
    """Run the spec's sampler and pruner against the table with max_concurrent workers.

    New trials are asked while fewer than ``n_trials`` were and less than ``compute_budget`` was
    charged; ``stop_when(replay, compute spent)`` ends the study early (checked as each trial ends).
    Running trials end. ``initial_trials`` (finished trials of an earlier study: a warm start) are
    added to the study before the first ask; they cost nothing and are not in the result. With
    ``tell_diverged``, a trial whose value turns non-finite ends at that epoch, the value unreported,
    and ``tell_diverged`` tells it to the study; it is DIVERGED, with no value (without
    ``tell_diverged``, a non-finite value is read as any other). With ``restarts``, each trial
    runs the table's complete short schedules before its full one (``restarted``). ``enqueue``:
    parameters asked first, in order (a starting portfolio), the sampler drawing any they omit.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(
            study_name="replay",  # Hyperband picks a trial's bracket from a hash of this name
            direction=spec.study.direction,
            sampler=search.build_sampler(spec.study.sampler, spec.study.max_concurrent, spec.source),
            pruner=build_pruner(spec),
        )
    for imported in initial_trials:
        study.add_trial(imported)
    for params in enqueue:
        study.enqueue_trial(params, skip_if_exists=False)
    stopper = stopper_for(spec, table)
    distributions = search.distributions(spec)
    result = Replay(trials=[], events=[], study=study)
    queue: list[tuple[float, int, int, int]] = []  # (clock, sequence, trial number, epoch ending)
    sequence = 0
    live: dict[int, tuple[optuna.Trial, TrialRun]] = {}
    stopped = False

    closed_s = 0.0  # the compute of the trials that ended; the running ones are added as of now

    def spent(clock: float) -> float:
        return closed_s + sum(clock - run.asked_s for _, run in live.values())

    def may_ask(clock: float) -> bool:
        return (
            not stopped
            and (n_trials is None or len(result.trials) < n_trials)
            and spent(clock) < compute_budget
        )

    def start(clock: float) -> None:
        nonlocal sequence
        trial = study.ask(distributions)
        params = dict(trial.params)
        if restarts:
            curve, judged_at = restarted(table, params, lookup)
            run = TrialRun(trial.number, params, curve, asked_s=clock, judged_at=judged_at)
        else:
            run = TrialRun(trial.number, params, lookup(table, params), asked_s=clock)
        result.trials.append(run)
        live[trial.number] = (trial, run)
        result.events.append((clock, trial.number, "start"))
        heapq.heappush(
            queue, (clock + run.recorded.overhead_s + run.recorded.epoch_s[0], sequence, trial.number, 1)
        )
        sequence += 1

    for _ in range(spec.study.max_concurrent):
        if may_ask(0.0):
            start(0.0)
    while queue:
        clock, _, number, epoch = heapq.heappop(queue)
        trial, run = live[number]
        value = run.recorded.values[epoch - 1]
        run.epochs = epoch
        result.events.append((clock, number, f"epoch {epoch}"))
        last = epoch == len(run.recorded.values)
        step = epoch if run.judged_at is None else run.judged_at.get(epoch)
        if tell_diverged is not None and not math.isfinite(value):
            tell_diverged(study, trial, spec.study.direction)
            run.state = "DIVERGED"
        elif step is not None and stopper.decide(trial, step, value, last):
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            run.state = "PRUNED"
        elif last:
            study.tell(trial, value)
            run.state, run.value = "COMPLETE", value
        else:
            heapq.heappush(queue, (clock + run.recorded.epoch_s[epoch], sequence, number, epoch + 1))
            sequence += 1
            continue
        run.end_s = clock
        closed_s += clock - run.asked_s
        del live[number]
        result.events.append((clock, number, run.state))
        if stop_when is not None and stop_when(result, spent(clock)):
            stopped = True
        if may_ask(clock):
            start(clock)
    return result


# -- many seeds ------------------------------------------------------------------------------


def _quartiles(values: Sequence[float | None], missing: float = math.inf) -> dict[str, float | None]:
    """Quartiles by linear interpolation. A missing value counts as ``missing``: +inf for a
    compute (the target never reached), -inf for a value to maximize (nothing completed); an
    infinite value makes every quantile it takes part in infinite, shown as None."""
    ordered = sorted(missing if v is None else v for v in values)
    if not ordered:
        return {"q1": None, "median": None, "q3": None}

    def quantile(p: float) -> float:
        at = p * (len(ordered) - 1)
        below, weight = int(at), at - int(at)
        if weight == 0:
            return ordered[below]
        if math.isinf(ordered[below]) or math.isinf(ordered[below + 1]):
            return ordered[below] if math.isinf(ordered[below]) else ordered[below + 1]
        return ordered[below] + weight * (ordered[below + 1] - ordered[below])  # inf stays inf

    return {"q1": _json(quantile(0.25)), "median": _json(quantile(0.5)), "q3": _json(quantile(0.75))}


def _json(x: float) -> float | None:
    return None if math.isinf(x) else round(x, 4)  # not reached: None in JSON, inf in the table


def _baseline(args: tuple[str, int, int, str]) -> tuple[float, float]:
    table_path, seed, trials, lookup = args
    table = Table.load(Path(table_path))
    run = replay(table, strategy_spec("random", table, seed), lookup=LOOKUPS[lookup], n_trials=trials)
    return run.total_compute(), max(t.value for t in run.trials if t.value is not None)


def _one(args: tuple[str, str, int, float, float, float, str, int]) -> dict[str, Any]:
    table_path, name, seed, target, budget, horizon, lookup, trials = args
    table = Table.load(Path(table_path))
    spec = strategy_spec(name, table, seed)
    maximize = spec.study.direction == "maximize"

    def done(run: Replay, spent: float) -> bool:  # the budget spent and the target reached, or far past
        if spent < budget:
            return False
        values = [t.value for t in run.trials if t.value is not None]
        return spent >= horizon or any((v >= target if maximize else v <= target) for v in values)

    started = time.monotonic()
    run = replay(
        table,
        spec,
        lookup=LOOKUPS[lookup],
        compute_budget=horizon,
        stop_when=done,
        restarts=name in RESTARTED,
        enqueue=held_out_portfolio(table, spec.study.portfolio or 0),
    )
    progress = run.progress(maximize)
    to_target = next((c for c, v, _ in progress if (v >= target if maximize else v <= target)), math.inf)
    if to_target > horizon:  # reached by a trial that started before the horizon and ended after it
        to_target = math.inf
    within = [(c, v, t) for c, v, t in progress if c <= budget]
    best = within[-1] if within else None
    budget_clock = _clock_at_compute(run, budget)
    return {
        "strategy": name,
        "seed": seed,
        "trials": sum(1 for t in run.trials if t.asked_s < budget_clock),
        "pruned": sum(1 for t in run.trials if t.asked_s < budget_clock and t.state == "PRUNED"),
        # What a trial costs on average, pruned ones included, against random search's (unpruned).
        "trial_cost": round(statistics.mean(ended) / (budget / trials), 4)
        if (ended := [t.end_s - t.asked_s for t in run.trials if math.isfinite(t.end_s)])
        else None,
        "compute_to_target": to_target / budget,
        "best_at_equal_compute": best[1] if best else None,
        "test_accuracy_of_best": best[2].recorded.test_accuracy if best else None,
        "progress": [(round(c / budget, 4), v) for c, v, _ in progress],
        "seconds": round(time.monotonic() - started, 2),
    }


@functools.cache
def _recorded() -> list[Table]:
    return [Table.load(p) for p in recorded_tables()]


def held_out_portfolio(table: Table, size: int = PORTFOLIO_SIZE) -> list[dict[str, Any]]:
    """The portfolio learned from every recorded task but ``table``'s, as ``table``'s parameters."""
    from bench import portfolio

    if not size:
        return []
    return [portfolio.params_for(table, e) for e in _learned_without(table.task, size)]


@functools.cache
def _learned_without(task: str, size: int) -> list[dict[str, float]]:
    """Learned once per process and task (a replay asks for it once per seed)."""
    from bench import portfolio

    return portfolio.learn(_recorded(), size, without=task)


def _clock_at_compute(run: Replay, compute: float) -> float:
    """The clock at which ``compute`` had been charged (bisection: compute_at only grows)."""
    low, high = 0.0, max((t.end_s for t in run.trials), default=0.0)
    if run.compute_at(high) <= compute:
        return math.inf
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if run.compute_at(middle) < compute else (low, middle)
    return high


def compare(
    table_path: Path, names: Sequence[str], seeds: int, trials: int, lookup: str, processes: int
) -> dict[str, Any]:
    table = Table.load(table_path)
    names = [n for n in names if n not in RESTARTED or table.short]
    with ProcessPoolExecutor(processes) as pool:
        baseline = list(
            pool.map(_baseline, [(str(table_path), s, trials, lookup) for s in seed_range(seeds)])
        )
        budget = statistics.median(c for c, _ in baseline)
        target = statistics.median(b for _, b in baseline)
        jobs = [
            (str(table_path), n, s, target, budget, 3 * budget, lookup, trials)
            for n in names
            for s in seed_range(seeds)
        ]
        runs = list(pool.map(_one, jobs))
    by_name: dict[str, list[dict[str, Any]]] = {n: [r for r in runs if r["strategy"] == n] for n in names}
    random_best = {r["seed"]: r["best_at_equal_compute"] for r in by_name.get("random", [])}
    worst = -math.inf if table.direction == "maximize" else math.inf  # nothing completed within the compute
    strategies = {}
    for name, rows in by_name.items():
        paired = [
            (r["best_at_equal_compute"], random_best[r["seed"]]) for r in rows if r["seed"] in random_best
        ]
        beats = [ours is not None and (theirs is None or ours > theirs) for ours, theirs in paired]
        ties = [ours is not None and ours == theirs for ours, theirs in paired]
        strategies[name] = {
            "definition": definition(name, table),
            "seeds": len(rows),
            "trials": statistics.median(r["trials"] for r in rows),
            "pruned": statistics.median(r["pruned"] for r in rows),
            "trial_cost": statistics.median(r["trial_cost"] for r in rows if r["trial_cost"] is not None),
            "compute_to_target": _quartiles([r["compute_to_target"] for r in rows]),
            "best_at_equal_compute": _quartiles([r["best_at_equal_compute"] for r in rows], worst),
            # None where the task keeps no held-out split (its table has no test accuracy).
            "test_accuracy_of_best": _quartiles([r["test_accuracy_of_best"] for r in rows], worst)
            if any(r["test_accuracy_of_best"] is not None for r in rows)
            else None,
            "beats_random_at_equal_compute": round(sum(beats) / len(beats), 3) if beats else None,
            # The same best: with the nearest lookup, both found the same recorded configuration.
            "ties_random_at_equal_compute": round(sum(ties) / len(ties), 3) if ties else None,
        }
    return {
        "metric": table.metric,
        # The lookup keeps values within [0, 1]: a target at that bound is one that seed noise
        # added to a good curve reaches by being cut there, and no strategy can be told apart.
        "saturated": table.direction == "maximize" and target >= 1.0,
        "lookup": lookup,
        "seeds": seeds,
        "random_trials": trials,
        "target": target,
        "compute_budget_s": round(budget, 1),
        "noise": noise_floor(table),
        "rank_correlation_with_last_epoch": fidelity(table),
        "strategies": strategies,
        "runs": runs,
    }


def definition(name: str, table: Table) -> dict[str, Any]:
    """The strategy's sampler and pruner as built for the table (defaults filled in)."""
    spec = strategy_spec(name, table, seed=0)
    out = {
        "sampler": {"name": spec.study.sampler.name, "options": spec.study.sampler.options},
        "pruner": {"name": spec.study.pruner.name, "options": spec.study.pruner.options},
    }
    return {**out, "backend": spec.study.backend} if spec.study.backend != "optuna" else out


def noise_floor(table: Table) -> dict[str, Any]:
    """How much the last epoch's value moves with the training seed alone (the table's repeats),
    beside the spread of the best recorded configurations: differences under it are luck."""
    runs: dict[int, list[float]] = {}
    for index, run in table.repeats:
        runs.setdefault(index, [table.configs[index].values[-1]]).append(run.values[-1])
    spreads = [statistics.stdev(values) for values in runs.values()]
    last = sorted((c.values[-1] for c in table.configs), reverse=table.direction == "maximize")
    return {
        "configurations_repeated": len(runs),
        "seeds_each": 1 + len(table.repeats) // max(1, len(runs)),
        "seed_sd_median": round(statistics.median(spreads), 4) if spreads else None,
        "seed_sd_max": round(max(spreads), 4) if spreads else None,
        "best_recorded": last[0],
        "tenth_best_recorded": last[9] if len(last) >= 10 else None,
    }


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's: the correlation of the ranks (ties broken by order, rare in these values)."""
    rank_a, rank_b = (np.argsort(np.argsort(np.asarray(v))) for v in (a, b))
    return float(np.corrcoef(rank_a, rank_b)[0, 1])


def fidelity(table: Table) -> list[float]:
    """How well each epoch's value ranks the configurations as the last epoch does: what a pruner
    deciding at that epoch can know."""
    last = [c.values[-1] for c in table.configs]
    return [
        round(rank_correlation([c.values[e] for c in table.configs], last), 3) for e in range(table.epochs)
    ]


def print_table(result: dict[str, Any]) -> None:
    print(
        f"replay ({result['lookup']} lookup), {result['seeds']} seeds; target: random search's median best "
        f"{result['target']:.4f} after {result['random_trials']} trials; compute in units of random's "
        f"median total ({result['compute_budget_s'] / 3600:.2f} CPU-h)"
    )

    def cell(q: dict[str, float | None] | None, digits: int) -> str:
        if q is None:
            return "-"
        shown = ["inf" if v is None else f"{v:.{digits}f}" for v in (q["q1"], q["median"], q["q3"])]
        return f"{shown[1]} [{shown[0]}, {shown[2]}]"

    print(f"{'strategy':18} {'trials':>6} {'compute to target':>22} {'best at equal compute':>26} "
          f"{'its test accuracy':>26} {'beats/ties random':>17}")  # fmt: skip
    for name, s in result["strategies"].items():
        beats = s["beats_random_at_equal_compute"]
        versus = "" if beats is None else f"{beats:.0%}/{s['ties_random_at_equal_compute']:.0%}"
        print(f"{name:18} {s['trials']:>6.0f} {cell(s['compute_to_target'], 3):>22} "
              f"{cell(s['best_at_equal_compute'], 4):>26} {cell(s['test_accuracy_of_best'], 4):>26} {versus:>17}")  # fmt: skip
    print(
        "(median [first quartile, third quartile] over the seeds; inf: not reached within 3x random's compute)"
    )
    if result.get("saturated"):
        print("saturated: random search's median best is the bound of the values (1.0); these figures tell "
              "no strategy apart (the uniform draw of seed noise lifts good curves to the bound)")  # fmt: skip
    if (noise := result.get("noise")) and noise["seed_sd_median"] is not None:
        print(f"noise floor: the last epoch's {result['metric']} moves by {noise['seed_sd_median']:.4f} "
              f"(median SD; max {noise['seed_sd_max']:.4f}) with the training seed alone "
              f"({noise['configurations_repeated']} configurations x {noise['seeds_each']} seeds); the best "
              f"recorded is {noise['best_recorded']:.4f}, the tenth best {noise['tenth_best_recorded']:.4f}")  # fmt: skip
    if correlations := result.get("rank_correlation_with_last_epoch"):
        print("rank correlation of each epoch's value with the last epoch's: "
              + ", ".join(f"{e + 1}: {c:.2f}" for e, c in enumerate(correlations)))  # fmt: skip


def summarize(tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per strategy: each task's median compute to target and share of seeds that beat random at
    equal compute, and the worst of them over every task and over the held-out ones (those the
    shipped default was not chosen on). A target not reached counts as infinitely far. A task
    whose target saturated (see ``compare``) is listed apart and judges nothing."""
    names = list(dict.fromkeys(n for r in tasks.values() for n in r["strategies"]))
    judged = {task: r for task, r in tasks.items() if not r.get("saturated")}
    out: dict[str, Any] = {}
    for name in names:  # over the tasks it ran on (a restarted one: those with short runs)
        per_task = per_task_figures({t: r for t, r in judged.items() if name in r["strategies"]}, name)
        out[name] = {
            "per_task": per_task,
            "worst": worst_figures(per_task),
            "worst_held_out": worst_figures({t: v for t, v in per_task.items() if t != CHOSEN_ON}),
        }
    summary = {"strategies": out, "saturated": sorted(set(tasks) - set(judged))}
    summary["leave_one_task_out"] = leave_one_task_out(summary)
    return summary


def per_task_figures(tasks: dict[str, dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    """A strategy's median compute to target and share of seeds beating random, task by task."""
    return {
        task: {
            "compute_to_target": r["strategies"][name]["compute_to_target"]["median"],
            "beats_random": r["strategies"][name]["beats_random_at_equal_compute"],
        }
        for task, r in tasks.items()
    }


def worst_figures(per_task: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The worst of ``per_task_figures`` over its tasks (None for no task)."""
    if not per_task:
        return None
    compute = [
        math.inf if v["compute_to_target"] is None else v["compute_to_target"] for v in per_task.values()
    ]
    beats = [v["beats_random"] for v in per_task.values() if v["beats_random"] is not None]
    return {"compute_to_target": _json(max(compute)), "beats_random": min(beats) if beats else None}


def leave_one_task_out(summary: dict[str, Any]) -> dict[str, Any]:
    """Choose a default as it would be chosen without each task, and score it on that task.

    For each judged task, the strategy (random search aside) with the lowest worst compute to
    target over the other tasks (ties: the higher worst share of seeds beating random), and that
    strategy's figures on the task left out: what the choice is worth on a task it never saw."""
    tasks = sorted({t for s in summary["strategies"].values() for t in s["per_task"]})
    strategies = {  # a candidate must have run on every task
        n: s for n, s in summary["strategies"].items() if n != "random" and len(s["per_task"]) == len(tasks)
    }
    if len(tasks) < 2:
        return {}

    def rank(per_task: dict[str, dict[str, Any]], others: list[str]) -> tuple[float, float]:
        compute = max(
            math.inf if per_task[t]["compute_to_target"] is None else per_task[t]["compute_to_target"]
            for t in others
        )
        beats = min(per_task[t]["beats_random"] or 0.0 for t in others)
        return compute, -beats

    folds = {}
    for held_out in tasks:
        others = [t for t in tasks if t != held_out]
        chosen = min(strategies, key=lambda n: rank(strategies[n]["per_task"], others))
        folds[held_out] = {"chosen": chosen, **strategies[chosen]["per_task"][held_out]}
    return folds


def print_summary(summary: dict[str, Any], all_tasks: Sequence[str]) -> None:
    tasks = [t for t in all_tasks if t not in summary["saturated"]]
    print(f"every task: median compute to target (x random's), share of seeds beating random at equal "
          f"compute; worst over all tasks, and over those held out (all but {CHOSEN_ON})")  # fmt: skip

    def cell(v: dict[str, Any] | None) -> str:
        if v is None:
            return "-"
        compute = "inf" if v["compute_to_target"] is None else f"{v['compute_to_target']:.3f}"
        beats = "-" if v["beats_random"] is None else f"{v['beats_random']:.0%}"
        return f"{compute} / {beats}"

    print(
        f"{'strategy':18} "
        + " ".join(f"{t[:22]:>22}" for t in tasks)
        + f" {'worst':>14} {'worst held-out':>14}"
    )
    for name, s in summary["strategies"].items():
        cells = " ".join(f"{cell(s['per_task'].get(t)):>22}" for t in tasks)
        print(f"{name:18} {cells} {cell(s['worst']):>14} {cell(s['worst_held_out']):>14}")
    for task, fold in summary.get("leave_one_task_out", {}).items():
        compute = "inf" if fold["compute_to_target"] is None else f"{fold['compute_to_target']:.3f}"
        print(f"chosen without {task}: {fold['chosen']}; on {task}: compute to target {compute}, "
              f"beats random in {fold['beats_random'] or 0:.0%} of seeds")  # fmt: skip
    for task in summary["saturated"]:
        print(f"not judged: {task} (random search's median best reached the bound of the values, 1.0: "
              "the seed noise drawn for a good curve lifts it there, and the strategies tie)")  # fmt: skip


def recorded_tables() -> list[Path]:
    """Every task's table, the one the default was chosen on first."""
    paths = sorted(CURVES.glob("*/table.json"))
    return sorted(paths, key=lambda p: p.parent.name != CHOSEN_ON)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", nargs="+", help="the tasks to replay (default: every recorded table)")
    parser.add_argument("--table", type=Path, help="one table file instead of the tasks'")
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGIES),
                        default=[n for n in STRATEGIES if n not in SLOW | RETIRED],
                        help=f"default: all but {', '.join(sorted(SLOW))} (slow) and "
                             f"{', '.join(sorted(RETIRED))} (retired)")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--trials", type=int, default=64, help="random search's trials (the baseline)")
    parser.add_argument("--lookup", choices=list(LOOKUPS), default="3-nearest+noise")
    parser.add_argument("--also-lookup", nargs="*", choices=list(LOOKUPS), default=[],
                        help="the same again with other lookups (how much the lookup changes the result)")  # fmt: skip
    parser.add_argument("--also-seeds", type=int, default=20, help="seeds for the other lookups")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/replay.json")
    args = parser.parse_args(argv)
    names = ["random", *(n for n in args.strategies if n != "random")]
    if args.table:
        tables = [args.table]
    elif args.tasks:
        tables = [CURVES / task / "table.json" for task in args.tasks]
    else:
        tables = recorded_tables()
    started = time.monotonic()
    result: dict[str, Any] = {
        "lookup": args.lookup,
        "seeds": args.seeds,
        "random_trials": args.trials,
        "chosen_on": CHOSEN_ON,
        "tasks": {},
        "other_lookups": {},
    }
    for path in tables:
        task = Table.load(path).task
        print(f"== task {task} ({path.relative_to(REPO) if path.is_relative_to(REPO) else path})")
        result["tasks"][task] = compare(path, names, args.seeds, args.trials, args.lookup, args.processes)
        print_table(result["tasks"][task])
        print()
        for lookup in args.also_lookup:
            other = compare(path, names, args.also_seeds, args.trials, lookup, args.processes)
            print_table(other)
            print()
            other.pop("runs")  # the figure draws the main lookup's runs; the others' summaries are kept
            result["other_lookups"].setdefault(lookup, {})[task] = other
    result["summary"] = summarize(result["tasks"])
    print_summary(result["summary"], list(result["tasks"]))
    result["seconds"] = round(time.monotonic() - started, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"replayed in {result['seconds']:.0f} s; {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
