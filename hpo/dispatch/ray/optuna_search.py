"""The adapter to Ray Tune's ``OptunaSearch``: Tune's trials written to the study as the Optuna
backend writes them. The only code that touches ``OptunaSearch``'s internals (``_ot_trials``,
``_ot_study``, ``_completed_trials``), which no public API exposes; a Ray upgrade that renames them
breaks here and nowhere else.

Ray is imported inside the functions that use it: the launcher, ``hpo status`` and the pre-flight
checks import this module on machines and in processes where Ray is absent or not wanted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import optuna

from hpo import record, search
from hpo.budget.admission import ADMITTED, Admission
from hpo.budget.usage import trial_gpus
from hpo.paths import private_dir, trial_dir
from hpo.trial import measured

if TYPE_CHECKING:
    from hpo.config import StudySpec


@dataclasses.dataclass
class _Gate:
    """The searcher's question before each trial: ``ask(study)``, the launch's admission
    (``hpo.budget.admission``), which says it and stores it."""

    ask: Callable[[optuna.Study], Admission]

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles the searcher into its experiment state. The question stays behind: it holds
        # the launcher's log, which may be the builtin print that Ray can replace in a driver
        # (pickling it by reference then fails, and the Ray job with it), and a relaunch builds
        # a new gate.
        return {"ask": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.ask = _admitted


def _admitted(study: optuna.Study) -> Admission:
    return ADMITTED


FAIL_REASON_FILE = "fail_reason"
"""In a Tune trial's folder (``hpo.paths.trial_dir``, on the study's shared workdir): the one line
its objective failed with. Tune tells a searcher only that a trial raised; fail fast
(``hpo.budget.failing``) reads what it raised, as on the Optuna backend."""


PROGRAM_DIVERGED = "hpo_diverged"
"""A Tune result's key for the program's own words when it ended on a divergence ("loss is nan")."""
PROGRAM_FAILED = "hpo_failed"
"""A Tune result's key for a failure no rerun changes (a usage error, a missing module): the trial
ends with it instead of raising, so that Tune does not run it again ``max_retries`` times."""


def failure_reason(err: BaseException) -> str:
    """The reason a Tune trial's objective failed with, worded as ``hpo.trial.task`` words it."""
    from hpo.errors import one_line
    from hpo.trial.objective import ObjectiveFailed

    return one_line(err, name=not isinstance(err, ObjectiveFailed))


def note_failure(spec: StudySpec, tune_trial_id: str, reason: str) -> None:
    """Keep the reason a Tune trial failed with, for the searcher to store with the trial."""
    folder = private_dir(trial_dir(spec, f"ray-{tune_trial_id}"))
    (folder / FAIL_REASON_FILE).write_text(reason + "\n")


def _noted_failure(spec: StudySpec, tune_trial_id: str) -> str | None:
    path = trial_dir(spec, f"ray-{tune_trial_id}") / FAIL_REASON_FILE
    try:
        return path.read_text().strip() or None
    except OSError:  # a trial Tune failed before its objective ran (an actor lost)
        return None


def _tell(
    study: optuna.Study,
    ot_trial: optuna.Trial,
    value: Any,
    epochs_done: int,
    epochs: int,
    error: bool,
    diverged: tuple[int, str] | None = None,
    last_reported: int = 0,
) -> None:
    """Tune's ended trial into the study: a trial its scheduler stopped early is PRUNED; one whose
    metric turned NaN or infinite (``diverged``: its step and reason) is DIVERGED, its finite
    reports kept. ``last_reported``: the last epoch already stored from ``on_trial_result``."""
    if diverged is None and value is not None and not math.isfinite(float(value)):
        diverged = (epochs_done, f"{record.REASON_DIVERGED} {epochs_done}: {value}")
    if diverged is not None:
        step, reason = diverged
        record.tell_diverged(study, ot_trial, reason, step)
        return
    if value is not None and epochs_done and epochs_done != last_reported:
        # Tune hands the last epoch's result to on_trial_complete alone when its scheduler stops
        # the trial there; a trial that ran to its end had it in on_trial_result too.
        ot_trial.report(float(value), epochs_done)
    if error or value is None:
        study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
    elif epochs_done < epochs:
        study.tell(ot_trial, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(ot_trial, float(value))


def _ended_attrs(
    spec: StudySpec, trial_id: str, result: dict[str, Any] | None, error: bool
) -> tuple[int, dict[str, Any]]:
    """The epochs an ended Tune trial trained, and its attributes (its noted reason if it raised)."""
    epochs_done = int(result.get("training_iteration", 0)) if result else 0
    attrs = measured.tune_result_attrs(result, epochs_done, error, spec.resources.tasks_per_node)
    if record.ATTR_ELAPSED_S in attrs:  # its cost, as a per-trial job's own (hpo studies sums them)
        hours = float(attrs[record.ATTR_ELAPSED_S]) / 3600
        attrs[record.ATTR_GPU_HOURS] = round(hours * trial_gpus(spec), 6)
        attrs[record.ATTR_CPU_HOURS] = round(hours * spec.resources.cpus_per_task * spec.trial_ranks, 6)
    if error and (reason := _noted_failure(spec, trial_id)):
        attrs[record.ATTR_FAIL_REASON] = reason
    return epochs_done, attrs


def _tell_ended(
    spec: StudySpec,
    study: optuna.Study,
    ot_trial: optuna.Trial,
    trial_id: str,
    result: dict[str, Any] | None,
    error: bool,
    where: dict[str, Any],
    epochs: int,
    diverged: tuple[int, str] | None,
    last_reported: int,
) -> None:
    """Tune's ended trial into the study with its attributes; a failure's own result (a failure
    no rerun changes, ended without raising) is no epoch, and the trial FAIL."""
    failed = bool(result and result.get(PROGRAM_FAILED))
    epochs_done, attrs = _ended_attrs(spec, trial_id, result, error or failed)
    record.set_attrs(ot_trial, {**where, **attrs})
    value = None if not result or failed else result.get(spec.study.metric)
    _tell(study, ot_trial, value, epochs_done - failed, epochs, error or failed, diverged, last_reported)


def _divergence(metric: str, result: dict[str, Any]) -> tuple[int, str] | None:
    """The step and reason of a Tune result whose metric is NaN or infinite, else None."""
    value = result.get(metric)
    if not isinstance(value, float) or math.isfinite(value) or result.get(PROGRAM_FAILED):
        return None
    step = int(result.get("training_iteration", 0))
    return step, f"{record.REASON_DIVERGED} {step}: {result.get(PROGRAM_DIVERGED) or f'{metric}={value}'}"


def study_search(
    spec: StudySpec,
    storage: Any,
    epochs: int,
    job_id: str,
    admission: Callable[[optuna.Study], Admission] = _admitted,
) -> Any:
    """``admission(study)``: whether Tune may start another trial (``hpo.budget.admission``)."""
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    gate = _Gate(admission)
    where = {**record.placement(spec.resources.executor, record.DispatchMode.RAY), record.ATTR_JOB_ID: job_id}
    diverged: dict[str, tuple[int, str]] = {}  # Tune trial id -> (step, "diverged at step N: ...")
    reported: dict[str, int] = {}  # Tune trial id -> the last epoch stored as an intermediate value

    class StudySearch(OptunaSearch):
        """OptunaSearch records a trial that Tune's scheduler stopped early as COMPLETE; here it
        is PRUNED, as with the Optuna backend, and carries the same attributes."""

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            answer = gate.ask(self._ot_study) if self._ot_study is not None else ADMITTED
            if answer.holds:
                return None  # Tune asks again later
            if not answer.open:  # Tune's "no more trials" sentinel: a str where it says dict
                return cast(dict[str, Any], Searcher.FINISHED)
            config: dict[str, Any] | None = super().suggest(trial_id)
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is not None:  # where it runs, visible while it runs (hpo status, hpo cancel)
                record.set_attrs(ot_trial, {**where, record.ATTR_STARTED_AT: record.now_iso()})
            return config

        def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
            found = _divergence(self.metric, result)
            if found is not None:  # not stored as an intermediate value: told DIVERGED at its end
                diverged.setdefault(trial_id, found)
            elif not result.get(PROGRAM_FAILED):  # a failure's result: told FAIL at its end
                super().on_trial_result(trial_id, result)
                reported[trial_id] = int(result.get("training_iteration", 0))

        def on_trial_complete(
            self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
        ) -> None:
            if trial_id in self._completed_trials or trial_id not in self._ot_trials:
                return
            assert self._ot_study is not None  # set up before the first trial is suggested
            ot_trial, at, last = self._ot_trials[trial_id], diverged.get(trial_id), reported.get(trial_id, 0)
            _tell_ended(spec, self._ot_study, ot_trial, trial_id, result, error, where, epochs, at, last)
            self._completed_trials.add(trial_id)

    sampler = search.sampler_for(spec)
    return StudySearch(
        space=search.distributions(spec),
        metric=spec.study.metric,
        mode="max" if spec.study.direction == "maximize" else "min",
        sampler=sampler,
        study_name=spec.study.name,
        storage=storage,
    )
