"""SMAC3 as a peer row of the replay: its hyperparameter-optimization facade (a random forest over
the configurations, log expected improvement, local and random search over the forest, a Sobol
initial design), asked and told through Optuna's sampler interface so that the replay runs it as
it runs every strategy. Not a sampler a study file can name.

The study's choices reach it as ConfigSpace categoricals, as the study file gives them (TPE's
``tpe`` row sees them so too); the replay's lookup gives a configuration the same curve every
time, so SMAC is told the objective is deterministic and evaluates each configuration once.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

PLANNED_TRIALS = 64
"""What SMAC is told the study's size is (the replay's random baseline): its initial design is a
quarter of it, 16 Sobol points."""


class SmacSampler(optuna.samplers.BaseSampler):
    """Each trial the study asks for is one SMAC ``ask``; its end is SMAC's ``tell`` (a pruned or
    failed trial with the worst cost told so far). A trial whose parameters were fixed beforehand
    is left alone."""

    def __init__(self, space: Mapping[str, BaseDistribution], seed: int | None = None) -> None:
        self.space, self.seed = dict(space), seed or 0
        self._facade: Any = None
        self._asked: dict[int, Any] = {}  # trial number -> SMAC's TrialInfo
        self._worst = -math.inf  # the highest cost told
        self._folder = tempfile.TemporaryDirectory(prefix="smac-")

    def _smac(self) -> Any:
        if self._facade is None:
            from smac import HyperparameterOptimizationFacade, Scenario
            from smac.model.random_forest import RandomForest

            scenario = Scenario(
                _configspace(self.space, self.seed),
                deterministic=True,
                n_trials=PLANNED_TRIALS,
                seed=self.seed,
                output_directory=Path(self._folder.name),
            )
            # The facade's own forest (HyperparameterOptimizationFacade.get_model's settings) in one
            # thread: with a thread per core, joblib's polling of the trees spent half its time asleep.
            forest = RandomForest(
                scenario.configspace,
                log_y=True,
                n_trees=10,
                ratio_features=1.0,
                min_samples_split=2,
                min_samples_leaf=1,
                max_depth=2**20,
                bootstrapping=True,
                seed=scenario.seed,
                n_jobs=1,
            )
            self._facade = HyperparameterOptimizationFacade(
                scenario,
                target_function=lambda config, seed=0: 0.0,
                model=forest,
                logging_level=False,
                overwrite=True,
            )
        return self._facade

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if trial.system_attrs.get("fixed_params") or not search_space:
            return {}
        info = self._smac().ask()
        self._asked[trial.number] = info
        config = dict(info.config)
        return {name: _value(self.space[name], config[name]) for name in search_space if name in config}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return optuna.samplers.RandomSampler(seed=self.seed + trial.number).sample_independent(
            study, trial, param_name, param_distribution
        )

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        info = self._asked.pop(trial.number, None)
        if info is None:
            return
        from smac.runhistory.dataclasses import TrialValue

        if state == TrialState.COMPLETE and values and math.isfinite(values[0]):
            sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
            cost = sign * values[0]
            self._worst = max(self._worst, cost)
        else:  # no value: the worst told so far (SMAC's forest takes no infinite cost)
            cost = self._worst if math.isfinite(self._worst) else 0.0
        self._smac().tell(info, TrialValue(cost=cost), save=False)


def _configspace(space: Mapping[str, BaseDistribution], seed: int) -> Any:
    from ConfigSpace import Categorical, ConfigurationSpace, Float, Integer

    out = ConfigurationSpace(seed=seed)
    for name, distribution in space.items():
        if isinstance(distribution, FloatDistribution):
            out.add(Float(name, (distribution.low, distribution.high), log=distribution.log))
        elif isinstance(distribution, IntDistribution):
            out.add(Integer(name, (distribution.low, distribution.high), log=distribution.log))
        elif isinstance(distribution, CategoricalDistribution):
            out.add(Categorical(name, [str(c) for c in distribution.choices]))
        else:
            raise TypeError(f"{name}: no ConfigSpace hyperparameter for {distribution!r}")
    return out


def _value(distribution: BaseDistribution, value: Any) -> Any:
    """SMAC's value as the study's distribution holds it (a choice by its text; a float's step)."""
    if isinstance(distribution, CategoricalDistribution):
        return next(c for c in distribution.choices if str(c) == str(value))
    if isinstance(distribution, IntDistribution):
        return round(value)
    if isinstance(distribution, FloatDistribution) and distribution.step is not None:
        low, step = distribution.low, distribution.step
        return min(distribution.high, low + round((float(value) - low) / step) * step)
    return float(value)
