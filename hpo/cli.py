"""The ``hpo`` command. It only parses arguments and calls the modules that do the work."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import hpo


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="hpo", description=hpo.__doc__)
    parser.add_argument("--version", action="version", version=f"hpo {hpo.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "train",
        help="run one training directly (same flags as `python -m trainer`; see `hpo train --help`)",
        add_help=False,
    )
    if argv[:1] == ["train"]:
        # Forwarded untouched: the trainer owns its flags.
        from trainer.cli import main as train_main

        return train_main(argv[1:])
    parser.parse_args(argv)
    return 0
