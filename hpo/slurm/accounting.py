"""What Slurm's accounting says a job cost, and what a trial's own elapsed time says it cost.

A trial that ran as its own Slurm job costs what ``sacct`` says: the elapsed time of every run of
the job (a requeued job runs several times; ``--duplicates`` lists each run) times the GPUs, or
CPUs, allocated to it. A trial that shared its job, or ran as a local process, is estimated: its
own elapsed time times the resources one trial gets. ``hpo.budget.cost`` adds them up per study.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterable
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


def sacct_usage(job_ids: Iterable[str], since: datetime | None = None) -> dict[str, Usage]:
    """Elapsed time and allocation of Slurm jobs, every run of a requeued job summed.

    ``since`` (the study's first trial) keeps out older jobs that had the same id (sacct searches
    from the epoch when given job ids; ids restart after a wrap-around or a controller reset).
    """
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    window = ["-S", since.strftime("%Y-%m-%dT%H:%M:%S")] if since is not None else []
    try:
        out = subprocess.run(
            ["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,ElapsedRaw,AllocTRES", *window, "-j", ",".join(ids)],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}  # no accounting here: callers fall back to estimates
    return parse_usage(out)


def parse_usage(out: str) -> dict[str, Usage]:
    """``sacct -X -D -n -P -o JobID,ElapsedRaw,AllocTRES`` output: per job, its runs summed
    (seconds, GPU-seconds, CPU-seconds, each run with its own allocation)."""
    sums: dict[str, list[float]] = {}
    for line in out.splitlines():
        job_id, elapsed, tres = [*line.split("|"), "", ""][:3]
        if not elapsed.isdigit():
            continue
        run = sums.setdefault(job_id, [0.0, 0.0, 0.0])
        run[0] += float(elapsed)
        run[1] += float(elapsed) * _tres_count(tres, "gres/gpu")
        run[2] += float(elapsed) * _tres_count(tres, "cpu")
    return {
        job_id: Usage(secs, gpu_s / secs if secs else 0.0, cpu_s / secs if secs else 0.0, measured=True)
        for job_id, (secs, gpu_s, cpu_s) in sums.items()
    }


def _tres_count(tres: str, name: str) -> int:
    """``gres/gpu=4`` (else the sum of typed ``gres/gpu:a100=4``) or ``cpu=8`` from AllocTRES."""
    counts = {
        key: int(value)
        for key, _, value in (item.partition("=") for item in tres.split(","))
        if value.isdigit()
    }
    if name in counts:
        return counts[name]
    return sum(value for key, value in counts.items() if key.startswith(name + ":"))


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
