"""The study section: its name, storage, metric, sampler, pruner, stop rules, warm start and budget."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from hpo.config.fields import nested
from hpo.config.values import (
    COST_OBJECTIVES,
    METRICS,
    NAME,
    PRUNERS,
    SAMPLERS,
    Backend,
    CostObjective,
    Direction,
    OptunaPruner,
    RayOnlyPruner,
    Sampler,
    check_safe_name,
    parse_duration_min,
)
from trainer.fields import KeyProblem, build, config_dataclass, field


@config_dataclass()
class SamplerSpec:
    name: Sampler = field("tpe", f"One of {', '.join(SAMPLERS)} (Optuna's samplers).")
    seed: int | None = field(0, "Seed of the sampler, for a reproducible sequence of trials.")
    options: dict[str, Any] = field(factory=dict, help="Keyword arguments of the Optuna sampler class.")
    ordered_choices: bool = field(
        False,
        "Show the sampler each parameter of ordered numeric choices (a power_of_two range, choices of "
        "3 or more numbers) as the position of its value in their order, so that TPE or the GP can "
        "learn that larger (or smaller) is better; the trials still store the values themselves.",
    )


DEFAULT_PORTFOLIO = 4
"""Starting-portfolio entries a study that names no sampler tries first (the size replayed)."""

# Names a user may know a pruner by, from papers or Ray Tune: the name it has here, and why.
PRUNER_ALIASES = {"asha": "successive_halving", "sha": "successive_halving", "median_stopping": "median"}
PRUNER_ALIAS_WHY = {
    "successive_halving": "Optuna's SuccessiveHalvingPruner is asynchronous successive halving, "
    "ASHA; with the Ray backend it becomes Tune's ASHAScheduler",
    "median": "Optuna's MedianPruner is the median stopping rule; with the Ray backend, Tune's "
    "MedianStoppingRule",
}


@config_dataclass()
class PrunerSpec:
    name: Literal[OptunaPruner, RayOnlyPruner] = field(
        "median",
        f"One of {', '.join(PRUNERS)} (Optuna's pruners), or, with the Ray backend only, pbt "
        "(Ray Tune's Population Based Training; options perturbation_interval, quantile_fraction, "
        "resample_probability, mutations). A study file that names no pruner gets none (measured "
        "by bench/replay.py: under OneCycle no pruner paid); one that gives options without a "
        "name gets median with n_warmup_steps at 4/9 of a full run's steps and those options; a "
        "named median keeps Optuna's defaults.",
    )
    options: dict[str, Any] = field(factory=dict, help="Keyword arguments of the Optuna pruner class.")


@config_dataclass()
class PortfolioSpec:
    size: int | None = field(
        None,
        "How many configurations of the service's learned starting portfolio (hpo/portfolio.json, "
        "learned from the recorded tasks by bench/portfolio.py; 4 ship) to try after enqueue, "
        "before the sampler: each entry's positions in this study's ranges for the parameters it "
        "has a role for, the others drawn by the sampler. Default: 4 when the study file names no "
        "sampler (the measured default, bench/replay.py), 0 when it names one or the study is "
        "warm-started. Never more than n_trials leaves after enqueue. `portfolio: 4` is short for "
        "`portfolio: {size: 4}`.",
        ge=0,
    )
    roles: dict[str, str] = field(
        factory=dict,
        help="The portfolio's roles (lr, weight_decay, batch_size, pct_start, capacity) and the "
        "search-space parameter that plays each, where its name is not one the service knows: "
        "{lr: my_lr}. Known without it: lr, learning_rate, max_lr, base_lr; weight_decay, wd; "
        "batch_size, bs, batch; pct_start, warmup_ratio; hidden, width, channels (hpo.portfolio.ROLE_NAMES).",
    )


def _portfolio(data: Any) -> Any:
    """``portfolio: 4`` is ``portfolio: {size: 4}``; null is every default."""
    if isinstance(data, int) and not isinstance(data, bool):
        data = {"size": data}
    elif data is not None and not isinstance(data, dict | PortfolioSpec):
        raise KeyProblem("", f"must be an integer (the size) or a mapping (size, roles), got {data!r}")
    return build(PortfolioSpec, data)


@config_dataclass()
class StopSpec:
    patience: int | None = field(
        None,
        "End the study once this many finished trials in a row (complete or pruned, in the order "
        "they ended) brought no improvement of the best value larger than min_improvement.",
        ge=1,
    )
    min_improvement: float = field(
        0.0, "With patience: the smallest change of the best value that counts as one.", ge=0
    )
    terminator: bool = field(
        False,
        "End the study once Optuna's Terminator judges it converged: the regret bound of a Gaussian "
        "process fitted to the completed trials is below the metric's noise (needs SciPy: the "
        "samplers extra).",
    )
    noise: float | None = field(
        None,
        "With terminator: the metric's noise, e.g. its standard deviation over training seeds "
        "(default: Optuna's estimate from the study's first trials, which in the replay of "
        "docs/benchmarks.md was 1/25 of the seed SD and never stopped a study: set it).",
        gt=0,
    )
    min_trials: int = field(
        10,
        "Complete trials of this study before a stop rule may end it (in the replay, a Terminator "
        "allowed to stop after 5 lost more than the noise in 38% of seeds).",
        ge=2,
    )

    def __post_init__(self) -> None:
        if self.patience is None and self.min_improvement:
            raise KeyProblem("min_improvement", "applies with patience; set patience too")
        if not self.terminator and self.noise is not None:
            raise KeyProblem("noise", "applies to the terminator; set terminator: true too")

    @property
    def active(self) -> bool:
        return self.patience is not None or self.terminator


@config_dataclass()
class WarmStartSpec:
    studies: list[str] = field(
        factory=list,
        help="Earlier studies whose finished trials seed this one: imported as completed trials "
        "(marked imported, counted in no budget, never re-run, never this study's best).",
    )
    enqueue_best_of: str | None = field(
        None,
        "An earlier study whose best configurations this study runs first, as its own trials "
        "(hpo launch --enqueue-best-of STUDY).",
    )
    enqueue_best: int = field(3, "How many of that study's best configurations.", ge=1)
    storage: str | None = field(
        None, "Where those studies live, if not in this study's storage (a storage URL)."
    )
    rescale_lr: bool = field(
        True,
        "Rescale an imported lr by the linear rule when its trial's global batch (batch_size x "
        "ranks) differs from what it is here.",
    )

    def __post_init__(self) -> None:
        for index, name in enumerate(self.studies):
            check_safe_name(f"studies[{index}]", name)
        if self.enqueue_best_of is not None:
            check_safe_name("enqueue_best_of", self.enqueue_best_of)
        if self.storage is not None and not (self.studies or self.enqueue_best_of):
            raise KeyProblem("studies", "is empty: name the studies to warm-start from")

    @property
    def sources(self) -> list[str]:
        return [*self.studies, *([self.enqueue_best_of] if self.enqueue_best_of else [])]


@config_dataclass()
class StudySection:
    name: str = field(help="Study name, unique in its storage ([A-Za-z0-9._-]).")
    storage: str | None = field(
        None,
        "Storage URL: postgresql://user@host:port/db (password from PGPASSWORD or ~/.pgpass), "
        "sqlite:///path, journal:path, or empty for the embedded default (a journal file in workdir).",
    )
    workdir: str | None = field(
        None, "Folder for job logs, checkpoints and the embedded storage (default: runs/<name>)."
    )
    backend: Backend = field(
        "optuna",
        "optuna (the launcher submits each trial as a job) or ray (Ray Tune inside one allocation, "
        "or a local Ray instance with the local executor).",
    )
    metric: str = field(
        "val_accuracy",
        f"The value optimized, reported every epoch: with the trainer one of {', '.join(METRICS)}; "
        "with an objective section, the name of its metric (letters, digits, _).",
    )
    direction: Direction | None = field(
        None, "maximize or minimize (default: what a trainer metric implies; required otherwise)."
    )
    also_minimize: CostObjective | None = field(
        None,
        f"A cost minimized alongside the metric, making a multi-objective study whose result is a "
        f"Pareto front: one of {', '.join(COST_OBJECTIVES)} (the trial's own). Optuna cannot prune "
        "such a study: it gets no pruner when it names none, and a named pruner other than none is "
        "refused.",
    )
    sampler: Annotated[SamplerSpec, nested(SamplerSpec)] = field(
        factory=SamplerSpec, help="The sampler that proposes each trial's parameters."
    )
    pruner: Annotated[PrunerSpec, nested(PrunerSpec)] = field(
        factory=PrunerSpec, help="The pruner that stops unpromising trials early, from their epochs' metric."
    )
    n_trials: int = field(20, "Trials in the study, those of earlier launches included.", ge=1)
    max_concurrent: int = field(2, "Trials in flight at once.", ge=1)
    max_concurrent_counts: Literal["trials", "jobs"] = field(
        "trials",
        "What max_concurrent counts of per-trial jobs: trials (a finished trial's place goes to "
        "the next once its job has left its result, while that job may take a second or two more "
        "to exit: the study may briefly have one more job per place on the cluster) or jobs (the "
        "next trial waits until the scheduler no longer lists the job: never more than "
        "max_concurrent of the study's jobs at once, in sacct too, at the cost of that exit per "
        "trial).",
    )
    max_retries: int = field(
        1,
        "Times a failed trial (exception, job cancelled outside the service, node lost) is run "
        "again with the same parameters, from its last checkpoint; 0 never retries.",
        ge=0,
    )
    fail_fast: bool = field(
        True,
        "Stop a launch whose first trials all fail the same way (2 trials with different "
        "parameters for a failure no rerun changes: a usage error, a missing file, a metric "
        "pattern that never matched; 3 for any other), before the budget is spent on it.",
    )
    timeout: str | int | None = field(
        None, "Stop submitting new trials after this long (minutes, or 90s, 30m, 2h, 1-00:00:00)."
    )
    enqueue: list[dict[str, Any]] = field(
        factory=list, help="Parameter sets to try first (e.g. the current hand-tuned one)."
    )
    portfolio: Annotated[
        PortfolioSpec, BeforeValidator(_portfolio, json_schema_input_type=int | PortfolioSpec | None)
    ] = field(
        factory=PortfolioSpec,
        help="The learned starting portfolio: how many of its configurations to try first (an "
        "integer, or size), and which parameters play its roles (roles).",
    )
    budget: float | None = field(
        None,
        "Compute budget in GPU-hours (CPU-hours when trials have no GPU), earlier launches "
        "included: no trial is submitted once the hours spent plus the expected cost of the "
        "trials in flight and of one more trial would pass it. Whichever of n_trials, timeout "
        "and budget is reached first ends the study.",
        gt=0,
    )
    stop: Annotated[StopSpec, nested(StopSpec)] = field(
        factory=StopSpec,
        help="End the study early once it stops improving (a patience rule, Optuna's Terminator).",
    )
    warm_start: Annotated[WarmStartSpec, nested(WarmStartSpec)] = field(
        factory=WarmStartSpec, help="Seed the study with the finished trials of earlier studies."
    )
    tensorboard: bool = field(
        True,
        "Built-in trainer: write each trial's TensorBoard event files (per-epoch metrics, learning "
        "rate, throughput, data wait; its parameters in the HParams view) under workdir, for "
        "`tensorboard --logdir <workdir>`.",
    )
    profile_trials: int = field(
        0,
        "Built-in trainer: run torch.profiler in the first this many trials (numbers 0 to K-1) over "
        "steps 2-6 of their first epoch; `hpo logs STUDY TRIAL --trace` says where the trace is.",
        ge=0,
    )

    def __post_init__(self) -> None:
        check_safe_name("name", self.name)
        if self.name in self.warm_start.sources and self.warm_start.storage is None:
            key = "studies" if self.name in self.warm_start.studies else "enqueue_best_of"
            raise KeyProblem(f"warm_start.{key}", f"names this study itself ({self.name!r})")
        if not NAME.fullmatch(self.metric):
            raise KeyProblem("metric", f"must be a name (letters, digits and _), got {self.metric!r}")
        if self.direction is None and self.metric in METRICS:
            self.direction = METRICS[self.metric]
        if self.also_minimize is not None:
            if self.pruner.name != "none":
                raise KeyProblem(
                    "pruner.name",
                    f"Optuna cannot prune a multi-objective study (also_minimize is set); got "
                    f"{self.pruner.name!r}, use none",
                )
            if self.backend != "optuna":
                raise KeyProblem(
                    "also_minimize", "the ray backend optimizes one objective; use backend optuna"
                )
        if self.timeout is not None:
            parse_duration_min("timeout", self.timeout)
        if self.stop.active and self.also_minimize is not None:
            raise KeyProblem(
                "stop", "a stop rule reads one metric; a multi-objective study (also_minimize) has none"
            )
        if self.profile_trials and self.backend == "ray":
            raise KeyProblem(
                "profile_trials", "profiles trials of backend optuna (Ray Tune names its own trials)"
            )
        if self.profile_trials and self.warm_start.studies:
            # Imported trials take the first numbers: no trial run here would be below K.
            raise KeyProblem(
                "profile_trials",
                "counts trials from 0, which a warm start's imported trials take; profile a cold study",
            )
        if self.pruner.name == "pbt" and (self.stop.active or self.budget is not None):
            # PBT trains its whole population at once, from start to end: nothing to hold back.
            key = "stop" if self.stop.active else "budget"
            raise KeyProblem(key, "does not apply to pbt, whose population trains at once; use n_trials")

    @property
    def timeout_min(self) -> float | None:
        return None if self.timeout is None else parse_duration_min("timeout", self.timeout)

    @property
    def on_ray(self) -> bool:
        """Whether Ray Tune runs the trials (inside one allocation), rather than the launcher."""
        return self.backend == "ray"
