"""Reading a study file: the YAML (with YAML 1.2 numbers), ``${VAR}`` interpolation and ``--set``
overrides, before the schema (``hpo.config.schema``) validates the result.

A study file is untrusted bytes: whatever it holds, reading it ends in a :class:`StudyFileError`
(one line naming the file) or a document for the schema.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hpo.config.schema import StudySpec, build_spec
from hpo.errors import StudyFileError
from trainer.errors import ConfigError
from trainer.fields import KeyProblem, join
from trainer.yamlfile import MAX_DEPTH, YamlLoader, load_yaml_mapping

_INTERPOLATION = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def load_study(
    path: str | Path, overrides: Sequence[str] = (), labels: Mapping[str, str] | None = None
) -> StudySpec:
    """Read, interpolate, override and validate a study file.

    ``labels`` names the command-line option behind an override key (``study.n_trials`` ->
    ``--n-trials``) for error messages; other overrides are named ``--set KEY``.
    """
    source = str(path)
    try:
        document: Any = load_yaml_mapping(path)
    except ConfigError as err:
        raise StudyFileError(str(err)) from None
    try:
        document = _interpolate(document, "")
    except KeyProblem as problem:
        raise StudyFileError(f"{source}: {problem}") from None
    overridden: list[str] = []
    for assignment in overrides:
        key = _apply_override(document, assignment, source)
        overridden.append(key)
    try:
        spec = build_spec(document, source)
        _check_paths(spec)
        return spec
    except KeyProblem as problem:
        culprit = next(
            (k for k in overridden if problem.path == k or problem.path.startswith((k + ".", k + "["))), None
        )
        label = (labels or {}).get(culprit or "", f"--set {culprit}")
        where = f"{source} ({label})" if culprit else source
        raise StudyFileError(f"{where}: {problem}") from None


def _check_paths(spec: StudySpec) -> None:
    """The paths the study names must be usable as paths (the schema checks they are strings):
    what would otherwise fail later as a RuntimeError or a ValueError, is a key problem here."""
    for key, text in (("study.workdir", spec.study.workdir), ("study.storage", spec.study.storage)):
        if not text:
            continue
        if "\0" in text:
            raise KeyProblem(key, "contains a NUL character")
        path = text.removeprefix("journal:").removeprefix("//") if key == "study.storage" else text
        if path.startswith("~"):
            try:
                Path(path).expanduser()
            except RuntimeError:  # ~name of no user, or no HOME
                raise KeyProblem(key, f"cannot expand {path.split('/')[0]!r}: no such user's home") from None


def _interpolate(value: Any, path: str) -> Any:
    """Replace ``${VAR}`` and ``${VAR:-default}`` in strings; ``$$`` is a literal ``$``."""
    if isinstance(value, dict):
        return {key: _interpolate(item, join(path, str(key))) for key, item in value.items()}
    if isinstance(value, list):
        return [_interpolate(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise KeyProblem(
            path, f"environment variable {name} is not set (write ${{{name}:-default}} for a default)"
        )

    result = _INTERPOLATION.sub(substitute, value)
    whole = _INTERPOLATION.fullmatch(value)
    if whole and whole.group(0) != "$$":
        # `n_trials: ${N}` is the number N, as if written in the file.
        try:
            return yaml.load(result, Loader=YamlLoader) if result.strip() else result
        except yaml.YAMLError:
            return result
    return result


def _apply_override(document: dict[str, Any], assignment: str, source: str) -> str:
    """Apply ``--set a.b=value`` (value parsed as YAML) and return the key path it set."""
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise StudyFileError(f"--set {assignment}: expected KEY.PATH=VALUE, like study.n_trials=20")
    try:
        value = yaml.load(text, Loader=YamlLoader) if text.strip() else None
    except yaml.YAMLError:
        raise StudyFileError(f"--set {assignment}: the value is not valid YAML") from None
    node = document
    parts = key.split(".")
    if len(parts) > MAX_DEPTH:
        raise StudyFileError(f"--set {key[:80]}...: a key path of more than {MAX_DEPTH} parts")
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            prefix = ".".join(parts[: depth + 1])
            raise StudyFileError(f"{source} (--set {key}): {prefix}: is not a mapping, cannot set {key}")
        node = child
    node[parts[-1]] = value
    return key
