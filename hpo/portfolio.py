"""The learned starting portfolio: configurations tried first on a new study, before the sampler.

A configuration transfers between tasks as positions in the study's own ranges, not as values (an
AdamW task's learning rates live two decades below an SGD task's): a parameter's position is where
its value lies in its range, in [0, 1], log-scaled where the range is. Parameters are matched by
role (``ROLE_NAMES``: ``lr`` and ``max_lr`` are one role, ``hidden`` and ``width`` the model's
capacity; a study file names its own with ``study.portfolio.roles``); a parameter of no role is
left to the sampler, and the launch says which those are.

``portfolio.json`` beside this module is learned by ``python -m bench.portfolio --write`` from
every task the service recorded (bench/curves/); replayed with each task held out from its own
portfolio, TPE after it is the measured default (bench/results/replay.json, docs/benchmarks-explained.md).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

    from hpo.config import ParamSpec, StudySpec

ROLE_NAMES = {
    "lr": ("lr", "learning_rate", "max_lr", "base_lr", "peak_lr", "initial_lr", "init_lr", "lr_max"),
    "weight_decay": ("weight_decay", "wd", "l2", "l2_reg"),
    "batch_size": ("batch_size", "bs", "batch", "batchsize", "train_batch_size", "per_device_train_batch_size"),
    "pct_start": ("pct_start", "warmup_pct", "warmup_ratio", "warmup_fraction"),
    "capacity": ("hidden", "width", "hidden_size", "hidden_dim", "channels", "base_channels", "num_channels", "n_hidden", "d_model"),
}  # fmt: skip
"""The names a parameter of each role goes by, as users write them (torch's OneCycleLR says
``max_lr``, Hugging Face ``per_device_train_batch_size``); compared case-, dash- and
underscore-blind, on the last part of a dotted name (``optimizer.lr``). The same role transfers
between tasks; a study file names any other with ``study.portfolio.roles``."""

_BY_NAME = {name.replace("_", ""): role for role, names in ROLE_NAMES.items() for name in names}


def role_of(name: str) -> str | None:
    """The role a parameter's name says it has (``ROLE_NAMES``), or None."""
    last = re.split(r"[./:]", name.strip().lstrip("-"))[-1]
    return _BY_NAME.get(re.sub(r"[-_\s]", "", last).lower())


def roles(space: Mapping[str, Any], given: Mapping[str, str] | None = None) -> dict[str, str]:
    """Parameter -> role for the parameters of ``space`` that have one: those ``given`` names
    (role -> parameter, ``study.portfolio.roles``), then the others by name, for a role not given."""
    given = dict(given or {})
    found = {param: role for role, param in given.items() if param in space}
    for name in space:
        role = role_of(name)
        if name not in found and role is not None and role not in given:
            found[name] = role
    return found


SHIPPED = Path(__file__).with_name("portfolio.json")

Entry = dict[str, float]
"""A portfolio entry: a position in [0, 1] by role."""


def position(param: ParamSpec, value: Any) -> float:
    """Where ``value`` lies in the range ``param``, in [0, 1] (log-scaled for a log or power-of-two
    range; a categorical's choices ordered by value when they are numbers, else as listed)."""
    if param.type == "categorical":
        choices = _ordered(list(param.choices or []))
        return choices.index(value) / max(1, len(choices) - 1)
    low, high, x = float(param.low or 0), float(param.high or 0), float(value)
    if param.log or param.power_of_two:
        low, high, x = math.log(low), math.log(high), math.log(x)
    return (x - low) / (high - low) if high > low else 0.0


def _ordered(choices: list[Any]) -> list[Any]:
    """Numbers by value (``[512, 32, 128]``: 32 is the smallest batch, whatever the list's order);
    other choices as the study file lists them, the only order they have."""
    numbers = all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices)
    return sorted(choices) if numbers else choices


def value_at(param: ParamSpec, where: float) -> Any:
    """The value of the range ``param`` at a position, one its distribution holds: the nearest
    choice (categorical, power of two), on the step's grid, an integer for an int range."""
    where = min(1.0, max(0.0, where))
    if param.type == "categorical" or param.power_of_two:
        choices = list(param.choices or []) if param.type == "categorical" else param.powers_of_two()
        return min(choices, key=lambda c: abs(position(param, c) - where))
    low, high = float(param.low or 0), float(param.high or 0)
    if param.log:
        x = math.exp(math.log(low) + where * (math.log(high) - math.log(low)))
    else:
        x = low + where * (high - low)
    if param.step is not None:  # Optuna holds only low + k * step
        x = low + round((x - low) / float(param.step)) * float(param.step)
    x = min(high, max(low, x))
    return min(int(high), max(int(low), round(x))) if param.type == "int" else x


def params_for(
    space: Mapping[str, ParamSpec], entry: Entry, given: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A portfolio entry as a study's parameters: those whose role (``roles``) the entry has (the
    rest are the sampler's to draw)."""
    found = roles(space, given)
    return {n: value_at(p, entry[found[n]]) for n, p in space.items() if found.get(n) in entry}


def shipped() -> list[Entry]:
    """The portfolio learned from every recorded task, best entry first."""
    return [dict(e["positions"]) for e in json.loads(SHIPPED.read_text())["entries"]]


def starting_trials(spec: StudySpec) -> list[dict[str, Any]]:
    """The parameters a study tries first from the shipped portfolio: its first
    ``study.portfolio.size`` entries in the study's ranges, those that share no role with the space,
    repeat one before or an enqueued configuration left out, and never more than the trials
    ``study.n_trials`` leaves after the study file's own enqueue (an entry past it would wait
    forever). ``study.portfolio.size`` is 0 by default after a warm start (``hpo.config.schema``)."""
    room = spec.study.portfolio.size or 0
    if spec.study.n_trials is not None:
        room = min(room, spec.study.n_trials - len(spec.study.enqueue))
    trials: list[dict[str, Any]] = []
    for entry in shipped()[: spec.study.portfolio.size] if room > 0 else []:
        params = params_for(spec.search_space, entry, spec.study.portfolio.roles)
        if (
            params
            and params not in trials
            and not any(params.items() <= e.items() for e in spec.study.enqueue)
        ):
            trials.append(params)
    return trials[:room]


def first_trials(study: optuna.Study, spec: StudySpec) -> list[dict[str, Any]]:
    """What a launch enqueues to run first (``hpo.study_record.enqueue_first_trials``): the study
    file's enqueue, then, on a study with no trial yet, the portfolio's ``starting_trials``."""
    learned = starting_trials(spec)
    if learned and study.get_trials(deepcopy=False):  # read only where there is something to add
        learned = []
    return [*spec.study.enqueue, *learned]


def check(spec: StudySpec) -> None:
    """A size past the entries that ship, or a role or a parameter ``study.portfolio.roles`` names
    that does not exist, is bad input (``hpo.dispatch.preflight``)."""
    from hpo.errors import StudyFileError

    asked, ships = spec.study.portfolio.size or 0, len(shipped())
    if asked > ships:
        raise StudyFileError(
            f"{spec.source}: study.portfolio: {asked} entries asked, but the learned portfolio has "
            f"{ships} (hpo/portfolio.json): at most {ships}"
        )
    for role, param in spec.study.portfolio.roles.items():
        for name, valid, what in (
            (role, list(ROLE_NAMES), "role"),
            (param, list(spec.search_space), "search_space parameter"),
        ):
            if name not in valid:
                close = difflib.get_close_matches(name, valid, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise StudyFileError(
                    f"{spec.source}: study.portfolio.roles.{role}: no {what} {name!r}{hint}; one of {', '.join(valid)}"
                )


def coverage_line(spec: StudySpec) -> str | None:
    """What the portfolio sets of this study's parameters, and what it leaves to the sampler (a
    name it does not know: ``max_lr`` is known, ``my_lr`` is not until ``study.portfolio.roles``
    names it); None when the study tries no portfolio entry."""
    size = spec.study.portfolio.size or 0
    if not size:
        return None
    found = roles(spec.search_space, spec.study.portfolio.roles)
    known = ", ".join(ROLE_NAMES)
    left = [name for name in spec.search_space if name not in found]
    if not found:
        return (
            f"portfolio: no parameter of the search space has a role it knows ({known}): nothing "
            "enqueued from it, the sampler draws every trial; name yours with study.portfolio.roles, "
            f"e.g. {{lr: {next(iter(spec.search_space), 'my_lr')}}}"
        )
    sets = ", ".join(f"{name} (as {role})" for name, role in found.items())
    line = f"portfolio: its {size} entries set {sets}"
    if left:
        line += f"; the sampler draws {', '.join(left)}"
    unmatched = [role for role in ROLE_NAMES if role not in found.values()]
    if unmatched and left:  # one of those may be a role under a name it does not know
        line += (
            f"; no parameter found for {', '.join(unmatched)} (study.portfolio.roles maps a role "
            "to a parameter of another name)"
        )
    return line
