"""The Optuna side of a study: sampler, pruner, distributions, creation and the trial budget.

Everything here is shared by the launcher (which asks) and the trial processes (which report,
ask ``should_prune`` and tell), so that both build the same pruner from the same study file.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpo.errors import StudyFileError
from hpo.studyfile import RAY_ONLY_PRUNERS

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution
    from optuna.storages import BaseStorage

    from hpo.studyfile import ParamSpec, PrunerSpec, SamplerSpec, StudySpec

# Trial user attributes written by the service (shown by `hpo status` and optuna-dashboard).
ATTR_JOB_ID = "job_id"
ATTR_EXECUTOR = "executor"
ATTR_JOB_FOLDER = "job_folder"
ATTR_NODES = "nodes"
ATTR_ELAPSED_S = "elapsed_s"
ATTR_FAIL_REASON = "fail_reason"
ATTR_ASKED_AT = "asked_at"
ATTR_STARTED_AT = "started_at"
ATTR_FINISHED_AT = "finished_at"
ATTR_EPOCHS = "epochs_completed"
ATTR_IMAGES_PER_S = "images_per_s"
# Accuracy on the held-out test images (trainer.test_held_out), for the completed trials.
ATTR_TEST_ACCURACY = "test_accuracy"
ATTR_SURPLUS = "surplus"
ATTR_JOB_KIND = "job_kind"
"""slurm or local: where a --workers worker (executor "worker") runs."""
ATTR_INFEASIBLE = "infeasible"
"""Set on a trial that ran out of memory (see hpo.retries)."""
ATTR_GPU_HOURS = "gpu_hours"
ATTR_EPOCH_TIME_S = "epoch_time_s"
"""Mean seconds per epoch (training and validation) of the trial's last run."""
ATTR_CURVE = "epoch_values"
"""{epoch: metric} after each epoch, in a multi-objective study (which takes no intermediate values)."""
ATTR_CPU_HOURS = "cpu_hours"
ATTR_RESUMED_FROM = "resumed_from_epoch"
"""The epoch whose checkpoint the trial's last run resumed from (after a requeue, or a retry)."""
ATTR_RESTARTS = "restarts"
"""How many times Slurm requeued the trial's job (preemption, time limit, node failure)."""
# Trial system attributes of a retry: the names Optuna's RetryHeartbeatStaleTrialCallback uses.
SYSTEM_ATTR_FAILED_TRIAL = "failed_trial"
SYSTEM_ATTR_RETRY_HISTORY = "retry_history"
REASON_CANCELLED = "cancelled by hpo cancel"
# Study user attributes.
STUDY_ATTR_CANCEL = "hpo_cancel_requested_at"
STUDY_ATTR_RAY_JOB = "hpo_ray_job"
"""The Slurm job id of a Ray-backed study's allocation."""
STUDY_ATTR_ENQUEUED = "hpo_enqueued"


def distributions(spec: StudySpec) -> dict[str, BaseDistribution]:
    return {name: _distribution(param) for name, param in spec.search_space.items()}


def _distribution(param: ParamSpec) -> BaseDistribution:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

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
    import optuna

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
    import optuna

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
        raise StudyFileError(f"{where}: {str(err).splitlines()[0]}") from None
    except ImportError as err:
        raise StudyFileError(f"{where}: needs a package that is not installed: {err.name or err}") from None


def validate_optuna_settings(spec: StudySpec) -> None:
    """Build the sampler and pruner once, so that bad options fail before anything else."""
    build_sampler(spec.study.sampler, spec.study.max_concurrent, spec.source)
    build_pruner(spec.study.pruner, spec.source)


def load(spec: StudySpec, storage: BaseStorage, *, create: bool) -> optuna.Study:
    import optuna

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
    import warnings

    import optuna

    if study.metric_names != objective_names(spec):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(objective_names(spec))


def counted_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that use up the budget: all of them, except surplus ones closed unrun and
    failed ones whose retry (queued or run) takes their place."""
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    return [t for t in trials if not t.user_attrs.get(ATTR_SURPLUS) and t.number not in retried]


def retried_numbers(trials: list[optuna.trial.FrozenTrial]) -> set[int]:
    """The numbers of the trials that have a retry."""
    return {
        t.system_attrs[SYSTEM_ATTR_RETRY_HISTORY][-1]
        for t in trials
        if t.system_attrs.get(SYSTEM_ATTR_RETRY_HISTORY)
    }


def cancel_requested_at(study: optuna.Study) -> float:
    """When `hpo cancel` last ran on the study (unix time; 0 if never): launchers and workers
    started before it take no new trial."""
    return float(study.user_attrs.get(STUDY_ATTR_CANCEL, 0.0))


def enqueue_first_trials(study: optuna.Study, spec: StudySpec) -> int:
    """Enqueue ``study.enqueue`` once per study (a relaunch must not enqueue them again)."""
    if not spec.study.enqueue or study.user_attrs.get(STUDY_ATTR_ENQUEUED):
        return 0
    for params in spec.study.enqueue:
        study.enqueue_trial(params, skip_if_exists=True)
    study.set_user_attr(STUDY_ATTR_ENQUEUED, True)
    return len(spec.study.enqueue)


def curve(trial: optuna.trial.FrozenTrial) -> dict[int, float]:
    """The metric after each epoch: Optuna's intermediate values, or the attribute that holds
    them in a multi-objective study."""
    if trial.intermediate_values:
        return dict(trial.intermediate_values)
    return {int(epoch): float(v) for epoch, v in trial.user_attrs.get(ATTR_CURVE, {}).items()}


def metric_value(trial: optuna.trial.FrozenTrial) -> float | None:
    """The trial's metric: its (first) objective value, else its last reported one."""
    if trial.values:
        return trial.values[0]
    values = curve(trial)
    return values[max(values)] if values else None


def best_trial(study: optuna.Study, spec: StudySpec) -> optuna.trial.FrozenTrial | None:
    """The best trial; in a multi-objective study, the one of the Pareto front best in the metric."""
    if not spec.study.also_minimize:
        try:
            return study.best_trial
        except ValueError:
            return None
    front = study.best_trials
    if not front:
        return None
    pick = max if spec.study.direction == "maximize" else min
    return pick(front, key=lambda t: t.values[0])


def pareto_front(study: optuna.Study, spec: StudySpec) -> list[optuna.trial.FrozenTrial]:
    """The multi-objective study's non-dominated trials, best metric first; [] for one objective."""
    if not spec.study.also_minimize:
        return []
    return sorted(study.best_trials, key=lambda t: t.values[0], reverse=spec.study.direction == "maximize")


def format_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
