"""Per-trial jobs: each trial is one Slurm job (or local process), up to ``max_concurrent`` at once."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from hpo import record
from hpo.dispatch.common import Dispatcher, InFlight, signals_deferred
from hpo.errors import LaunchError, one_line
from hpo.slurm import executors
from hpo.storage import with_retries
from hpo.trial import retries
from hpo.trial.task import TrialTask


class PerTrialDispatcher(Dispatcher):
    """Asks a trial the moment a slot frees, submits it as its own job, and watches it end."""

    def run(self) -> None:
        executor = executors.make_executor(
            self.spec, self.options.executor, job_name=f"hpo-{self.spec.study.name}"
        )
        with_retries(lambda: self._take_over_running_trials(per_trial=True), "re-attach", self.log)
        # Each round only reads the storage or makes a step that can be repeated, so a round cut
        # off by a database outage is simply run again once the database answers.
        while not with_retries(lambda: self._round(executor), "launcher round", self.log):
            time.sleep(self.options.poll_interval_s)

    def _round(self, executor: Any) -> bool:
        """Collect the trials that ended, submit new ones; True once the study is done."""
        self._collect_finished()
        budget_left = self.spec.study.n_trials - self._counted()
        accepting = self._accepting()
        while accepting and budget_left > 0 and len(self.in_flight) < self.spec.study.max_concurrent:
            self._submit(executor)
            budget_left -= 1
        if not self.in_flight and (budget_left <= 0 or not accepting):
            if not accepting and budget_left > 0:
                self.log(f"stopped early: {budget_left} trials of the budget not started")
            if self.progress:
                self.progress.tick()  # the final count
            return True
        if self.progress:
            self.progress.tick()
        return False

    def _submit(self, executor: Any) -> None:

        with signals_deferred():
            trial = self.study.ask(self.space)
            retries.inherit_checkpoint(self.spec, trial)
            asked = {record.ATTR_EXECUTOR: self.options.executor, record.ATTR_ASKED_AT: record.now_iso()}
            record.set_attrs(trial, asked)
            task = TrialTask(
                self.spec, self.storage, trial.number, dict(trial.params), self.options.objective
            )
            try:
                job = executor.submit(task)
            except Exception as err:
                reason = f"submission failed: {one_line(err, last=True, name=False)}"
                record.fail(self.study, trial, reason)
                raise LaunchError(f"trial {trial.number}: {reason}") from None
            # A trial that fails within a second may have told already: its attributes are frozen.
            with contextlib.suppress(RuntimeError):
                with_retries(
                    lambda: record.set_attr(trial, record.ATTR_JOB_ID, str(job.job_id)),
                    "store the job id",
                    self.log,
                )
            # Still under the deferred signals: a launcher stopped now reports this trial as running.
            entry = InFlight(
                trial.number,
                record.trial_id(trial),
                str(job.job_id),
                self.options.executor,
                self.spec.resources.world_size,
                job,
            )
            self.in_flight.append(entry)
            retry_of = trial.user_attrs.get(record.ATTR_RETRY_OF)
            self.log(
                f"trial {trial.number} submitted as {self.options.executor} job {job.job_id}: {record.format_params(trial.params)}"
                + (f" (retry of trial {retry_of})" if retry_of is not None else "")
            )

    def _collect_finished(self) -> None:

        failed = False
        for entry in list(self.in_flight):
            frozen = record.read_trial(self.study, entry.trial_id)
            if not frozen.state.is_finished() and self._ended(entry):
                # The trial process may have told its result just before exiting.
                if not record.read_trial(self.study, entry.trial_id).state.is_finished():
                    self._fail(entry.number, self._end_reason(entry), self._out_of_memory(entry))
                frozen = record.read_trial(self.study, entry.trial_id)
            if frozen.state.is_finished():
                self._report(frozen)
                self.in_flight.remove(entry)
                failed = failed or frozen.state.name == "FAIL"
        if failed:
            self._queue_retries()

    def _out_of_memory(self, entry: InFlight) -> bool:
        """Slurm killed the job for exceeding its memory: the parameters are infeasible there."""
        return (
            entry.executor == "slurm"
            and entry.job is not None
            and self.slurm.state(entry.job) == "OUT_OF_MEMORY"
        )
