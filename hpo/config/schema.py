"""Study files: their schema and strict validation (``${VAR}`` and ``--set`` are ``loading.py``'s).

A study file has these sections::

    study:          name, storage, metric and direction, sampler, pruner, budget, retries
    search_space:   the parameters to tune, each a float / int / categorical distribution
    trainer:        fixed settings of the built-in trainer (any key of ``python -m trainer --help``)
    objective:      or, instead of the trainer, the user's own code: a command or a Python function
    resources:      what one trial gets: executor (slurm | local), nodes, GPUs, time, account...
    launcher:       where ``hpo launch --detach`` runs the launcher (partition, account, time...)

Each key is declared once, in its section's dataclass (``study_section``, ``space``,
``resources``, ``objective_section``; built with ``trainer.fields``): type, default, bounds and
help text, which pydantic validates and :func:`json_schema` publishes (docs/study.schema.json, for
editors). Every error is one line, ``FILE: key.path: problem``, raised as :class:`StudyFileError`
before anything touches a database or a scheduler. Unknown keys are rejected with the list of valid
ones (as submitit does for its executor parameters): a typo must never be silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import Field, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from hpo.config.user_code import RUNTIME_PLACEHOLDERS, placeholders
from trainer.config import RUNTIME_ONLY_FIELDS, TrainConfig, field_names
from trainer.errors import ConfigError
from trainer.fields import KeyProblem, build, config_dataclass, field, join, kind

if TYPE_CHECKING:
    from pydantic.json_schema import CoreSchemaOrField

from hpo.config import executor_sections
from hpo.config.fields import check_keys
from hpo.config.objective_section import ObjectiveSection
from hpo.config.resources import LauncherSection, Resources
from hpo.config.space import ParamSpec
from hpo.config.study_section import (
    DEFAULT_PORTFOLIO,
    PRUNER_ALIAS_WHY,
    PRUNER_ALIASES,
    PrunerSpec,
    StudySection,
)
from hpo.config.values import METRICS, NAME, PRUNERS, RAY_ONLY_PRUNERS, VARIABLE
from hpo.executors import executor_class

_Section = TypeVar("_Section")


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
    executor_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Each executor's own section of resources, read by its class (``resources.slurm``)."""
    search_defaults: tuple[bool, Literal["named", "default", "options"]] = (False, "named")
    """Whether the sampler is the measured default's (the file names none), and where the pruner
    comes from: named in the file, the default (none), or options without a name (median from 4/9)."""

    @property
    def max_steps(self) -> int:
        """The step of a full run's last report: the trainer's epochs, or objective.steps."""
        if self.objective is not None:
            return self.objective.steps
        return int(self.trainer.get("epochs", 1))

    @property
    def trial_ranks(self) -> int:
        """The processes of one trial (with the Ray backend, ``nodes`` is the size of the
        allocation its trials share, not a trial's)."""
        res = self.resources
        return res.tasks_per_node if self.study.backend == "ray" else res.world_size

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
            global_batch = int(values.get("batch_size", TrainConfig.batch_size)) * self.trial_ranks
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


def median_from_four_ninths(max_steps: int) -> PrunerSpec:
    """Median stopping whose first decision is at 4/9 of a full run's steps: the pruner of a study
    file that gives pruner options without a name (the default before the starting portfolio)."""
    return PrunerSpec(name="median", options={"n_warmup_steps": math.ceil(4 * max_steps / 9)})


def default_search(study_doc: dict[str, Any]) -> tuple[bool, bool]:
    """(names no sampler, names no pruner): what gets the measured default. A study file that names
    no sampler gets TPE after the learned starting portfolio (``hpo.portfolio``), and one that names
    no pruner none: replayed over five recorded tasks, each held out of the portfolio it was scored
    with (bench/replay.py, 50 seeds), that start then TPE without pruning came nearest to random
    search's best soonest; median stopping from 4/9 of the steps after it did worse on 3 of 5 tasks,
    and no pruner paid under OneCycle, whose mid-schedule values rank configurations poorly
    (docs/benchmarks-explained.md)."""
    sampler, pruner = study_doc.get("sampler"), study_doc.get("pruner")
    return (
        sampler is None or (isinstance(sampler, dict) and "name" not in sampler),
        pruner is None or (isinstance(pruner, dict) and "name" not in pruner),
    )


def build_spec(document: dict[str, Any], source: str) -> StudySpec:
    try:
        check_keys(document, _StudyFile)
    except KeyProblem as err:
        raise KeyProblem(err.path, _section_hint(err.path) or err.problem) from None
    if "study" not in document:
        raise KeyProblem("study", "section is missing (it needs at least a name)")
    study_doc = document["study"]
    pruner_doc = study_doc.get("pruner") if isinstance(study_doc, dict) else None
    pruner_name = pruner_doc.get("name") if isinstance(pruner_doc, dict) else None
    if isinstance(pruner_name, str) and pruner_name.lower() in PRUNER_ALIASES:
        name = PRUNER_ALIASES[pruner_name.lower()]
        raise KeyProblem(
            "study.pruner.name",
            f"got {pruner_name!r}: that is {name!r} here ({PRUNER_ALIAS_WHY[name]}); must be one of "
            + ", ".join((*PRUNERS, *RAY_ONLY_PRUNERS)),
        )
    # No pruner, an empty one, or options without a name (a --set of one option): none, or the
    # median rule from 4/9 of the steps with the options given. A pruner named explicitly keeps
    # its class's own defaults.
    unnamed_sampler, unnamed_pruner = (
        default_search(study_doc) if isinstance(study_doc, dict) else (False, False)
    )
    pruner_options = (study_doc.get("pruner") or {}).get("options") if unnamed_pruner else None
    if unnamed_pruner and not pruner_options:
        study_doc = {**study_doc, "pruner": {**(study_doc.get("pruner") or {}), "name": "none"}}
    elif unnamed_pruner and study_doc.get("also_minimize") is not None:
        # Optuna cannot prune a Pareto study: no pruner rather than an error.
        study_doc = {**study_doc, "pruner": {"name": "none"}}
        pruner_options = None
    spec = _build_with_executor_sections(document, source, _section(StudySection, study_doc, "study"))
    spec.search_defaults = (
        unnamed_sampler,
        "named" if not unnamed_pruner else "options" if pruner_options else "default",
    )
    if spec.study.portfolio.size is None:
        # A warm start has a better start than the portfolio (the user's own earlier trials); a
        # `portfolio` the file sets is honoured with one as without.
        warm = bool(spec.study.warm_start.sources)
        spec.study.portfolio.size = DEFAULT_PORTFOLIO if unnamed_sampler and not warm else 0
    if pruner_options:
        median = median_from_four_ninths(spec.max_steps)
        spec.study.pruner = PrunerSpec(name=median.name, options={**median.options, **pruner_options})
        objective_doc = document.get("objective")
        if spec.objective is not None and not (isinstance(objective_doc, dict) and "steps" in objective_doc):
            spec.warnings.append(
                f"{source}: objective.steps: not set, so the pruner (median stopping from 4/9 of "
                "a full run's steps) may stop a trial from its first report; set it to the step of a "
                "full run's last report"
            )
    if unused := _scheduler_keys_unused(spec):
        spec.warnings.append(
            f"{source}: resources.executor is local, so {', '.join(unused)} "
            f"{'is' if len(unused) == 1 else 'are'} not used: every trial runs on this machine "
            "(set resources.executor: slurm, or launch with --executor slurm)"
        )
    return spec


SCHEDULER_KEYS = ("setup", "worker_time")
"""Keys of the resources section that only a job on a cluster reads."""


def _scheduler_keys_unused(spec: StudySpec) -> list[str]:
    """The cluster-only keys a study file set while its trials run here (a forgotten
    ``executor: slurm``: the GPUs, account and partition given, every trial local)."""
    if spec.resources.executor != "local":
        return []
    sections = [f"resources.{name}" for name in spec.executor_settings]
    return sections + [f"resources.{key}" for key in SCHEDULER_KEYS if getattr(spec.resources, key)]


def _build_with_executor_sections(document: dict[str, Any], source: str, study: StudySection) -> StudySpec:
    """:func:`_build_spec` of the document without the executors' own sections, which their
    classes read (``hpo.config.executor_sections``)."""
    resources_doc, settings, notes = executor_sections.split(document.get("resources"), source)
    spec = _build_spec({**document, "resources": resources_doc}, source, study)
    spec.executor_settings = settings
    spec.warnings[:0] = notes
    return spec


def _build_spec(document: dict[str, Any], source: str, study: StudySection) -> StudySpec:
    resources = _section(Resources, document.get("resources"), "resources")
    if "objective" in document:
        return _build_objective_spec(document, source, study, resources)
    if study.metric not in METRICS:
        raise KeyProblem(
            "study.metric",
            f"the trainer reports {', '.join(METRICS)}; got {study.metric!r} (an objective section "
            "names its own metric)",
        )
    trainer = _or_empty(document.get("trainer"))
    if not isinstance(trainer, dict):
        raise KeyProblem("trainer", f"must be a mapping of trainer keys, got {kind(trainer)}")
    _check_trainer_section(trainer)
    space_doc = _space_document(
        document, "must be a mapping of trainer keys", "name at least one trainer key to tune"
    )
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
        raise KeyProblem(
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
        raise KeyProblem(
            "objective", "a study tunes the built-in trainer or its own objective, not both: remove trainer"
        )
    objective = _section(ObjectiveSection, document["objective"], "objective")
    if study.profile_trials:
        raise KeyProblem(
            "study.profile_trials", "profiles the built-in trainer; profile your own code in your script"
        )
    if study.direction is None:
        raise KeyProblem("study.direction", f"is required for metric {study.metric!r}: maximize or minimize")
    if study.pruner.name == "pbt":
        raise KeyProblem("study.pruner.name", "pbt hands weights between trials: the built-in trainer only")
    space = _objective_space(document, objective)
    warnings = _command_warnings(source, objective, space) if objective.command is not None else []
    if resources.tasks_per_node > 1 and study.backend == "ray":
        raise KeyProblem(
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


def _space_document(document: dict[str, Any], not_mapping: str, empty: str) -> dict[Any, Any]:
    space_doc = _or_empty(document.get("search_space"))
    if not isinstance(space_doc, dict):
        raise KeyProblem("search_space", f"{not_mapping}, got {kind(space_doc)}")
    if not space_doc:
        raise KeyProblem("search_space", f"is empty: {empty}")
    return space_doc


def _objective_space(document: dict[str, Any], objective: ObjectiveSection) -> dict[str, ParamSpec]:
    """An objective section's parameters: any names but those the section or the service sets."""
    space_doc = _space_document(
        document, "must be a mapping of parameter names", "name at least one parameter to tune"
    )
    space = {}
    for name, param_doc in space_doc.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise KeyProblem(f"search_space.{name}", "must be a name (letters, digits and _)")
        space[name] = _section(ParamSpec, param_doc, f"search_space.{name}")
        if space[name].scale_with_batch_size is not None:
            raise KeyProblem(f"search_space.{name}.scale_with_batch_size", "applies to the trainer's lr only")
        if name in objective.fixed or name in RUNTIME_PLACEHOLDERS:
            where = "objective.fixed" if name in objective.fixed else "the service (for each trial)"
            raise KeyProblem(f"search_space.{name}", f"is also set by {where}; keep it in one place")
    return space


def _command_warnings(source: str, objective: ObjectiveSection, space: dict[str, ParamSpec]) -> list[str]:
    """Refuses a placeholder that names nothing; warns of a parameter the command leaves out."""
    assert objective.command is not None
    known = [*space, *objective.fixed, *RUNTIME_PLACEHOLDERS]
    for index, element in enumerate(objective.command):
        for name in placeholders(element):
            if name not in known:
                raise KeyProblem(
                    f"objective.command[{index}]",
                    f"{{{name}}} names no parameter; known: {', '.join('{' + k + '}' for k in known)}",
                )
    # A command that names none of the parameters reads them through hpo.trial.params(); one
    # that names some but not all has likely lost a flag.
    used = objective.placeholder_names()
    if not any(name in used for name in space):
        return []
    return [
        f"{source}: search_space.{name}: objective.command never uses {{{name}}}; the trial "
        "gets it only if the script reads it through hpo.trial.params()"
        for name in space
        if name not in used
    ]


def _check_whole(spec: StudySpec) -> None:
    """The checks across sections that every study file takes, trainer or objective."""
    _check_enqueued(spec)
    _check_packing(spec)
    if spec.study.also_minimize == "gpu_hours" and not spec.resources.gpus_per_node:
        raise KeyProblem("study.also_minimize", "gpu_hours needs resources.gpus_per_node; use cpu_hours")


def _check_packing(spec: StudySpec) -> None:
    """Packed trials are processes of one GPU: a DDP trial spans several, and cannot be packed."""
    res = spec.resources
    if not res.packed:
        return
    if spec.trial_ranks > 1:
        raise KeyProblem(
            "resources.trials_per_gpu",
            f"packs one-process trials; these are DDP runs of {spec.trial_ranks} processes "
            "(set tasks_per_node and nodes to 1, or trials_per_gpu to 1)",
        )


def _section(cls: type[_Section], data: Any, path: str) -> _Section:
    """One section of the document, its problems at their key path under ``path``."""
    try:
        return build(cls, data)
    except KeyProblem as problem:
        raise KeyProblem(join(path, problem.path), problem.problem) from None


def _or_empty(section: Any) -> Any:
    return {} if section is None else section


def tunable_keys() -> list[str]:
    """The trainer keys a search space may name: those that change what is computed, but the seed."""
    return [name for name in field_names() if name not in RUNTIME_ONLY_FIELDS and name != "seed"]


def _check_trainer_section(trainer: dict[str, Any]) -> None:
    if "checkpoint_dir" in trainer:
        raise KeyProblem("trainer.checkpoint_dir", "is set by the service for each trial (under workdir)")
    for key, instead in (("tensorboard_dir", "study.tensorboard"), ("profile_dir", "study.profile_trials")):
        if key in trainer:
            raise KeyProblem(
                f"trainer.{key}", f"is set by the service for each trial (under workdir): use {instead}"
            )
    try:
        TrainConfig.from_mapping(trainer)
    except ConfigError as err:
        raise KeyProblem("trainer", str(err)) from None


def _check_space_against_trainer(spec: StudySpec) -> None:
    valid = tunable_keys()
    for name, param in spec.search_space.items():
        path = f"search_space.{name}"
        if name not in valid:
            raise KeyProblem(path, f"is not a tunable trainer key; valid keys: {', '.join(valid)}")
        if name in spec.trainer:
            raise KeyProblem(path, "is also fixed in the trainer section; keep it in one place")
        if param.scale_with_batch_size is not None and name != "lr":
            raise KeyProblem(f"{path}.scale_with_batch_size", "applies to lr only")
        for value in param.values_to_check():
            try:
                TrainConfig.from_mapping({**spec.trainer, name: value})
            except ConfigError as err:
                raise KeyProblem(path, str(err)) from None


def _check_enqueued(spec: StudySpec) -> None:
    for index, params in enumerate(spec.study.enqueue):
        path = f"study.enqueue[{index}]"
        unknown = sorted(set(params) - set(spec.search_space))
        if unknown:
            raise KeyProblem(
                path, f"{unknown[0]!r} is not in search_space; searched keys: {', '.join(spec.search_space)}"
            )
        for name, value in params.items():
            problem = spec.search_space[name].rejects(value)
            if problem:
                raise KeyProblem(f"{path}.{name}", problem)
        if spec.objective is not None:
            continue
        try:
            spec.trainer_config(params)
        except ConfigError as err:
            raise KeyProblem(path, str(err)) from None


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
        "properties": {"search_space": {"propertyNames": {"pattern": NAME.pattern}}},
        "not": {"required": ["trainer"]},
    }
    schema["else"] = {
        "properties": {
            "search_space": {"propertyNames": {"enum": tunable_keys()}},
            "study": {"properties": {"metric": _or_variable({"enum": list(METRICS)})}},
        }
    }
    _add_executor_sections(schema)
    return {"$schema": GenerateJsonSchema.schema_dialect, **schema, "title": "hpo study file"}


def _add_executor_sections(schema: dict[str, Any]) -> None:
    """The built-in executors' own sections of resources (``resources.slurm``), from the classes that
    read them, and their former keys directly under resources, marked deprecated. An installed
    plugin's section is read the same way, but the committed schema is this project's alone."""
    resources = schema["$defs"]["Resources"]["properties"]
    for name in BUILT_IN_EXECUTORS:
        cls = executor_class(name)
        if cls.settings is None:
            continue
        section = TypeAdapter(cls.settings).json_schema(schema_generator=_StudyFileSchema)
        schema["$defs"].update(section.pop("$defs", {}))
        resources[name] = {**section, "description": f"The {cls.queue_name} executor's own keys."}
        for key in cls.former_keys:
            resources[key] = {
                **section["properties"][key],
                "deprecated": True,
                "description": f"Read as resources.{name}.{key}, its place now.",
            }


BUILT_IN_EXECUTORS = ("local", "slurm")
"""The executors this project registers (pyproject.toml); a test holds the two equal."""


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
    return {"anyOf": [schema, {"type": "string", "pattern": VARIABLE}]}
