"""The Optuna side of a study: the search space as distributions, the sampler, the pruner, and the
study created or loaded with them.

Everything here is shared by the launcher (which asks) and the trial processes (which report,
ask ``should_prune`` and tell), so that both build the same pruner from the same study file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from hpo import study_record, tally
from hpo.config import RAY_ONLY_PRUNERS
from hpo.errors import StudyFileError, one_line, optional_extra
from hpo.ordered_choices import OrderedChoices
from trainer.config import ADDED_SETTINGS, TrainConfig

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


# What each sampler's Optuna class imports beyond Optuna (the `samplers` extra). Optuna imports
# them lazily: without SciPy, gp fails at its 11th trial and qmc at its 2nd, mid-study.
SAMPLER_PACKAGES: dict[str, tuple[str, ...]] = {"gp": ("scipy",), "qmc": ("scipy",), "cmaes": ("cmaes",)}


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


def sampler_for(spec: StudySpec, seed_stream: int = 0) -> optuna.samplers.BaseSampler:
    """The study's sampler (``build_sampler``; ``OrderedChoices`` where the study asks) proposing
    no near-copy of a trial the study holds."""
    inner = build_sampler(spec.study.sampler, spec.study.max_concurrent, spec.source, seed_stream)
    if spec.study.sampler.ordered_choices:
        inner = OrderedChoices(inner, distributions(spec))
    return DistinctProposals(inner, distributions(spec))


RAY_SCHEDULERS = {
    "successive_halving": "Ray Tune's ASHAScheduler",
    "hyperband": "Ray Tune's HyperBandScheduler",
    "median": "Ray Tune's MedianStoppingRule",
    "pbt": "Ray Tune's PopulationBasedTraining",
}
"""What stops (or, PBT, mutates) a trial on the Ray backend, by the study's pruner name."""


def strategy_line(spec: StudySpec) -> str:
    """What the study's search is and why, in one line (``hpo launch --dry-run``)."""
    from hpo import portfolio

    sampler, pruner = spec.study.sampler, spec.study.pruner
    named = {"tpe": "TPE", "gp": "the GP", "random": "random search", "qmc": "QMC", "cmaes": "CMA-ES"}
    drawn = named[sampler.name]
    if sampler.name == "tpe" and spec.study.max_concurrent > 1 and sampler.options.get("constant_liar", True):
        drawn += f" (with the constant liar: {spec.study.max_concurrent} trials run at once)"
    if sampler.ordered_choices:
        drawn += ", numeric choices shown in their order"
    if pruner.name == "pbt":
        drawn += " for PBT's first population"
    size = len(portfolio.starting_trials(spec))  # as many as fit the budget and the space's roles
    start = f"the learned portfolio's {size} entries (hpo/portfolio.json), then " if size else ""
    if spec.study.on_ray:
        stop = RAY_SCHEDULERS.get(pruner.name, "no scheduler")
    else:
        stop = "no pruner" if pruner.name == "none" else f"the {pruner.name} pruner"
    default_sampler, pruner_from = spec.search_defaults
    why_pruner = {
        "default": "no pruner is the default (none paid under OneCycle)",
        "options": "study.pruner gives options without a name: median stopping from 4/9 of the steps",
        "named": f"study.pruner names {pruner.name}",
    }[pruner_from]
    if default_sampler and spec.study.warm_start.sources and not size:
        why = f"the study file names no sampler, and a warm start replaces the portfolio; {why_pruner}"
    elif default_sampler and pruner_from == "default":
        why = "the study file names no sampler and no pruner: the default, replayed on the recorded tasks (docs/benchmarks.md)"
    elif default_sampler:
        why = f"the study file names no sampler (the default's); {why_pruner}"
    elif pruner_from == "named":
        why = "the study file names both"
    else:
        why = f"study.sampler names {sampler.name}; {why_pruner}"
    return f"search: {start}{drawn}; {stop}. Why: {why}"


NEAR_COPY = 0.01
"""Two proposals closer than this in every parameter's position in its range (log-scaled where the
range is; categoricals equal) are one configuration tried twice."""


class DistinctProposals(optuna.samplers.BaseSampler):
    """A sampler that draws a trial's parameters again (up to ``attempts`` times) when they would be
    a near-copy of a trial the study already holds, waiting ones included. A seeded sampler's first
    random draws can be exactly a configuration enqueued before it: the starting portfolio's first
    entry was a recorded study's first draw of seed 0, and a default study, seed 0 too, drew it
    again after the portfolio. The whole trial is drawn at its start (the study's distributions as
    the relative space), parameter by parameter as the inner sampler would, so a proposal that is
    no copy is exactly the inner sampler's."""

    def __init__(
        self, inner: optuna.samplers.BaseSampler, space: dict[str, BaseDistribution], attempts: int = 16
    ) -> None:
        self.inner, self.space, self.attempts = inner, space, attempts

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        # An enqueued trial's fixed parameters, and a retry's (all of them), are not drawn.
        fixed = {**(trial.system_attrs.get("fixed_params") or {}), **trial.params}
        wanted = {n: d for n, d in search_space.items() if n not in fixed}
        if not wanted:
            return {}
        others = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        started = [t for t in others if t.state != TrialState.WAITING]
        if len(started) == 1 and wanted.keys() <= started[0].params.keys():
            # A study's second trial lies half the space away from its first in every dimension
            # drawn: if both fail the same way, the parameters cannot explain it, and fail fast
            # stops after these 2 (``hpo.budget.failing.confined``), not 3 or 4.
            contrast = _contrast({n: started[0].params[n] for n in wanted}, wanted)
            if not any(_near_copy({**fixed, **contrast}, t.params, self.space) for t in others):
                return contrast
        params: dict[str, Any] = {}
        for _ in range(self.attempts):
            relative_space = self.inner.infer_relative_search_space(study, trial)
            params = {
                n: v
                for n, v in self.inner.sample_relative(study, trial, relative_space).items()
                if n in wanted
            }
            for name, distribution in wanted.items():
                if name not in params:
                    params[name] = self.inner.sample_independent(study, trial, name, distribution)
            if not any(_near_copy({**fixed, **params}, t.params, self.space) for t in others):
                break
        return params

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


def _contrast(params: Mapping[str, Any], space: Mapping[str, BaseDistribution]) -> dict[str, Any]:
    """The point half the range away from ``params`` in each dimension (wrapping round; log-scaled
    where the range is): no two such points lie both in the lowest or both in the highest third of
    any dimension. A categorical's choices are shifted by half their number (by value for numbers)."""
    contrast: dict[str, Any] = {}
    for name, value in params.items():
        distribution = space[name]
        if isinstance(distribution, CategoricalDistribution):
            choices = list(distribution.choices)
            numbers = all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices)
            ordered = (
                sorted(choices, key=lambda c: float(c) if isinstance(c, int | float) else 0.0)
                if numbers
                else choices
            )
            at = ordered.index(value) if value in ordered else 0
            contrast[name] = ordered[(at + (len(ordered) + 1) // 2) % len(ordered)]
            continue
        assert isinstance(distribution, FloatDistribution | IntDistribution)
        low, high, x = float(distribution.low), float(distribution.high), float(value)
        scale: Callable[[float], float] = math.log if distribution.log else float
        unscale: Callable[[float], float] = math.exp if distribution.log else float
        a, b = scale(low), scale(high)
        where = ((scale(x) - a) / (b - a) + 0.5) % 1.0 if b > a else 0.0
        y = unscale(a + where * (b - a))
        if distribution.step is not None:  # Optuna holds only low + k * step
            y = low + round((y - low) / float(distribution.step)) * float(distribution.step)
        y = min(high, max(low, y))
        contrast[name] = round(y) if isinstance(distribution, IntDistribution) else y
    return contrast


def _near_copy(
    params: Mapping[str, Any], other: Mapping[str, Any], space: Mapping[str, BaseDistribution]
) -> bool:
    if set(params) != set(other):
        return False
    for name, value in params.items():
        distribution = space.get(name)
        if isinstance(distribution, FloatDistribution | IntDistribution):
            low, high, a, b = (float(x) for x in (distribution.low, distribution.high, value, other[name]))
            if distribution.log:
                low, high, a, b = (math.log(x) for x in (low, high, a, b))
            if high > low and abs(a - b) / (high - low) >= NEAR_COPY:
                return False
        elif value != other[name]:
            return False
    return True


def build_pruner(pruner: PrunerSpec, source: str, imported: int = 0) -> optuna.pruners.BasePruner:
    """``imported``: trials a warm start added. They count as COMPLETE trials for the median and
    percentile pruners' ``n_startup_trials`` but have no epochs to compare; the start-up is
    raised by their number so that it counts this study's own trials (the replay found pruning
    from the first own trials on lost more seeds than it saved)."""

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
    options = dict(pruner.options)
    if imported and pruner.name in ("median", "percentile"):
        options["n_startup_trials"] = int(options.get("n_startup_trials", 5)) + imported
    return _construct(classes[pruner.name], options, f"{source}: study.pruner.options")


def _construct(cls: Callable[..., Any], options: dict[str, Any], where: str) -> Any:
    valid = [name for name in inspect.signature(cls).parameters if name != "self"]
    for key in options:
        if key not in valid:
            raise StudyFileError(f"{where}.{key}: unknown option; valid options: {', '.join(valid)}")
    try:
        with optional_extra(where):  # a sampler that imports its package when made (cmaes...)
            return cls(**options)
    except (TypeError, ValueError) as err:
        raise StudyFileError(f"{where}: {one_line(err, name=False)}") from None


def validate_optuna_settings(spec: StudySpec) -> None:
    """Build the sampler and pruner once, so that bad options fail before anything else."""
    build_sampler(spec.study.sampler, spec.study.max_concurrent, spec.source)
    build_pruner(spec.study.pruner, spec.source)


def load(spec: StudySpec, storage: BaseStorage, *, create: bool) -> optuna.Study:

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = sampler_for(spec)
    # A study driven by a Ray-only scheduler is still read (hpo status, hpo best) through Optuna.
    ray_only = spec.study.pruner.name in RAY_ONLY_PRUNERS
    pruner = optuna.pruners.NopPruner() if ray_only else build_pruner(spec.study.pruner, spec.source)
    if create:
        # Loading first: creating a study that exists writes a refused entry to a journal, and a
        # relaunch refused for its study file must leave the storage as it was.
        with contextlib.suppress(KeyError):
            return with_own_startup(
                spec,
                optuna.load_study(
                    study_name=spec.study.name, storage=storage, sampler=sampler, pruner=pruner
                ),
            )
        return optuna.create_study(
            study_name=spec.study.name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            directions=directions(spec),  # type: ignore[arg-type]  # checked: maximize | minimize
            load_if_exists=True,
        )
    return with_own_startup(
        spec, optuna.load_study(study_name=spec.study.name, storage=storage, sampler=sampler, pruner=pruner)
    )


def with_own_startup(spec: StudySpec, study: optuna.Study) -> optuna.Study:
    """The study's pruner with its start-up counting this study's own trials (see build_pruner)."""
    if spec.study.pruner.name in ("median", "percentile"):
        imported = tally.imported_count(study)
        if imported:
            study.pruner = build_pruner(spec.study.pruner, spec.source, imported)
    return study


def reseed_sampler(study: optuna.Study, spec: StudySpec, seed_stream: int) -> None:
    study.sampler = sampler_for(spec, seed_stream)


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


def definition(spec: StudySpec) -> dict[str, Any]:
    """What gives a study's values their meaning: the metric and directions, the search space,
    and the fixed trainer settings that change what a trial computes (not those that only change
    how fast: ``trainer.config.RUNTIME_ONLY_FIELDS``). Stored on the study; JSON values."""
    fixed = (
        _objective_fingerprint(spec)
        if spec.objective is not None
        else TrainConfig.from_mapping(dict(spec.trainer)).training_fingerprint()
    )
    value = {
        "objectives": objective_names(spec),
        "directions": directions(spec),
        "search_space": {
            name: {k: v for k, v in dataclasses.asdict(param).items() if v is not None and v is not False}
            for name, param in spec.search_space.items()
        },
        "fixed": {k: v for k, v in fixed.items() if k not in spec.search_space},
    }
    normalized: dict[str, Any] = json.loads(json.dumps(value, default=str))  # as it reads back
    return normalized


def _objective_fingerprint(spec: StudySpec) -> dict[str, Any]:
    """What of an objective section changes a trial's value: the code run and how it is read
    (not the grace period, the folder or the environment, which the same code may need to move)."""
    objective = spec.objective
    assert objective is not None
    keys = ("command", "function", "metric_pattern", "final_pattern", "steps")
    fixed = {
        f"objective.{key}": getattr(objective, key) for key in keys if getattr(objective, key) is not None
    }
    fixed.update({f"objective.fixed.{name}": value for name, value in objective.fixed.items()})
    return fixed


def check_definition(study: optuna.Study, spec: StudySpec, *, allow_space_change: bool) -> bool:
    """Refuse a study file that would change what the stored study's values mean (exit 2, with the
    difference): another metric, other fixed settings, or a search space changed without
    ``allow_space_change`` (and, even with it, a change Optuna cannot model the stored trials
    with). Returns whether the definition to store differs from the stored one."""
    current = definition(spec)
    stored = study_record.stored_definition(study)
    where, name = spec.source, spec.study.name
    _check_space_compatible(study, spec)
    if stored is None:
        return True  # a new study, or one stored before definitions were: nothing to compare
    check_metric(study, spec)
    # A trainer setting the stored study predates reads as its default (what its trials ran with).
    if not any(t.values or t.intermediate_values for t in tally.own_trials(study)):
        # No trial measured anything yet (its first trials failed: a fixed command, a pattern that
        # now matches): there is nothing the new trials would be compared with.
        return stored != current
    defaults = ADDED_SETTINGS if spec.objective is None else {}
    fixed_changes = _differences(stored.get("fixed", {}), current["fixed"], defaults)
    if fixed_changes:
        key, how = fixed_changes[0]
        more = f" (and {len(fixed_changes) - 1} more)" if len(fixed_changes) > 1 else ""
        raise StudyFileError(
            f"{where}: {key if key.startswith('objective.') else 'trainer.' + key}: {how} since the stored study {name!r}{more}; its trials would not "
            "compare with the new ones (other fixed settings need a new study.name)"
        )
    space_changes = _differences(stored.get("search_space", {}), current["search_space"])
    if space_changes and not allow_space_change:
        key, how = space_changes[0]
        more = f" (and {len(space_changes) - 1} more)" if len(space_changes) > 1 else ""
        raise StudyFileError(
            f"{where}: search_space.{key}: {how} since the stored study {name!r}{more}; "
            "pass --allow-space-change to go on with the new space"
        )
    return stored != current


def check_metric(study: optuna.Study, spec: StudySpec) -> None:
    """The file measures what the stored study measured (a view would show one metric's values
    under another's name)."""
    stored = (study_record.stored_definition(study) or {}).get("objectives")
    if stored is not None and stored != objective_names(spec):
        raise StudyFileError(
            f"{spec.source}: study.metric: the stored study {spec.study.name!r} measured {', '.join(stored)}, "
            f"the file says {', '.join(objective_names(spec))}; the values would mix under one name "
            "(a new metric needs a new study.name)"
        )


def _check_space_compatible(study: optuna.Study, spec: StudySpec) -> None:
    """Optuna refuses, at the first ask, a parameter whose kind, log scale or categorical choices
    differ from a stored trial's: say it before anything is asked, naming the parameter."""
    new = distributions(spec)
    for trial in study.get_trials(deepcopy=False):
        for param, old in trial.distributions.items():
            if param not in new:
                continue
            try:
                optuna.distributions.check_distribution_compatibility(old, new[param])
            except ValueError as err:
                raise StudyFileError(
                    f"{spec.source}: search_space.{param}: the stored study {spec.study.name!r} drew it from "
                    f"{_shown(old)}, the file from {_shown(new[param])}; Optuna cannot model the stored "
                    f"trials with both ({one_line(err, name=False)}): use a new study.name"
                ) from None


def _shown(distribution: BaseDistribution) -> str:
    if isinstance(distribution, CategoricalDistribution):
        return f"choices {list(distribution.choices)}"
    assert isinstance(distribution, FloatDistribution | IntDistribution)
    kind = "float" if isinstance(distribution, FloatDistribution) else "int"
    return f"{kind} [{distribution.low}, {distribution.high}]" + (" log" if distribution.log else "")


def _differences(
    old: dict[str, Any], new: dict[str, Any], defaults: Mapping[str, Any] | None = None
) -> list[tuple[str, str]]:
    """(key, how it changed) for each key added, removed or changed, in key order; a key missing
    on one side whose value on the other is its entry in ``defaults`` is no change."""
    changes = []
    for key in sorted(set(old) | set(new)):
        if defaults is not None and key in defaults:
            old_value = old.get(key, defaults[key])
            if old_value == new.get(key, defaults[key]):
                continue
        if key not in old:
            changes.append((key, f"added ({_value(new[key])})"))
        elif key not in new:
            changes.append((key, f"removed (was {_value(old[key])})"))
        elif old[key] != new[key]:
            changes.append((key, f"{_value(old[key])} -> {_value(new[key])}"))
    return changes


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v!r}" for k, v in value.items())
    return repr(value)


def name_objective(study: optuna.Study, spec: StudySpec) -> None:
    """Store the metric's name, so optuna-dashboard's plots say "val_accuracy", not "Objective 0"."""

    if study.metric_names != objective_names(spec):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(objective_names(spec))
