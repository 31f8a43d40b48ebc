"""The Slurm executor's own section of a study file, ``resources.slurm``: where its jobs go
(partition, account, QoS, node constraint) and extra sbatch options. The config reads the section
with this class (``SlurmExecutor.settings``) as it reads any executor's; these keys were once
directly under ``resources`` (``SlurmExecutor.former_keys``), and are still read there with a note."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from hpo.config.resources import check_placement
from trainer.fields import KeyProblem, config_dataclass, field

if TYPE_CHECKING:
    from hpo.config import StudySpec

_CONSTRAINT = re.compile(r"[A-Za-z0-9_.\-&|\[\]*:()!]+")


@config_dataclass()
class SlurmSettings:
    """Where a trial's Slurm job goes, and what else sbatch is told."""

    partition: str | None = field(None, "Slurm partition.")
    account: str | None = field(None, "Slurm account (--account); Jean Zay's look like abc@a100.")
    qos: str | None = field(None, "Slurm QoS (--qos).")
    constraint: str | None = field(None, "Slurm node constraint (--constraint), e.g. a100 or h100.")
    sbatch: dict[str, Any] = field(factory=dict, help="Extra sbatch options, e.g. {hint: nomultithread}.")

    def __post_init__(self) -> None:
        check_placement(self.partition, self.account, self.qos, self.sbatch)
        if self.constraint is not None and not _CONSTRAINT.fullmatch(self.constraint):
            raise KeyProblem("constraint", f"is not a Slurm constraint expression: {self.constraint!r}")


def of(spec: StudySpec) -> SlurmSettings:
    """The study's ``resources.slurm`` (its defaults where the file has none)."""
    settings = spec.executor_settings.get("slurm")
    return settings if isinstance(settings, SlurmSettings) else SlurmSettings()
