"""Candidate samplers, measured by the replay and not shipped unless they win there: TPE whose
acquisition gets a term that fades as the study learns.

TPE proposes the candidate (of ``n_ei_candidates`` drawn from its density of good trials) with the
largest ``log l(x) - log g(x)``. ``AcquisitionTPE`` adds ``weight(n) * term(x)``, ``n`` the
study's finished trials and ``weight(n) = min(1, DECAY / n)``, the decay of a prior in πBO
(Hvarfner et al., ICLR 2022: the acquisition times ``prior(x) ** (beta / n)``):

- **a transfer prior** (``TransferPrior``): ``log prior(x)``, the density of the best tenth of the
  other recorded tasks' configurations over positions by role (``hpo.portfolio``), times how well
  this study's finished trials agree with it (the rank correlation of their prior density with
  their values, 0 when they disagree). Unlike the portfolio's fixed entries it is soft: it
  reorders TPE's candidates, never removes one, fades with ``n``, and drops out on a task whose
  results contradict it. Its start-up trials are drawn from it as πBO's initial design is (a
  random top configuration of a random other task, moved by the kernel's width), in the share
  of trials that the agreement gives;
- **cost** (``cost_aware``): ``-log`` of the trial's predicted cost against the median finished
  trial's, the cost predicted from the nearest finished trials' ``elapsed_s`` (what the service
  records of each trial; the replay sets it from its clock). Expected improvement per second
  (Snoek et al. 2012) cooled as the study goes on, so that cheap regions are tried first and
  not forever (Lee et al. 2020).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState
from scipy.stats import spearmanr

from bench.portfolio import entry_of, finals
from hpo import record
from hpo.portfolio import Entry, position, roles, value_at

if TYPE_CHECKING:
    from optuna.samplers._tpe.parzen_estimator import _ParzenEstimator

    from bench.replay_table import Table
    from hpo.config import ParamSpec

DECAY = 10.0
"""πBO's beta: the term counts fully up to 10 finished trials, 1/6.4 of it at 64."""
TOP_SHARE = 0.1
"""The share of a task's recorded configurations, best first, that its part of the prior holds."""
BANDWIDTH = 0.1
"""The prior's kernel width, in positions (a tenth of a range; log-scaled where the range is)."""
UNIFORM_SHARE = 0.1
"""The prior's floor: a uniform density mixed in, so that no region is ruled out."""
AGREEMENT_AFTER = 5
"""Finished trials before the agreement is measured; until then the prior is trusted."""
COST_NEIGHBOURS = 3


@dataclasses.dataclass(frozen=True)
class TransferPrior:
    """A density over positions by role: a mixture, task by task, of Gaussian kernels at the best
    configurations of other tasks (uniform in the roles a task's entries lack), plus a floor."""

    tasks: tuple[tuple[Entry, ...], ...]

    @classmethod
    def learn(cls, tables: Sequence[Table], without: str) -> TransferPrior:
        tasks = []
        for table in (t for t in tables if t.task != without):
            values = finals(table)
            best = np.argsort(-values, kind="stable")[: max(3, round(TOP_SHARE * len(values)))]
            tasks.append(tuple(entry_of(table, table.configs[i].params) for i in best))
        return cls(tuple(tasks))

    def log_density(self, positions: Mapping[str, np.ndarray]) -> np.ndarray:
        """``log prior`` at points given as positions by role (arrays of one length)."""
        size = len(next(iter(positions.values()))) if positions else 0
        if not self.tasks or size == 0:
            return np.zeros(size)
        per_task = []
        for entries in self.tasks:
            kernels = np.zeros(size)
            for entry in entries:
                shared = [r for r in entry if r in positions]
                squared = sum(((positions[r] - entry[r]) / BANDWIDTH) ** 2 for r in shared)
                kernels += np.exp(-0.5 * squared) / (BANDWIDTH * math.sqrt(2 * math.pi)) ** len(shared)
            per_task.append(kernels / len(entries))
        return np.log((1 - UNIFORM_SHARE) * np.mean(per_task, axis=0) + UNIFORM_SHARE)

    def draw(self, rng: np.random.RandomState) -> Entry:
        """One point of the prior: a top configuration of a random task, moved by the kernel."""
        entries = self.tasks[rng.randint(len(self.tasks))]
        entry = entries[rng.randint(len(entries))]
        return {r: float(np.clip(w + rng.normal(0.0, BANDWIDTH), 0.0, 1.0)) for r, w in entry.items()}


class AcquisitionTPE(optuna.samplers.TPESampler):
    """TPE with a fading transfer prior and/or cost term in its acquisition (module docstring)."""

    def __init__(
        self,
        space: Mapping[str, ParamSpec],
        distributions: Mapping[str, BaseDistribution],
        *,
        prior: TransferPrior | None = None,
        cost_aware: bool = False,
        **tpe_options: Any,
    ) -> None:
        super().__init__(**tpe_options)
        self.startup_trials = int(tpe_options.get("n_startup_trials", 10))  # TPESampler's default
        self.space, self.distributions = dict(space), dict(distributions)
        self.prior, self.cost_aware = prior, cost_aware
        self.roles = roles(space)
        self._study: optuna.Study | None = None

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._study = study  # what the acquisition's term reads: Optuna passes it no study
        super().before_trial(study, trial)

    # -- the start-up trials: from the prior, in the share the agreement gives

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if self.prior is not None and self._starting(study):
            return dict(self.distributions)
        return super().infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self.prior is None or not self._starting(study):
            return super().sample_relative(study, trial, search_space)
        # TPE's own random stream, so that the sampler's seed reproduces the study.
        if self._rng.rng.rand() >= self._agreement(study):
            return {}  # drawn at random, as TPE's start-up trials are
        entry = self.prior.draw(self._rng.rng)
        return {
            name: value_at(self.space[name], entry[role])
            for name, role in self.roles.items()
            if role in entry and name in search_space
        }

    def _starting(self, study: optuna.Study) -> bool:
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        return len(finished) < self.startup_trials

    # -- the acquisition's term

    def _compute_acquisition_func(
        self, samples: dict[str, np.ndarray], mpe_below: _ParzenEstimator, mpe_above: _ParzenEstimator
    ) -> np.ndarray:
        values = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        assert self._study is not None
        finished = _finished(self._study)
        weight = min(1.0, DECAY / max(1, len(finished)))
        external = {
            n: [self.distributions[n].to_external_repr(v) for v in samples[n]]
            for n in self.space
            if n in samples
        }
        if self.prior is not None and (agreement := self._agreement(self._study, finished)) > 0:
            values = values + weight * agreement * self.prior.log_density(self._role_positions(external))
        if self.cost_aware:
            values = values - weight * self._log_relative_cost(external, finished)
        return values

    def _positions(self, values: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
        """Values by parameter as positions in each parameter's range."""
        return {n: np.array([position(self.space[n], v) for v in vs]) for n, vs in values.items()}

    def _role_positions(self, values: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
        return {self.roles[n]: p for n, p in self._positions(values).items() if n in self.roles}

    def _agreement(self, study: optuna.Study, finished: list[FrozenTrial] | None = None) -> float:
        """How far the study's finished trials agree with the prior: the rank correlation of their
        prior density with their values (oriented: larger is better), 0 at worst; 1 before
        ``AGREEMENT_AFTER`` of them."""
        assert self.prior is not None
        finished = [
            t
            for t in (_finished(study) if finished is None else finished)
            if self.roles.keys() <= t.params.keys()
        ]
        if len(finished) < AGREEMENT_AFTER:
            return 1.0
        density = self.prior.log_density(
            self._role_positions({n: [t.params[n] for t in finished] for n in self.roles})
        )
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
        values = np.array([sign * float(t.value or 0.0) for t in finished])
        if np.ptp(density) == 0 or np.ptp(values) == 0:
            return 0.0
        return max(0.0, float(spearmanr(density, values)[0]))

    def _log_relative_cost(
        self, candidates: Mapping[str, Sequence[Any]], finished: list[FrozenTrial]
    ) -> np.ndarray:
        """log of each candidate's predicted cost over the median finished trial's: the mean
        ``elapsed_s`` of its ``COST_NEIGHBOURS`` nearest finished trials in positions."""
        size = len(next(iter(candidates.values()))) if candidates else 0
        names = list(candidates)
        timed = [
            t for t in finished if record.ATTR_ELAPSED_S in t.user_attrs and set(names) <= t.params.keys()
        ]
        if len(timed) < COST_NEIGHBOURS or not names:
            return np.zeros(size)
        seen = self._positions({n: [t.params[n] for t in timed] for n in names})
        asked = self._positions(candidates)
        known = np.stack([seen[n] for n in names], axis=1)  # trials x parameters
        at = np.stack([asked[n] for n in names], axis=1)  # candidates x parameters
        cost = np.array([float(t.user_attrs[record.ATTR_ELAPSED_S]) for t in timed])
        distances = np.linalg.norm(at[:, None, :] - known[None, :, :], axis=2)
        nearest = np.argsort(distances, axis=1, kind="stable")[:, :COST_NEIGHBOURS]
        return np.log(cost[nearest].mean(axis=1) / float(np.median(cost)))


def _finished(study: optuna.Study) -> list[FrozenTrial]:
    """The study's completed trials with a finite value."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.value is not None and math.isfinite(t.value)
    ]
