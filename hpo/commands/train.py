"""``hpo train``: one training run, the trainer's own command line (``python -m trainer``)."""

from __future__ import annotations

from hpo.commands.common import Forwarded


def main(argv: list[str]) -> int:
    from trainer.cli import main as train_main

    return train_main(argv)  # forwarded untouched: the trainer owns its flags


COMMAND = Forwarded(
    name="train",
    help="run one training directly (same flags as `python -m trainer`; see `hpo train --help`)",
    main=main,
)
