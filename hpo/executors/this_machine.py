"""Checks for jobs that run on the launcher's own machine (the local executor's, a plugin's queue
on this machine): a pack of trials needs the CPUs, and the trainer's dataset must be on this disk."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hpo.errors import NotReadyError, StudyFileError

if TYPE_CHECKING:
    from hpo.config import StudySpec


def check_runs_here(spec: StudySpec) -> None:
    """Every check of a study whose trials run on this machine."""
    check_packing_fits_here(spec)
    if spec.objective is None:
        check_local_data(spec)


def check_packing_fits_here(spec: StudySpec) -> None:
    """Local processes: a pack of trials cannot have more CPUs than this machine."""
    res = spec.resources
    cpus = os.cpu_count() or 1
    if res.packed and res.job_cpus_per_task > cpus:
        raise StudyFileError(
            f"{spec.source}: resources.trials_per_gpu: {res.trials_per_gpu} trials of "
            f"{res.cpus_per_task} CPUs each need {res.job_cpus_per_task} CPUs; this machine has {cpus}"
        )


def check_local_data(spec: StudySpec) -> None:
    """Trials that run here read the dataset from here: it must be on disk before they start."""
    from trainer.config import TrainConfig  # the trainer's config, not torch: only where it is needed
    from trainer.errors import ConfigError
    from trainer.sources import check_data_available, dsdir_hint

    try:
        config = TrainConfig.from_mapping(spec.trainer)
    except ConfigError as err:
        raise StudyFileError(f"{spec.source}: trainer: {err}") from None
    if config.resolved_data_root is None and config.dataset != "synthetic":  # generated, read from nowhere
        raise StudyFileError(
            f"{spec.source}: trainer.data_root: is required for dataset {config.dataset!r}{dsdir_hint()}"
        )
    try:
        check_data_available(config)
    except ConfigError as err:
        raise NotReadyError(
            f"{spec.source}: trainer: {err}", "install the dataset, or point trainer.data_root at it"
        ) from None
