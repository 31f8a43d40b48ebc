"""HPO service for Slurm GPU clusters: Optuna or Ray Tune studies whose trials run your own
training code (a command, the hpo.trial API, a Python function) or the built-in ResNet trainer."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

__version__ = "0.1.0"


def open_study(study_file: str, storage: str | None = None) -> optuna.Study:
    """The stored study of a study file, as an ``optuna.Study``: for a notebook or a script
    (``study.trials_dataframe()``, ``optuna.visualization``). Its storage is the one the file names,
    ``storage`` (a URL, as ``--storage``), or the file's last launch's, as for ``hpo status``; a
    PostgreSQL password comes from ``PGPASSWORD`` or ``~/.pgpass``."""
    import argparse
    from pathlib import Path

    from hpo.commands.common import open_study as open_for_command

    options = argparse.Namespace(study_file=Path(study_file), storage=storage, overrides=[])
    return open_for_command(options)[2]
