"""Each executor's own section of ``resources`` (``resources.slurm``), read by the class the
executor names (``Executor.settings``): the service's config does not know an executor's keys.

A key that an executor's section took over from ``resources`` itself (``Executor.former_keys``:
Slurm's ``partition``, ``account``, ``qos``, ``constraint``, ``sbatch``) is still read where an
older study file has it, into that section, with a one-line note; set in both places, it is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hpo.config.resources import Resources
from hpo.executors import executor_class
from hpo.executors import names as installed_executors
from trainer.fields import KeyProblem, build


def split(resources_doc: Any, source: str) -> tuple[Any, dict[str, Any], list[str]]:
    """(the resources section without the executors' sections, each executor's settings by name,
    the notes to show). An installed executor without settings of its own keeps its name in the
    section, which then refuses it as an unknown key."""
    if not isinstance(resources_doc, Mapping):
        return resources_doc, {}, []
    doc = dict(resources_doc)
    sections: dict[str, Any] = {}
    for name in installed_executors():
        if name in doc and executor_class(name).settings is not None:
            sections[name] = doc.pop(name)
    notes = []
    moved_from: set[str] = set()  # former keys, read from directly under resources
    own = {f.name for f in dataclasses.fields(Resources)}
    strays = [key for key in doc if isinstance(key, str) and key not in own]
    for name in installed_executors() if strays else ():
        moved = [key for key in strays if key in executor_class(name).former_keys]
        if not moved:
            continue
        section = sections.setdefault(name, {})
        if not isinstance(section, Mapping):
            raise KeyProblem(f"resources.{name}", "must be a mapping of keys")
        section = sections[name] = dict(section)
        for key in moved:
            if key in section:
                raise KeyProblem(f"resources.{key}", f"is also set as resources.{name}.{key}: keep that one")
            section[key] = doc.pop(key)
            moved_from.add(key)
        notes.append(
            f"{source}: {', '.join(f'resources.{key}' for key in moved)}: read as "
            f"{', '.join(f'resources.{name}.{key}' for key in moved)}, where they belong now; move them there"
        )
    settings = {}
    for name, section in sections.items():
        cls = executor_class(name).settings
        assert cls is not None
        try:
            settings[name] = build(cls, section)
        except KeyProblem as problem:
            # Named where the file has it: a former key directly under resources.
            where = "resources" if problem.path.split(".")[0] in moved_from else f"resources.{name}"
            raise KeyProblem(f"{where}.{problem.path}".rstrip("."), problem.problem) from None
    return doc, settings, notes
