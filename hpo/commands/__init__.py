"""The ``hpo`` commands: one module per command, each declaring its name, help, arguments and the
function that runs it (a :class:`~hpo.commands.common.Command`), listed once in :data:`COMMANDS`,
which both builds the parser and runs the command chosen (``hpo.cli`` is the console script's entry
point; a detached launcher's job runs the same options, minus ``--detach``).

Exit status: 0 success, 1 runtime failure, 2 bad input (one line naming the file and key,
nothing submitted), 3 this machine or a service it needs is not ready (one line and a hint),
130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import hpo
from hpo.commands import (
    best,
    cancel,
    dashboard,
    delete,
    launch,
    logs,
    report,
    schema,
    status,
    studies,
    train,
    tunnel,
)
from hpo.commands.common import Command, Forwarded, Options, execute, execute_as_process

__all__ = ["COMMANDS", "build_parser", "execute", "execute_as_process", "main", "parse"]

COMMANDS: tuple[Command | Forwarded, ...] = (
    train.COMMAND,
    launch.COMMAND,
    schema.COMMAND,
    tunnel.COMMAND,
    status.COMMAND,
    best.COMMAND,
    cancel.COMMAND,
    studies.COMMAND,
    delete.COMMAND,
    dashboard.COMMAND,
    report.COMMAND,
    logs.COMMAND,
)
"""Every command, in the order ``hpo --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    # The trainer's parser: a bad option is one line and exit 2, as everywhere in the service.
    from trainer.cli import OneLineErrorParser

    parser = OneLineErrorParser(prog="hpo", description=hpo.__doc__)
    parser.add_argument("--version", action="version", version=f"hpo {hpo.__version__}")
    subparsers = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=OneLineErrorParser
    )
    for command in COMMANDS:
        if isinstance(command, Forwarded):  # parsed by its own parser (main forwards it)
            subparsers.add_parser(command.name, help=command.help, add_help=False)
            continue
        subparser = subparsers.add_parser(command.name, help=command.help)
        command.add_arguments(subparser)
        subparser.set_defaults(run=command.run)
    return parser


def parse(argv: Sequence[str]) -> Options:
    """The options of the command line ``hpo ARGV...`` (a bad one exits 2 with one line)."""
    options = build_parser().parse_args(list(argv))
    options.argv = list(argv)
    return options


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    forwarded = {c.name: c for c in COMMANDS if isinstance(c, Forwarded)}
    if argv[:1] and argv[0] in forwarded:
        return forwarded[argv[0]].main(argv[1:])
    return execute_as_process(parse(argv))
