"""The strategies a replay compares: a study's sampler and pruner (or the Ray backend's
scheduler), built by the same code that builds them from a study file (``hpo.search``,
``hpo.dispatch.ray.driver``), and what decides after each epoch whether a trial goes on.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import optuna

from bench.acquisition import AcquisitionTPE, TransferPrior
from bench.curve_pruner import CurvePruner
from bench.refinement import LocalRefinement
from bench.replay_table import Table, recorded_tables
from bench.smac_sampler import SmacSampler
from hpo import search
from hpo.config import PrunerSpec, StudySpec
from hpo.config.schema import build_spec
from hpo.config.study_section import DEFAULT_PORTFOLIO
from trainer.yamlfile import load_yaml_mapping

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
    "gp": {"sampler": {"name": "gp"}, "pruner": {"name": "none"}},  # GP's own 10 random start-up trials
    "default+gp": {"sampler": {"name": "gp"}, "portfolio": DEFAULT_PORTFOLIO, "pruner": None},  # the portfolio, then GP
    "gp+ordered": {"sampler": {"name": "gp", "ordered_choices": True}, "pruner": {"name": "none"}},
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
    # Numeric choices (batch size, width) shown to the sampler in their order (hpo/ordered_choices.py).
    "tpe+ordered": {"sampler": {"name": "tpe", "ordered_choices": True}, "pruner": {"name": "none"}},
    "default+ordered": {"sampler": {"ordered_choices": True}, "pruner": None},  # the portfolio, then that
    # Local refinement around the incumbent late in the study (bench/refinement.py, SAMPLER_WRAPPERS).
    "tpe+refine": {"sampler": TPE, "pruner": {"name": "none"}},
    "default+refine": {"sampler": None, "pruner": None},
    # TPE whose acquisition gets a fading term (bench/acquisition.py, SAMPLER_WRAPPERS): the other
    # tasks' best configurations as a soft prior, in place of the portfolio's entries or after them;
    # or the trials' predicted cost.
    "tpe+prior": {"sampler": TPE, "pruner": {"name": "none"}},
    "default+prior": {"sampler": None, "pruner": None},
    "tpe+cost": {"sampler": TPE, "pruner": {"name": "none"}},
    "default+cost": {"sampler": None, "pruner": None},
    # SMAC3's random-forest optimizer as a peer (bench/smac_sampler.py, SAMPLER_WRAPPERS).
    "smac": {"sampler": {"name": "random"}, "pruner": {"name": "none"}},
}  # fmt: skip
RESTARTED = {"tpe+sha-restarts", "random+sha-restarts"}
"""Replayed on the tables that hold complete short runs only (``python -m bench.curves record-short``)."""
PORTFOLIO_SIZE = DEFAULT_PORTFOLIO
"""A study whose spec sets ``study.portfolio`` (one that names no sampler: "default") tries first
that many entries of the portfolio learned from the other recorded tasks (bench/portfolio.py),
never the shipped one, which was learned from the task scored too."""


# Stop rules measured here that no study file can name (not shipped: see bench/curve_pruner.py).
BENCH_PRUNERS: dict[str, Callable[..., optuna.pruners.BasePruner]] = {"curve": CurvePruner}
SamplerWrapper = Callable[[optuna.samplers.BaseSampler, StudySpec, Table], optuna.samplers.BaseSampler]
"""(the study's sampler, its spec, the table it is replayed on) -> the candidate sampler."""


def _refined(
    sampler: optuna.samplers.BaseSampler, spec: StudySpec, table: Table
) -> optuna.samplers.BaseSampler:
    return LocalRefinement(sampler, search.distributions(spec), seed=spec.study.sampler.seed)


def _acquisition(prior: bool, cost_aware: bool) -> SamplerWrapper:
    """The study's TPE (its options, the launcher's constant liar) as an ``AcquisitionTPE``, the
    prior learned from the other recorded tasks, behind the launcher's near-copy check."""

    def build(
        sampler: optuna.samplers.BaseSampler, spec: StudySpec, table: Table
    ) -> optuna.samplers.BaseSampler:
        options = {**spec.study.sampler.options, "seed": spec.study.sampler.seed}
        if spec.study.max_concurrent > 1:
            options.setdefault("constant_liar", True)  # as hpo.search.build_sampler sets it
        learned = _prior_without(table.task) if prior else None
        tpe = AcquisitionTPE(
            spec.search_space, search.distributions(spec), prior=learned, cost_aware=cost_aware, **options
        )
        return search.DistinctProposals(tpe, search.distributions(spec))

    return build


def _smac(sampler: optuna.samplers.BaseSampler, spec: StudySpec, table: Table) -> optuna.samplers.BaseSampler:
    """SMAC3 in the study's sampler's place (as a peer: without the launcher's near-copy check)."""
    return SmacSampler(search.distributions(spec), seed=spec.study.sampler.seed)


# Samplers measured here that no study file can name, by strategy: built around the study's own,
# or in its place.
SAMPLER_WRAPPERS: dict[str, SamplerWrapper] = {
    "tpe+refine": _refined,
    "default+refine": _refined,
    "tpe+prior": _acquisition(prior=True, cost_aware=False),
    "default+prior": _acquisition(prior=True, cost_aware=False),
    "tpe+cost": _acquisition(prior=False, cost_aware=True),
    "default+cost": _acquisition(prior=False, cost_aware=True),
    "smac": _smac,
}
# Strategies replayed in runs of their own (``python -m bench.replay --run NAME``, written to
# bench/results/replay-NAME.json and committed), which the plain run's summary reads beside its
# own figures: at 100 seeds the plain run keeps to 30 minutes. "pruners": the peers' stop rules
# (Optuna's median and Hyperband, Ray Tune's ASHA), 4 to 10 times a TPE seed's time each (a
# pruner reads every trial's curve at every report); "gp": a GP fit at every ask, 2 to 20 s
# a seed to 64 trials (10 to 100 times TPE's), run with --candidate-seeds, --horizon 1 and,
# across sessions, --resume; "gp-ordered", the same on ordered
# choices; "smac" likewise; "ordered": the candidates of ordered numeric choices; "refine": of
# local refinement; "acquisition": TPE with a transfer prior or cost term (bench/acquisition.py).
NAMED_RUNS: dict[str, set[str]] = {
    "pruners": {"tpe+hyperband", "tpe+median", "ray-asha"},
    "gp": {"gp", "default+gp"},
    "gp-ordered": {"gp+ordered"},
    "ordered": {"tpe+ordered", "default+ordered"},
    "refine": {"tpe+refine", "default+refine"},
    "acquisition": {"tpe+prior", "default+prior", "tpe+cost", "default+cost"},
    "smac": {"smac"},
}
# Left out of a plain run too (runnable by name), to keep five tasks' replay under 30 minutes
# (bench/results/replay-all-strategies.txt has the last run with all of them): measured on the
# first three tasks, the first six never reached random's median best on a held-out task (or,
# tpe+curve, did worse than its own z3 variant everywhere); on all five, tpe+sha-from-1/3 and
# tpe+curve-z3 were behind TPE alone on 4 of 5 tasks, and ray-default is the default itself
# (the Ray backend builds no scheduler for no pruner: the same sampler, the same trials);
# gp+median-from-2/3: its pruner did worse than none beside TPE on 5 of 6 tasks (tpe+median-from-2/3).
RETIRED = {
    "old default", "tpe+sha", "tpe+curve", "tpe+curve-z1", "random+sha", "random+hyperband",
    "tpe+sha-from-1/3", "tpe+curve-z3", "ray-default", "gp+median-from-2/3",
}  # fmt: skip


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


@functools.cache
def _recorded() -> list[Table]:
    return [Table.load(p) for p in recorded_tables(check_only=False)]


def held_out_portfolio(table: Table, size: int = PORTFOLIO_SIZE) -> list[dict[str, Any]]:
    """The portfolio learned from every recorded task but ``table``'s, as ``table``'s parameters."""
    from bench import portfolio

    if not size:
        return []
    return [portfolio.params_for(table, e) for e in _learned_without(table.task, size)]


@functools.cache
def _prior_without(task: str) -> TransferPrior:
    """Learned once per process and task, as the portfolio is."""
    return TransferPrior.learn(_recorded(), without=task)


@functools.cache
def _learned_without(task: str, size: int) -> list[dict[str, float]]:
    """Learned once per process and task (a replay asks for it once per seed)."""
    from bench import portfolio

    return portfolio.learn(_recorded(), size, without=task)
