"""What a trial cost: its executor's measure, or its own elapsed time times what one trial gets.

A trial that ran as its own job costs what its executor measures (``Executor.cost``: for Slurm,
sacct's elapsed time of every run of the job times the GPUs, or CPUs, allocated to it). A trial
that shared its job, or whose executor measures nothing, is estimated: its own elapsed time times
the resources one trial gets. ``hpo.budget.cost`` adds them up per study.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from hpo import record

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudySpec


@dataclasses.dataclass(frozen=True)
class Usage:
    seconds: float
    """Wall time, every run of the job included."""
    gpus: float
    cpus: float
    """Allocated to it (averaged over the runs of a requeued job, weighted by their time); a
    packed trial's share of its job's."""
    measured: bool
    """From sacct; False for an estimate from the trial's own elapsed time."""

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.gpus / 3600

    @property
    def cpu_hours(self) -> float:
        return self.seconds * self.cpus / 3600


def trial_estimate(spec: StudySpec, trial: optuna.trial.FrozenTrial) -> Usage:
    """The trial's own elapsed time times what one trial gets (shared or local jobs)."""
    pack = trial.user_attrs.get(record.ATTR_PACK_SIZE)  # a short last pack shares among fewer
    gpus = trial_gpus(spec, None if pack is None else int(pack))
    return Usage(trial_seconds(trial), gpus, spec.resources.cpus_per_task * spec.trial_ranks, measured=False)


def trial_seconds(trial: optuna.trial.FrozenTrial) -> float:
    """How long the trial has run: its elapsed time, or a running trial's time since it started
    (a job still waiting in the queue costs nothing yet)."""
    seconds = trial.user_attrs.get(record.ATTR_ELAPSED_S)
    if seconds is None and trial.state.name == "RUNNING":
        started = trial.user_attrs.get(record.ATTR_STARTED_AT)
        if started:
            seconds = max(0.0, (datetime.now(timezone.utc) - datetime.fromisoformat(started)).total_seconds())
    elif seconds is None and trial.duration is not None:
        seconds = trial.duration.total_seconds()
    return float(seconds or 0.0)


def trial_gpus(spec: StudySpec, pack_size: int | None = None) -> float:
    """The GPUs one trial holds: its job's (with the Ray backend, one node's), shared among the
    trials packed on them (``trials_per_gpu``, or the size of its own pack where known)."""
    res = spec.resources
    nodes = 1 if spec.study.on_ray else res.nodes
    return res.gpus_per_node * nodes / (pack_size or res.trials_per_gpu)


def format_hours(hours: float) -> str:
    return f"{hours:.3g}" if hours < 10 else f"{hours:.1f}"
