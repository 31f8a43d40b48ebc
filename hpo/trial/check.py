"""``hpo launch --check``: the study's objective run once on this machine, up to its first report.

Before a job waits in a queue, the user sees the command start with the parameters of the first
trial a new study runs (``check_parameters``), its output, and the first value the study would read from
it (a line ``metric_pattern`` matches, or a ``hpo.trial.report`` call); then the run is stopped, as
a pruned trial is. A command that exits with an error, or without a report, is bad input (exit 2)
with the study file's key to change. Nothing is stored or submitted; the run's folders (in a
temporary workdir) are removed.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import signal
import tempfile
import time
from typing import TYPE_CHECKING, Any

import optuna

from hpo import failures, portfolio, search
from hpo.errors import StudyFileError
from hpo.trial.objective import ObjectiveFailed, StepReport
from hpo.trial.task import objective_for
from trainer.reporting import Decision, EpochMetrics

if TYPE_CHECKING:
    from hpo.config import StudySpec

CHECK_KEY = "check"
"""The run's trial key (``HPO_TRIAL_KEY``; no trial number)."""


@dataclasses.dataclass
class FirstReport:
    """A reporter that takes the first report and says stop."""

    metric: str
    reports: list[tuple[int, float]] = dataclasses.field(default_factory=list)

    def report(self, metrics: EpochMetrics | StepReport) -> Decision:
        self.reports.append((metrics.epoch, float(getattr(metrics, self.metric))))
        return Decision.STOP


class CheckTimedOut(Exception):
    pass


def check_parameters(spec: StudySpec) -> dict[str, Any]:
    """The parameters of the first trial the study runs when launched new: the study file's first
    enqueued set, else the starting portfolio's first entry (each completed by the study's sampler
    where it names fewer parameters), else the sampler's first draw."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory" line
    try:
        study = optuna.create_study(
            sampler=search.sampler_for(spec),
            directions=search.directions(spec),  # type: ignore[arg-type]  # checked: maximize | minimize
        )
        first = [*spec.study.enqueue, *portfolio.starting_trials(spec)]
        if first:
            study.enqueue_trial(dict(first[0]), skip_if_exists=False)
        return dict(study.ask(search.distributions(spec)).params)
    finally:
        optuna.logging.set_verbosity(verbosity)


def run_check(spec: StudySpec, timeout_s: float, log: Any = print) -> None:
    """Run the objective once up to its first report; raises StudyFileError if it gives none."""
    params = check_parameters(spec)
    what = (
        "objective.command"
        if spec.objective is not None and spec.objective.command is not None
        else ("objective.function" if spec.objective is not None else "the trainer")
    )
    log(
        f"check: running {what} once on this machine up to its first report (at most {timeout_s:g} s), with {params}"
    )
    # Its folders (checkpoint, trial folder) in a temporary workdir: nothing of the study's is
    # touched, and no earlier check's checkpoint is resumed.
    scratch = tempfile.mkdtemp(prefix="hpo-check-")
    spec = dataclasses.replace(spec, study=dataclasses.replace(spec.study, workdir=scratch))
    reporter = FirstReport(spec.study.metric)

    def timed_out(signum: int, frame: Any) -> None:
        raise CheckTimedOut

    previous = signal.signal(signal.SIGALRM, timed_out)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    started = time.monotonic()
    result = None
    try:
        result = objective_for(spec)(spec, CHECK_KEY, params, reporter)
    except CheckTimedOut:
        if reporter.reports:
            pass  # reported, then the stop took its grace: the check has what it needs
        else:
            key = "objective.metric_pattern" if what == "objective.command" else "objective"
            raise StudyFileError(
                f"{spec.source}: {key}: --check: no report in {timeout_s:g} s (stopped); raise --check-timeout "
                "if a first step takes longer"
            ) from None
    except ObjectiveFailed as err:
        failure = failures.classify(str(err))
        key = "objective.metric_pattern" if failure.kind == failures.NO_METRIC else "objective.command"
        if what == "objective.function":
            key = "objective.function"
        raise StudyFileError(f"{spec.source}: {key}: --check: {err}") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        shutil.rmtree(scratch, ignore_errors=True)
    took = time.monotonic() - started
    if reporter.reports:
        step, value = reporter.reports[0]
        diverged = "" if math.isfinite(value) else " (not a number: a trial reporting it ends DIVERGED)"
        log(
            f"check: first report after {took:.1f} s: {spec.study.metric}={value:.6g} at step {step}{diverged}; "
            "stopped there. Nothing was submitted"
        )
    elif result is not None:  # a final value only (final_pattern, a function's return value)
        log(
            f"check: no step reported, final {spec.study.metric}={result.value:.6g} after {took:.1f} s (the "
            "pruner cannot stop such trials early). Nothing was submitted"
        )
