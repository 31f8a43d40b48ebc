"""What a trial computes: an objective runs one trial's work on one rank and returns its metric.

The built-in objective is the trainer (a short AMP/DDP ResNet run, checkpointed under the study's
workdir). A study's ``objective`` section makes it the user's own code instead: a command
(``hpo.trial.command_objective``) or a Python function (:class:`FunctionObjective`). ``FixedDurationObjective``
stands in for training when only dispatch is measured.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import TYPE_CHECKING, Any, Protocol

from hpo import joblog, record
from hpo.config.user_code import import_function
from hpo.paths import checkpoint_dir, private_dir, profile_dir, tensorboard_dir
from hpo.trial import client, measured
from trainer.reporting import Decision, EpochMetrics

if TYPE_CHECKING:
    from hpo.config import StudySpec


@dataclasses.dataclass
class ObjectiveResult:
    value: float
    """The metric at the end of the run (at the last epoch trained)."""
    pruned: bool
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)


def stop_at(spec: StudySpec, step: int, decision: Decision) -> Decision:
    """The pruner's decision after ``step``, except at a full run's last step: a stop there would
    throw a finished run away as PRUNED, so the trial completes (as the trainer's last epoch
    does). The last step is known when the study gives it (objective.steps above 1)."""
    if decision == Decision.STOP and spec.max_steps > 1 and step >= spec.max_steps:
        return Decision.CONTINUE
    return decision


class ObjectiveFailed(RuntimeError):
    """The user's objective failed; the message is the trial's fail reason (one line)."""


class TrialDiverged(ObjectiveFailed):
    """The trial's metric (or the trainer's training loss) turned NaN or infinite: a value the
    study cannot rank. The trial ends as diverged (``hpo.record.tell_diverged``) with the finite
    values it reported before as its curve; no rerun with its parameters changes it."""

    def __init__(self, step: int, name: str, value: float | str) -> None:
        # "diverged at step 3: val_loss=nan", or the program's own words when it stopped itself.
        super().__init__(f"{record.REASON_DIVERGED} {step}: " + (f"{name}={value}" if name else str(value)))
        self.step = step


def check_finite(step: int, values: dict[str, float]) -> None:
    """Raise :class:`TrialDiverged` for the first non-finite value of a report."""
    for name, value in values.items():
        if not math.isfinite(value):
            raise TrialDiverged(step, name, value)


@dataclasses.dataclass
class StepReport:
    """One report of the user's objective: its step (an epoch) and its metric, read like the
    trainer's :class:`EpochMetrics` by the reporters (``epoch``, the metric's name, ``to_dict``)."""

    epoch: int
    values: dict[str, float]

    def __getattr__(self, name: str) -> float:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, **self.values}


class StepReporter(Protocol):
    """A reporter to the study (Optuna's or Tune's): the trainer's epochs or an objective's steps."""

    def report(self, metrics: EpochMetrics | StepReport) -> Decision | None: ...


class Objective(Protocol):
    """Runs one trial's work on this rank. ``reporter`` is None on ranks other than 0, except in a
    Ray Train DDP trial, whose reporter every rank calls (Train's report is a barrier)."""

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: StepReporter | None
    ) -> ObjectiveResult: ...


@dataclasses.dataclass
class TrainerObjective:
    """The real objective: a short trainer run, checkpointed under the study's workdir."""

    resume_may_change: str = ""
    """Optimizer settings a resumed checkpoint may differ in (the trainer's option of that name)."""

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: StepReporter | None
    ) -> ObjectiveResult:
        import torch  # only in the trial's own process: the launcher never loads torch

        from trainer import train

        torch.set_num_threads(spec.resources.cpus_per_task)
        joblog.to_stdout()  # the trainer's epoch lines in the job's output (`hpo logs`)
        profiled = isinstance(trial_key, int) and trial_key < spec.study.profile_trials
        config = spec.trainer_config(
            params,
            checkpoint_dir=str(checkpoint_dir(spec, trial_key)),
            resume_may_change=self.resume_may_change,
            tensorboard_dir=str(tensorboard_dir(spec, trial_key)) if spec.study.tensorboard else None,
            profile_dir=str(profile_dir(spec, trial_key)) if profiled else None,
        )
        hparams = {"trial": str(trial_key), **params}
        result = train(config, reporter, hparams=hparams)
        last = result.history[-1] if result.history else None
        value = float(getattr(last, spec.study.metric)) if last is not None else float("nan")
        return ObjectiveResult(
            value=value,
            pruned=result.stopped_early,
            attrs={
                record.ATTR_EPOCHS_COMPLETED: result.epochs_completed,
                **(
                    {
                        record.ATTR_EPOCH_TIME_S: round(
                            sum(m.epoch_time_s for m in result.history) / len(result.history), 3
                        ),
                        record.ATTR_EPOCH_SECONDS: [
                            [round(m.train_time_s, 3), round(m.epoch_time_s - m.train_time_s, 3)]
                            for m in result.history
                        ],
                    }
                    if result.history
                    else {}
                ),
                record.ATTR_IMAGES_PER_S: result.train_images_per_s,
                **measured.measurement_attrs([m.to_dict() for m in result.history], result.world_size),
                **({record.ATTR_TENSORBOARD_DIR: config.tensorboard_dir} if config.tensorboard_dir else {}),
                **({record.ATTR_PROFILE_TRACE: config.profile_dir} if config.profile_dir else {}),
                **(
                    {record.ATTR_TEST_ACCURACY: last.test_accuracy}
                    if last is not None and last.test_accuracy is not None
                    else {}
                ),
                **(
                    {record.ATTR_RESUMED_FROM_EPOCH: result.resumed_from_epoch}
                    if result.resumed_from_epoch
                    else {}
                ),
            },
        )


@dataclasses.dataclass
class FunctionObjective:
    """``objective.function``: the user's function, called in this process as ``fn(params, trial)``
    with the trial's :class:`hpo.trial.Trial` (also what ``hpo.trial``'s functions use meanwhile).
    Its return value is the final metric; a report that the pruner stops ends it as pruned."""

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: StepReporter | None
    ) -> ObjectiveResult:
        assert spec.objective is not None and spec.objective.function is not None
        function = import_function(spec.objective.function, spec.objective_cwd)
        stopped: list[float] = []
        last: list[float] = []
        metrics: dict[str, dict[str, float]] = {}

        def ask(step: int, value: float, others: dict[str, float]) -> bool:
            assert reporter is not None
            last[:] = [value]
            for name, other in others.items():
                metrics.setdefault(name, {})[str(step)] = other
            decision = reporter.report(StepReport(epoch=step, values={spec.study.metric: value}))
            stop = stop_at(spec, step, decision or Decision.CONTINUE) == Decision.STOP
            if stop:
                stopped.append(value)
            return stop

        trial = client.Trial(
            key=str(trial_key),
            number=trial_key if isinstance(trial_key, int) else None,
            params={**spec.objective.fixed, **params},  # as a command's hpo.trial.params() has them
            checkpoint_dir=str(private_dir(checkpoint_dir(spec, trial_key))),
            ask=ask if reporter is not None else None,
        )
        previous_env = {name: os.environ.get(name) for name in spec.objective.env}
        os.environ.update(spec.objective.env)
        client.set_current(trial)
        try:
            value = function(dict(params), trial)
        finally:
            client.set_current(None)
            for name, old in previous_env.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old
        kept = {record.ATTR_METRICS: metrics} if metrics else {}
        if stopped:
            return ObjectiveResult(value=stopped[-1], pruned=True, attrs=kept)
        if reporter is None:  # another rank of a DDP trial: rank 0's value counts
            return ObjectiveResult(value=float("nan"), pruned=False)
        if value is None and not last:
            raise ObjectiveFailed(f"{spec.objective.function} returned None and reported nothing")
        try:
            return ObjectiveResult(
                value=float(value if value is not None else last[-1]), pruned=False, attrs=kept
            )
        except (TypeError, ValueError):
            raise ObjectiveFailed(
                f"{spec.objective.function} returned {value!r}, not a number (the final metric)"
            ) from None


@dataclasses.dataclass
class FixedDurationObjective:
    """A stand-in for training that takes a fixed time: for measuring dispatch overhead.

    It sleeps ``seconds`` in ``epochs`` equal steps, reporting after each, and returns a value
    that depends smoothly on the parameters (so a sampler has something to optimize).
    """

    seconds: float
    epochs: int = 3

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: StepReporter | None
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
