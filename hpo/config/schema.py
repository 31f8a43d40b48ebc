"""Study files: their schema, ``${VAR}`` interpolation, ``--set`` overrides and strict validation.

A study file has four sections, and an optional fifth::

    study:          name, storage, metric and direction, sampler, pruner, budget, retries
    search_space:   trainer keys to tune, each a float / int / categorical distribution
    trainer:        fixed trainer settings (any key of ``python -m trainer --help``)
    resources:      what one trial gets: executor (slurm | local), nodes, GPUs, time, account...
    launcher:       where ``hpo launch --detach`` runs the launcher (partition, account, time...)

Every error is one line, ``FILE: key.path: problem``, raised as :class:`StudyFileError` before
anything touches a database or a scheduler. Unknown keys are rejected with the list of valid ones
(as submitit does for its executor parameters): a typo must never be silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from trainer.config import RUNTIME_ONLY_FIELDS, TrainConfig, field_names
from trainer.errors import ConfigError

METRICS = {
    "val_accuracy": "maximize",
    "val_loss": "minimize",
    "train_accuracy": "maximize",
    "train_loss": "minimize",
}
SAMPLERS = ("tpe", "random", "qmc", "gp", "cmaes")
PRUNERS = ("none", "median", "percentile", "successive_halving", "hyperband", "threshold")
# Schedulers that exist only in Ray Tune: no Optuna pruner does what they do.
RAY_ONLY_PRUNERS = ("pbt",)
# Costs a multi-objective study may minimize alongside its metric (see hpo.trial.task.cost_objective).
COST_OBJECTIVES = ("gpu_hours", "cpu_hours", "epoch_time_s")
EXECUTORS = ("local", "slurm")
BACKENDS = ("optuna", "ray")
PARAM_TYPES = ("float", "int", "categorical")

# Names that end up in sbatch scripts, job names and file paths: no quoting needed anywhere.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ACCOUNT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
_SBATCH_OPTION = re.compile(r"^[a-z][a-z0-9-]*$")


class _KeyProblem(Exception):
    """A problem at a key path inside the document; the loader adds the file name."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


def _field(default: Any = dataclasses.MISSING, help: str = "") -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


# --------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SamplerSpec:
    name: str = _field("tpe", f"One of {', '.join(SAMPLERS)} (Optuna's samplers).")
    seed: int | None = _field(0, "Seed of the sampler, for a reproducible sequence of trials.")
    options: dict[str, Any] = dataclasses.field(
        default_factory=dict, metadata={"help": "Keyword arguments of the Optuna sampler class."}
    )

    def check(self) -> None:
        _one_of("name", self.name, SAMPLERS)


@dataclasses.dataclass
class PrunerSpec:
    name: str = _field(
        "successive_halving",
        f"One of {', '.join(PRUNERS)} (Optuna's pruners), or, with the Ray backend only, pbt "
        "(Ray Tune's Population Based Training; options perturbation_interval, quantile_fraction, "
        "resample_probability, mutations).",
    )
    options: dict[str, Any] = dataclasses.field(
        default_factory=dict, metadata={"help": "Keyword arguments of the Optuna pruner class."}
    )

    def check(self) -> None:
        _one_of("name", self.name, PRUNERS + RAY_ONLY_PRUNERS)


@dataclasses.dataclass
class StudySection:
    name: str = _field(help="Study name, unique in its storage ([A-Za-z0-9._-]).")
    storage: str | None = _field(
        None,
        "Storage URL: postgresql://user@host:port/db (password from PGPASSWORD or ~/.pgpass), "
        "sqlite:///path, journal:path, or empty for the embedded default (a journal file in workdir).",
    )
    workdir: str | None = _field(
        None, "Folder for job logs, checkpoints and the embedded storage (default: runs/<name>)."
    )
    backend: str = _field(
        "optuna",
        "optuna (the launcher submits each trial as a job) or ray (Ray Tune inside one allocation, "
        "or a local Ray instance with the local executor).",
    )
    metric: str = _field("val_accuracy", f"Objective, reported every epoch: one of {', '.join(METRICS)}.")
    direction: str | None = _field(None, "maximize or minimize (default: what the metric implies).")
    also_minimize: str | None = _field(
        None,
        f"A cost minimized alongside the metric, making a multi-objective study whose result is a "
        f"Pareto front: one of {', '.join(COST_OBJECTIVES)} (the trial's own). Optuna cannot prune "
        "such a study: set pruner to none.",
    )
    sampler: SamplerSpec = dataclasses.field(default_factory=SamplerSpec)
    pruner: PrunerSpec = dataclasses.field(default_factory=PrunerSpec)
    n_trials: int = _field(20, "Trials in the study, those of earlier launches included.")
    max_concurrent: int = _field(2, "Trials in flight at once.")
    max_retries: int = _field(
        1,
        "Times a failed trial (exception, job cancelled outside the service, node lost) is run "
        "again with the same parameters, from its last checkpoint; 0 never retries.",
    )
    timeout: str | int | None = _field(
        None, "Stop submitting new trials after this long (minutes, or 90s, 30m, 2h, 1-00:00:00)."
    )
    enqueue: list[dict[str, Any]] = dataclasses.field(
        default_factory=list,
        metadata={"help": "Parameter sets to try first (e.g. the current hand-tuned one)."},
    )

    def check(self) -> None:
        _safe_name("name", self.name)
        _one_of("backend", self.backend, BACKENDS)
        _one_of("metric", self.metric, tuple(METRICS))
        if self.direction is None:
            self.direction = METRICS[self.metric]
        _one_of("direction", self.direction, ("maximize", "minimize"))
        if self.also_minimize is not None:
            _one_of("also_minimize", self.also_minimize, COST_OBJECTIVES)
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
        _at_least("n_trials", self.n_trials, 1)
        _at_least("max_concurrent", self.max_concurrent, 1)
        _at_least("max_retries", self.max_retries, 0)
        if self.timeout is not None:
            parse_duration_min("timeout", self.timeout)

    @property
    def timeout_min(self) -> float | None:
        return None if self.timeout is None else parse_duration_min("timeout", self.timeout)


@dataclasses.dataclass
class ParamSpec:
    type: str = _field(help=f"One of {', '.join(PARAM_TYPES)}.")
    low: int | float | None = _field(None, "Lower bound (float and int).")
    high: int | float | None = _field(None, "Upper bound, included (float and int).")
    log: bool = _field(False, "Sample on a log scale (float and int).")
    step: int | float | None = _field(None, "Discretisation step (float and int).")
    choices: list[Any] | None = _field(None, "The values of a categorical parameter.")
    power_of_two: bool = _field(False, "int only: the powers of two from low to high, as choices.")
    scale_with_batch_size: int | None = _field(
        None,
        "lr only: the sampled value is the LR for a global batch of this size; the trial uses it "
        "scaled linearly with its own global batch size (batch_size x GPUs).",
    )

    def check(self) -> None:
        _one_of("type", self.type, PARAM_TYPES)
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
        if self.scale_with_batch_size is not None:
            _at_least("scale_with_batch_size", self.scale_with_batch_size, 1)

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


@dataclasses.dataclass
class Resources:
    executor: str = _field(
        "local", "slurm (one Slurm job per trial, through submitit) or local (processes here)."
    )
    nodes: int = _field(1, "Nodes per trial.")
    tasks_per_node: int = _field(
        1,
        "Processes per node (one per GPU for DDP). With the Ray backend, N > 1 makes each trial a DDP "
        "run of N Ray Train workers (TorchTrainer), each with cpus_per_task CPUs and gpus_per_node / N "
        "GPUs (nodes is then the size of the allocation the trials share).",
    )
    gpus_per_node: int = _field(0, "GPUs per node.")
    cpus_per_task: int = _field(1, "CPU cores per process (also the trainer's torch threads).")
    mem_gb: float | None = _field(None, "Memory per node in GB (default: the partition's).")
    time: str | int = _field("01:00:00", "Time limit of one trial's job (minutes, 30m, 2h, 1-00:00:00).")
    worker_time: str | int | None = _field(
        None,
        "Time limit of a --workers job (default: time x its share of the trials, at most 24 h).",
    )
    partition: str | None = _field(None, "Slurm partition.")
    account: str | None = _field(None, "Slurm account (--account).")
    qos: str | None = _field(None, "Slurm QoS (--qos).")
    constraint: str | None = _field(None, "Slurm node constraint (--constraint), e.g. a100 or h100.")
    setup: list[str] = dataclasses.field(
        default_factory=list,
        metadata={
            "help": "Shell lines run in the job before the trial (module load ..., conda activate ...)."
        },
    )
    sbatch: dict[str, Any] = dataclasses.field(
        default_factory=dict, metadata={"help": "Extra sbatch options, e.g. {hint: nomultithread}."}
    )
    python: str | None = _field(None, "Python interpreter on the compute nodes (default: this one).")

    def check(self) -> None:
        _one_of("executor", self.executor, EXECUTORS)
        for key in ("nodes", "tasks_per_node", "cpus_per_task"):
            _at_least(key, getattr(self, key), 1)
        _at_least("gpus_per_node", self.gpus_per_node, 0)
        if self.mem_gb is not None and not self.mem_gb > 0:
            raise _KeyProblem("mem_gb", f"must be > 0, got {self.mem_gb!r}")
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


@dataclasses.dataclass
class LauncherSection:
    """Where ``hpo launch --detach`` runs the launcher: a small CPU job that mostly sleeps."""

    partition: str | None = _field(None, "Partition of the launcher's job (a CPU one; Jean Zay: prepost).")
    account: str | None = _field(None, "Account of the launcher's job (Jean Zay: your CPU account, abc@cpu).")
    qos: str | None = _field(None, "QoS of the launcher's job.")
    time: str | int = _field(
        "20h", "Time limit of one run of the launcher's job; shortly before it, the job requeues itself."
    )
    cpus_per_task: int = _field(1, "CPU cores of the launcher's job.")
    sbatch: dict[str, Any] = dataclasses.field(
        default_factory=dict, metadata={"help": "Extra sbatch options of the launcher's job."}
    )

    def check(self) -> None:
        _check_placement(self.partition, self.account, self.qos, self.sbatch)
        parse_duration_min("time", self.time)
        _at_least("cpus_per_task", self.cpus_per_task, 1)

    @property
    def time_min(self) -> int:
        return max(1, math.ceil(parse_duration_min("time", self.time)))


@dataclasses.dataclass
class StudySpec:
    """A validated study file: everything a launcher, a trial or a report needs."""

    source: str
    study: StudySection
    search_space: dict[str, ParamSpec]
    trainer: dict[str, Any]
    resources: Resources
    launcher: LauncherSection = dataclasses.field(default_factory=LauncherSection)

    @property
    def workdir(self) -> Path:
        return Path(self.study.workdir or f"runs/{self.study.name}").expanduser().absolute()

    def trainer_config(self, params: Mapping[str, Any], **runtime: Any) -> TrainConfig:
        """The trainer settings of one trial: fixed settings, then the trial's parameters."""
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


_SECTIONS = {
    "study": StudySection,
    "search_space": None,
    "trainer": None,
    "resources": Resources,
    "launcher": LauncherSection,
}


def build_spec(document: dict[str, Any], source: str) -> StudySpec:
    _reject_unknown(document, list(_SECTIONS), "")
    if "study" not in document:
        raise _KeyProblem("study", "section is missing (it needs at least a name)")
    study = _build(StudySection, document["study"], "study")
    resources = _build(Resources, _or_empty(document.get("resources")), "resources")
    trainer = _or_empty(document.get("trainer"))
    if not isinstance(trainer, dict):
        raise _KeyProblem("trainer", f"must be a mapping of trainer keys, got {_kind(trainer)}")
    _check_trainer_section(trainer)
    space_doc = _or_empty(document.get("search_space"))
    if not isinstance(space_doc, dict):
        raise _KeyProblem("search_space", f"must be a mapping of trainer keys, got {_kind(space_doc)}")
    if not space_doc:
        raise _KeyProblem("search_space", "is empty: name at least one trainer key to tune")
    space = {}
    for name, param_doc in space_doc.items():
        space[name] = _build(ParamSpec, param_doc, f"search_space.{name}")
    launcher = _build(LauncherSection, _or_empty(document.get("launcher")), "launcher")
    spec = StudySpec(
        source=source,
        study=study,
        search_space=space,
        trainer=trainer,
        resources=resources,
        launcher=launcher,
    )
    _check_space_against_trainer(spec)
    _check_enqueued(spec)
    if study.also_minimize == "gpu_hours" and not resources.gpus_per_node:
        raise _KeyProblem("study.also_minimize", "gpu_hours needs resources.gpus_per_node; use cpu_hours")
    return spec


def _or_empty(section: Any) -> Any:
    return {} if section is None else section


def _check_trainer_section(trainer: dict[str, Any]) -> None:
    if "checkpoint_dir" in trainer:
        raise _KeyProblem("trainer.checkpoint_dir", "is set by the service for each trial (under workdir)")
    try:
        TrainConfig.from_mapping(trainer)
    except ConfigError as err:
        raise _KeyProblem("trainer", str(err)) from None


def _check_space_against_trainer(spec: StudySpec) -> None:
    valid = [name for name in field_names() if name not in RUNTIME_ONLY_FIELDS and name != "seed"]
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
        try:
            spec.trainer_config(params)
        except ConfigError as err:
            raise _KeyProblem(path, str(err)) from None


# --------------------------------------------------------------------------------------------------
# Generic dataclass construction with key paths
# --------------------------------------------------------------------------------------------------


def _build(cls: type[Any], data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _KeyProblem(path, f"must be a mapping, got {_kind(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    _reject_unknown(data, list(fields), path, cls)
    hints = _type_hints(typing.cast(type, cls))
    values = {}
    for name, value in data.items():
        values[name] = _convert(value, hints[name], _join(path, name))
    for name, field in fields.items():
        if (
            name not in values
            and field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING
        ):
            raise _KeyProblem(_join(path, name), "is required")
    instance = cls(**values)
    try:
        instance.check()
    except _KeyProblem as problem:
        raise _KeyProblem(_join(path, problem.path), problem.problem) from None
    return instance


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(value: Any, annotation: Any, path: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise _KeyProblem(path, f"must be {_describe(annotation)}, got null")
        for option in args:
            if option is type(None):
                continue
            try:
                return _convert(value, option, path)
            except _KeyProblem:
                continue
        raise _KeyProblem(path, f"must be {_describe(annotation)}, got {value!r}")
    if dataclasses.is_dataclass(annotation):
        return _build(typing.cast(type, annotation), value, path)
    if origin is list:
        if not isinstance(value, list):
            raise _KeyProblem(path, f"must be a list, got {_kind(value)}")
        return [_convert(item, args[0], f"{path}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _KeyProblem(path, f"must be a mapping, got {_kind(value)}")
        for key in value:
            if not isinstance(key, str):
                raise _KeyProblem(path, f"keys must be names, got {key!r}")
        return {key: _convert(item, args[1], _join(path, key)) for key, item in value.items()}
    if annotation is Any:
        return value
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, annotation) or (annotation in (int, float) and isinstance(value, bool)):
        raise _KeyProblem(path, f"must be {_describe(annotation)}, got {value!r}")
    if annotation is float and not math.isfinite(value):
        raise _KeyProblem(path, f"must be a finite number, got {value!r}")
    return value


def _describe(annotation: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}
    args = typing.get_args(annotation) or (annotation,)
    return " or ".join(names.get(a, getattr(a, "__name__", str(a))) for a in args)


def _reject_unknown(data: dict[str, Any], valid: list[str], path: str, cls: type[Any] | None = None) -> None:
    for key in data:
        if not isinstance(key, str):
            raise _KeyProblem(path, f"keys must be names, got {key!r}")
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _KeyProblem(
                _join(path, key), f"unknown key{hint}; valid keys: {_list_with_defaults(valid, cls)}"
            )


def _list_with_defaults(valid: list[str], cls: type[Any] | None) -> str:
    if cls is None:
        return ", ".join(valid)
    parts = []
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            parts.append(f"{field.name}={field.default!r}")
        else:
            parts.append(field.name)
    return ", ".join(parts)


def _join(path: str, key: str) -> str:
    if not key:
        return path
    if not path:
        return key
    return f"{path}{key}" if key.startswith("[") else f"{path}.{key}"


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


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


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise _KeyProblem(key, f"must be one of {', '.join(allowed)}; got {value!r}")


def _at_least(key: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise _KeyProblem(key, f"must be >= {minimum}, got {value!r}")


def _safe_name(key: str, value: str) -> None:
    if not _SAFE_NAME.fullmatch(value) or len(value) > 100:
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
