"""Config keys declared once, for the trainer's config and the study file's sections alike.

It lives in the trainer because the trainer's own config is built with it and the trainer never imports
the service; ``hpo/config`` builds its sections with it too, and holds what only a study file needs
(nested sections, a document's keys) in ``hpo/config/fields.py``. The study file's wording of a problem
stays here beside the trainer's: both are one translation of pydantic's errors (:func:`problem_of`).

A key is a field of a :func:`config_dataclass`: the annotation is its type, and :func:`field` gives its
default, its bounds and its help text (the ``--help`` line and the JSON schema's description). pydantic
validates: types are strict (``true`` is not an integer, ``"3"`` not a number; an integer is accepted where
a float is expected, and converted), an unknown key is an error, and the checks that involve several keys
stay in ``__post_init__``.

pydantic reports every problem it finds, with its location; a user gets one line about the first, worded as
each kind of file has always worded it: the trainer's flat config (``batch_size must be a int, got True``)
and the study file's nested sections (``study.n_trials: must be an integer, got 'ten'``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, TypeVar, Union

import pydantic
from pydantic import ConfigDict, ValidationError
from pydantic_core import ErrorDetails
from typing_extensions import dataclass_transform

from trainer.errors import ConfigError

T = TypeVar("T")

# pydantic's error types, by what the message says.
_UNKNOWN_KEY = ("unexpected_keyword_argument", "extra_forbidden")
_MISSING = ("missing_argument", "missing")
_NOT_A_MAPPING = ("dict_type", "dataclass_type", "dataclass_exact_type", "dataclass_args_type")
_BOUNDS = {"gt": ("(", ">"), "ge": ("[", ">="), "lt": (")", "<"), "le": ("]", "<=")}
_OUT_OF_BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")
# The study file's words for the types of a value; the trainer's are the Python names ("a int").
_TYPE_WORDS = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    type(None): "null",
}


class KeyProblem(ConfigError):
    """A problem at a key path (``resources.setup[1]``; empty: the mapping itself), in one line."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


def field(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> Any:
    """A config key: its default (or a factory of it), its help text, and the bounds of its value."""
    bounds = {
        name: value for name, value in (("gt", gt), ("ge", ge), ("lt", lt), ("le", le)) if value is not None
    }
    # pydantic reads the Field() arguments among a dataclass field's metadata: description and bounds.
    metadata = {"help": help, "description": help, **bounds}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass_transform(field_specifiers=(dataclasses.field,))
def config_dataclass(*, flat: bool = False, allow_inf_nan: bool = False) -> Callable[[type[T]], type[T]]:
    """A pydantic dataclass of config keys, whose constructor raises one line, a :class:`ConfigError`.

    ``flat``: a mapping of keys that users know from the trainer (``batch_size must be a int, got True``);
    otherwise a section of a document, which raises a :class:`KeyProblem` whose path its caller prefixes.
    """

    def decorate(cls: type[T]) -> type[T]:
        config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=allow_inf_nan)
        made = typing.cast("type[T]", pydantic.dataclasses.dataclass(config=config)(cls))
        validating_init = made.__init__

        @functools.wraps(validating_init)
        # `self` positional-only: a key named self is one more unknown key, not a clash with it.
        def __init__(self: Any, /, *args: Any, **kwargs: Any) -> None:
            try:
                validating_init(self, *args, **kwargs)
            except ValidationError as err:
                problem = problem_of(err, made, flat=flat)
                if not flat:
                    raise problem from None
                raise ConfigError(
                    f"{problem.path} {problem.problem}" if problem.path else problem.problem
                ) from None

        setattr(made, "__init__", __init__)  # noqa: B010 (mypy refuses assigning to a method)
        return made

    return decorate


def build(cls: type[T], data: Any) -> T:
    """``cls(**data)`` for a mapping of key names, or None for every default."""
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise KeyProblem("", f"must be a mapping, got {kind(data)}")
    check_names(data)
    return cls(**data)


def check_names(data: Mapping[Any, Any]) -> None:
    """Every key of a mapping of keys is a string."""
    for key in data:
        if not isinstance(key, str):
            raise KeyProblem("", f"keys must be names, got {key!r}")


def unknown_key(key: str, owner: type[Any], *, flat: bool = False) -> str:
    """The problem of an unknown key of the dataclass ``owner``: the valid keys, and the closest one."""
    fields = [f for f in dataclasses.fields(owner) if f.init]
    if flat:
        return f"unknown key {key!r}; valid keys: {', '.join(f.name for f in fields)}"
    close = difflib.get_close_matches(key, [f.name for f in fields], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listing = ", ".join(
        f.name if f.default is dataclasses.MISSING else f"{f.name}={f.default!r}" for f in fields
    )
    return f"unknown key{hint}; valid keys: {listing}"


def problem_of(err: ValidationError, cls: type[Any], *, flat: bool = False) -> KeyProblem:
    """The first problem pydantic found in a ``cls``, in one line; an unknown key first (a typo explains
    what follows from it)."""
    error: ErrorDetails = sorted(err.errors(), key=lambda e: e["type"] not in _UNKNOWN_KEY)[0]
    loc, value, problem_type = error["loc"], error["input"], error["type"]
    if loc and loc[-1] == "[key]":  # a mapping's key (loc: ..., key, "[key]"), not one of its values
        return KeyProblem(_locate(cls, loc[:-2]).path, f"keys must be names, got {value!r}")
    spot = _locate(cls, loc)
    if problem_type in _UNKNOWN_KEY and spot.owner is not None:
        parent = _locate(cls, loc[:-1]).path
        if flat:
            return KeyProblem(parent, unknown_key(str(loc[-1]), spot.owner, flat=True))
        return KeyProblem(spot.path, unknown_key(str(loc[-1]), spot.owner))
    if problem_type == "value_error":  # raised by a check in __post_init__
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, KeyProblem):
            return KeyProblem(join(spot.path, cause.path), cause.problem)
        return KeyProblem(spot.path, str(cause))
    if problem_type in _MISSING:
        return KeyProblem(spot.path, "is required")
    if problem_type in _OUT_OF_BOUNDS and spot.field is not None:
        # The value as the key holds it: pct_start: 0 is 0.0.
        shown = float(value) if _options(spot.annotation) == [float] else value
        return KeyProblem(spot.path, f"must be {_interval(spot.field)}, got {shown!r}")
    if problem_type == "finite_number":
        return KeyProblem(spot.path, f"must be a finite number, got {value!r}")
    if problem_type == "literal_error" and isinstance(value, str):
        choices = [str(c) for option in _options(spot.annotation) for c in typing.get_args(option)]
        return KeyProblem(spot.path, f"must be one of {', '.join(choices)}; got {value!r}")
    if problem_type == "list_type":
        return KeyProblem(spot.path, f"must be a list, got {kind(value)}")
    if problem_type in _NOT_A_MAPPING:
        return KeyProblem(spot.path, f"must be a mapping, got {kind(value)}")
    options = [_value_type(option) for option in _options(spot.annotation, with_none=True)]
    if flat:
        return KeyProblem(spot.path, f"must be a {options[0].__name__}, got {value!r}")
    words = " or ".join(_TYPE_WORDS.get(option, option.__name__) for option in options)
    return KeyProblem(spot.path, f"must be {words}, got {'null' if value is None else repr(value)}")


class _Spot(NamedTuple):
    """Where an error is: its key path, the type of the value there, and the key's field and dataclass."""

    path: str
    annotation: Any
    field: dataclasses.Field[Any] | None
    owner: type[Any] | None


def _locate(cls: type[Any], loc: tuple[int | str, ...]) -> _Spot:
    spot = _Spot("", cls, None, None)
    for part in loc:
        options = _options(spot.annotation)
        container = options[0] if len(options) == 1 else None
        if container is not None and dataclasses.is_dataclass(container):
            owner = typing.cast(type, container)
            field = next((f for f in dataclasses.fields(owner) if f.name == part), None)
            annotation = _type_hints(owner).get(str(part))
            spot = _Spot(join(spot.path, str(part)), annotation, field, owner)
        elif typing.get_origin(container) is dict:
            spot = _Spot(join(spot.path, str(part)), typing.get_args(container)[1], None, None)
        elif typing.get_origin(container) is list:
            spot = _Spot(f"{spot.path}[{part}]", typing.get_args(container)[0], None, None)
        # Otherwise the part names the member of a union that pydantic tried: the key is the same.
    return spot


@functools.cache
def _type_hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _options(annotation: Any, *, with_none: bool = False) -> list[Any]:
    """The types a value may have: ``int | None`` -> [int] (with_none: [int, NoneType])."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        options = list(typing.get_args(annotation))
    else:
        options = [annotation]
    return [option for option in options if with_none or option is not type(None)]


def _value_type(option: Any) -> Any:
    """A Literal's values are strings: its type, for "must be a string"."""
    return type(typing.get_args(option)[0]) if typing.get_origin(option) is Literal else option


def _interval(field: dataclasses.Field[Any]) -> str:
    """``> 0``, ``>= 1`` or ``in (0, 1]``: the bounds :func:`field` gave the key."""
    bounds = [(name, field.metadata[name]) for name in _BOUNDS if name in field.metadata]
    if len(bounds) == 2:
        (low, low_value), (high, high_value) = bounds
        return f"in {_BOUNDS[low][0]}{low_value}, {high_value}{_BOUNDS[high][0]}"
    return " and ".join(f"{_BOUNDS[name][1]} {value}" for name, value in bounds)


def join(path: str, key: str) -> str:
    """``study`` + ``n_trials`` -> ``study.n_trials``; ``setup`` + ``[1]`` -> ``setup[1]``."""
    if not key:
        return path
    if not path:
        return key
    return f"{path}{key}" if key.startswith("[") else f"{path}.{key}"


def kind(value: Any) -> str:
    """The YAML-ish name of a value's type, for "must be a mapping, got list"."""
    return "null" if value is None else type(value).__name__
