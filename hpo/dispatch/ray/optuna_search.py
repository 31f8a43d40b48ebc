"""The adapter to Ray Tune's ``OptunaSearch``: Tune's trials written to the study as the Optuna
backend writes them. The only code that touches ``OptunaSearch``'s internals (``_ot_trials``,
``_ot_study``, ``_completed_trials``), which no public API exposes; a Ray upgrade that renames them
breaks here and nowhere else.

Ray is imported inside the functions that use it: the launcher, ``hpo status`` and the pre-flight
checks import this module on machines and in processes where Ray is absent or not wanted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna

from hpo import record, search, study_record

if TYPE_CHECKING:
    from hpo.config import StudySpec


HOLD = "hold"
"""What ``ending`` answers when no trial may start now but one may once a running trial ends."""


@dataclasses.dataclass
class _Gate:
    """Whether Tune may start another trial: not after ``hpo cancel`` since this driver started,
    nor once ``ending`` gives a reason (said once in the log)."""

    launched_at: float
    log: Any
    ending: Callable[[optuna.Study], str | None]
    cancel_seen: bool = False
    ended: str = ""

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles the searcher into its experiment state. The callables stay behind: the
        # launcher's log may be the builtin print, which Ray can replace in a driver (pickling it
        # by reference then fails, and the Ray job with it), and a relaunch builds a new gate.
        return {**self.__dict__, "log": None, "ending": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, log=_say, ending=_no_reason)

    def closed(self, study: optuna.Study) -> str | None:
        """None to start a trial, HOLD for not now, or why no more trials start."""
        requested = study_record.cancel_requested_at(study)
        if requested >= self.launched_at:
            if not self.cancel_seen:
                study_record.acknowledge_cancel(study, requested)  # the cancel is told it was seen
                self.cancel_seen = True
                self.log("hpo cancel: starting no more trials")
            return "cancelled"
        reason = self.ended or self.ending(study)
        if reason and reason != HOLD:
            if not self.ended:
                self.log(reason)
            self.ended = reason
        return reason


def _say(line: str) -> None:
    print(line, flush=True)


def _no_reason(study: optuna.Study) -> str | None:
    return None


def _tell(
    study: optuna.Study, ot_trial: optuna.Trial, value: Any, epochs_done: int, epochs: int, error: bool
) -> None:
    """Tune's ended trial into the study: a trial its scheduler stopped early is PRUNED."""
    if value is not None and epochs_done:
        # Tune hands the last epoch's result to on_trial_complete, not on_trial_result.
        ot_trial.report(float(value), epochs_done)
    if error or value is None:
        study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
    elif epochs_done < epochs:
        study.tell(ot_trial, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(ot_trial, float(value))


def study_search(
    spec: StudySpec,
    storage: Any,
    epochs: int,
    job_id: str,
    launched_at: float,
    log: Any = print,
    ending: Callable[[optuna.Study], str | None] = lambda study: None,
) -> Any:
    """``ending(study)``: why no further trial may start (the compute budget, a stop rule), HOLD
    for not now, or None."""
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    gate = _Gate(launched_at, log, ending)
    where = {record.ATTR_EXECUTOR: "ray", record.ATTR_JOB_ID: job_id}

    class StudySearch(OptunaSearch):
        """OptunaSearch records a trial that Tune's scheduler stopped early as COMPLETE; here it
        is PRUNED, as with the Optuna backend, and carries the same attributes."""

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            closed = gate.closed(self._ot_study) if self._ot_study is not None else None
            if closed == HOLD:
                return None  # Tune asks again later
            if closed:
                return Searcher.FINISHED  # Tune's sentinel: no more trials from this searcher
            config: dict[str, Any] | None = super().suggest(trial_id)
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is not None:  # where it runs, visible while it runs (hpo status, hpo cancel)
                record.set_attrs(ot_trial, {**where, record.ATTR_STARTED_AT: record.now_iso()})
            return config

        def on_trial_complete(
            self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
        ) -> None:
            if trial_id in self._completed_trials or trial_id not in self._ot_trials:
                return
            ot_trial = self._ot_trials[trial_id]
            epochs_done = int(result.get("training_iteration", 0)) if result else 0
            attrs = record.tune_result_attrs(result, epochs_done, error, spec.resources.tasks_per_node)
            record.set_attrs(ot_trial, {**where, **attrs})
            assert self._ot_study is not None  # set up before the first trial is suggested
            value = None if not result else result.get(self.metric)
            _tell(self._ot_study, ot_trial, value, epochs_done, epochs, error)
            self._completed_trials.add(trial_id)

    sampler = search.build_sampler(spec.study.sampler, spec.study.max_concurrent, spec.source)
    return StudySearch(
        space=search.distributions(spec),
        metric=spec.study.metric,
        mode="max" if spec.study.direction == "maximize" else "min",
        sampler=sampler,
        study_name=spec.study.name,
        storage=storage,
    )
