"""What only a study file needs of ``trainer.fields``: sections nested in a section, and the keys of a
document checked before it is built (the trainer's config is one flat mapping and needs neither)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from pydantic import BeforeValidator

from trainer.fields import KeyProblem, build, check_names, unknown_key


def nested(cls: type[Any]) -> BeforeValidator:
    """The annotation metadata of a key that holds a section: ``Annotated[SamplerSpec, nested(SamplerSpec)]``.

    Strict types would want an instance there: the section is built from its mapping (null: every default),
    so that its problems are reported at their own key path.
    """
    return BeforeValidator(functools.partial(build, cls))


def check_keys(data: Mapping[Any, Any], owner: type[Any]) -> None:
    """Every key of ``data`` is one of the dataclass ``owner``'s (for a mapping that is not built)."""
    check_names(data)
    valid = {f.name for f in dataclasses.fields(owner)}
    for key in data:
        if key not in valid:
            raise KeyProblem(key, unknown_key(key, owner))
