"""What a study cost in GPU-hours (CPU-hours where trials have no GPU): each trial's measured
cost where its executor measures it (a per-trial Slurm job: ``sacct``), else an estimate from its
own elapsed time (``hpo.budget.usage``).

Pruned and failed trials count like completed ones: they were paid for. Trials packed into one job
(``resources.trials_per_gpu``) share what the job cost, each in proportion to its own elapsed
time, so that their shares add up to the job. Trials that ran one after another in a shared job
(``--workers``, the Ray backend) or as local processes are charged their own elapsed time times
the resources one trial gets (a packed trial 1/k of a GPU): an estimate, and marked as one.

Saved by pruning: what the pruned trials would have cost had they trained every epoch, minus what
they cost; each pruned trial's cost times (planned epochs / epochs trained - 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from hpo import executors, record, tally
from hpo.budget.usage import Usage, trial_estimate, trial_seconds
from trainer.errors import ConfigError

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudySpec


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


def measured_usage(trials: Sequence[optuna.trial.FrozenTrial]) -> dict[int, Usage]:
    """What each trial's own job cost, for the per-trial jobs of executors that measure it (a
    worker's or Ray trial's job is shared: estimated instead)."""
    jobs: dict[str, dict[int, str]] = {}
    for trial in trials:
        name = record.executor_name(trial)
        if (
            record.dispatch_mode(trial) == record.DispatchMode.PER_TRIAL
            and name in executors.names()
            and executors.executor_class(name).measured_cost
            and record.ATTR_JOB_ID in trial.user_attrs
        ):
            jobs.setdefault(name, {})[trial.number] = str(trial.user_attrs[record.ATTR_JOB_ID])
    found: dict[int, Usage] = {}
    for name, own_job in jobs.items():
        starts = [t.datetime_start for t in trials if t.number in own_job and t.datetime_start is not None]
        usage = executors.get(name).cost(
            own_job.values(), since=min(starts) - timedelta(days=1) if starts else None
        )
        found |= {number: usage[job] for number, job in own_job.items() if job in usage}
    return found


def study_cost(spec: StudySpec, trials: Sequence[optuna.trial.FrozenTrial]) -> StudyCost:
    measured = measured_usage(trials)
    study_gpus = spec.resources.gpus_per_node * spec.resources.nodes
    shares = packed_shares(trials)
    per_trial: dict[int, Usage] = {}
    for trial in trials:
        if trial.state.name == "WAITING" or not tally.is_own(trial):
            continue
        if trial.number not in measured:
            per_trial[trial.number] = trial_estimate(spec, trial)
            continue
        usage = measured[trial.number]
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
    """Each packed trial's share of its job (``tally.packs``): its running time over that of
    every trial the job held (a trial still running: its time so far; equal shares while none has
    run). Trials alone in their job are not listed."""
    by_number = {t.number: t for t in trials}
    shares: dict[int, float] = {}
    for numbers in tally.packs(trials).values():
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
