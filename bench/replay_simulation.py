"""The replay's clock: a strategy's study asked and told against a recorded table, with
``max_concurrent`` workers that each start the next trial as soon as theirs ends, as the launcher
does, each epoch ending on a clock driven by the recorded seconds of each epoch and the trial's
measured overhead.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna

from bench.replay_strategies import SamplerWrapper, Stopper, build_pruner, stopper_for
from bench.replay_table import Lookup, Recorded, Table, nearest_neighbour, restarted
from hpo import record, search
from hpo.config import StudySpec

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclasses.dataclass
class TrialRun:
    number: int
    params: dict[str, Any]
    recorded: Recorded
    asked_s: float
    end_s: float = math.inf
    epochs: int = 0
    state: str = "RUNNING"
    value: float | None = None
    judged_at: dict[int, int] | None = None
    """Restarted fidelities (``restarted``): the epochs of its curve at which it reports, and the
    step each reports; None: every epoch, at its own number."""


@dataclasses.dataclass
class Replay:
    trials: list[TrialRun]
    events: list[tuple[float, int, str]]
    """(clock, trial number, what): "start", "epoch N", "COMPLETE", "PRUNED" (or "DIVERGED"), in order."""
    study: optuna.Study = dataclasses.field(repr=False, compare=False)
    """The Optuna study that was asked and told."""

    def compute_at(self, clock: float) -> float:
        """CPU-seconds charged by ``clock``: every trial's span from its ask, up to then."""
        asked = np.fromiter((t.asked_s for t in self.trials), float, len(self.trials))
        ended = np.fromiter((t.end_s for t in self.trials), float, len(self.trials))
        return float(np.clip(np.minimum(ended, clock) - asked, 0.0, None).sum())

    def total_compute(self) -> float:
        return sum(t.end_s - t.asked_s for t in self.trials)

    def progress(self, maximize: bool) -> list[tuple[float, float, TrialRun]]:
        """(compute, best value, best trial) each time the best improves."""
        best: TrialRun | None = None
        out = []
        for trial in sorted(
            (t for t in self.trials if t.state == "COMPLETE"), key=lambda t: (t.end_s, t.number)
        ):
            assert trial.value is not None
            if best is None or (trial.value > best.value if maximize else trial.value < best.value):  # type: ignore[operator]
                best = trial
                out.append((self.compute_at(trial.end_s), trial.value, trial))
        return out


TellDiverged = Callable[[optuna.Study, optuna.Trial, str | None], None]
"""How a trial whose value turned non-finite is told: (the study, the trial, the study's direction)."""


def replay(
    table: Table,
    spec: StudySpec,
    *,
    lookup: Lookup = nearest_neighbour,
    n_trials: int | None = None,
    compute_budget: float = math.inf,
    stop_when: Callable[[Replay, float], bool] | None = None,
    initial_trials: Sequence[optuna.trial.FrozenTrial] = (),
    tell_diverged: TellDiverged | None = None,
    restarts: bool = False,
    enqueue: Sequence[dict[str, Any]] = (),
    wrap_sampler: SamplerWrapper | None = None,
) -> Replay:
    """Run the spec's sampler and pruner against the table with max_concurrent workers.

    New trials are asked while fewer than ``n_trials`` were and less than ``compute_budget`` was
    charged; ``stop_when(replay, compute spent)`` ends the study early (checked as each trial ends).
    Running trials end. ``initial_trials`` (finished trials of an earlier study: a warm start) are
    added to the study before the first ask; they cost nothing and are not in the result. With
    ``tell_diverged``, a trial whose value turns non-finite ends at that epoch, the value unreported,
    and ``tell_diverged`` tells it to the study; it is DIVERGED, with no value (without
    ``tell_diverged``, a non-finite value is read as any other). With ``restarts``, each trial
    runs the table's complete short schedules before its full one (``restarted``). ``enqueue``:
    parameters asked first, in order (a starting portfolio), the sampler drawing any they omit.
    ``wrap_sampler``: a candidate sampler built around the spec's (one no study file can name).
    """
    study = _study(spec, table, wrap_sampler)
    for imported in initial_trials:
        study.add_trial(imported)
    for params in enqueue:
        study.enqueue_trial(params, skip_if_exists=False)
    workers = _Workers(table, spec, study, lookup, restarts, n_trials, compute_budget)
    for _ in range(spec.study.max_concurrent):
        if workers.may_ask(0.0):
            workers.start(0.0)
    while workers.queue:
        clock, _, number, epoch = heapq.heappop(workers.queue)
        if not workers.end_epoch(clock, number, epoch, tell_diverged):
            continue
        if stop_when is not None and stop_when(workers.result, workers.spent(clock)):
            workers.stopped = True
        if workers.may_ask(clock):
            workers.start(clock)
    return workers.result


def _study(spec: StudySpec, table: Table, wrap_sampler: SamplerWrapper | None = None) -> optuna.Study:
    """The strategy's in-memory study: its sampler and pruner as a study file builds them."""
    sampler = search.sampler_for(spec)  # as the launcher builds it (no near-copy proposals)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.create_study(
            study_name="replay",  # Hyperband picks a trial's bracket from a hash of this name
            direction=spec.study.direction,
            sampler=wrap_sampler(sampler, spec, table) if wrap_sampler else sampler,
            pruner=build_pruner(spec),
        )


class _Workers:
    """The replay's running state: the trials in flight, the compute charged, and the queue of
    epoch ends ordered by clock (ties: in the order they were queued)."""

    def __init__(
        self,
        table: Table,
        spec: StudySpec,
        study: optuna.Study,
        lookup: Lookup,
        restarts: bool,
        n_trials: int | None,
        compute_budget: float,
    ) -> None:
        self.table, self.spec, self.study, self.lookup = table, spec, study, lookup
        self.restarts, self.n_trials, self.compute_budget = restarts, n_trials, compute_budget
        self.stopper: Stopper = stopper_for(spec, table)
        self.distributions = search.distributions(spec)
        self.result = Replay(trials=[], events=[], study=study)
        self.queue: list[tuple[float, int, int, int]] = []  # (clock, sequence, trial number, epoch ending)
        self.sequence = 0
        self.live: dict[int, tuple[optuna.Trial, TrialRun]] = {}
        self.stopped = False
        self.closed_s = 0.0  # the compute of the trials that ended; the running ones are added as of now

    def spent(self, clock: float) -> float:
        return self.closed_s + sum(clock - run.asked_s for _, run in self.live.values())

    def may_ask(self, clock: float) -> bool:
        return (
            not self.stopped
            and (self.n_trials is None or len(self.result.trials) < self.n_trials)
            and self.spent(clock) < self.compute_budget
        )

    def _queue(self, clock: float, number: int, epoch: int) -> None:
        heapq.heappush(self.queue, (clock, self.sequence, number, epoch))
        self.sequence += 1

    def start(self, clock: float) -> None:
        """Ask the study for a trial and start it: its first epoch ends after its overhead."""
        trial = self.study.ask(self.distributions)
        params = dict(trial.params)
        if self.restarts:
            curve, judged_at = restarted(self.table, params, self.lookup)
            run = TrialRun(trial.number, params, curve, asked_s=clock, judged_at=judged_at)
        else:
            run = TrialRun(trial.number, params, self.lookup(self.table, params), asked_s=clock)
        self.result.trials.append(run)
        self.live[trial.number] = (trial, run)
        self.result.events.append((clock, trial.number, "start"))
        self._queue(clock + run.recorded.overhead_s + run.recorded.epoch_s[0], trial.number, 1)

    def end_epoch(self, clock: float, number: int, epoch: int, tell_diverged: TellDiverged | None) -> bool:
        """The trial's ``epoch`` ends at ``clock``: it reports, then goes on (False) or ends (True)."""
        trial, run = self.live[number]
        value = run.recorded.values[epoch - 1]
        run.epochs = epoch
        self.result.events.append((clock, number, f"epoch {epoch}"))
        last = epoch == len(run.recorded.values)
        step = epoch if run.judged_at is None else run.judged_at.get(epoch)
        if tell_diverged is not None and not math.isfinite(value):
            run.state = "DIVERGED"
        elif step is not None and self.stopper.decide(trial, step, value, last):
            run.state = "PRUNED"
        elif last:
            run.state = "COMPLETE"
        else:
            self._queue(clock + run.recorded.epoch_s[epoch], number, epoch + 1)
            return False
        trial.set_user_attr(record.ATTR_ELAPSED_S, round(clock - run.asked_s, 3))  # as the service records it
        if run.state == "DIVERGED":
            assert tell_diverged is not None
            tell_diverged(self.study, trial, self.spec.study.direction)
        elif run.state == "PRUNED":
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self.study.tell(trial, value)
            run.value = value
        run.end_s = clock
        self.closed_s += clock - run.asked_s
        del self.live[number]
        self.result.events.append((clock, number, run.state))
        return True
