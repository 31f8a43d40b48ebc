"""Study files: their schema and strict validation (``${VAR}`` and ``--set`` are ``loading.py``'s).

A study file has these sections::

    study:          name, storage, metric and direction, sampler, pruner, budget, retries
    search_space:   the parameters to tune, each a float / int / categorical distribution
    trainer:        fixed settings of the built-in trainer (any key of ``python -m trainer --help``)
    objective:      or, instead of the trainer, the user's own code: a command or a Python function
    resources:      what one trial gets: executor (slurm | local), nodes, GPUs, time, account...
    launcher:       where ``hpo launch --detach`` runs the launcher (partition, account, time...)

Each key is declared once, in a section's dataclass (``trainer.fields``): type, default, bounds and
help text, which pydantic validates and :func:`json_schema` publishes (docs/study.schema.json, for
editors). Every error is one line, ``FILE: key.path: problem``, raised as :class:`StudyFileError`
before anything touches a database or a scheduler. Unknown keys are rejected with the list of valid
ones (as submitit does for its executor parameters): a typo must never be silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import Field, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from hpo.config.user_code import RUNTIME_PLACEHOLDERS, TemplateError, placeholders
from trainer.config import RUNTIME_ONLY_FIELDS, TrainConfig, field_names
from trainer.errors import ConfigError
from trainer.fields import KeyProblem, build, check_keys, config_dataclass, field, join, kind, nested

if TYPE_CHECKING:
    from pydantic.json_schema import CoreSchemaOrField

Direction = Literal["maximize", "minimize"]
# The built-in trainer's metrics; an objective section names its own.
METRICS: dict[str, Direction] = {
    "val_accuracy": "maximize",
    "val_loss": "minimize",
    "train_accuracy": "maximize",
    "train_loss": "minimize",
}
Sampler = Literal["tpe", "random", "qmc", "gp", "cmaes"]
OptunaPruner = Literal["none", "median", "percentile", "successive_halving", "hyperband", "threshold"]
# Schedulers that exist only in Ray Tune: no Optuna pruner does what they do.
RayOnlyPruner = Literal["pbt"]
# Costs a multi-objective study may minimize alongside its metric (see hpo.trial.task.cost_objective).
CostObjective = Literal["gpu_hours", "cpu_hours", "epoch_time_s"]
Executor = Literal["local", "slurm"]
Backend = Literal["optuna", "ray"]
ParamType = Literal["float", "int", "categorical"]

SAMPLERS: tuple[str, ...] = typing.get_args(Sampler)
PRUNERS: tuple[str, ...] = typing.get_args(OptunaPruner)
RAY_ONLY_PRUNERS: tuple[str, ...] = typing.get_args(RayOnlyPruner)
COST_OBJECTIVES: tuple[str, ...] = typing.get_args(CostObjective)
EXECUTORS: tuple[str, ...] = typing.get_args(Executor)
BACKENDS: tuple[str, ...] = typing.get_args(Backend)
PARAM_TYPES: tuple[str, ...] = typing.get_args(ParamType)

# Names that end up in sbatch scripts, job names and file paths: no quoting needed anywhere.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ACCOUNT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
_SBATCH_OPTION = re.compile(r"^[a-z][a-z0-9-]*$")
# A whole value written ${VAR} or ${VAR:-default}: hpo.config.loading reads it as the value of VAR.
_VARIABLE = r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}$"
# A parameter or metric of the user's own objective: a placeholder name, a Tune result key.
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What the service sets for each rank of a trial's command (torchrun's names).
_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")

# The names loading.py (and the tests) know these by.
_KeyProblem = KeyProblem
_join = join

_Section = TypeVar("_Section")


# --------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------


@config_dataclass()
class SamplerSpec:
    name: Sampler = field("tpe", f"One of {', '.join(SAMPLERS)} (Optuna's samplers).")
    seed: int | None = field(0, "Seed of the sampler, for a reproducible sequence of trials.")
    options: dict[str, Any] = field(factory=dict, help="Keyword arguments of the Optuna sampler class.")


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
        "resample_probability, mutations). A study file whose pruner names none gets median with "
        "n_warmup_steps at 4/9 of a full run's steps (no trial stopped before; measured by "
        "bench/replay.py), and the options it gives; a named median keeps Optuna's defaults.",
    )
    options: dict[str, Any] = field(factory=dict, help="Keyword arguments of the Optuna pruner class.")


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
            raise _KeyProblem("min_improvement", "applies with patience; set patience too")
        if not self.terminator and self.noise is not None:
            raise _KeyProblem("noise", "applies to the terminator; set terminator: true too")

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
            _safe_name(f"studies[{index}]", name)
        if self.enqueue_best_of is not None:
            _safe_name("enqueue_best_of", self.enqueue_best_of)
        if self.storage is not None and not (self.studies or self.enqueue_best_of):
            raise _KeyProblem("studies", "is empty: name the studies to warm-start from")

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
        _safe_name("name", self.name)
        if self.name in self.warm_start.sources and self.warm_start.storage is None:
            key = "studies" if self.name in self.warm_start.studies else "enqueue_best_of"
            raise _KeyProblem(f"warm_start.{key}", f"names this study itself ({self.name!r})")
        if not _NAME.fullmatch(self.metric):
            raise _KeyProblem("metric", f"must be a name (letters, digits and _), got {self.metric!r}")
        if self.direction is None and self.metric in METRICS:
            self.direction = METRICS[self.metric]
        if self.also_minimize is not None:
            if self.pruner.name != "none":
                raise _KeyProblem(
                    "pruner.name",
                    f"Optuna cannot prune a multi-objective study (also_minimize is set); got "
                    f"{self.pruner.name!r}, use none",
                )
            if self.backend != "optuna":
                raise _KeyProblem(
                    "also_minimize", "the ray backend optimizes one objective; use backend optuna"
                )
        if self.timeout is not None:
            parse_duration_min("timeout", self.timeout)
        if self.stop.active and self.also_minimize is not None:
            raise _KeyProblem(
                "stop", "a stop rule reads one metric; a multi-objective study (also_minimize) has none"
            )
        if self.profile_trials and self.backend == "ray":
            raise _KeyProblem(
                "profile_trials", "profiles trials of backend optuna (Ray Tune names its own trials)"
            )
        if self.profile_trials and self.warm_start.studies:
            # Imported trials take the first numbers: no trial run here would be below K.
            raise _KeyProblem(
                "profile_trials",
                "counts trials from 0, which a warm start's imported trials take; profile a cold study",
            )
        if self.pruner.name == "pbt" and (self.stop.active or self.budget is not None):
            # PBT trains its whole population at once, from start to end: nothing to hold back.
            key = "stop" if self.stop.active else "budget"
            raise _KeyProblem(key, "does not apply to pbt, whose population trains at once; use n_trials")

    @property
    def timeout_min(self) -> float | None:
        return None if self.timeout is None else parse_duration_min("timeout", self.timeout)


@config_dataclass()
class ParamSpec:
    type: ParamType = field(help=f"One of {', '.join(PARAM_TYPES)}.")
    low: int | float | None = field(None, "Lower bound (float and int).")
    high: int | float | None = field(None, "Upper bound, included (float and int).")
    log: bool = field(False, "Sample on a log scale (float and int).")
    step: int | float | None = field(None, "Discretisation step (float and int).")
    choices: list[Any] | None = field(None, "The values of a categorical parameter.")
    power_of_two: bool = field(False, "int only: the powers of two from low to high, as choices.")
    scale_with_batch_size: int | None = field(
        None,
        "lr only: the sampled value is the LR for a global batch of this size; the trial uses it "
        "scaled linearly with its own global batch size (batch_size x GPUs).",
        ge=1,
    )

    def __post_init__(self) -> None:
        if self.type == "categorical":
            for key in ("low", "high", "step"):
                if getattr(self, key) is not None:
                    raise _KeyProblem(key, "does not apply to a categorical parameter (use choices)")
            if self.log or self.power_of_two:
                raise _KeyProblem(
                    "log" if self.log else "power_of_two", "does not apply to a categorical parameter"
                )
            if not self.choices:
                raise _KeyProblem("choices", "must be a non-empty list")
            if len(set(map(repr, self.choices))) != len(self.choices):
                raise _KeyProblem("choices", f"has duplicates: {self.choices!r}")
            for value in self.choices:
                if not isinstance(value, str | int | float | bool) and value is not None:
                    raise _KeyProblem(
                        "choices", f"values must be numbers, strings or booleans, got {value!r}"
                    )
            return
        if self.choices is not None:
            raise _KeyProblem("choices", f"applies to categorical parameters, not {self.type}")
        if self.low is None or self.high is None:
            raise _KeyProblem(
                "low" if self.low is None else "high", f"is required for a {self.type} parameter"
            )
        if self.type == "int":
            for key in ("low", "high", "step"):
                value = getattr(self, key)
                if value is not None and value != int(value):
                    raise _KeyProblem(key, f"must be an integer for an int parameter, got {value!r}")
        if not self.low < self.high:
            raise _KeyProblem("high", f"must be greater than low ({self.low!r}), got {self.high!r}")
        if self.log and self.low <= 0:
            raise _KeyProblem("low", f"must be > 0 on a log scale, got {self.low!r}")
        if self.step is not None:
            if not self.step > 0:
                raise _KeyProblem("step", f"must be > 0, got {self.step!r}")
            if self.log:
                raise _KeyProblem("step", "cannot be combined with log: true (Optuna does not support it)")
        if self.power_of_two:
            if self.type != "int":
                raise _KeyProblem("power_of_two", "applies to int parameters only")
            for key in ("low", "high"):
                value = int(getattr(self, key))
                if value < 1 or value & (value - 1):
                    raise _KeyProblem(key, f"must be a power of two, got {value}")
            if self.log or self.step is not None:
                raise _KeyProblem("power_of_two", "cannot be combined with log or step")

    def rejects(self, value: Any) -> str | None:
        """Why ``value`` is not in this distribution (an enqueued trial must be), or None."""
        choices = (
            self.choices
            if self.type == "categorical"
            else self.powers_of_two()
            if self.power_of_two
            else None
        )
        if choices is not None:
            return None if value in choices else f"{value!r} is not one of the choices {choices!r}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {value!r}"
        if self.type == "int" and value != int(value):
            return f"must be an integer, got {value!r}"
        if not (self.low or 0) <= value <= (self.high or 0):
            return f"{value!r} is outside [{self.low!r}, {self.high!r}]"
        return None

    def values_to_check(self) -> list[Any]:
        """Representative values, each of which must be a valid trainer setting."""
        if self.type == "categorical":
            return list(self.choices or [])
        if self.power_of_two:
            return self.powers_of_two()
        if self.type == "int":
            return [int(self.low or 0), int(self.high or 0)]
        return [float(self.low or 0), float(self.high or 0)]

    def powers_of_two(self) -> list[int]:
        low, high = int(self.low or 1), int(self.high or 1)
        return [2**k for k in range(int(math.log2(low)), int(math.log2(high)) + 1)]


@config_dataclass()
class Resources:
    executor: Executor = field(
        "local", "slurm (one Slurm job per trial, through submitit) or local (processes here)."
    )
    nodes: int = field(1, "Nodes per trial.", ge=1)
    tasks_per_node: int = field(
        1,
        "Processes per node (one per GPU for DDP). With the Ray backend, N > 1 makes each trial a DDP "
        "run of N Ray Train workers (TorchTrainer), each with cpus_per_task CPUs and gpus_per_node / N "
        "GPUs (nodes is then the size of the allocation the trials share).",
        ge=1,
    )
    gpus_per_node: int = field(0, "GPUs per node.", ge=0)
    cpus_per_task: int = field(1, "CPU cores per process (also the trainer's torch threads).", ge=1)
    mem_gb: float | None = field(None, "Memory per node in GB (default: the partition's).", gt=0)
    time: str | int = field("01:00:00", "Time limit of one trial's job (minutes, 30m, 2h, 1-00:00:00).")
    worker_time: str | int | None = field(
        None,
        "Time limit of a --workers job (default: time x its share of the trials, at most 24 h).",
    )
    partition: str | None = field(None, "Slurm partition.")
    account: str | None = field(None, "Slurm account (--account).")
    qos: str | None = field(None, "Slurm QoS (--qos).")
    constraint: str | None = field(None, "Slurm node constraint (--constraint), e.g. a100 or h100.")
    setup: list[str] = field(
        factory=list,
        help="Shell lines run in the job before the trial (module load ..., conda activate ...).",
    )
    sbatch: dict[str, Any] = field(factory=dict, help="Extra sbatch options, e.g. {hint: nomultithread}.")
    python: str | None = field(None, "Python interpreter on the compute nodes (default: this one).")

    def __post_init__(self) -> None:
        parse_duration_min("time", self.time)
        if self.worker_time is not None:
            parse_duration_min("worker_time", self.worker_time)
        _check_placement(self.partition, self.account, self.qos, self.sbatch)
        if self.constraint is not None and not re.fullmatch(r"[A-Za-z0-9_.\-&|\[\]*:()!]+", self.constraint):
            raise _KeyProblem("constraint", f"is not a Slurm constraint expression: {self.constraint!r}")
        for index, line in enumerate(self.setup):
            _simple_command(f"setup[{index}]", line)
        if self.executor == "local" and self.nodes > 1:
            raise _KeyProblem(
                "nodes", f"the local executor runs on this machine only; got nodes={self.nodes}"
            )
        if self.python is not None:
            _single_line("python", self.python)

    @property
    def time_min(self) -> int:
        return max(1, math.ceil(parse_duration_min("time", self.time)))

    @property
    def worker_time_min(self) -> int | None:
        if self.worker_time is None:
            return None
        return max(1, math.ceil(parse_duration_min("worker_time", self.worker_time)))

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node


def _check_placement(
    partition: str | None, account: str | None, qos: str | None, sbatch: dict[str, Any]
) -> None:
    """Names that go into a job script: nothing that needs quoting, one line each."""
    for key, value in (("partition", partition), ("qos", qos)):
        if value is not None:
            _safe_name(key, value)
    # Jean Zay's accounts look like abc@a100.
    if account is not None and not _ACCOUNT.fullmatch(account):
        raise _KeyProblem(
            "account", f"may contain only letters, digits, '.', '_', '-' and '@', got {account!r}"
        )
    for option, value in sbatch.items():
        if not _SBATCH_OPTION.fullmatch(option):
            raise _KeyProblem(f"sbatch.{option}", "is not an sbatch long option name (like mail-type)")
        if not isinstance(value, str | int | float | bool):
            raise _KeyProblem(f"sbatch.{option}", f"must be a single value, got {value!r}")
        _single_line(f"sbatch.{option}", str(value))


@config_dataclass()
class LauncherSection:
    """Where ``hpo launch --detach`` runs the launcher: a small CPU job that mostly sleeps."""

    partition: str | None = field(None, "Partition of the launcher's job (a CPU one; Jean Zay: prepost).")
    account: str | None = field(None, "Account of the launcher's job (Jean Zay: your CPU account, abc@cpu).")
    qos: str | None = field(None, "QoS of the launcher's job.")
    time: str | int = field(
        "20h", "Time limit of one run of the launcher's job; shortly before it, the job requeues itself."
    )
    cpus_per_task: int = field(1, "CPU cores of the launcher's job.", ge=1)
    sbatch: dict[str, Any] = field(factory=dict, help="Extra sbatch options of the launcher's job.")

    def __post_init__(self) -> None:
        _check_placement(self.partition, self.account, self.qos, self.sbatch)
        parse_duration_min("time", self.time)

    @property
    def time_min(self) -> int:
        return max(1, math.ceil(parse_duration_min("time", self.time)))


@config_dataclass()
class ObjectiveSection:
    """The user's own training code as the objective, instead of the built-in trainer."""

    command: list[str] | None = field(
        None,
        "The program and its arguments, one list element each (no shell): {name} takes the trial's "
        "value of a search-space parameter or of objective.fixed; also {trial}, {checkpoint_dir} (the "
        "same across requeues and retries of a trial), {trial_dir} and {python} (the job's "
        "interpreter). {{ and }} are literal braces.",
    )
    function: str | None = field(
        None,
        "package.module:name, called in the trial's job as name(params, trial) with the trial's "
        "parameters and its hpo.trial handle; its return value is the final metric.",
    )
    metric_pattern: str | None = field(
        None,
        "command only: a regular expression searched in each line the command prints; its group "
        "(?P<value>...) is the metric, (?P<step>...) the step (default: the count of matches). Each "
        "match is a report the pruner sees. Not needed by a script that reports through hpo.trial.",
    )
    final_pattern: str | None = field(
        None,
        "command only: a regular expression with (?P<value>...) for the final metric "
        "(default: the last report).",
    )
    fixed: dict[str, str | int | float | bool] = field(
        factory=dict, help="Fixed values of placeholders (not searched), e.g. {epochs: 10}."
    )
    steps: int = field(1, "The step of a full run's last report (its epochs): the pruners' maximum.", ge=1)
    stop_grace_s: float = field(
        10.0, "Seconds a pruned command has between SIGTERM and SIGKILL to its process group.", gt=0
    )
    cwd: str | None = field(
        None, "Folder the command runs in, relative to the study file's (default: the study file's folder)."
    )
    env: dict[str, str] = field(factory=dict, help="Environment variables of the command or function.")

    def __post_init__(self) -> None:
        if (self.command is None) == (self.function is None):
            raise _KeyProblem(
                "command",
                "give one of command (a program and its arguments) or function (package.module:name)",
            )
        if self.command is not None:
            if not self.command:
                raise _KeyProblem("command", "is empty: give the program and its arguments")
            for index, element in enumerate(self.command):
                key = f"command[{index}]"
                if "\0" in element:
                    raise _KeyProblem(key, "contains a NUL character")
                try:
                    names = placeholders(element)
                except TemplateError as err:
                    raise _KeyProblem(key, f"{err}: {element!r}") from None
                if index == 0 and names and element != "{python}":
                    # A parameter value (read back from a shared database) must never pick the program.
                    raise _KeyProblem(
                        key, f"the program may be {{python}} or a fixed name or path, got {element!r}"
                    )
        else:
            for key in ("metric_pattern", "final_pattern"):
                if getattr(self, key) is not None:
                    raise _KeyProblem(key, "applies to a command objective, not a function")
            if not _FUNCTION.fullmatch(str(self.function)):
                raise _KeyProblem("function", f"must be package.module:name, got {self.function!r}")
        for key in ("metric_pattern", "final_pattern"):
            pattern = getattr(self, key)
            if pattern is None:
                continue
            try:
                groups = re.compile(pattern).groupindex
            except re.error as err:
                raise _KeyProblem(key, f"is not a regular expression ({err}): {pattern!r}") from None
            if "value" not in groups:
                raise _KeyProblem(key, f"needs a group (?P<value>...) for the metric: {pattern!r}")
        for name, value in self.fixed.items():
            if not _NAME.fullmatch(name):
                raise _KeyProblem(f"fixed.{name}", "must be a name (letters, digits and _)")
            if name in RUNTIME_PLACEHOLDERS:
                raise _KeyProblem(f"fixed.{name}", "is set by the service for each trial")
            _single_line(f"fixed.{name}", str(value))
        for name, value in self.env.items():
            if not _NAME.fullmatch(name):
                raise _KeyProblem(f"env.{name}", "must be an environment variable name")
            if name.startswith("HPO_") or name in _RANK_VARIABLES:
                raise _KeyProblem(f"env.{name}", "is set by the service for each trial and rank")
            _single_line(f"env.{name}", value)
        if self.cwd is not None:
            _single_line("cwd", self.cwd)

    def placeholder_names(self) -> list[str]:
        return [name for element in self.command or [] for name in placeholders(element)]


@dataclasses.dataclass
class StudySpec:
    """A validated study file: everything a launcher, a trial or a report needs."""

    source: str
    study: StudySection
    search_space: dict[str, ParamSpec]
    trainer: dict[str, Any]
    resources: Resources
    launcher: LauncherSection = dataclasses.field(default_factory=LauncherSection)
    objective: ObjectiveSection | None = None
    """The user's own code as the objective; None: the built-in trainer."""
    objective_cwd: str = ""
    """Where the objective runs: objective.cwd resolved against the study file's folder."""
    warnings: list[str] = dataclasses.field(default_factory=list)
    """What the launch says before it starts, without refusing (a parameter the command never names)."""

    @property
    def max_steps(self) -> int:
        """The step of a full run's last report: the trainer's epochs, or objective.steps."""
        if self.objective is not None:
            return self.objective.steps
        return int(self.trainer.get("epochs", 1))

    @property
    def workdir(self) -> Path:
        return Path(self.study.workdir or f"runs/{self.study.name}").expanduser().absolute()

    def trainer_config(self, params: Mapping[str, Any], **runtime: Any) -> TrainConfig:
        """The trainer settings of one trial: fixed settings, then the trial's parameters."""
        if self.objective is not None:
            raise ConfigError("this study tunes its own objective, not the trainer")
        values = dict(self.trainer)
        values.update(params)
        lr_spec = self.search_space.get("lr")
        if lr_spec is not None and lr_spec.scale_with_batch_size and "lr" in params:
            # A Ray-backend trial spans tasks_per_node ranks: its nodes are the shared allocation's.
            ranks = (
                self.resources.tasks_per_node if self.study.backend == "ray" else self.resources.world_size
            )
            global_batch = int(values.get("batch_size", TrainConfig.batch_size)) * ranks
            values["lr"] = float(params["lr"]) * global_batch / lr_spec.scale_with_batch_size
        values.update(runtime)
        return TrainConfig.from_mapping(values)


# A whole study file, for json_schema(); build_spec validates a document section by section, in the
# order of its checks.
@config_dataclass()
class _StudyFile:
    """A study file of `hpo launch`: the study, the trainer keys it tunes, the fixed trainer settings,
    and what each trial gets."""

    study: StudySection = field(help="The study: its name, storage, objective, sampler, pruner and budget.")
    search_space: Annotated[dict[str, ParamSpec], Field(min_length=1)] = field(
        help="The trainer keys to tune, each with the distribution its values are drawn from."
    )
    trainer: TrainConfig = field(
        factory=TrainConfig, help="Fixed trainer settings (any key of `python -m trainer --help`)."
    )
    objective: ObjectiveSection | None = field(
        None,
        "Instead of trainer: the user's own code (a command, or a Python function) as the objective.",
    )
    resources: Resources = field(
        factory=Resources, help="What one trial gets: executor, nodes, GPUs, time..."
    )
    launcher: LauncherSection = field(
        factory=LauncherSection, help="Where `hpo launch --detach` runs the launcher, as a Slurm job."
    )


def _section_hint(key: str) -> str | None:
    """A top-level key that is a key of one section (``--set n_trials=5``): the path it needs."""
    for section in ("study", "resources", "objective", "launcher", "trainer"):
        owner = typing.get_type_hints(_StudyFile, include_extras=False)[section]
        owner = next((a for a in typing.get_args(owner) if dataclasses.is_dataclass(a)), owner)
        if any(f.name == key for f in dataclasses.fields(owner)):
            top = ", ".join(f.name for f in dataclasses.fields(_StudyFile))
            return f"unknown key (did you mean '{section}.{key}'?); valid keys: {top}"
    return None


def default_pruner(max_steps: int) -> PrunerSpec:
    """The pruner of a study file that names none: median stopping, its first decision at 4/9 of a
    full run's steps. Replayed over the recorded learning curves (bench/replay.py, 50 seeds,
    random search's 64 trials as the yardstick), TPE with it reached random search's median best
    with 0.39x random's compute, against 0.43x without pruning and 0.53x with successive halving
    from the first epoch: the OneCycle schedule's warm-up makes early epochs poor predictors of
    the last. Median stopping from 2/3 of the steps did as well (0.37x); from the first, 0.69x."""
    return PrunerSpec(name="median", options={"n_warmup_steps": math.ceil(4 * max_steps / 9)})


def build_spec(document: dict[str, Any], source: str) -> StudySpec:
    try:
        check_keys(document, _StudyFile)
    except _KeyProblem as err:
        raise _KeyProblem(err.path, _section_hint(err.path) or err.problem) from None
    if "study" not in document:
        raise _KeyProblem("study", "section is missing (it needs at least a name)")
    study_doc = document["study"]
    pruner_doc = study_doc.get("pruner") if isinstance(study_doc, dict) else None
    pruner_name = pruner_doc.get("name") if isinstance(pruner_doc, dict) else None
    if isinstance(pruner_name, str) and pruner_name.lower() in PRUNER_ALIASES:
        name = PRUNER_ALIASES[pruner_name.lower()]
        raise _KeyProblem(
            "study.pruner.name",
            f"got {pruner_name!r}: that is {name!r} here ({PRUNER_ALIAS_WHY[name]}); must be one of "
            + ", ".join((*PRUNERS, *RAY_ONLY_PRUNERS)),
        )
    # No pruner, an empty one, or options without a name (a --set of one option): the measured
    # default, with the options given. A pruner named explicitly keeps its class's own defaults.
    pruner_doc = study_doc.get("pruner") if isinstance(study_doc, dict) else None
    unnamed = isinstance(study_doc, dict) and (
        pruner_doc is None or (isinstance(pruner_doc, dict) and "name" not in pruner_doc)
    )
    if unnamed and study_doc.get("also_minimize") is not None:
        # Optuna cannot prune a Pareto study: no pruner rather than an error.
        study_doc = {**study_doc, "pruner": {**(pruner_doc or {}), "name": "none"}}
        unnamed = False
    spec = _build_spec(document, source, _section(StudySection, study_doc, "study"))
    if unnamed:
        default = default_pruner(spec.max_steps)
        spec.study.pruner = PrunerSpec(
            name=default.name, options={**default.options, **spec.study.pruner.options}
        )
        objective_doc = document.get("objective")
        if spec.objective is not None and not (isinstance(objective_doc, dict) and "steps" in objective_doc):
            spec.warnings.append(
                f"{source}: objective.steps: not set, so the default pruner (median stopping from 4/9 of "
                "a full run's steps) may stop a trial from its first report; set it to the step of a "
                "full run's last report"
            )
    return spec


def _build_spec(document: dict[str, Any], source: str, study: StudySection) -> StudySpec:
    resources = _section(Resources, document.get("resources"), "resources")
    if "objective" in document:
        return _build_objective_spec(document, source, study, resources)
    if study.metric not in METRICS:
        raise _KeyProblem(
            "study.metric",
            f"the trainer reports {', '.join(METRICS)}; got {study.metric!r} (an objective section "
            "names its own metric)",
        )
    trainer = _or_empty(document.get("trainer"))
    if not isinstance(trainer, dict):
        raise _KeyProblem("trainer", f"must be a mapping of trainer keys, got {kind(trainer)}")
    _check_trainer_section(trainer)
    space_doc = _or_empty(document.get("search_space"))
    if not isinstance(space_doc, dict):
        raise _KeyProblem("search_space", f"must be a mapping of trainer keys, got {kind(space_doc)}")
    if not space_doc:
        raise _KeyProblem("search_space", "is empty: name at least one trainer key to tune")
    space = {
        name: _section(ParamSpec, param_doc, f"search_space.{name}") for name, param_doc in space_doc.items()
    }
    launcher = _section(LauncherSection, document.get("launcher"), "launcher")
    spec = StudySpec(
        source=source,
        study=study,
        search_space=space,
        trainer=trainer,
        resources=resources,
        launcher=launcher,
    )
    _check_space_against_trainer(spec)
    if study.pruner.name == "pbt" and "momentum" in space and trainer.get("cycle_momentum"):
        raise _KeyProblem(
            "trainer.cycle_momentum",
            "OneCycle's momentum cycle would overwrite the momentum PBT perturbs mid-run; turn one off",
        )
    _check_whole(spec)
    return spec


def _build_objective_spec(
    document: dict[str, Any], source: str, study: StudySection, resources: Resources
) -> StudySpec:
    """A study of the user's own code: parameters of any name, no trainer section."""
    if "trainer" in document:
        raise _KeyProblem(
            "objective", "a study tunes the built-in trainer or its own objective, not both: remove trainer"
        )
    objective = _section(ObjectiveSection, document["objective"], "objective")
    if study.profile_trials:
        raise _KeyProblem(
            "study.profile_trials", "profiles the built-in trainer; profile your own code in your script"
        )
    if study.direction is None:
        raise _KeyProblem("study.direction", f"is required for metric {study.metric!r}: maximize or minimize")
    if study.pruner.name == "pbt":
        raise _KeyProblem("study.pruner.name", "pbt hands weights between trials: the built-in trainer only")
    space_doc = _or_empty(document.get("search_space"))
    if not isinstance(space_doc, dict) or not space_doc:
        raise _KeyProblem("search_space", "must name at least one parameter to tune")
    space = {}
    for name, param_doc in space_doc.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _KeyProblem(f"search_space.{name}", "must be a name (letters, digits and _)")
        space[name] = _section(ParamSpec, param_doc, f"search_space.{name}")
        if space[name].scale_with_batch_size is not None:
            raise _KeyProblem(
                f"search_space.{name}.scale_with_batch_size", "applies to the trainer's lr only"
            )
        if name in objective.fixed or name in RUNTIME_PLACEHOLDERS:
            where = "objective.fixed" if name in objective.fixed else "the service (for each trial)"
            raise _KeyProblem(f"search_space.{name}", f"is also set by {where}; keep it in one place")
    warnings = []
    if objective.command is not None:
        known = [*space, *objective.fixed, *RUNTIME_PLACEHOLDERS]
        used = objective.placeholder_names()
        for index, element in enumerate(objective.command):
            for name in placeholders(element):
                if name not in known:
                    raise _KeyProblem(
                        f"objective.command[{index}]",
                        f"{{{name}}} names no parameter; known: {', '.join('{' + k + '}' for k in known)}",
                    )
        # A command that names none of the parameters reads them through hpo.trial.params(); one
        # that names some but not all has likely lost a flag.
        for name in space if any(name in used for name in space) else ():
            if name not in used:
                warnings.append(
                    f"{source}: search_space.{name}: objective.command never uses {{{name}}}; the trial "
                    "gets it only if the script reads it through hpo.trial.params()"
                )
    if resources.tasks_per_node > 1 and study.backend == "ray":
        raise _KeyProblem(
            "resources.tasks_per_node",
            "a Ray-backend trial of an objective section is one process; use backend optuna for DDP",
        )
    folder = Path(source).expanduser().absolute().parent
    spec = StudySpec(
        source=source,
        study=study,
        search_space=space,
        trainer={},
        resources=resources,
        launcher=_section(LauncherSection, document.get("launcher"), "launcher"),
        objective=objective,
        objective_cwd=str(folder / Path(objective.cwd).expanduser() if objective.cwd else folder),
        warnings=warnings,
    )
    _check_whole(spec)
    return spec


def _check_whole(spec: StudySpec) -> None:
    """The checks across sections that every study file takes, trainer or objective."""
    _check_enqueued(spec)
    if spec.study.also_minimize == "gpu_hours" and not spec.resources.gpus_per_node:
        raise _KeyProblem("study.also_minimize", "gpu_hours needs resources.gpus_per_node; use cpu_hours")


def _section(cls: type[_Section], data: Any, path: str) -> _Section:
    """One section of the document, its problems at their key path under ``path``."""
    try:
        return build(cls, data)
    except KeyProblem as problem:
        raise _KeyProblem(join(path, problem.path), problem.problem) from None


def _or_empty(section: Any) -> Any:
    return {} if section is None else section


def tunable_keys() -> list[str]:
    """The trainer keys a search space may name: those that change what is computed, but the seed."""
    return [name for name in field_names() if name not in RUNTIME_ONLY_FIELDS and name != "seed"]


def _check_trainer_section(trainer: dict[str, Any]) -> None:
    if "checkpoint_dir" in trainer:
        raise _KeyProblem("trainer.checkpoint_dir", "is set by the service for each trial (under workdir)")
    for key, instead in (("tensorboard_dir", "study.tensorboard"), ("profile_dir", "study.profile_trials")):
        if key in trainer:
            raise _KeyProblem(
                f"trainer.{key}", f"is set by the service for each trial (under workdir): use {instead}"
            )
    try:
        TrainConfig.from_mapping(trainer)
    except ConfigError as err:
        raise _KeyProblem("trainer", str(err)) from None


def _check_space_against_trainer(spec: StudySpec) -> None:
    valid = tunable_keys()
    for name, param in spec.search_space.items():
        path = f"search_space.{name}"
        if name not in valid:
            raise _KeyProblem(path, f"is not a tunable trainer key; valid keys: {', '.join(valid)}")
        if name in spec.trainer:
            raise _KeyProblem(path, "is also fixed in the trainer section; keep it in one place")
        if param.scale_with_batch_size is not None and name != "lr":
            raise _KeyProblem(f"{path}.scale_with_batch_size", "applies to lr only")
        for value in param.values_to_check():
            try:
                TrainConfig.from_mapping({**spec.trainer, name: value})
            except ConfigError as err:
                raise _KeyProblem(path, str(err)) from None


def _check_enqueued(spec: StudySpec) -> None:
    for index, params in enumerate(spec.study.enqueue):
        path = f"study.enqueue[{index}]"
        unknown = sorted(set(params) - set(spec.search_space))
        if unknown:
            raise _KeyProblem(
                path, f"{unknown[0]!r} is not in search_space; searched keys: {', '.join(spec.search_space)}"
            )
        for name, value in params.items():
            problem = spec.search_space[name].rejects(value)
            if problem:
                raise _KeyProblem(f"{path}.{name}", problem)
        if spec.objective is not None:
            continue
        try:
            spec.trainer_config(params)
        except ConfigError as err:
            raise _KeyProblem(path, str(err)) from None


# --------------------------------------------------------------------------------------------------
# JSON schema
# --------------------------------------------------------------------------------------------------


def json_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of a study file, for editors and CI (docs/study.schema.json)."""
    schema = TypeAdapter(_StudyFile).json_schema(schema_generator=_StudyFileSchema)
    # The service sets checkpoint_dir for each trial; the search space names tunable trainer keys only.
    schema["$defs"]["TrainConfig"]["properties"].pop("checkpoint_dir")
    # With an objective section: parameters of any name (its placeholders), a metric of its own, no
    # trainer section. Without: the trainer's tunable keys and metrics.
    schema["if"] = {"required": ["objective"]}
    schema["then"] = {
        "properties": {"search_space": {"propertyNames": {"pattern": _NAME.pattern}}},
        "not": {"required": ["trainer"]},
    }
    schema["else"] = {
        "properties": {
            "search_space": {"propertyNames": {"enum": tunable_keys()}},
            "study": {"properties": {"metric": _or_variable({"enum": list(METRICS)})}},
        }
    }
    return {"$schema": GenerateJsonSchema.schema_dialect, **schema, "title": "hpo study file"}


class _StudyFileSchema(GenerateJsonSchema):
    """A scalar may also be written ``${VAR}`` or ``${VAR:-default}`` (hpo.config.loading reads it as
    the variable's value before the schema applies); a key's description says more than its title."""

    def field_title_should_be_set(self, schema: CoreSchemaOrField) -> bool:
        return False

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        return _or_variable(super().int_schema(schema))

    def float_schema(self, schema: core_schema.FloatSchema) -> JsonSchemaValue:
        return _or_variable(super().float_schema(schema))

    def bool_schema(self, schema: core_schema.BoolSchema) -> JsonSchemaValue:
        return _or_variable(super().bool_schema(schema))

    def literal_schema(self, schema: core_schema.LiteralSchema) -> JsonSchemaValue:
        return _or_variable(super().literal_schema(schema))


def _or_variable(schema: JsonSchemaValue) -> JsonSchemaValue:
    return {"anyOf": [schema, {"type": "string", "pattern": _VARIABLE}]}


# --------------------------------------------------------------------------------------------------
# Small validators
# --------------------------------------------------------------------------------------------------


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_duration_min(key: str, value: str | int | float) -> float:
    """Minutes from ``90`` (minutes), ``90s``/``30m``/``2h``/``1d`` or Slurm's ``[D-]HH:MM:SS`` forms."""
    if isinstance(value, bool):
        raise _KeyProblem(key, f"must be a duration, got {value!r}")
    if isinstance(value, int | float):
        minutes = float(value)
    else:
        text = value.strip()
        short = _DURATION.fullmatch(text)
        slurm = _SLURM_TIME.fullmatch(text)
        if short:
            minutes = float(short.group(1)) * {"s": 1 / 60, "m": 1, "h": 60, "d": 1440}[short.group(2)]
        elif slurm:
            minutes = _slurm_minutes(text, slurm)
        else:
            raise _KeyProblem(
                key, f"is not a duration (minutes, 90s, 30m, 2h, 1d, HH:MM:SS, D-HH:MM), got {value!r}"
            )
    if not minutes > 0:
        raise _KeyProblem(key, f"must be a positive duration, got {value!r}")
    return minutes


def _slurm_minutes(text: str, match: re.Match[str]) -> float:
    days, first, second, third = match.groups()
    numbers = [int(x) for x in (first, second, third) if x is not None]
    if days is not None:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = [*numbers, 0, 0][:3]
        return int(days) * 1440 + hours * 60 + minutes + seconds / 60
    if len(numbers) == 1:  # M
        return float(numbers[0])
    if len(numbers) == 2:  # M:S
        return numbers[0] + numbers[1] / 60
    return numbers[0] * 60 + numbers[1] + numbers[2] / 60  # H:M:S


def _safe_name(key: str, value: str) -> None:
    if len(value) > 100:  # a job name, a folder name: within every filesystem's and Slurm's limits
        raise _KeyProblem(key, f"may be at most 100 characters long, got {len(value)}")
    if not _SAFE_NAME.fullmatch(value):
        raise _KeyProblem(key, f"may contain only letters, digits, '.', '_' and '-', got {value!r}")


_SHELL_SYNTAX = re.compile(r"[;&|`<>'\"\\]|\$\(")


def _simple_command(key: str, line: str) -> None:
    """A set-up line goes verbatim into the job script: one simple command (module load, source,
    conda activate, export X=$Y), nothing that chains, substitutes, redirects or quotes."""
    _single_line(key, line)
    found = _SHELL_SYNTAX.search(line)
    if found:
        raise _KeyProblem(
            key,
            f"must be one simple command (no {found.group(0)!r}; put anything more in a script and "
            f"source it), got {line!r}",
        )


def _single_line(key: str, value: str) -> None:
    if any(ch in value for ch in "\n\r\x00"):
        raise _KeyProblem(key, f"must be a single line, got {value!r}")
