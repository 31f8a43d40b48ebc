"""A ``--workers`` job: a long-running process that asks, runs and tells trials until the budget is met."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
import traceback
from typing import TYPE_CHECKING, Any

import optuna
from submitit.core.utils import UncompletedJobError

from hpo import executors, joblog, record, search, tally
from hpo.budget import admission, compute
from hpo.outages import with_retries
from hpo.storage import StorageRef, open_storage
from hpo.trial import packing, retries
from hpo.trial.objective import Objective, TrainerObjective
from hpo.trial.task import run_attached

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from hpo.config import StudySpec


@dataclasses.dataclass
class WorkerTask:
    """A long-running worker job (``--workers``): ask, run, tell, until the budget is met."""

    spec: StudySpec
    storage: StorageRef
    deadline_unix: float | None = None
    objective: Objective = dataclasses.field(default_factory=TrainerObjective)
    started: float = 0.0
    """When the launcher started: an `hpo cancel` after it stops the worker."""
    time_limit_min: float | None = None
    """The worker job's time limit: no trial is started that could not end within it."""
    _suspect_since: int | None = dataclasses.field(default=None, init=False, repr=False)
    """Fail fast's hold (``admission.suspicion``), kept between this worker's questions."""

    def __call__(self) -> dict[str, Any]:
        joblog.to_stdout()
        job_started = time.time()
        longest_trial_s = 0.0
        study = with_retries(  # connecting is outside the storage's own policy
            lambda: search.load(self.spec, open_storage(self.storage, create=False), create=False),
            "load the study",
        )
        # Each worker samples its own sequence (same seed everywhere would mean the same proposals).
        worker = executors.here().current_job() or str(os.getpid())
        slot = int(os.environ.get(packing.ENV_SLOT, "0"))  # workers packed on one GPU share a job
        search.reseed_sampler(
            study,
            self.spec,
            seed_stream=1 + len(study.get_trials(deepcopy=False)) + 7919 * int(worker) + 104729 * slot,
        )
        space = search.distributions(self.spec)
        budget = compute.BudgetGate(self.spec, study, keep=False)  # the launcher stores the figure
        job_end = None if self.time_limit_min is None else job_started + 60 * self.time_limit_min
        ran = 0
        while admission.trials_left(self.spec, study) > 0:
            answer = self._admission(study, budget, job_end, longest_trial_s)
            if answer.holds:
                # Fail fast's hold ends when another worker's trial ends; the budget's when a trial
                # has finished to say what one costs.
                time.sleep(1.0 if self._suspect_since is not None else compute.REMEASURE_S)
                continue
            if not answer.open:
                log.info(f"worker stops: {answer.reason}")
                break
            trial = study.ask(space)
            retries.inherit_checkpoint(self.spec, trial)
            if admission.is_surplus(self.spec, study, trial):  # closed unrun: the budget is exact
                record.mark_surplus(study, trial)
                break
            record.set_attrs(trial, record.placement(executors.here().name, record.DispatchMode.WORKERS))
            trial_started = time.time()
            try:
                run_attached(self.spec, study, trial, self.objective)
            except UncompletedJobError:
                raise  # the job is at its time limit or preempted: no further trial
            except Exception:
                traceback.print_exc()  # recorded as FAIL with its reason; the worker goes on
            longest_trial_s = max(longest_trial_s, time.time() - trial_started)
            ran += 1
        return {"trials_run": ran}

    def _admission(
        self, study: Any, budget: compute.BudgetGate, job_end: float | None, longest_trial_s: float
    ) -> admission.Admission:
        """Whether this worker takes another trial (``hpo.budget.admission``): it obeys the verdict
        its launcher stored and judges fail fast itself, to stop as soon as it sees one. After a
        first failure that two parameter sets decide, it waits for the trial another worker runs
        (the launcher's hold), so that a set-up mistake costs 2 trials, not one per worker more."""
        ended = tally.ended_since(study, self.started)
        running = sum(
            1
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            if tally.is_own(t)
        )
        self._suspect_since = admission.suspicion(self.spec, ended, running, self._suspect_since)
        return admission.decide(
            study,
            self.spec,
            now=time.time(),
            started=self.started,
            deadline=self.deadline_unix,
            ended=ended,
            running=running,
            suspect_since=self._suspect_since,
            role=admission.WORKER,
            spending=functools.partial(budget.spending, len(ended)),
            job_end=job_end,
            longest_trial_s=longest_trial_s,
        )
