"""The trainer's reporter on rank 0 of an Optuna trial: each epoch's metric in, prune or go on out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpo import record
from hpo.storage import with_retries
from trainer.reporting import Decision, EpochMetrics

if TYPE_CHECKING:
    import optuna


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
            dict(trial.user_attrs.get(record.ATTR_CURVE, {})) if multi_objective else {}
        )

    def report(self, metrics: EpochMetrics) -> Decision:
        # A database restart mid-trial costs a wait, not the trial (a repeated report of the same
        # step is ignored by Optuna).
        value = float(getattr(metrics, self.metric))
        if self.multi_objective:
            earlier = {k: v for k, v in self.curve.items() if int(k) < metrics.epoch}
            self.curve = {**earlier, str(metrics.epoch): value}
            with_retries(lambda: record.set_attr(self.trial, record.ATTR_CURVE, self.curve), "report")
            return Decision.CONTINUE
        with_retries(lambda: self.trial.report(value, step=metrics.epoch), "report")
        prune = with_retries(self.trial.should_prune, "should_prune")
        return Decision.STOP if prune else Decision.CONTINUE
