"""Per-trial jobs: each trial is one job of the study's executor (a Slurm job, a local process), up
to ``max_concurrent`` at once."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import optuna

from hpo import record, tally
from hpo.budget import admission
from hpo.dispatch.common import Deferral, Dispatcher, InFlight, signals_deferred
from hpo.errors import LaunchError, NotReadyError, one_line
from hpo.executors import jobs
from hpo.trial import retries
from hpo.trial.packing import PackedJob
from hpo.trial.task import TrialTask, objective_for


class CancelledMeanwhile(Exception):
    """`hpo cancel` came while the launcher waited for Slurm's controller to submit a trial."""


TRIAL_READ_S = 10.0
"""How often the launcher reads a trial in flight from the study when neither its result file nor
Slurm says it ended (a trial that told and whose job has not left yet)."""

QUEUE_READ_S = 2.0
"""How often, at most, the launcher asks squeue which of its finished trials' jobs are still queued
(only at the site's job limit): one call for all, whatever max_concurrent is."""

ADMISSION_READ_S = 1.0
"""How often the launcher asks the study whether it may start trials (the trial budget, `hpo
cancel`, the timeout, the stop rules, the compute budget) when no trial has ended since it last
asked: each ask reads the study's trials, which at every poll would cost the database tens of
queries a second, and the launcher the CPU the trials' jobs start on. A trial's end is asked about
at once."""

JOB_EXIT_WAIT_S = 120.0
"""How long a finished trial's Slurm job may stay in the queue (completing) before its place in
max_concurrent is given to the next trial regardless."""


class PerTrialDispatcher(Dispatcher):
    """Asks a trial the moment a slot frees, submits it as its own job, and watches it end."""

    hold_jobs_until_gone = False
    """Whether a finished trial's job keeps its place until squeue no longer lists it (at the
    site's job limit, where one more job would be refused, and where the study's
    ``max_concurrent_counts`` is jobs)."""

    admitted_at = float("-inf")
    """When the launcher last asked the study's admission (monotonic)."""

    def run(self) -> None:
        executor = self.executor.submitter(self.spec, job_name=jobs.job_name(self.spec), direct=True)
        self._take_over_running_trials(per_trial=True)
        # Every storage call waits out a database outage on its own (hpo.storage's policy).
        while not self._round(executor):
            time.sleep(self.options.poll_interval_s)

    def _round(self, executor: Any) -> bool:
        """Collect the trials that ended, submit new ones; True once the study is done."""
        changed = self._collect_finished()
        if not changed and time.monotonic() - self.admitted_at < ADMISSION_READ_S:
            if self.progress:
                self.progress.tick()
            return False
        self.admitted_at = time.monotonic()
        budget_left = admission.trials_left(self.spec, self.study)
        # Admission is asked before every submission: a cancel during a slow sbatch stops the next.
        while (
            budget_left > 0
            and (room := admission.room_in_flight(self.spec, len(self.in_flight))) > 0
            and self._accepting().open
        ):
            self._submit(executor, min(self.spec.resources.trials_per_gpu, budget_left, room))
            budget_left = admission.trials_left(self.spec, self.study)
        accepting = self._accepting().open
        if not self.in_flight and (budget_left <= 0 or not accepting):
            if not accepting and budget_left > 0:
                self.log(f"stopped early: {budget_left} trials of the budget not started")
            if self.progress:
                self.progress.tick()  # the final count
            return True
        if self.progress:
            self.progress.tick()
        return False

    def _submit(self, executor: Any, size: int) -> None:
        """Ask ``size`` trials and submit them as one job: one trial, or a pack of trials that
        share its GPU (``resources.trials_per_gpu``)."""
        with signals_deferred() as deferral:
            if self.claim is not None:
                self.claim.confirm()
            trials: list[optuna.Trial] = []
            try:
                for _ in range(size):
                    trials.append(self.study.ask(self.space))
                self._submit_asked(executor, trials, deferral)
            except BaseException as err:
                # Whatever stopped the submission, the trials asked for it are not left RUNNING.
                why = (
                    record.REASON_LAUNCHER_STOPPED if deferral.held else one_line(err, last=True, name=False)
                )
                reason = f"never submitted: {why}"
                for trial in trials:
                    with contextlib.suppress(Exception):
                        record.close_not_run(self.study, trial, reason)
                if isinstance(err, Exception) and not isinstance(err, NotReadyError) and not deferral.held:
                    numbers = ", ".join(str(t.number) for t in trials)
                    raise LaunchError(f"trial {numbers}: {reason}") from None
                raise  # an interruption, or the database gone for longer than the outage policy waits

    def _submit_asked(self, executor: Any, trials: list[optuna.Trial], deferral: Deferral) -> None:
        packed = self.spec.resources.packed
        for slot, trial in enumerate(trials):
            retries.inherit_checkpoint(self.spec, trial)
            asked: dict[str, Any] = {
                **record.placement(self.executor.name, record.DispatchMode.PER_TRIAL),
                record.ATTR_ASKED_AT: record.now_iso(),
            }
            if packed:
                asked |= {record.ATTR_PACK_SLOT: slot, record.ATTR_PACK_SIZE: len(trials)}
            record.set_attrs(trial, asked)
        if self.gate.cancelled():  # `hpo cancel` between the ask and now
            for trial in trials:
                record.close_not_run(self.study, trial, f"never submitted: {record.REASON_CANCELLED}")
            return
        objective = self.options.objective or objective_for(self.spec)
        tasks = [TrialTask(self.spec, self.storage, t.number, dict(t.params), objective) for t in trials]
        job_task: Any = PackedJob(list(tasks)) if packed else tasks[0]
        try:
            # A controller restart is waited out here, the trial held (closed if the launcher stops).
            job = self.executor.submit_with_retries(
                lambda: executor.submit(job_task), self.log, deferral.sleep, self._still_wanted
            )
        except CancelledMeanwhile:
            for trial in trials:
                record.close_not_run(self.study, trial, f"never submitted: {record.REASON_CANCELLED}")
            return
        except Exception as err:
            raise LaunchError(f"submission failed: {one_line(err, last=True, name=False)}") from None
        for slot, trial in enumerate(trials):
            # A trial that fails within a second may have told already: its attributes are frozen.
            with record.unless_told_meanwhile():
                record.set_attrs(
                    trial, {record.ATTR_JOB_ID: str(job.job_id), record.ATTR_SUBMITTED_AT: record.now_iso()}
                )
            # Still under the deferred signals: a launcher stopped now reports this trial as running.
            entry = InFlight(
                trial.number,
                record.trial_id(trial),
                str(job.job_id),
                self.executor,
                self.spec.resources.world_size,
                job,
                slot=slot if packed else None,
            )
            self.in_flight.append(entry)
            self.gate.budget.submitted()
            retry_of = trial.user_attrs.get(record.ATTR_RETRY_OF)
            shared = f", {len(trials)} trials on its GPU" if packed else ""
            self.log(
                f"trial {trial.number} submitted as {self.executor.name} job {job.job_id}{shared}: {tally.format_params(trial.params)}"
                + (f" (retry of trial {retry_of})" if retry_of is not None else "")
            )

    def _still_wanted(self) -> None:
        """Between two sbatch tries: still this study's launcher, and no cancel since."""
        if self.claim is not None:
            self.claim.confirm()  # raises if another launcher took the study meanwhile
        if self.gate.cancelled():
            raise CancelledMeanwhile

    def _collect_finished(self) -> bool:
        """The trials whose end this round sees; True if it saw one, or freed a place. A trial's
        end comes with its job's result file or Slurm's state (no query to the study for it): the
        study is read for a trial then, and otherwise once every ``TRIAL_READ_S`` (a trial that
        told but whose job stays on), so that the launcher's queries do not grow with
        ``max_concurrent`` times the polling rate."""
        failed = changed = False
        now = time.monotonic()
        for entry in list(self.in_flight):
            frozen = entry.finished
            if frozen is None:
                ended = self._ended(entry)
                if not ended and now - entry.read_at < TRIAL_READ_S:
                    continue
                entry.read_at = now
                frozen = record.read_trial(self.study, entry.trial_id)
                if not frozen.state.is_finished() and ended:
                    # The trial process may have told its result just before exiting.
                    if not record.read_trial(self.study, entry.trial_id).state.is_finished():
                        self._fail(entry.number, self._end_reason(entry), self._out_of_memory(entry))
                    frozen = record.read_trial(self.study, entry.trial_id)
                if not frozen.state.is_finished():
                    continue
                entry.finished, changed = frozen, True
                # Said at once; its place in max_concurrent may stay held a while longer.
                self._report(frozen)
                failed = failed or frozen.state.name == "FAIL"
            if not self._still_holds_resources(entry):
                self.in_flight.remove(entry)
                changed = True
        if failed:
            self._queue_retries()
        return changed

    def _still_holds_resources(self, entry: InFlight) -> bool:
        """A job whose trial has told its result (on an executor whose jobs outlive their trial:
        Slurm) is still on the cluster while its process exits. Its place in ``max_concurrent``
        goes to the next trial once the process has left its result file, the last thing it writes
        (no RPC: a file on the shared folder), or once Slurm says the job ended. At the site's job
        limit (``hold_jobs_until_gone``) that is not enough: the job counts against the limit until
        squeue no longer lists it, so the launcher waits for that, reading squeue at most every
        ``QUEUE_READ_S`` for all its jobs at once. A job stuck in the queue holds its place for at
        most ``JOB_EXIT_WAIT_S``."""
        if any(other.finished is None for other in self.in_flight if other.job_id == entry.job_id):
            return True  # trials packed with it still train on the job's GPU
        if not entry.executor.outlives_trial:
            return False
        now = time.monotonic()
        if entry.told_at is None:
            entry.told_at = now
        if now - entry.told_at > JOB_EXIT_WAIT_S:
            return False
        max_age_s = QUEUE_READ_S if self.hold_jobs_until_gone else None
        return entry.executor.still_queued(entry.job_id, entry.job, max_age_s)

    def _out_of_memory(self, entry: InFlight) -> bool:
        """The executor killed the job for exceeding its memory: the parameters are infeasible there."""
        return (
            entry.slot is None  # a packed job's memory was its trials': whose fault is not known
            and entry.executor.killed_for_memory(entry.job)
        )
