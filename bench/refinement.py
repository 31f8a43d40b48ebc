"""A candidate sampler, measured by the replay and not shipped unless it wins there: local
refinement around the incumbent late in a study.

On two recorded tasks random search's median best sits within seed noise of the best recorded
configuration, and only a handful of configurations beat it: reaching it means putting many
trials into a small top region. TPE spreads its late trials over every region its density still
favours. This wrapper gives part of them, once enough trials have finished, to small steps from
one of the study's best few trials instead.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState


class LocalRefinement(optuna.samplers.BaseSampler):
    """The inner sampler, except that once ``after`` trials have completed, each new trial is, with
    probability ``share``, one of the ``top`` best completed trials moved in every numeric
    parameter by a normal step of ``scale`` of its range (log-scaled where the range is, reflected
    at the ends); its categorical parameters are the incumbent's. An enqueued trial is left to
    the inner sampler. Its steps are not checked against near-copies of the study's trials (the
    launcher's ``DistinctProposals`` wraps the inner sampler only): in the replay, a step that
    lands among the same 3 nearest recorded configurations is their curve again with new noise."""

    def __init__(
        self,
        inner: optuna.samplers.BaseSampler,
        space: dict[str, BaseDistribution],
        *,
        after: int = 24,
        share: float = 0.5,
        top: int = 3,
        scale: float = 0.05,
        seed: int | None = None,
    ) -> None:
        self.inner, self.space = inner, space
        self.after, self.share, self.top, self.scale = after, share, top, scale
        self._rng = random.Random(seed)
        self._refined: dict[int, dict[str, Any]] = {}
        """The proposal of each trial chosen for refinement, by trial number."""

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)
        if trial.system_attrs.get("fixed_params") or self._rng.random() >= self.share:
            return
        complete = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and math.isfinite(t.value)
        ]
        if len(complete) < self.after:
            return
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        best = sorted(complete, key=lambda t: float(t.value or 0.0), reverse=maximize)[: self.top]
        incumbent = self._rng.choice(best)
        self._refined[trial.number] = {
            name: self._step(incumbent.params[name], distribution)
            for name, distribution in self.space.items()
            if name in incumbent.params
        }

    def _step(self, value: Any, distribution: BaseDistribution) -> Any:
        if not isinstance(distribution, FloatDistribution | IntDistribution):
            return value
        low, high = float(distribution.low), float(distribution.high)
        scale, unscale = (math.log, math.exp) if distribution.log else (float, float)
        a, b = scale(low), scale(high)
        if b <= a:
            return value
        where = (scale(float(value)) - a) / (b - a) + self._rng.gauss(0.0, self.scale)
        where = abs(where) % 2.0  # reflected at both ends
        where = 2.0 - where if where > 1.0 else where
        moved = min(high, max(low, unscale(a + where * (b - a))))
        if distribution.step is not None:
            moved = low + round((moved - low) / float(distribution.step)) * float(distribution.step)
            moved = min(high, max(low, moved))
        return round(moved) if isinstance(distribution, IntDistribution) else moved

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if trial.number in self._refined:
            return dict(self.space)
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if trial.number in self._refined:
            return {n: v for n, v in self._refined[trial.number].items() if n in search_space}
        return self.inner.sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._refined.pop(trial.number, None)
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
