"""Population Based Training on the Ray backend, recorded in the study's Optuna storage.

PBT trains a population of runs at once; every few epochs a run in the bottom quantile takes the
weights of one in the top quantile and goes on with perturbed settings (Jaderberg et al. 2017).
Tune's ``PopulationBasedTraining`` does the exploiting and exploring; it refuses a search
algorithm, so Optuna's part is the first population: the study's sampler proposes each member
(enqueued trials first), and each member is one Optuna trial. Its parameters are the ones it
started with; what PBT changed later is kept in the trial's ``pbt_schedule`` attribute (after
which epoch, whose weights, which values), and its values at the end in ``pbt_final_params``.

Only settings a run can change mid-schedule are perturbed: the optimizer's lr, weight decay and
momentum (``trainer.config.RESUMABLE_CHANGES``). Every other parameter of a member that takes
another's weights becomes that member's, since the weights were trained with it.

Ray is imported inside the functions that use it: the launcher, ``hpo status`` and the pre-flight
checks import this module on machines and in processes where Ray is absent or not wanted.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution

from hpo import record, search
from hpo.errors import StudyFileError, one_line
from hpo.trial import measured
from trainer.config import RESUMABLE_CHANGES

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

    from hpo.config import StudySpec

PBT_OPTIONS = ("perturbation_interval", "quantile_fraction", "resample_probability", "mutations")
MEMBER_KEY = "hpo_member"
"""A config key naming the member a Tune trial's weights come from (PBT copies it on cloning)."""
ATTR_PBT_SCHEDULE = "pbt_schedule"
ATTR_PBT_FINAL_PARAMS = "pbt_final_params"


def mutations(spec: StudySpec) -> list[str]:
    """The parameters PBT perturbs: those the study file names, else every one it can."""
    where = f"{spec.source}: study.pruner.options"
    options = spec.study.pruner.options
    for key in options:
        if key not in PBT_OPTIONS:
            raise StudyFileError(f"{where}.{key}: unknown option; valid options: {', '.join(PBT_OPTIONS)}")
    names = options.get("mutations")
    if names is None:
        names = [name for name in RESUMABLE_CHANGES if name in spec.search_space]
        if not names:
            raise StudyFileError(
                f"{where}.mutations: pbt perturbs {', '.join(RESUMABLE_CHANGES)}; "
                "the search space has none of them"
            )
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise StudyFileError(f"{where}.mutations: must be a non-empty list of parameter names, got {names!r}")
    for name in names:
        if name not in spec.search_space:
            raise StudyFileError(f"{where}.mutations: {name!r} is not in search_space")
        if name not in RESUMABLE_CHANGES:
            raise StudyFileError(
                f"{where}.mutations: {name!r} cannot change in the middle of a run; "
                f"pbt can perturb {', '.join(RESUMABLE_CHANGES)}"
            )
    return list(names)


def build_scheduler(spec: StudySpec) -> Any:
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    where = f"{spec.source}: study.pruner.options"
    options = spec.study.pruner.options
    distributions = search.distributions(spec)
    names = mutations(spec)
    space: dict[str, Any] = {}
    for name in names:
        dist = distributions[name]
        if isinstance(dist, CategoricalDistribution):
            space[name] = list(dist.choices)  # PBT moves to a neighbouring choice
        elif isinstance(dist, FloatDistribution):
            space[name] = (tune.loguniform if dist.log else tune.uniform)(dist.low, dist.high)
        else:
            raise StudyFileError(f"{where}.mutations: {name!r} must be a float or categorical parameter")

    def stay_in_bounds(config: dict[str, Any]) -> dict[str, Any]:
        # PBT multiplies a value by 0.8 or 1.2 with no regard for the search space's bounds.
        for name in names:
            dist = distributions[name]
            if isinstance(dist, FloatDistribution):
                config[name] = min(max(float(config[name]), dist.low), dist.high)
        return config

    try:
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=float(options.get("perturbation_interval", 1)),
            quantile_fraction=float(options.get("quantile_fraction", 0.25)),
            resample_probability=float(options.get("resample_probability", 0.25)),
            hyperparam_mutations=space,
            custom_explore_fn=stay_in_bounds,
        )
    except (TypeError, ValueError) as err:
        raise StudyFileError(f"{where}: {one_line(err, name=False)}") from None


def first_population(
    study: optuna.Study, spec: StudySpec, size: int, job_id: str
) -> tuple[list[optuna.trial.Trial], list[dict[str, Any]]]:
    """Ask the study for ``size`` members (its enqueued trials first): Optuna trials, and the Tune
    configs that start them. Members beyond max_concurrent wait (no start time) until others end."""
    distributions: dict[str, BaseDistribution] = search.distributions(spec)
    members, configs = [], []
    for index in range(size):
        trial = study.ask(distributions)
        record.set_attrs(
            trial,
            {
                **record.placement(spec.resources.executor, record.DispatchMode.RAY),
                record.ATTR_JOB_ID: job_id,
            },
        )
        members.append(trial)
        configs.append({**trial.params, MEMBER_KEY: index})
    return members, configs


class PopulationRecorder:
    """A Tune callback that writes each member's epochs, its schedule and its end to its Optuna trial."""

    def __init__(self, study: optuna.Study, spec: StudySpec, members: list[optuna.trial.Trial]) -> None:
        self.study = study
        self.spec = spec
        self.members = members
        self.epochs = int(spec.trainer.get("epochs", 1))
        self.member_of: dict[str, int] = {}
        self.last_epoch: dict[int, int] = {}
        self.params: dict[int, dict[str, Any]] = {}
        self.schedule: dict[int, list[dict[str, Any]]] = {}
        self.told: set[int] = set()

    def as_tune_callback(self) -> Any:
        from ray import tune

        recorder = self

        class Callback(tune.Callback):
            def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
                recorder.started(trial)

            def on_trial_result(
                self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
            ) -> None:
                recorder.result(trial, result)

            def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
                recorder.finished(trial, error=False)

            def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
                recorder.finished(trial, error=True)

        return Callback()

    def started(self, trial: Any) -> None:
        # The first start comes before any cloning, so the config still names the member itself.
        if trial.trial_id not in self.member_of:
            index = int(trial.config[MEMBER_KEY])
            self.member_of[trial.trial_id] = index
            self.params[index] = self._params(trial.config)
            record.set_attr(self.members[index], record.ATTR_STARTED_AT, record.now_iso())

    def _params(self, config: dict[str, Any]) -> dict[str, Any]:
        return {name: config[name] for name in self.spec.search_space}

    def result(self, trial: Any, result: dict[str, Any]) -> None:
        index = self.member_of.get(trial.trial_id)
        if index is None or index in self.told:
            return
        member = self.members[index]
        epoch = int(result.get("epoch", result.get("training_iteration", 0)))
        value = result.get(self.spec.study.metric)
        # A member that took the weights of one behind it trains those epochs again: the first
        # value of each epoch is the one kept, as Optuna does.
        if value is not None and epoch > self.last_epoch.get(index, 0):
            member.report(float(value), epoch)
            self.last_epoch[index] = epoch
        # Tune's PBT has already given the trial its new config when this result arrives.
        params = self._params(trial.config)
        source = int(trial.config[MEMBER_KEY])
        if params != self.params[index] or source != index:
            self.schedule.setdefault(index, []).append(
                {"after_epoch": epoch, "weights_of_trial": self.members[source].number, "params": params}
            )
            self.params[index] = params
            # From now on this trial's weights are its own: a member cloning it must name it.
            trial.config[MEMBER_KEY] = index
            record.set_attr(member, ATTR_PBT_SCHEDULE, self.schedule[index])

    def finished(self, trial: Any, error: bool) -> None:

        index = self.member_of.get(trial.trial_id)
        if index is None or index in self.told:
            return
        member = self.members[index]
        result = trial.last_result or {}
        value = result.get(self.spec.study.metric)
        epochs_done = int(result.get("epoch", 0))
        attrs = measured.tune_result_attrs(result, epochs_done, error, self.spec.resources.tasks_per_node)
        record.set_attrs(member, {**attrs, record.ATTR_PBT_FINAL_PARAMS: self.params[index]})
        if error or value is None or math.isnan(float(value)) or epochs_done < self.epochs:
            self.study.tell(member, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(member, float(value))
        self.told.add(index)

    def fail_unfinished(self, reason: str) -> int:
        """Members the Ray run ended without finishing (time budget, stop) are failed."""

        failed = 0
        for index, member in enumerate(self.members):
            if index in self.told:
                continue
            record.set_attr(member, record.ATTR_FAIL_REASON, reason)
            self.study.tell(member, state=optuna.trial.TrialState.FAIL)
            self.told.add(index)
            failed += 1
        return failed
