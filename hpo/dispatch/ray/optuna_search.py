"""The adapter to Ray Tune's ``OptunaSearch``: Tune's trials written to the study as the Optuna
backend writes them. The only code that touches ``OptunaSearch``'s internals (``_ot_trials``,
``_ot_study``, ``_completed_trials``), which no public API exposes; a Ray upgrade that renames them
breaks here and nowhere else.

Ray is imported inside the functions that use it: the launcher, ``hpo status`` and the pre-flight
checks import this module on machines and in processes where Ray is absent or not wanted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna

from hpo import record, search

if TYPE_CHECKING:
    from hpo.config import StudySpec


HOLD = "hold"
"""What ``ending`` answers when no trial may start now but one may once a running trial ends."""


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

    class StudySearch(OptunaSearch):
        """OptunaSearch records a trial that Tune's scheduler stopped early as COMPLETE; here it
        is PRUNED, as with the Optuna backend, and carries the same attributes."""

        cancel_seen = False
        ended = ""

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            # `hpo cancel` since this driver started: no new trial, and the cancel is told so.
            if self._ot_study is not None and record.cancel_requested_at(self._ot_study) >= launched_at:
                if not self.cancel_seen:
                    record.acknowledge_cancel(self._ot_study, record.cancel_requested_at(self._ot_study))
                    self.cancel_seen = True
                    log("hpo cancel: starting no more trials")
                return Searcher.FINISHED  # Tune's sentinel: no more trials from this searcher
            if self._ot_study is not None:
                reason = self.ended or ending(self._ot_study)
                if reason == HOLD:
                    return None  # Tune asks again later
                if reason:
                    if not self.ended:
                        log(reason)
                    self.ended = reason
                    return Searcher.FINISHED
            config: dict[str, Any] | None = super().suggest(trial_id)
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is not None:  # where it runs, visible while it runs (hpo status, hpo cancel)
                started = {record.ATTR_STARTED_AT: record.now_iso()}
                record.set_attrs(
                    ot_trial, {record.ATTR_EXECUTOR: "ray", record.ATTR_JOB_ID: job_id, **started}
                )
            return config

        def on_trial_complete(
            self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
        ) -> None:
            if trial_id in self._completed_trials or trial_id not in self._ot_trials:
                return
            ot_trial = self._ot_trials[trial_id]
            value = None if not result else result.get(self.metric)
            epochs_done = int(result.get("training_iteration", 0)) if result else 0
            attrs = record.tune_result_attrs(result, epochs_done, error, spec.resources.tasks_per_node)
            record.set_attrs(ot_trial, {record.ATTR_EXECUTOR: "ray", record.ATTR_JOB_ID: job_id, **attrs})
            if value is not None and epochs_done:
                # Tune hands the last epoch's result to on_trial_complete, not on_trial_result.
                ot_trial.report(float(value), epochs_done)
            study = self._ot_study
            assert study is not None  # set up before the first trial is suggested
            if error or value is None:
                study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
            elif epochs_done < epochs:
                study.tell(ot_trial, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(ot_trial, float(value))
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
