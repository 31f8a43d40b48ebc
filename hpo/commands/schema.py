"""``hpo schema``: the JSON Schema of study files (it reads no study file)."""

from __future__ import annotations

import argparse

from hpo.commands.common import Command, Options


def schema_text() -> str:
    """The JSON Schema of a study file, as ``hpo schema`` prints it and docs/study.schema.json holds it."""
    import json

    from hpo.config.schema import json_schema

    return json.dumps(json_schema(), indent=2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """It takes none."""


def run(options: Options) -> int:
    print(schema_text())
    return 0


COMMAND = Command(
    name="schema",
    help="print the JSON Schema of study files (for editors: the shipped files name "
    "docs/study.schema.json in a yaml-language-server line)",
    add_arguments=add_arguments,
    run=run,
)
