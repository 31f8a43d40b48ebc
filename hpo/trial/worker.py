"""A ``--workers`` job: a long-running process that asks, runs and tells trials until the budget is met."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import traceback
from typing import TYPE_CHECKING, Any

from submitit.core.utils import UncompletedJobError

from hpo import joblog, record, search, study_record
from hpo.budget import compute, failing
from hpo.storage import StorageRef, open_storage, with_retries
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

    def __call__(self) -> dict[str, Any]:
        joblog.to_stdout()
        job_started = time.time()
        longest_trial_s = 0.0
        study = with_retries(  # connecting is outside the storage's own policy
            lambda: search.load(self.spec, open_storage(self.storage, create=False), create=False),
            "load the study",
        )
        # Each worker samples its own sequence (same seed everywhere would mean the same proposals).
        worker = (
            os.environ.get("SLURM_ARRAY_TASK_ID")
            or os.environ.get("SUBMITIT_LOCAL_JOB_ID")
            or str(os.getpid())
        )
        slot = int(os.environ.get(packing.ENV_SLOT, "0"))  # workers packed on one GPU share a job
        search.reseed_sampler(
            study,
            self.spec,
            seed_stream=1 + len(study.get_trials(deepcopy=False)) + 7919 * int(worker) + 104729 * slot,
        )
        space = search.distributions(self.spec)
        ran = 0
        while record.started_count(study) < self.spec.study.n_trials:  # enqueued ones count once run
            if self.deadline_unix is not None and time.time() >= self.deadline_unix:
                break
            if study_record.cancel_requested_at(study) >= self.started:
                break
            spending = compute.measure(self.spec, study.get_trials(deepcopy=False))
            reason = self._reason_to_stop(study, spending, job_started, longest_trial_s)
            if reason:
                log.info(f"worker stops: {reason}")
                break
            if spending is not None and not spending.allows_another:
                time.sleep(compute.REMEASURE_S)  # no trial has finished yet to say what one costs
                continue
            trial = study.ask(space)
            retries.inherit_checkpoint(self.spec, trial)
            # Several workers may ask at the same moment for the last slot: the trial numbers
            # decide, and a surplus trial is closed unrun so that the budget is exact.
            earlier = [t for t in record.counted_trials(study) if t.number < trial.number]
            if len(earlier) >= self.spec.study.n_trials:
                record.mark_surplus(study, trial)
                break
            kind = os.environ.get("SUBMITIT_EXECUTOR", "local")
            record.set_attrs(trial, {record.ATTR_EXECUTOR: "worker", record.ATTR_JOB_KIND: kind})
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

    def _reason_to_stop(
        self, study: Any, spending: compute.Spending | None, job_started: float, longest_trial_s: float
    ) -> str | None:
        """Why this worker takes no further trial (a stop rule, the launch's first trials failing
        the same way, the compute budget, too little time left in the job), or None."""
        stopped = study_record.stopped(study)
        if stopped and float(stopped.get("at", 0)) >= self.started:
            return f"stop rule met ({stopped['reason']})"
        if self.spec.study.fail_fast and failing.check(record.ended_since(study, self.started)):
            # The launcher stores the verdict and says why; a worker stops as soon as it sees it.
            return "the launch's first trials failed the same way"
        if spending is not None and spending.exhausted:
            return f"compute budget reached: {spending.line()}"
        if self.time_limit_min is not None:
            left_s = job_started + 60 * self.time_limit_min - time.time()
            if left_s < 1.2 * longest_trial_s + 60:
                return f"{left_s:.0f} s left, the longest trial took {longest_trial_s:.0f} s"
        return None
