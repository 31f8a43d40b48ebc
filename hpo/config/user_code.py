"""How the objective section names the user's code: a command's argv template, whose ``{name}``
placeholders are filled per trial, and a ``package.module:function`` to import.

Each element of ``objective.command`` is one argv element, filled by substitution only: a value
never becomes shell syntax, a separate argument or a program, whatever characters it holds.
``{{`` and ``}}`` stand for literal braces.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# What the service provides besides the trial's parameters and objective.fixed.
RUNTIME_PLACEHOLDERS = ("trial", "checkpoint_dir", "trial_dir", "python")

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TemplateError(ValueError):
    """A template element that is not well formed; the message says why."""


def placeholders(element: str) -> list[str]:
    """The placeholder names of one argv element, in order; raises TemplateError on a stray brace
    or a placeholder that is not a plain name (no format specs, no attribute access)."""
    names = []
    for match in _PLACEHOLDER.finditer(element):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        if match.group(1) is None:
            raise TemplateError(f"has a lone {token!r} (write {token * 2} for a literal brace)")
        name = match.group(1)
        if not _NAME.fullmatch(name):
            raise TemplateError(f"placeholder {{{name}}} is not a name (letters, digits and _)")
        names.append(name)
    return names


def render(template: list[str], values: Mapping[str, Any]) -> list[str]:
    """The argv of one trial: each element with its placeholders replaced by their values."""

    def fill(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        return format_value(values[match.group(1)])

    return [_PLACEHOLDER.sub(fill, element) for element in template]


def format_value(value: Any) -> str:
    """A parameter as a command-line word: floats in their shortest exact form, booleans as
    true/false (what argparse users parse), everything else as str()."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def import_function(target: str, cwd: str) -> Any:
    """The callable ``package.module:name``, imported with ``cwd`` (the objective's folder) first
    on the module path, as the script next to the study file would see it."""
    import importlib
    import sys

    module_name, _, name = target.partition(":")
    if cwd and cwd not in sys.path:
        sys.path.insert(0, cwd)
    module = importlib.import_module(module_name)
    function = getattr(module, name)
    if not callable(function):
        raise TypeError(f"{target} is a {type(function).__name__}, not a function")
    return function
