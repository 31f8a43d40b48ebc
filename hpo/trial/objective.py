"""What a trial computes: an objective runs one trial's work on one rank and returns its metric.

The built-in objective is the trainer (a short AMP/DDP ResNet run, checkpointed under the study's
workdir); ``FixedDurationObjective`` stands in for training when only dispatch is measured.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any, Protocol

from hpo import record
from hpo.paths import checkpoint_dir
from trainer.reporting import Decision, EpochMetrics, Reporter

if TYPE_CHECKING:
    from hpo.config import StudySpec


@dataclasses.dataclass
class ObjectiveResult:
    value: float
    """The metric at the end of the run (at the last epoch trained)."""
    pruned: bool
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)


class Objective(Protocol):
    """Runs one trial's work on this rank. ``reporter`` is None on ranks other than 0, except in a
    Ray Train DDP trial, whose reporter every rank calls (Train's report is a barrier)."""

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: Reporter | None
    ) -> ObjectiveResult: ...


@dataclasses.dataclass
class TrainerObjective:
    """The real objective: a short trainer run, checkpointed under the study's workdir."""

    resume_may_change: str = ""
    """Optimizer settings a resumed checkpoint may differ in (the trainer's option of that name)."""

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: Reporter | None
    ) -> ObjectiveResult:
        import torch  # only in the trial's own process: the launcher never loads torch

        from trainer import train

        torch.set_num_threads(spec.resources.cpus_per_task)
        config = spec.trainer_config(
            params,
            checkpoint_dir=str(checkpoint_dir(spec, trial_key)),
            resume_may_change=self.resume_may_change,
        )
        result = train(config, reporter)
        last = result.history[-1] if result.history else None
        value = float(getattr(last, spec.study.metric)) if last is not None else float("nan")
        return ObjectiveResult(
            value=value,
            pruned=result.stopped_early,
            attrs={
                record.ATTR_EPOCHS: result.epochs_completed,
                **(
                    {
                        record.ATTR_EPOCH_TIME_S: round(
                            sum(m.epoch_time_s for m in result.history) / len(result.history), 3
                        )
                    }
                    if result.history
                    else {}
                ),
                record.ATTR_IMAGES_PER_S: result.train_images_per_s,
                **(
                    {record.ATTR_TEST_ACCURACY: last.test_accuracy}
                    if last is not None and last.test_accuracy is not None
                    else {}
                ),
                **(
                    {record.ATTR_RESUMED_FROM: result.resumed_from_epoch} if result.resumed_from_epoch else {}
                ),
            },
        )


@dataclasses.dataclass
class FixedDurationObjective:
    """A stand-in for training that takes a fixed time: for measuring dispatch overhead.

    It sleeps ``seconds`` in ``epochs`` equal steps, reporting after each, and returns a value
    that depends smoothly on the parameters (so a sampler has something to optimize).
    """

    seconds: float
    epochs: int = 3

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: Reporter | None
    ) -> ObjectiveResult:

        value = 0.0
        for epoch in range(1, self.epochs + 1):
            time.sleep(self.seconds / self.epochs)
            value = (
                sum(math.tanh(float(v)) for v in params.values() if isinstance(v, int | float))
                * epoch
                / self.epochs
            )
            if reporter is not None:
                step_s = self.seconds / self.epochs
                metrics = EpochMetrics(
                    epoch=epoch, step=epoch, train_loss=value, train_accuracy=value, val_loss=value,
                    val_accuracy=value, lr=0.0, images_per_s=0.0, train_time_s=step_s, epoch_time_s=step_s,
                )  # fmt: skip
                if reporter.report(metrics) == Decision.STOP:
                    return ObjectiveResult(value=value, pruned=True)
        return ObjectiveResult(value=value, pruned=False)
