"""The values a study file's keys take: the names they are chosen from, and the small checks
several sections share (durations, safe names, one-line shell commands)."""

from __future__ import annotations

import re
import typing
from typing import Literal

from trainer.fields import KeyProblem

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
Backend = Literal["optuna", "ray"]
ParamType = Literal["float", "int", "categorical"]

SAMPLERS: tuple[str, ...] = typing.get_args(Sampler)
PRUNERS: tuple[str, ...] = typing.get_args(OptunaPruner)
RAY_ONLY_PRUNERS: tuple[str, ...] = typing.get_args(RayOnlyPruner)
COST_OBJECTIVES: tuple[str, ...] = typing.get_args(CostObjective)
BACKENDS: tuple[str, ...] = typing.get_args(Backend)
PARAM_TYPES: tuple[str, ...] = typing.get_args(ParamType)

# Names that end up in sbatch scripts, job names and file paths: no quoting needed anywhere.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ACCOUNT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
SBATCH_OPTION = re.compile(r"^[a-z][a-z0-9-]*$")
# A whole value written ${VAR} or ${VAR:-default}: hpo.config.loading reads it as the value of VAR.
VARIABLE = r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}$"
# A parameter or metric of the user's own objective: a placeholder name, a Tune result key.
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What the service sets for each rank of a trial's command (torchrun's names).
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_duration_min(key: str, value: str | int | float) -> float:
    """Minutes from ``90`` (minutes), ``90s``/``30m``/``2h``/``1d`` or Slurm's ``[D-]HH:MM:SS`` forms."""
    if isinstance(value, bool):
        raise KeyProblem(key, f"must be a duration, got {value!r}")
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
            raise KeyProblem(
                key, f"is not a duration (minutes, 90s, 30m, 2h, 1d, HH:MM:SS, D-HH:MM), got {value!r}"
            )
    if not minutes > 0:
        raise KeyProblem(key, f"must be a positive duration, got {value!r}")
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


def check_safe_name(key: str, value: str) -> None:
    if len(value) > 100:  # a job name, a folder name: within every filesystem's and Slurm's limits
        raise KeyProblem(key, f"may be at most 100 characters long, got {len(value)}")
    if not _SAFE_NAME.fullmatch(value):
        raise KeyProblem(key, f"may contain only letters, digits, '.', '_' and '-', got {value!r}")


_SHELL_SYNTAX = re.compile(r"[;&|`<>'\"\\]|\$\(")


def check_simple_command(key: str, line: str) -> None:
    """A set-up line goes verbatim into the job script: one simple command (module load, source,
    conda activate, export X=$Y), nothing that chains, substitutes, redirects or quotes."""
    check_single_line(key, line)
    found = _SHELL_SYNTAX.search(line)
    if found:
        raise KeyProblem(
            key,
            f"must be one simple command (no {found.group(0)!r}; put anything more in a script and "
            f"source it), got {line!r}",
        )


def check_single_line(key: str, value: str) -> None:
    if any(ch in value for ch in "\n\r\x00"):
        raise KeyProblem(key, f"must be a single line, got {value!r}")
