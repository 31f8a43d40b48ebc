"""What a study cost in GPU-hours (CPU-hours where trials have no GPU), from Slurm's accounting.

A trial that ran as its own Slurm job costs what ``sacct`` says: the elapsed time of every run of
the job (a requeued job runs several times; ``--duplicates`` lists each run) times the GPUs, or
CPUs, allocated to it. Pruned and failed trials count like completed ones: they were paid for.
Trials packed into one job (``resources.trials_per_gpu``) share what sacct says it cost, each in
proportion to its own elapsed time, so that their shares add up to the job. Trials that ran one
after another in a shared job (``--workers``, the Ray backend) or as local processes are charged
their own elapsed time times the resources one trial gets (a packed trial 1/k of a GPU): an
estimate, and marked as one.

Saved by pruning: what the pruned trials would have cost had they trained every epoch, minus what
they cost; each pruned trial's cost times (planned epochs / epochs trained - 1).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from hpo import record
from hpo.trial import packing
from trainer.errors import ConfigError

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


@dataclasses.dataclass
class StudyCost:
    unit: str
    """"GPU-hours", or "CPU-hours" for a study whose trials have no GPU."""
    per_trial: dict[int, Usage]
    by_state: dict[str, float]
    saved_by_pruning: float
    measured: bool
    """Every trial's cost came from sacct."""

    @property
    def total(self) -> float:
        return sum(self.by_state.values())

    def of(self, usage: Usage) -> float:
        return usage.gpu_hours if self.unit == "GPU-hours" else usage.cpu_hours


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


def own_allocation(spec: StudySpec) -> tuple[float, float]:
    """(GPUs, CPUs) of the job this process runs in (Slurm's numbers, else the study's), divided
    among the trials packed into it."""
    share = int(os.environ.get(packing.ENV_SIZE) or 1)
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
        nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or 1)
        gpus = int(os.environ.get("SLURM_GPUS_ON_NODE") or 0)
        cpus = int(os.environ.get("SLURM_CPUS_ON_NODE") or 0)
        return gpus * nodes / share, cpus * nodes / share
    res = spec.resources
    return res.gpus_per_node * res.nodes / share, res.cpus_per_task * res.world_size


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
    nodes = 1 if spec.study.backend == "ray" else res.nodes
    return res.gpus_per_node * nodes / (pack_size or res.trials_per_gpu)


def study_cost(spec: StudySpec, trials: Sequence[optuna.trial.FrozenTrial]) -> StudyCost:
    # Per-trial Slurm jobs: their own job is their cost. (A worker's or Ray trial's job is shared.)
    own_job = {
        t.number: str(t.user_attrs[record.ATTR_JOB_ID])
        for t in trials
        if t.user_attrs.get(record.ATTR_EXECUTOR) == "slurm" and record.ATTR_JOB_ID in t.user_attrs
    }
    starts = [t.datetime_start for t in trials if t.number in own_job and t.datetime_start is not None]
    measured = sacct_usage(own_job.values(), since=min(starts) - timedelta(days=1) if starts else None)
    study_gpus = spec.resources.gpus_per_node * spec.resources.nodes
    shares = packed_shares(trials)
    per_trial: dict[int, Usage] = {}
    for trial in trials:
        if trial.state.name == "WAITING" or not record.is_own(trial):
            continue
        job = own_job.get(trial.number, "")
        if job not in measured:
            per_trial[trial.number] = trial_estimate(spec, trial)
            continue
        usage = measured[job]
        share = shares.get(trial.number, 1.0)  # a packed trial's part of its job
        if study_gpus and not usage.gpus:
            # A cluster that does not track gres/gpu in AccountingStorageTRES: sacct's time
            # times the GPUs the study asked for, an estimate.
            usage = Usage(usage.seconds, study_gpus, usage.cpus, measured=False)
        per_trial[trial.number] = Usage(usage.seconds, usage.gpus * share, usage.cpus * share, usage.measured)
    unit = "GPU-hours" if spec.resources.gpus_per_node else "CPU-hours"
    cost = StudyCost(unit, per_trial, {}, 0.0, all(u.measured for u in per_trial.values()))
    for trial in trials:
        if trial.number not in per_trial:
            continue
        spent = cost.of(per_trial[trial.number])
        cost.by_state[trial.state.name] = cost.by_state.get(trial.state.name, 0.0) + spent
        planned = _planned_epochs(spec, trial)
        trained = len(trial.intermediate_values)
        if trial.state.name == "PRUNED" and 0 < trained < planned:
            cost.saved_by_pruning += spent * (planned / trained - 1)
    return cost


def packed_shares(trials: Sequence[optuna.trial.FrozenTrial]) -> dict[int, float]:
    """Each packed trial's share of its job (``record.packs``): its running time over that of
    every trial the job held (a trial still running: its time so far; equal shares while none has
    run). Trials alone in their job are not listed."""
    by_number = {t.number: t for t in trials}
    shares: dict[int, float] = {}
    for numbers in record.packs(trials).values():
        if len(numbers) < 2:
            continue
        seconds = {n: trial_seconds(by_number[n]) for n in numbers}
        total = sum(seconds.values())
        for number, own in seconds.items():
            shares[number] = own / total if total > 0 else 1 / len(numbers)
    return shares


def _planned_epochs(spec: StudySpec, trial: optuna.trial.FrozenTrial) -> int:
    """The epochs the trial was to train (``epochs`` may be a searched parameter)."""
    if spec.objective is not None:
        return spec.max_steps
    try:
        return spec.trainer_config(trial.params).epochs
    except ConfigError:  # the study file changed since: its fixed setting is the best guess
        return int(spec.trainer.get("epochs", 1))


def format_hours(hours: float) -> str:
    return f"{hours:.3g}" if hours < 10 else f"{hours:.1f}"
