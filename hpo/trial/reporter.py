"""The trainer's reporter on rank 0 of an Optuna trial: each epoch's metric in, prune or go on out."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hpo import record, tally
from hpo.trial.objective import TrialDiverged, check_finite
from trainer.reporting import Decision, EpochMetrics

if TYPE_CHECKING:
    from hpo.trial.objective import StepReport

if TYPE_CHECKING:
    import optuna


class TrialAborted(RuntimeError):
    """The trial ends here, for the reason a signal handler decided on (see ``abort``)."""


class OptunaReporter:
    """The trainer's reporter on rank 0: one intermediate value per epoch, then ``should_prune``.

    A multi-objective study takes no intermediate values and cannot prune: the curve is kept as a
    trial attribute instead (for `hpo status` and the report) and the run always continues.
    """

    def __init__(self, trial: optuna.Trial, metric: str, multi_objective: bool = False) -> None:
        self.trial = trial
        self.metric = metric
        self.multi_objective = multi_objective
        # epoch (a string: attributes are JSON) -> value; a requeued or retried run goes on with it
        self.curve: dict[str, float] = (
            dict(trial.user_attrs.get(record.ATTR_EPOCH_VALUES, {})) if multi_objective else {}
        )
        stored = tally.curve(record.read_trial(trial.study, record.trial_id(trial)))
        self.last_epoch = max(stored, default=0)
        """The last epoch stored for the trial, by this run or an earlier one."""
        self.last_value: float | None = stored[self.last_epoch] if stored else None
        """The metric at that epoch."""
        self.abort = ""
        """Set (to the reason) when the trial must end at its next report: a signal handler's
        exception can be swallowed by the code it interrupts (an import's broad except)."""
        self.diverged: TrialDiverged | None = None
        """Set at the first non-finite report: the run is told to stop, and the trial ends as
        diverged however the objective then ends (``hpo.trial.task``)."""
        self.first_report_s: float | None = None
        """How long this run's first stored report took (the value written, the pruner asked)."""

    def report(self, metrics: EpochMetrics | StepReport) -> Decision:
        # A database restart mid-trial costs a wait, not the trial (a repeated report of the same
        # step is ignored by Optuna).
        if self.abort:
            raise TrialAborted(self.abort)
        value = float(getattr(metrics, self.metric))
        # A non-finite metric ends the trial as diverged (its finite curve kept); so does the
        # trainer's training loss, which turns NaN while an accuracy still reads as a number.
        # Told as STOP, so that every rank of a DDP run (and a user's script told through
        # hpo.trial) stops at this step as it would when pruned.
        train_loss = getattr(metrics, "train_loss", None) if self.metric != "train_loss" else None
        try:
            check_finite(
                metrics.epoch,
                {self.metric: value, **({"train_loss": float(train_loss)} if train_loss is not None else {})},
            )
        except TrialDiverged as diverged:
            self.diverged = self.diverged or diverged
        if self.diverged is not None:
            return Decision.STOP
        if metrics.epoch >= self.last_epoch:
            self.last_value = value
        self.last_epoch = max(self.last_epoch, metrics.epoch)
        if self.multi_objective:
            earlier = {k: v for k, v in self.curve.items() if int(k) < metrics.epoch}
            self.curve = {**earlier, str(metrics.epoch): value}
            record.set_attr(self.trial, record.ATTR_EPOCH_VALUES, self.curve)
            return Decision.CONTINUE
        reporting = time.perf_counter()
        record.report_step(self.trial, metrics.epoch, value)
        prune = self.trial.should_prune()
        if self.first_report_s is None:
            self.first_report_s = round(time.perf_counter() - reporting, 4)
        return Decision.STOP if prune else Decision.CONTINUE
