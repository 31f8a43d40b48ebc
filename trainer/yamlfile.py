"""YAML files read as people write them: numbers resolved as in YAML 1.2, one mapping per file.

Shared by the trainer's ``--config`` files and the service's study files (the service imports it
from here; the trainer never imports the service).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from trainer.errors import ConfigError


class YamlLoader(yaml.SafeLoader):
    """Numbers resolved as in YAML 1.2, not PyYAML's YAML 1.1.

    In YAML 1.1 ``1e-4`` (no dot, or no exponent sign) is a string, and ``1:30:00`` is the
    sexagesimal integer 5400: learning rates and Slurm time limits are written exactly like that.
    """


_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
YamlLoader.add_implicit_resolver(
    _INT_TAG, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
YamlLoader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config file: {err.strerror or err}") from None
    try:
        values = yaml.load(text, Loader=YamlLoader)  # safe: a SafeLoader subclass
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"{path}: not valid YAML{line}: {getattr(err, 'problem', err)}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(values).__name__}")
    return values
