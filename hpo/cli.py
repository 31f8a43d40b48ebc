"""The ``hpo`` console script (``python -m hpo`` too): the command table of ``hpo.commands`` parses
the command line and runs the command chosen."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from hpo import commands

    return commands.main(argv)
