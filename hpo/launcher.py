"""``hpo launch``: keep up to ``max_concurrent`` trials in flight until the budget is met.

Asynchronous dispatch: the moment a trial ends, the next one is asked and submitted; there are no
synchronous batches leaving GPUs idle. A trial's end is seen in the storage, where the trial
process told it (fast, no sacct round trip); a job that died without telling is seen through
submitit (result file, then sacct) and its trial is failed with the job's state as the reason.

Relaunching a study resumes it: the budget counts the trials already stored, and trials still
running in Slurm jobs are re-attached through the job ids stored on them, never submitted twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpo import executors
from hpo import study as study_lib
from hpo.errors import LaunchError
from hpo.storage import StorageRef, check_reachable, mask
from hpo.trial_job import Objective, TrainerObjective, TrialTask, WorkerTask, now_iso

if TYPE_CHECKING:
    import optuna

    from hpo.studyfile import StudySpec


@dataclasses.dataclass
class LaunchOptions:
    executor: str
    workers: int | None = None
    objective: Objective = dataclasses.field(default_factory=TrainerObjective)
    poll_interval_s: float = 0.25


@dataclasses.dataclass
class _InFlight:
    number: int
    trial_id: int
    job_id: str
    executor: str
    job: Any = None
    """The submitit job, or None for a local process re-attached by pid."""

    def ended(self) -> bool:
        if self.job is not None:
            return bool(self.job.done())
        return not executors.local_process_alive(self.job_id)

    def end_reason(self) -> str:
        if self.job is None:
            return f"local process {self.job_id} exited without telling a result"
        state = executors.slurm_state(self.job) if self.executor == "slurm" else "exited"
        detail = ""
        try:
            error = self.job.exception()
        except Exception as err:  # submitit raises when the job left no result at all
            error = err
        if error is not None:
            lines = [line for line in str(error).strip().splitlines() if line.strip()]
            detail = f": {lines[-1].strip()}" if lines else ""
        return f"job {self.job_id} {state} without telling a result{detail}"


@dataclasses.dataclass
class LaunchSummary:
    counts: dict[str, int]
    best_number: int | None
    best_value: float | None
    best_params: dict[str, Any]


Log = Callable[[str], None]


def launch(spec: StudySpec, storage: StorageRef, options: LaunchOptions, log: Log = print) -> LaunchSummary:
    backend = check_reachable(storage, spec.source)
    study = study_lib.load(spec, backend, create=True)
    study_lib.check_direction(study, spec)
    stored = len(study_lib.counted_trials(study))
    # A relaunch continues the seeded sequence elsewhere instead of replaying its first proposals.
    study_lib.reseed_sampler(study, spec, seed_stream=len(study.get_trials(deepcopy=False)))
    enqueued = study_lib.enqueue_first_trials(study, spec)
    log(
        f"study {spec.study.name!r} in {mask(str(storage))}: {stored} of {spec.study.n_trials} trials stored"
        + (f", {enqueued} enqueued to run first" if enqueued else "")
    )
    deadline = None if spec.study.timeout_min is None else time.time() + 60 * spec.study.timeout_min
    dispatcher = _Dispatcher(spec, storage, study, options, log, deadline)
    try:
        if options.workers:
            dispatcher.run_workers(options.workers)
        else:
            dispatcher.run_per_trial_jobs()
    except KeyboardInterrupt:
        dispatcher.report_interrupted()
        raise
    return summarize(study, log)


class _Dispatcher:
    def __init__(
        self,
        spec: StudySpec,
        storage: StorageRef,
        study: optuna.Study,
        options: LaunchOptions,
        log: Log,
        deadline: float | None,
    ) -> None:
        self.spec = spec
        self.storage = storage
        self.study = study
        self.options = options
        self.log = log
        self.deadline = deadline
        self.space = study_lib.distributions(spec)
        self.in_flight: list[_InFlight] = []
        self.best: float | None = None

    # --- per-trial jobs -----------------------------------------------------------------------
    def run_per_trial_jobs(self) -> None:
        executor = executors.make_executor(
            self.spec, self.options.executor, job_name=f"hpo-{self.spec.study.name}"
        )
        self._reattach()
        while True:
            self._collect_finished()
            budget_left = self.spec.study.n_trials - self._counted()
            accepting = self.deadline is None or time.time() < self.deadline
            while accepting and budget_left > 0 and len(self.in_flight) < self.spec.study.max_concurrent:
                self._submit(executor)
                budget_left -= 1
            if not self.in_flight and (budget_left <= 0 or not accepting):
                if not accepting and budget_left > 0:
                    self.log(f"timeout reached: {budget_left} trials of the budget not started")
                return
            time.sleep(self.options.poll_interval_s)

    def _submit(self, executor: Any) -> None:
        import optuna

        trial = self.study.ask(self.space)
        trial.set_user_attr(study_lib.ATTR_EXECUTOR, self.options.executor)
        trial.set_user_attr(study_lib.ATTR_ASKED_AT, now_iso())
        task = TrialTask(self.spec, self.storage, trial.number, dict(trial.params), self.options.objective)
        try:
            job = executor.submit(task)
        except Exception as err:
            reason = f"submission failed: {str(err).strip().splitlines()[-1] if str(err).strip() else err!r}"
            trial.set_user_attr(study_lib.ATTR_FAIL_REASON, reason)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise LaunchError(f"trial {trial.number}: {reason}") from None
        trial.set_user_attr(study_lib.ATTR_JOB_ID, str(job.job_id))
        self.in_flight.append(
            _InFlight(trial.number, trial._trial_id, str(job.job_id), self.options.executor, job)
        )
        self.log(
            f"trial {trial.number} submitted as {self.options.executor} job {job.job_id}: {study_lib.format_params(trial.params)}"
        )

    def _reattach(self) -> None:
        """Take over the trials a previous launcher left running; fail those whose job is gone."""
        import optuna

        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            executor = trial.user_attrs.get(study_lib.ATTR_EXECUTOR)
            job_id = trial.user_attrs.get(study_lib.ATTR_JOB_ID)
            if executor not in ("slurm", "local"):
                continue  # a --workers trial: its worker job tells it
            if job_id is None:
                self._fail(
                    trial.number,
                    trial._trial_id,
                    "never submitted: the launcher stopped between ask and submit",
                )
                continue
            job = executors.slurm_job(self.spec, str(job_id)) if executor == "slurm" else None
            entry = _InFlight(trial.number, trial._trial_id, str(job_id), executor, job)
            self.in_flight.append(entry)
            self.log(f"trial {trial.number} re-attached to {executor} job {job_id}")

    def _collect_finished(self) -> None:
        storage = self.study._storage  # reads through the study's own connection pool
        for entry in list(self.in_flight):
            frozen = storage.get_trial(entry.trial_id)
            if frozen.state.is_finished():
                self._report(frozen)
                self.in_flight.remove(entry)
            elif entry.ended():
                # The trial process may have told its result just before exiting.
                frozen = storage.get_trial(entry.trial_id)
                if not frozen.state.is_finished():
                    self._fail(entry.number, entry.trial_id, entry.end_reason())
                    frozen = storage.get_trial(entry.trial_id)
                self._report(frozen)
                self.in_flight.remove(entry)

    def _fail(self, number: int, trial_id: int, reason: str) -> None:
        import optuna

        storage = self.study._storage
        storage.set_trial_user_attr(trial_id, study_lib.ATTR_FAIL_REASON, reason)
        with contextlib.suppress(RuntimeError, ValueError):  # told by its own process meanwhile
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)

    def _report(self, trial: optuna.trial.FrozenTrial) -> None:
        state = trial.state.name
        if trial.state.name == "COMPLETE" and trial.value is not None:
            better = self.best is None or (
                trial.value > self.best
                if self.spec.study.direction == "maximize"
                else trial.value < self.best
            )
            if better:
                self.best = trial.value
            note = " (best so far)" if better else ""
            self.log(f"trial {trial.number} COMPLETE: {self.spec.study.metric}={trial.value:.4f}{note}")
        elif state == "PRUNED":
            step = max(trial.intermediate_values) if trial.intermediate_values else 0
            value = study_lib.metric_value(trial)
            shown = f"{value:.4f}" if value is not None else "-"
            self.log(f"trial {trial.number} PRUNED at epoch {step}: {self.spec.study.metric}={shown}")
        else:
            self.log(f"trial {trial.number} {state}: {trial.user_attrs.get(study_lib.ATTR_FAIL_REASON, '')}")

    def _counted(self) -> int:
        import optuna

        return sum(
            1 for t in study_lib.counted_trials(self.study) if t.state != optuna.trial.TrialState.WAITING
        )

    # --- --workers ----------------------------------------------------------------------------
    def run_workers(self, count: int) -> None:
        import optuna

        if self._counted() >= self.spec.study.n_trials:
            return
        executor = executors.make_executor(
            self.spec,
            self.options.executor,
            job_name=f"hpo-{self.spec.study.name}-worker",
            array_parallelism=count,
        )
        task = WorkerTask(self.spec, self.storage, self.deadline, self.options.objective)
        with executor.batch():
            jobs = [executor.submit(task) for _ in range(count)]
        self.log(
            f"{count} workers submitted as {self.options.executor} jobs {', '.join(str(j.job_id) for j in jobs)}"
        )
        seen: set[int] = {t.number for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()}
        while True:
            all_done = all(job.done() for job in jobs)
            for trial in self.study.get_trials(deepcopy=False):
                if trial.state.is_finished() and trial.number not in seen:
                    seen.add(trial.number)
                    if not trial.user_attrs.get(study_lib.ATTR_SURPLUS):
                        self._report(trial)
            if all_done:
                break
            time.sleep(self.options.poll_interval_s)
        # A worker that died mid-trial leaves that trial RUNNING: fail it with the worker's state.
        by_id = {str(job.job_id): job for job in jobs}
        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            job_id = str(trial.user_attrs.get(study_lib.ATTR_JOB_ID))
            if job_id in by_id:
                entry = _InFlight(trial.number, trial._trial_id, job_id, self.options.executor, by_id[job_id])
                self._fail(trial.number, trial._trial_id, entry.end_reason())
                self._report(self.study._storage.get_trial(trial._trial_id))

    def report_interrupted(self) -> None:
        if not self.in_flight:
            return
        numbers = ", ".join(str(entry.number) for entry in self.in_flight)
        if self.options.executor == "slurm":
            self.log(f"launcher stopped; trials {numbers} keep running as Slurm jobs: `hpo launch` again "
                     "re-attaches to them, `hpo cancel` stops them")  # fmt: skip
        else:
            self.log(f"launcher stopped while trials {numbers} ran; `hpo launch` again resumes the study")


def summarize(study: optuna.Study, log: Log = print) -> LaunchSummary:
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        if trial.user_attrs.get(study_lib.ATTR_SURPLUS):
            continue
        counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
    summary = LaunchSummary(counts=counts, best_number=None, best_value=None, best_params={})
    log("trials: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    try:
        best = study.best_trial
    except ValueError:
        log("no trial completed")
        return summary
    summary.best_number, summary.best_value, summary.best_params = best.number, best.value, dict(best.params)
    log(f"best trial {best.number}: value={best.value:.4f} {study_lib.format_params(best.params)}")
    return summary
