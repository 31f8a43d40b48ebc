"""``--workers``: K long-running worker jobs (one job array) that pull trials until the budget is met."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import optuna

from hpo import record, tally
from hpo.budget import admission
from hpo.dispatch.common import Dispatcher, InFlight, signals_deferred, worker_entry
from hpo.errors import LaunchError, one_line
from hpo.executors import jobs
from hpo.trial.packing import PackedJob
from hpo.trial.task import objective_for
from hpo.trial.worker import WorkerTask

REPORT_EVERY_S = 2.0
"""How often the launcher reads the study for the trials its workers finished."""


class WorkerDispatcher(Dispatcher):
    """Keeps the worker jobs going and reports the trials they finish."""

    def run(self, count: int) -> None:
        """Keep ``count`` worker jobs pulling trials until the budget is met. Workers that end
        (time limit, failure) are replaced while trials remain, as long as a round makes progress."""
        live = self._take_over_running_trials(per_trial=False)
        # An earlier launch's workers that still run are watched as this launch's own (its
        # launcher was killed): they go on pulling trials, and count toward ``count``.
        adopted = [
            InFlight(-1, -1, job_id, executor, 1, executor.job(self.spec, job_id))
            for job_id, executor in sorted(live.items())
        ]
        if adopted:
            self.log(f"{len(adopted)} workers of an earlier launch still run: {', '.join(sorted(live))}")
        seen = {t.number for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()}
        while admission.trials_left(self.spec, self.study) > 0 and self._accepting().open:
            running = len(adopted) * self.spec.resources.trials_per_gpu  # workers per job
            wanted = min(count - running, admission.trials_left(self.spec, self.study))
            if self.claim is not None:
                self.claim.confirm()
            submitted = self._submit_workers(wanted) if wanted > 0 else []
            watched = [worker_entry(job, self.executor) for job in submitted] + adopted
            finished_before = len(seen)
            reported_at = time.monotonic()
            while not all(self._ended(entry) for entry in watched):
                # The workers pull and tell trials themselves: the launcher reads the study only to
                # report them, every REPORT_EVERY_S (a read loads every trial of the study).
                if time.monotonic() - reported_at >= REPORT_EVERY_S:
                    seen = self._report_new(seen)
                    reported_at = time.monotonic()
                self._accepting()  # tells `hpo cancel` at once that no more workers come
                time.sleep(self.options.poll_interval_s)
            seen = self._report_new(seen)
            self._fail_orphans(watched)
            seen = self._report_new(seen)
            adopted = []  # the earlier launch's workers are not waited for twice
            if len(seen) == finished_before and admission.trials_left(self.spec, self.study) > 0:
                raise LaunchError(
                    f"{len(watched)} workers ended without finishing a trial; see their logs in {jobs.jobs_folder(self.spec)}"
                )

    def _submit_workers(self, count: int) -> list[Any]:
        res = self.spec.resources
        # Enough time for the worker's share of the budget, within the study's timeout if any.
        share = math.ceil(admission.trials_left(self.spec, self.study) / count)
        time_min = res.worker_time_min or min(24 * 60, res.time_min * share)
        if self.deadline is not None:
            time_min = max(
                res.time_min, min(time_min, math.ceil((self.deadline - time.time()) / 60) + res.time_min)
            )
        time_min = self.executor.job_time_limit(self.spec, time_min, "workers", self.log)
        executor = self.executor.submitter(
            self.spec,
            job_name=jobs.job_name(self.spec, "worker"),
            array_parallelism=math.ceil(count / self.spec.resources.trials_per_gpu),
            time_min=time_min,
            direct=True,
        )
        task = WorkerTask(
            self.spec,
            self.storage,
            self.deadline,
            self.options.objective or objective_for(self.spec),
            started=self.started,
            time_limit_min=time_min,
        )

        # Packed (trials_per_gpu k): k workers share each job's GPU, each its own process.
        per_job = self.spec.resources.trials_per_gpu
        sizes = [min(per_job, count - start) for start in range(0, count, per_job)]

        def submit_array() -> list[Any]:
            with executor.batch():
                if not self.spec.resources.packed:
                    return [executor.submit(task) for _ in sizes]
                return [executor.submit(PackedJob([task] * size)) for size in sizes]

        try:
            with signals_deferred() as deferral:
                submitted = self.executor.submit_with_retries(
                    submit_array, self.log, deferral.sleep, lambda: None
                )
        except Exception as err:  # (a stop meanwhile is a KeyboardInterrupt, not caught here)
            raise LaunchError(f"worker submission failed: {one_line(err, last=True, name=False)}") from None
        packed = f", {per_job} workers per job" if self.spec.resources.packed else ""
        self.log(
            f"{count} workers submitted as {self.executor.name} jobs {', '.join(str(j.job_id) for j in submitted)} ({time_min} min each{packed})"
        )
        return submitted

    def _report_new(self, seen: set[int]) -> set[int]:
        failed = False
        for trial in self.study.get_trials(deepcopy=False):
            if trial.state.is_finished() and trial.number not in seen:
                seen.add(trial.number)
                if tally.is_own(trial):
                    self._report(trial)
                    failed = failed or trial.state.name == "FAIL"
        if failed:
            self._queue_retries()
        if self.progress:
            self.progress.tick()
        return seen

    def _fail_orphans(self, workers: list[InFlight]) -> None:
        """A worker that died mid-trial leaves that trial RUNNING: fail it with the worker's end."""

        by_id = {entry.job_id: entry for entry in workers}
        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            entry = by_id.get(str(trial.user_attrs.get(record.ATTR_JOB_ID)))
            if entry is not None:
                slot = trial.user_attrs.get(record.ATTR_PACK_SLOT)  # a packed worker's own log
                self._fail(trial.number, self._end_reason(dataclasses.replace(entry, slot=slot)))
