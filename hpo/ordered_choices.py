"""Numeric choices shown to the sampler in their order.

A ``power_of_two`` range (batch size 64/128/256) and numeric choices (width 8/16/32) are stored as
Optuna categoricals: the dashboard, the views, enqueued and warm-started trials all see the values
themselves. But a categorical tells TPE and the GP nothing of order: "wider was better" cannot be
learned, and 32 is as far from 16 as from 8. :class:`OrderedChoices` wraps the study's sampler
and shows it each such parameter as the integer position of its value among the sorted choices
(an ``IntDistribution``), over a view of the study whose trials are translated the same way; what
it proposes is translated back. The stored trials never change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from hpo import record


def ordered_values(distribution: BaseDistribution) -> list[Any] | None:
    """The choices in their order, for a categorical of three or more numbers (booleans aside);
    None for any other distribution (two choices have no order worth learning)."""
    if not isinstance(distribution, CategoricalDistribution) or len(distribution.choices) < 3:
        return None
    choices = list(distribution.choices)
    if not all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices):
        return None
    return sorted(choices)


class OrderedChoices(optuna.samplers.BaseSampler):
    """The inner sampler, shown each ordered categorical of ``space`` as the position of its value
    (see the module's docstring). Other parameters pass through unchanged."""

    def __init__(self, inner: optuna.samplers.BaseSampler, space: dict[str, BaseDistribution]) -> None:
        self.inner = inner
        self.orders = {name: values for name, d in space.items() if (values := ordered_values(d)) is not None}
        self._encoded: dict[tuple[int, int], FrozenTrial] = {}
        """Finished trials translated once (they no longer change), by trial id and value count."""

    # --- translation ----------------------------------------------------------------------------
    def _position(self, name: str) -> IntDistribution:
        return IntDistribution(0, len(self.orders[name]) - 1)

    def _encode_space(self, space: dict[str, BaseDistribution]) -> dict[str, BaseDistribution]:
        return {n: self._position(n) if self._ordered(n, d) else d for n, d in space.items()}

    def _ordered(self, name: str, distribution: BaseDistribution) -> bool:
        return name in self.orders and ordered_values(distribution) == self.orders[name]

    def _decode(self, name: str, value: Any) -> Any:
        return self.orders[name][int(value)] if name in self.orders else value

    def encode_trial(self, trial: FrozenTrial) -> FrozenTrial:
        """The trial as the inner sampler sees it: each ordered parameter's value as its position."""
        names = [n for n, d in trial.distributions.items() if self._ordered(n, d)]
        if not names:
            return trial
        key = (record.trial_id(trial), len(trial.values or ()))
        if trial.state.is_finished() and key in self._encoded:
            return self._encoded[key]
        params, distributions = dict(trial.params), dict(trial.distributions)
        for name in names:
            params[name] = self.orders[name].index(trial.params[name])
            distributions[name] = self._position(name)
        encoded = optuna.trial.FrozenTrial(
            number=trial.number,
            state=trial.state,
            value=None,
            values=trial.values,
            datetime_start=trial.datetime_start,
            datetime_complete=trial.datetime_complete,
            params=params,
            distributions=distributions,
            user_attrs=trial.user_attrs,
            system_attrs=trial.system_attrs,
            intermediate_values=trial.intermediate_values,
            trial_id=record.trial_id(trial),
        )
        if trial.state.is_finished():
            self._encoded[key] = encoded
        return encoded

    def _view(self, study: optuna.Study) -> optuna.Study:
        return _EncodedStudy(study, self.encode_trial)  # type: ignore[return-value]

    # --- the sampler ----------------------------------------------------------------------------
    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        # Optuna checks each relative parameter against the distribution it is suggested with: the
        # space handed back is the stored one (categoricals), translated again for the inner sampler.
        inferred = self.inner.infer_relative_search_space(self._view(study), self.encode_trial(trial))
        return {
            n: CategoricalDistribution(self.orders[n]) if n in self.orders and d == self._position(n) else d
            for n, d in inferred.items()
        }

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        encoded = self._encode_space(search_space)
        proposed = self.inner.sample_relative(self._view(study), self.encode_trial(trial), encoded)
        return {
            n: self._decode(n, v) if encoded.get(n) != search_space.get(n) else v for n, v in proposed.items()
        }

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        if not self._ordered(param_name, param_distribution):
            return self.inner.sample_independent(self._view(study), trial, param_name, param_distribution)
        position = self.inner.sample_independent(
            self._view(study), self.encode_trial(trial), param_name, self._position(param_name)
        )
        return self._decode(param_name, position)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(self._view(study), self.encode_trial(trial))

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self.inner.after_trial(self._view(study), self.encode_trial(trial), state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


class _EncodedStudy:
    """The study as the inner sampler reads it: its trials translated, everything else its own."""

    def __init__(self, study: optuna.Study, encode: Any) -> None:
        self._study, self._encode = study, encode

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        return [self._encode(t) for t in self._study.get_trials(deepcopy=False, states=states)]

    def _get_trials(
        self, deepcopy: bool = True, states: Any = None, use_cache: bool = False
    ) -> list[FrozenTrial]:
        trials = self._study._get_trials(deepcopy=False, states=states, use_cache=use_cache)
        return [self._encode(t) for t in trials]
