"""Live progress of ``hpo launch``: one line that tells where the study stands.

On a terminal the line stays at the bottom and is rewritten in place (at most once a second),
under the launcher's event lines. Elsewhere (a pipe, a Slurm log, ``--detach``) it is a plain
``progress:`` line each time a trial ends, and once a minute while nothing ends, so a log stays
readable with ``tail`` and ``grep``.

GPU-hours here are what the trials used so far (finished trials' elapsed time, and running trials'
time since they started, times the resources a trial gets): a live estimate. `hpo status` and
`hpo report` give sacct's figures.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from hpo import record, study_record, tally
from hpo.budget.usage import format_hours, trial_estimate

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudySpec

_CLEAR_LINE = "\r\x1b[K"


class Progress:
    def __init__(
        self,
        spec: StudySpec,
        study: optuna.Study,
        deadline: float | None,
        log: Callable[[str], None] = print,
        stream: TextIO | None = None,
        heartbeat_s: float = 60.0,
    ) -> None:
        self.spec = spec
        self.study = study
        self.deadline = deadline
        self._log = log
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.heartbeat_s = heartbeat_s
        self._shown = False  # a progress line is on the terminal's last line
        self._last_time = 0.0
        self._last_finished = -1
        self._events = True  # an event line since the last look: a trial may have ended
        self.closed = False
        """Set by the launcher once no trial may start again (a stop rule, the budget, a cancel,
        the timeout): the time left is then the running trials' alone."""

    def log(self, message: str) -> None:
        """An event line; on a terminal it goes above the progress line."""
        if self._shown:
            self.stream.write(_CLEAR_LINE)
            self._shown = False
        self._log(message)
        self._events = True
        if self.tty:
            self._last_time = 0.0  # redraw at the next tick

    def tick(self) -> None:
        """Called each launcher round; reads the study only when a line is due."""
        now = time.monotonic()
        if self.tty:
            if now - self._last_time < 1.0:
                return
            line = self.line()
            self.stream.write(_CLEAR_LINE + line[: _width()])
            self.stream.flush()
            self._shown = True
            self._last_time = now
            return
        heartbeat = now - self._last_time >= self.heartbeat_s
        if not (self._events or heartbeat):
            return  # nothing happened: no need to read the study
        self._events = False
        trials = self._trials()
        finished = sum(1 for t in trials if t.state.is_finished())
        if finished != self._last_finished or heartbeat:
            self._log(self.line(trials))
            self._last_finished, self._last_time = finished, now

    def close(self) -> None:
        if self._shown:
            self.stream.write(_CLEAR_LINE)
            self.stream.flush()
            self._shown = False

    def _trials(self) -> list[optuna.trial.FrozenTrial]:
        return tally.counted_trials(self.study)

    def line(self, trials: list[optuna.trial.FrozenTrial] | None = None) -> str:
        trials = self._trials() if trials is None else trials
        counts = Counter(record.shown_state(t) for t in trials)
        done = sum(n for state, n in counts.items() if state not in ("RUNNING", "WAITING"))
        by_state = ", ".join(f"{counts[s]} {s}" for s in record.END_STATES if counts[s])
        parts = [
            f"progress: {done}/{self.spec.study.n_trials} done" + (f" ({by_state})" if by_state else ""),
            f"{counts['RUNNING']} running",
            self._best(trials),
            self._used(trials),
            self._time_left(trials, done),
        ]
        return ", ".join(p for p in parts if p)

    def _best(self, trials: list[optuna.trial.FrozenTrial]) -> str:
        complete = [
            t
            for t in trials
            if t.state.name == "COMPLETE" and t.values and not t.user_attrs.get(record.ATTR_INFEASIBLE)
        ]
        if not complete:
            return ""
        pick = max if self.spec.study.direction == "maximize" else min
        best = pick(complete, key=lambda t: t.values[0])
        return f"best {self.spec.study.metric}={tally.format_value(best.values[0])} (trial {best.number})"

    def _used(self, trials: list[optuna.trial.FrozenTrial]) -> str:
        res = self.spec.resources
        unit = "GPU-hours" if res.gpus_per_node else "CPU-hours"
        limit = self.spec.study.budget
        # With a budget, the launcher's measure (sacct's figures for Slurm jobs) once it has one.
        total = study_record.spent_hours(self.study) if limit is not None else None
        if total is None:
            total = 0.0
            for t in tally.own_trials(self.study):  # failed trials that were retried cost too
                if t.state.name != "WAITING":
                    usage = trial_estimate(self.spec, t)
                    total += usage.gpu_hours if res.gpus_per_node else usage.cpu_hours
        if limit is None:
            return f"{format_hours(total)} {unit} used"
        left = max(0.0, limit - total)
        return f"{format_hours(total)} of {format_hours(limit)} {unit} used ({format_hours(left)} left)"

    def _time_left(self, trials: list[optuna.trial.FrozenTrial], done: int) -> str:
        remaining = self.spec.study.n_trials - done
        if self.closed:  # stopped early (a stop rule, the budget, a cancel): only the running finish
            remaining = sum(1 for t in trials if t.state.name == "RUNNING")
        if remaining <= 0:
            return ""  # nothing left to run: a timeout still ahead says nothing about this study
        left: list[float] = []
        if self.deadline is not None:
            left.append(max(0.0, self.deadline - time.time()))
        durations = [t.duration.total_seconds() for t in trials if t.state.is_finished() and t.duration]
        if durations:
            waves = math.ceil(remaining / max(1, self.spec.study.max_concurrent))
            left.append(waves * sum(durations) / len(durations))
        if not left:
            return ""
        return f"~{_minutes(min(left))} left"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _width() -> int:

    return max(40, shutil.get_terminal_size().columns - 1)
