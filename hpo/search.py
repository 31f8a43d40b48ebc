"""The Optuna side of a study: the search space as distributions, the sampler, the pruner, and the
study created or loaded with them.

Everything here is shared by the launcher (which asks) and the trial processes (which report,
ask ``should_prune`` and tell), so that both build the same pruner from the same study file.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from hpo.config import RAY_ONLY_PRUNERS
from hpo.errors import NotReadyError, StudyFileError, one_line

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.storages import BaseStorage

    from hpo.config import ParamSpec, PrunerSpec, SamplerSpec, StudySpec


def distributions(spec: StudySpec) -> dict[str, BaseDistribution]:
    return {name: _distribution(param) for name, param in spec.search_space.items()}


def _distribution(param: ParamSpec) -> BaseDistribution:

    if param.type == "categorical":
        return CategoricalDistribution(list(param.choices or []))
    if param.power_of_two:
        return CategoricalDistribution(param.powers_of_two())
    if param.type == "int":
        step = int(param.step) if param.step is not None else 1
        return IntDistribution(int(param.low or 0), int(param.high or 0), log=param.log, step=step)
    return FloatDistribution(float(param.low or 0), float(param.high or 0), log=param.log, step=param.step)


def build_sampler(
    sampler: SamplerSpec, max_concurrent: int, source: str, seed_stream: int = 0
) -> optuna.samplers.BaseSampler:
    """The study's sampler. ``seed_stream`` tells apart processes that sample from one study (a
    relaunch, each --workers worker): with the same seed they would propose the same sequence."""

    classes: dict[str, Callable[..., optuna.samplers.BaseSampler]] = {
        "tpe": optuna.samplers.TPESampler,
        "random": optuna.samplers.RandomSampler,
        "qmc": optuna.samplers.QMCSampler,
        "gp": optuna.samplers.GPSampler,
        "cmaes": optuna.samplers.CmaEsSampler,
    }
    options = dict(sampler.options)
    if sampler.name == "tpe" and max_concurrent > 1:
        # Trials run in parallel: without the constant liar, TPE proposes near-copies of a point
        # whose result is not in yet.
        options.setdefault("constant_liar", True)
    seed = sampler.seed
    if seed is not None and seed_stream:
        seed = (seed + 1_000_003 * seed_stream) % 2**32
    return _construct(classes[sampler.name], {**options, "seed": seed}, f"{source}: study.sampler.options")


def build_pruner(pruner: PrunerSpec, source: str) -> optuna.pruners.BasePruner:

    if pruner.name in RAY_ONLY_PRUNERS:
        raise StudyFileError(
            f"{source}: study.pruner.name: {pruner.name} is a Ray Tune scheduler; it needs study.backend: ray"
        )

    classes: dict[str, Callable[..., optuna.pruners.BasePruner]] = {
        "none": optuna.pruners.NopPruner,
        "median": optuna.pruners.MedianPruner,
        "percentile": optuna.pruners.PercentilePruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
        "threshold": optuna.pruners.ThresholdPruner,
    }
    return _construct(classes[pruner.name], dict(pruner.options), f"{source}: study.pruner.options")


def _construct(cls: Callable[..., Any], options: dict[str, Any], where: str) -> Any:
    valid = [name for name in inspect.signature(cls).parameters if name != "self"]
    for key in options:
        if key not in valid:
            raise StudyFileError(f"{where}.{key}: unknown option; valid options: {', '.join(valid)}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as err:
        raise StudyFileError(f"{where}: {one_line(err, name=False)}") from None
    except ImportError as err:
        raise NotReadyError(
            f"{where}: needs a package that is not installed: {err.name or err}",
            f"pip install {err.name or err}",
        ) from None


def validate_optuna_settings(spec: StudySpec) -> None:
    """Build the sampler and pruner once, so that bad options fail before anything else."""
    build_sampler(spec.study.sampler, spec.study.max_concurrent, spec.source)
    build_pruner(spec.study.pruner, spec.source)


def load(spec: StudySpec, storage: BaseStorage, *, create: bool) -> optuna.Study:

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = build_sampler(spec.study.sampler, spec.study.max_concurrent, spec.source)
    # A study driven by a Ray-only scheduler is still read (hpo status, hpo best) through Optuna.
    ray_only = spec.study.pruner.name in RAY_ONLY_PRUNERS
    pruner = optuna.pruners.NopPruner() if ray_only else build_pruner(spec.study.pruner, spec.source)
    if create:
        return optuna.create_study(
            study_name=spec.study.name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            directions=directions(spec),  # type: ignore[arg-type]  # checked: maximize | minimize
            load_if_exists=True,
        )
    return optuna.load_study(study_name=spec.study.name, storage=storage, sampler=sampler, pruner=pruner)


def reseed_sampler(study: optuna.Study, spec: StudySpec, seed_stream: int) -> None:
    study.sampler = build_sampler(spec.study.sampler, spec.study.max_concurrent, spec.source, seed_stream)


def directions(spec: StudySpec) -> list[str]:
    """The metric's direction, then "minimize" for the cost of a multi-objective study."""
    return [str(spec.study.direction)] + (["minimize"] if spec.study.also_minimize else [])


def objective_names(spec: StudySpec) -> list[str]:
    return [spec.study.metric] + ([spec.study.also_minimize] if spec.study.also_minimize else [])


def check_direction(study: optuna.Study, spec: StudySpec) -> None:
    """A stored study keeps its directions; a study file that changed them is an error, not a surprise."""
    stored = [d.name.lower() for d in study.directions]
    if len(stored) != len(directions(spec)):
        raise StudyFileError(
            f"{spec.source}: study.also_minimize: the stored study {spec.study.name!r} has "
            f"{len(stored)} objective(s), the file asks for {len(directions(spec))}"
        )
    if stored[0] != spec.study.direction:
        raise StudyFileError(
            f"{spec.source}: study.direction: the stored study {spec.study.name!r} is {stored[0]}, "
            f"the file says {spec.study.direction}"
        )


def name_objective(study: optuna.Study, spec: StudySpec) -> None:
    """Store the metric's name, so optuna-dashboard's plots say "val_accuracy", not "Objective 0"."""

    if study.metric_names != objective_names(spec):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(objective_names(spec))
