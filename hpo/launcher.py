"""``hpo launch``: keep up to ``max_concurrent`` trials in flight until the budget is met.

Asynchronous dispatch: the moment a trial ends, the next one is asked and submitted; there are no
synchronous batches leaving GPUs idle. A trial's end is seen in the storage, where the trial
process told it (fast, no sacct round trip); a job that died without telling is seen through its
result file or Slurm's state, and its trial is failed with that state as the reason.

Relaunching a study resumes it: the budget counts the trials already stored, and trials still
running in jobs are re-attached through the job ids stored on them, never submitted twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import signal
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from hpo import executors, retries
from hpo import study as study_lib
from hpo.errors import LaunchError
from hpo.paths import private_dir
from hpo.progress import Progress
from hpo.storage import StorageRef, check_reachable, mask, with_retries
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
    progress: bool = True
    """A live progress line (plain lines when not on a terminal)."""


@dataclasses.dataclass
class _InFlight:
    """A trial whose job this launcher watches."""

    number: int
    trial_id: int
    job_id: str
    executor: str
    tasks: int
    job: Any = None
    """The submitit job; None for a local process re-attached by pid after a relaunch."""


@dataclasses.dataclass
class LaunchSummary:
    counts: dict[str, int]
    best_number: int | None
    best_value: float | None
    best_params: dict[str, Any]


Log = Callable[[str], None]


def launch(spec: StudySpec, storage: StorageRef, options: LaunchOptions, log: Log = print) -> LaunchSummary:
    private_dir(spec.workdir)  # logs, checkpoints, submitit's pickles: the owner's only
    backend = check_reachable(storage, spec.source)
    study = study_lib.load(spec, backend, create=True)
    study_lib.check_direction(study, spec)
    study_lib.name_objective(study, spec)
    stored = len(study_lib.counted_trials(study))
    # A relaunch continues the seeded sequence elsewhere instead of replaying its first proposals.
    study_lib.reseed_sampler(study, spec, seed_stream=len(study.get_trials(deepcopy=False)))
    enqueued = study_lib.enqueue_first_trials(study, spec)
    log(
        f"study {spec.study.name!r} in {mask(str(storage))}: {stored} of {spec.study.n_trials} trials stored"
        + (f", {enqueued} enqueued to run first" if enqueued else "")
    )
    # Failures told while no launcher watched (a trial failing after a launcher was stopped).
    queue_retries(study, spec, log)
    deadline = None if spec.study.timeout_min is None else time.time() + 60 * spec.study.timeout_min
    progress = Progress(spec, study, deadline, log) if options.progress else None
    dispatcher = _Dispatcher(
        spec, storage, study, options, progress.log if progress else log, deadline, progress
    )
    try:
        if options.workers:
            dispatcher.run_workers(options.workers)
        else:
            dispatcher.run_per_trial_jobs()
    except KeyboardInterrupt:
        dispatcher.report_interrupted()
        raise
    finally:
        if progress:
            progress.close()
    return summarize(study, spec, log)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while a job is submitted and its id stored: a launcher stopped in
    between would leave a job that no stored trial points to. (A signal mask would not do: the
    kernel may hand the signal to another thread, and Python still raises in the main one.)"""
    held: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if held:
        raise KeyboardInterrupt


class _Dispatcher:
    def __init__(
        self,
        spec: StudySpec,
        storage: StorageRef,
        study: optuna.Study,
        options: LaunchOptions,
        log: Log,
        deadline: float | None,
        progress: Progress | None = None,
    ) -> None:
        self.spec = spec
        self.storage = storage
        self.study = study
        self.options = options
        self.log = log
        self.deadline = deadline
        self.started = time.time()
        self.space = study_lib.distributions(spec)
        self.in_flight: list[_InFlight] = []
        self.slurm = executors.SlurmStates()
        self.best: float | None = None
        self.progress = progress

    # --- per-trial jobs -----------------------------------------------------------------------
    def run_per_trial_jobs(self) -> None:
        executor = executors.make_executor(
            self.spec, self.options.executor, job_name=f"hpo-{self.spec.study.name}"
        )
        with_retries(lambda: self._take_over_running_trials(per_trial=True), "re-attach", self.log)
        # Each round only reads the storage or makes a step that can be repeated, so a round cut
        # off by a database outage is simply run again once the database answers.
        while not with_retries(lambda: self._per_trial_round(executor), "launcher round", self.log):
            time.sleep(self.options.poll_interval_s)

    def _per_trial_round(self, executor: Any) -> bool:
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

    def _accepting(self) -> bool:
        """Whether new trials may start: not past the timeout, no `hpo cancel` since this launch."""
        if self.deadline is not None and time.time() >= self.deadline:
            return False
        return study_lib.cancel_requested_at(self.study) < self.started

    def _submit(self, executor: Any) -> None:
        import optuna

        with _signals_deferred():
            trial = self.study.ask(self.space)
            retries.inherit_checkpoint(self.spec, trial)
            trial.set_user_attr(study_lib.ATTR_EXECUTOR, self.options.executor)
            trial.set_user_attr(study_lib.ATTR_ASKED_AT, now_iso())
            task = TrialTask(
                self.spec, self.storage, trial.number, dict(trial.params), self.options.objective
            )
            try:
                job = executor.submit(task)
            except Exception as err:
                reason = f"submission failed: {_last_line(err)}"
                trial.set_user_attr(study_lib.ATTR_FAIL_REASON, reason)
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                raise LaunchError(f"trial {trial.number}: {reason}") from None
            # A trial that fails within a second may have told already: its attributes are frozen.
            with contextlib.suppress(RuntimeError):
                with_retries(
                    lambda: trial.set_user_attr(study_lib.ATTR_JOB_ID, str(job.job_id)),
                    "store the job id",
                    self.log,
                )
            # Still under the deferred signals: a launcher stopped now reports this trial as running.
            entry = _InFlight(
                trial.number,
                trial._trial_id,
                str(job.job_id),
                self.options.executor,
                self.spec.resources.world_size,
                job,
            )
            self.in_flight.append(entry)
            retry_of = trial.user_attrs.get(retries.ATTR_RETRY_OF)
            self.log(
                f"trial {trial.number} submitted as {self.options.executor} job {job.job_id}: {study_lib.format_params(trial.params)}"
                + (f" (retry of trial {retry_of})" if retry_of is not None else "")
            )

    def _take_over_running_trials(self, per_trial: bool) -> set[str]:
        """Deal with the trials a previous launcher left RUNNING: re-attach per-trial jobs that
        still run (``per_trial``), fail those whose job is gone. Returns the job ids of live workers."""
        import optuna

        live_workers: set[str] = set()
        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            executor = trial.user_attrs.get(study_lib.ATTR_EXECUTOR)
            job_id = trial.user_attrs.get(study_lib.ATTR_JOB_ID)
            if job_id is None:
                if executor in ("slurm", "local"):
                    self._fail(
                        trial.number,
                        trial._trial_id,
                        "never submitted: the launcher stopped between ask and submit",
                    )
                continue  # a worker's trial between ask and start: its worker tells it
            job_id = str(job_id)
            kind = str(trial.user_attrs.get(study_lib.ATTR_JOB_KIND, executor))
            entry = _InFlight(trial.number, trial._trial_id, job_id, kind, self.spec.resources.world_size)
            if kind == "slurm":
                entry.job = executors.slurm_job(self.spec, job_id)
            if self._ended(entry):
                self._fail(trial.number, trial._trial_id, self._end_reason(entry))
            elif executor == "worker":
                live_workers.add(job_id)
            elif per_trial:
                self.in_flight.append(entry)
                self.log(f"trial {trial.number} re-attached to {kind} job {job_id}")
        return live_workers

    def _ended(self, entry: _InFlight) -> bool:
        if entry.job is None:
            return not executors.local_process_alive(entry.job_id)
        if entry.executor == "slurm":
            return self.slurm.ended(entry.job)
        return bool(entry.job.done())

    def _end_reason(self, entry: _InFlight) -> str:
        if entry.job is None:
            return f"local process {entry.job_id} exited without telling a result"
        state = self.slurm.state(entry.job) if entry.executor == "slurm" else "exited"
        detail = executors.error_line(self.spec, entry.job_id, entry.tasks)
        return f"job {entry.job_id} {state} without telling a result" + (f": {detail}" if detail else "")

    def _collect_finished(self) -> None:
        storage = self.study._storage  # reads through the study's own connection pool
        failed = False
        for entry in list(self.in_flight):
            frozen = storage.get_trial(entry.trial_id)
            if not frozen.state.is_finished() and self._ended(entry):
                # The trial process may have told its result just before exiting.
                if not storage.get_trial(entry.trial_id).state.is_finished():
                    self._fail(
                        entry.number, entry.trial_id, self._end_reason(entry), self._out_of_memory(entry)
                    )
                frozen = storage.get_trial(entry.trial_id)
            if frozen.state.is_finished():
                self._report(frozen)
                self.in_flight.remove(entry)
                failed = failed or frozen.state.name == "FAIL"
        if failed:
            queue_retries(self.study, self.spec, self.log)

    def _fail(self, number: int, trial_id: int, reason: str, out_of_memory: bool = False) -> None:
        import optuna

        # These raise if the trial's own process told it meanwhile: then its state stands.
        with contextlib.suppress(RuntimeError, ValueError):
            if out_of_memory:
                retries.tell_infeasible(self.study, trial_id, number, reason, study_lib.directions(self.spec))
                return
            self.study._storage.set_trial_user_attr(trial_id, study_lib.ATTR_FAIL_REASON, reason)
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)

    def _out_of_memory(self, entry: _InFlight) -> bool:
        """Slurm killed the job for exceeding its memory: the parameters are infeasible there."""
        return (
            entry.executor == "slurm"
            and entry.job is not None
            and self.slurm.state(entry.job) == "OUT_OF_MEMORY"
        )

    def _report(self, trial: optuna.trial.FrozenTrial) -> None:
        state = trial.state.name
        if state == "COMPLETE" and trial.values and not trial.user_attrs.get(study_lib.ATTR_INFEASIBLE):
            value = trial.values[0]
            better = self.best is None or (
                value > self.best if self.spec.study.direction == "maximize" else value < self.best
            )
            if better:
                self.best = value
            note = " (best so far)" if better else ""
            cost = (
                f" {self.spec.study.also_minimize}={trial.values[1]:.4g}"
                if self.spec.study.also_minimize
                else ""
            )
            self.log(f"trial {trial.number} COMPLETE: {self.spec.study.metric}={value:.4f}{cost}{note}")
        elif state == "PRUNED":
            step = max(trial.intermediate_values) if trial.intermediate_values else 0
            value = study_lib.metric_value(trial)
            shown = f"{value:.4f}" if value is not None else "-"
            self.log(f"trial {trial.number} PRUNED at epoch {step}: {self.spec.study.metric}={shown}")
        elif trial.user_attrs.get(study_lib.ATTR_INFEASIBLE):
            self.log(
                f"trial {trial.number} infeasible: {trial.user_attrs.get(study_lib.ATTR_FAIL_REASON, '')}"
            )
        else:
            self.log(f"trial {trial.number} {state}: {trial.user_attrs.get(study_lib.ATTR_FAIL_REASON, '')}")

    def _counted(self) -> int:
        import optuna

        return sum(
            1 for t in study_lib.counted_trials(self.study) if t.state != optuna.trial.TrialState.WAITING
        )

    # --- --workers ----------------------------------------------------------------------------
    def run_workers(self, count: int) -> None:
        """Keep ``count`` worker jobs pulling trials until the budget is met. Workers that end
        (time limit, failure) are replaced while trials remain, as long as a round makes progress."""
        live = self._take_over_running_trials(per_trial=False)
        if live:
            self.log(f"{len(live)} workers of an earlier launch still run: {', '.join(sorted(live))}")
        seen = {t.number for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()}
        while self._counted() < self.spec.study.n_trials and self._accepting():
            wanted = min(count - len(live), self.spec.study.n_trials - self._counted())
            jobs = self._submit_workers(wanted) if wanted > 0 else []
            finished_before = len(seen)
            while not all(self._ended(_worker_entry(job, self.options.executor)) for job in jobs):
                seen = with_retries(functools.partial(self._report_new, seen), "launcher round", self.log)
                time.sleep(self.options.poll_interval_s)
            seen = with_retries(functools.partial(self._report_new, seen), "launcher round", self.log)
            self._fail_orphans(jobs)
            seen = self._report_new(seen)
            live = set()  # the earlier launch's workers are not waited for twice
            if len(seen) == finished_before and self._counted() < self.spec.study.n_trials:
                raise LaunchError(
                    f"{len(jobs)} workers ended without finishing a trial; see their logs in {executors.jobs_folder(self.spec)}"
                )

    def _submit_workers(self, count: int) -> list[Any]:
        res = self.spec.resources
        # Enough time for the worker's share of the budget, within the study's timeout if any.
        share = math.ceil((self.spec.study.n_trials - self._counted()) / count)
        time_min = res.worker_time_min or min(24 * 60, res.time_min * share)
        if self.deadline is not None:
            time_min = max(
                res.time_min, min(time_min, math.ceil((self.deadline - time.time()) / 60) + res.time_min)
            )
        executor = executors.make_executor(
            self.spec,
            self.options.executor,
            job_name=f"hpo-{self.spec.study.name}-worker",
            array_parallelism=count,
            time_min=time_min,
        )
        task = WorkerTask(
            self.spec,
            self.storage,
            self.deadline,
            self.options.objective,
            started=self.started,
            time_limit_min=time_min,
        )
        try:
            with _signals_deferred(), executor.batch():
                jobs = [executor.submit(task) for _ in range(count)]
        except Exception as err:
            raise LaunchError(f"worker submission failed: {_last_line(err)}") from None
        self.log(
            f"{count} workers submitted as {self.options.executor} jobs {', '.join(str(j.job_id) for j in jobs)} ({time_min} min each)"
        )
        return jobs

    def _report_new(self, seen: set[int]) -> set[int]:
        failed = False
        for trial in self.study.get_trials(deepcopy=False):
            if trial.state.is_finished() and trial.number not in seen:
                seen.add(trial.number)
                if not trial.user_attrs.get(study_lib.ATTR_SURPLUS):
                    self._report(trial)
                    failed = failed or trial.state.name == "FAIL"
        if failed:
            queue_retries(self.study, self.spec, self.log)
        if self.progress:
            self.progress.tick()
        return seen

    def _fail_orphans(self, jobs: list[Any]) -> None:
        """A worker that died mid-trial leaves that trial RUNNING: fail it with the worker's end."""
        import optuna

        by_id = {str(job.job_id): job for job in jobs}
        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            job = by_id.get(str(trial.user_attrs.get(study_lib.ATTR_JOB_ID)))
            if job is not None:
                self._fail(
                    trial.number, trial._trial_id, self._end_reason(_worker_entry(job, self.options.executor))
                )

    def report_interrupted(self) -> None:
        if not self.in_flight:
            return
        numbers = ", ".join(str(entry.number) for entry in self.in_flight)
        if self.options.executor == "slurm":
            self.log(f"launcher stopped; trials {numbers} keep running as Slurm jobs: `hpo launch` again "
                     "re-attaches to them, `hpo cancel` stops them")  # fmt: skip
        else:
            self.log(f"launcher stopped while trials {numbers} ran; `hpo launch` again resumes the study")


def queue_retries(study: optuna.Study, spec: StudySpec, log: Log) -> None:
    for number in retries.queue_retries(study, spec.study.max_retries):
        log(f"trial {number} failed: queued a retry with the same parameters")


def _worker_entry(job: Any, executor: str) -> _InFlight:
    return _InFlight(-1, -1, str(job.job_id), executor, 1, job)


def _last_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else repr(err)


def summarize(study: optuna.Study, spec: StudySpec, log: Log = print) -> LaunchSummary:
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        if trial.user_attrs.get(study_lib.ATTR_SURPLUS):
            continue
        counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
    summary = LaunchSummary(counts=counts, best_number=None, best_value=None, best_params={})
    log("trials: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    best = study_lib.best_trial(study, spec)
    if best is None:
        log("no trial completed")
        return summary
    summary.best_number, summary.best_value, summary.best_params = (
        best.number,
        best.values[0],
        dict(best.params),
    )
    front = study_lib.pareto_front(study, spec)
    if front:
        log(f"Pareto front ({' vs '.join(study_lib.objective_names(spec))}): " + ", ".join(
            f"trial {t.number} ({', '.join(f'{v:.4g}' for v in t.values)})" for t in front
        ))  # fmt: skip
    log(f"best trial {best.number}: value={best.values[0]:.4f} {study_lib.format_params(best.params)}")
    return summary
