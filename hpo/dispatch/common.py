"""What every dispatch mode shares: opening the study for a launch, the trials in flight, how a
trial's end is seen and logged, and the summary at the end. Where the jobs run is the executor's
business (``hpo.executors``): this module asks it, and never which one it is.

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
import signal
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import optuna

from hpo import executors, failures, record, requeue, search, study_record, tally, warm_start
from hpo.budget import admission
from hpo.dispatch.lease import Lease
from hpo.dispatch.progress import Progress
from hpo.errors import NotReadyError
from hpo.executors import jobs
from hpo.storage import StorageRef, check_reachable, open_storage
from hpo.trial.objective import Objective

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from hpo.config import StudySpec


@dataclasses.dataclass
class LaunchOptions:
    executor: str
    """The name of its executor (an ``hpo.executors`` entry point)."""
    workers: int | None = None
    objective: Objective | None = None
    """None: the study's own (``hpo.trial.task.objective_for``)."""
    poll_interval_s: float = 0.25
    progress: bool = True
    """A live progress line (plain lines when not on a terminal)."""
    allow_space_change: bool = False


@dataclasses.dataclass
class InFlight:
    """A trial whose job this launcher watches."""

    number: int
    trial_id: int
    job_id: str
    executor: executors.Executor
    tasks: int
    job: Any = None
    """The submitit job; None where the executor watches a job by its id (a local process
    re-attached by pid after a relaunch)."""
    told_at: float | None = None
    """When its job was first seen with no trial of its own running (monotonic), its trial and
    any packed with it told: the job may still be exiting."""
    finished: optuna.trial.FrozenTrial | None = None
    """Its trial as first seen finished (its job may still be on the cluster)."""
    read_at: float = float("-inf")
    """When the launcher last read its trial from the study (monotonic)."""
    slot: int | None = None
    """Its place in a packed job (``resources.trials_per_gpu``), whose log is its own."""


@dataclasses.dataclass
class LaunchSummary:
    counts: dict[str, int]
    best_number: int | None
    best_value: float | None
    best_params: dict[str, Any]
    cancelled: bool = False
    """`hpo cancel` stopped the study: no completed trial is then no failure of the launcher."""
    failing: str | None = None
    """The launch stopped as its first trials failed the same way (``hpo.budget.failing``)."""


Log = Callable[[str], None]


def open_study(
    spec: StudySpec,
    storage: StorageRef,
    *,
    reseed: bool = True,
    allow_space_change: bool = False,
    schema_checked: bool = False,
) -> tuple[optuna.Study, BaseStorage, warm_start.Plan]:
    """The launch set-up every backend shares: the storage reached (its schema created, unless
    ``schema_checked``: the launcher that submitted this job did it), the study created or
    resumed, checked against what the stored study means (a relaunch that would mix values of
    another metric, other settings or, unless allowed, another search space is refused before
    anything is written), its metric named. Returns the study, the opened storage (the
    Ray backend's searcher writes through the same one) and what a warm start is to add, read
    before the study is created (a source that cannot be is bad input, exit 2) and written by
    ``warm_start.apply`` under the study's lease."""
    # In an allocation the schema check (alembic's scripts read, half a CPU-second) would only
    # slow the start of the Ray head beside it.
    backend = open_storage(storage, create=False) if schema_checked else check_reachable(storage, spec.source)
    planned = warm_start.plan(spec, storage)
    study = search.load(spec, backend, create=True)
    search.check_direction(study, spec)
    if search.check_definition(study, spec, allow_space_change=allow_space_change):
        study_record.store_definition(study, search.definition(spec))
    search.name_objective(study, spec)
    if reseed:
        # A relaunch continues the seeded sequence elsewhere instead of replaying its first proposals.
        search.reseed_sampler(study, spec, seed_stream=len(study.get_trials(deepcopy=False)))
    return study, backend, planned


class Deferral:
    """SIGINT, SIGTERM and SIGHUP held (see :func:`signals_deferred`), with a pause that lets them through."""

    def __init__(self) -> None:
        self.held: list[int] = []
        signals = [signal.SIGINT, signal.SIGTERM]
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup: a hang-up is no stop
            signals.append(signal.SIGHUP)
        self.previous = {sig: signal.getsignal(sig) for sig in signals}

    def hold(self) -> None:
        for sig in self.previous:
            signal.signal(sig, lambda signum, frame: self.held.append(signum))

    def release(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def sleep(self, seconds: float) -> None:
        """Wait with the signals let through (between two sbatch tries nothing is half-done): a
        stop now raises here, and the caller closes the trial it holds."""
        self.release()
        try:
            if self.held:  # held before the release: raised now, with the handlers restored
                raise KeyboardInterrupt
            time.sleep(seconds)
        finally:
            self.hold()


@contextlib.contextmanager
def signals_deferred() -> Iterator[Deferral]:
    """Hold SIGINT, SIGTERM and SIGHUP while a job is submitted and its id stored: a launcher stopped in
    between would leave a job that no stored trial points to. (A signal mask would not do: the
    kernel may hand the signal to another thread, and Python still raises in the main one.)

    The stop reaches sbatch too (Ctrl-C signals the terminal's whole process group, a requeue or a
    cancel every process of the launcher's job): a submission that failed meanwhile was stopped, not
    refused, and ends the launch as the stop does."""
    deferral = Deferral()
    deferral.hold()
    try:
        yield deferral
    except Exception as err:
        if deferral.held:
            raise KeyboardInterrupt from err
        raise
    finally:
        deferral.release()
    if deferral.held:
        raise KeyboardInterrupt


class Dispatcher:
    """What the per-trial and --workers modes share: the trials in flight, their end, the budget,
    the log."""

    def __init__(
        self,
        spec: StudySpec,
        storage: StorageRef,
        study: optuna.Study,
        options: LaunchOptions,
        log: Log,
        deadline: float | None,
        progress: Progress | None = None,
        claim: Lease | None = None,
    ) -> None:
        self.spec = spec
        self.storage = storage
        self.study = study
        self.options = options
        self.log = log
        self.deadline = deadline
        self.started = time.time()
        self.space = search.distributions(spec)
        self.in_flight: list[InFlight] = []
        self.executor = executors.get(options.executor, log)
        """The launch's own executor; the jobs of an earlier launch are watched by theirs."""
        self._executors = {self.executor.name: self.executor}
        self.best: float | None = None
        self.progress = progress
        self.claim = claim
        """The study's launcher lease, confirmed before each submission."""
        self.gate = admission.Gate(spec, study, started=self.started, deadline=deadline, log=log)
        self.ended: list[optuna.trial.FrozenTrial] = []
        """This launch's trials in the order they were seen ending (the fail-fast rule reads them;
        the stop rules and the budget look again when it grows)."""

    def _accepting(self) -> admission.Admission:
        """Whether new trials may start (``hpo.budget.admission``: the timeout, `hpo cancel` since
        this launch, fail fast, the stop rules, the compute budget). Asked between submissions
        only, so that a cancel it sees is acknowledged to `hpo cancel` (which waits for that) with
        no submission under way."""
        running = sum(1 for entry in self.in_flight if entry.finished is None)
        admission = self.gate.ask(self.ended, running, cut_short=self._cut_short)
        if self.progress is not None and not admission.open:
            self.progress.closed = True  # no trial starts again: the time left is the running ones'
        return admission

    def _cut_short(self) -> list[int]:
        """End the trials in flight when the launch stops on a failure no rerun changes: they run
        the same set-up (on a cluster, each may wait in the queue only to fail). Their jobs are
        cancelled after their trials are failed, so the cancel is not taken for an outside one."""
        cut = []
        for entry in self.in_flight:
            with record.unless_told_meanwhile():  # told meanwhile: its state stands
                record.fail(self.study, entry.number, record.REASON_STOPPED_FAILING)
                cut.append(entry.number)
            if entry.number not in cut:
                continue
            if entry.job is not None:
                with contextlib.suppress(Exception):  # a job that has just ended
                    entry.job.cancel(check=False)
        return cut

    def _take_over_running_trials(self, per_trial: bool) -> dict[str, executors.Executor]:
        """Deal with the trials a previous launcher left RUNNING: re-attach per-trial jobs that
        still run (``per_trial``), fail those whose job is gone. Returns the live workers' job ids
        with their executor (as they were submitted)."""

        this_mode = record.DispatchMode.PER_TRIAL if per_trial else record.DispatchMode.WORKERS
        refuse_live_jobs_of_other_modes(self.spec, self.study, this_mode, self.executor_named)
        live_workers: dict[str, executors.Executor] = {}
        failed = False
        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            mode = record.dispatch_mode(trial)
            job_id = trial.user_attrs.get(record.ATTR_JOB_ID)
            if mode == record.DispatchMode.RAY:  # its Ray job has ended (see the refusal above)
                self._fail(trial.number, "its Ray job ended first")
                failed = True
                continue
            if job_id is None:
                # None: the ask itself failed after creating the trial (a worker's: see below)
                if mode != record.DispatchMode.WORKERS:
                    with record.unless_told_meanwhile():
                        record.close_not_run(
                            self.study,
                            trial.number,
                            "never submitted: the launcher stopped between ask and submit",
                        )
                continue  # a worker's trial between ask and start: its worker tells it
            job_id = str(job_id)
            executor = self.executor_named(record.executor_name(trial) or self.executor.name)
            slot = trial.user_attrs.get(record.ATTR_PACK_SLOT)
            entry = InFlight(
                trial.number,
                record.trial_id(trial),
                job_id,
                executor,
                self.spec.resources.world_size,
                job=executor.job(self.spec, job_id),
                slot=None if slot is None else int(slot),
            )
            if self._ended(entry):
                self._fail(trial.number, self._end_reason(entry))
                failed = True
            elif mode == record.DispatchMode.WORKERS:
                live_workers[job_id] = executor
            elif per_trial:
                self.in_flight.append(entry)
                self.log(f"trial {trial.number} re-attached to {executor.name} job {job_id}")
        if failed:  # a job that ended while no launcher watched it is retried as any other
            self._queue_retries()
        return live_workers

    def executor_named(self, name: str) -> executors.Executor:
        """The executor of this name, one per launch (its view of its jobs' states is shared)."""
        if name not in self._executors:
            self._executors[name] = executors.get(name, self.log)
        return self._executors[name]

    def _ended(self, entry: InFlight) -> bool:
        return entry.executor.ended(entry.job_id, entry.job)

    def _end_reason(self, entry: InFlight) -> str:
        if entry.job is None:
            return f"{entry.executor.name} process {entry.job_id} exited without telling a result"
        state = entry.executor.end_state(entry.job)
        detail = jobs.error_line(self.spec, entry.job_id, entry.tasks, entry.slot)
        reason = f"job {entry.job_id} {state} without telling a result" + (f": {detail}" if detail else "")
        if study_record.cancel_requested_at(self.study) >= self.started:
            # Seen before `hpo cancel` wrote its own reason on the trial: the cancel ended it.
            return f"{record.REASON_CANCELLED} ({reason})"
        return reason

    def _fail(self, number: int, reason: str, out_of_memory: bool = False) -> None:
        # Told by the trial's own process meanwhile: its state stands. A storage that cannot be
        # written (a journal on a full disk) stops the launch.
        with record.unless_told_meanwhile():
            if out_of_memory:
                record.tell_infeasible(self.study, number, reason, search.directions(self.spec))
                return
            record.fail(self.study, number, reason)

    def _report(self, trial: optuna.trial.FrozenTrial) -> None:
        self.ended.append(trial)
        state = trial.state.name
        if state == "COMPLETE" and trial.values and not trial.user_attrs.get(record.ATTR_INFEASIBLE):
            value = trial.values[0]
            better = self.best is None or (
                value > self.best if self.spec.study.direction == "maximize" else value < self.best
            )
            if better:
                self.best = value
            note = " (best so far)" if better else ""
            cost = (
                f" {self.spec.study.also_minimize}={tally.format_value(trial.values[1])}"
                if self.spec.study.also_minimize
                else ""
            )
            self.log(
                f"trial {trial.number} COMPLETE: {self.spec.study.metric}={tally.format_value(value)}{cost}{note}"
            )
            last = tally.steps_mismatch(trial, self.spec)
            if last is not None:
                self.log(f"warning: {steps_warning(self.spec, trial.number, last)}")
        elif record.is_diverged(trial):
            reason = trial.user_attrs.get(record.ATTR_FAIL_REASON, "")
            self.log(f"trial {trial.number} DIVERGED: {reason} (not retried: its parameters diverge)")
        elif state == "PRUNED":
            step = max(trial.intermediate_values) if trial.intermediate_values else 0
            value = tally.metric_value(trial)
            shown = tally.format_value(value)
            self.log(f"trial {trial.number} PRUNED at epoch {step}: {self.spec.study.metric}={shown}")
        elif trial.user_attrs.get(record.ATTR_INFEASIBLE):
            self.log(f"trial {trial.number} infeasible: {trial.user_attrs.get(record.ATTR_FAIL_REASON, '')}")
        else:
            reason = str(trial.user_attrs.get(record.ATTR_FAIL_REASON, ""))
            permanent = tally.ran_and_failed(trial) and failures.classify(reason).permanent
            self.log(
                f"trial {trial.number} {state}: {reason}"
                + (" (not retried: no rerun changes it)" if permanent else "")
            )

    # --- --workers ----------------------------------------------------------------------------
    def _queue_retries(self) -> None:
        queue_retries(self.study, self.spec, self.log)

    def report_interrupted(self) -> None:
        running = [entry for entry in self.in_flight if entry.finished is None]
        if not running:
            return
        numbers = ", ".join(str(entry.number) for entry in running)
        self.log(self.executor.interrupted_line(numbers))


def steps_warning(spec: StudySpec, number: int, last: int) -> str:
    assert spec.objective is not None
    return (
        f"trial {number} reported steps up to {last}, {spec.source}: objective.steps says "
        f"{spec.objective.steps}: the pruner takes objective.steps for a full run's last step; set it to {last}"
    )


def queue_retries(study: optuna.Study, spec: StudySpec, log: Log) -> None:
    for number in requeue.queue_retries(study, spec.study.max_retries):
        log(f"trial {number} failed: queued a retry with the same parameters")


def worker_entry(job: Any, executor: executors.Executor) -> InFlight:
    return InFlight(-1, -1, str(job.job_id), executor, 1, job)


def refuse_live_jobs_of_other_modes(
    spec: StudySpec,
    study: optuna.Study,
    mode: record.DispatchMode,
    executor_named: Callable[[str], executors.Executor] = executors.get,
) -> None:
    """Refuse, in one line naming them, a launch beside trials that jobs of another launch mode
    still run (a Ray allocation, --workers jobs, per-trial jobs whose launcher was stopped): it
    would neither count them in ``max_concurrent`` nor leave them their trials. A trial whose job
    the scheduler says has ended is this launch's to fail or retry, as in its own mode."""
    live: dict[str, list[int]] = {}
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        other = record.dispatch_mode(trial)
        job_id = trial.user_attrs.get(record.ATTR_JOB_ID)
        if other in (None, mode) or job_id is None:
            continue
        executor = executor_named(record.executor_name(trial) or spec.resources.executor)
        if not executor.ended(str(job_id), executor.job(spec, str(job_id))):
            live.setdefault(f"{executor.name} job {job_id} ({other.value})", []).append(trial.number)
    if live:
        running = "; ".join(f"{job}: trial {', '.join(map(str, numbers))}" for job, numbers in live.items())
        raise NotReadyError(
            f"study {spec.study.name!r} has trials running in jobs of another launch mode ({running}): "
            "a launch in this mode would run beside them, past study.max_concurrent",
            "wait for them to end (`hpo status`), relaunch in their mode to follow them, or end them with `hpo cancel`",
        )


def refuse_during_cancel(spec: StudySpec, study: optuna.Study) -> None:
    """Refuse, in one line, a launch while `hpo cancel` runs on the study: it would start trials
    that the cancel, waiting on the study's launcher, neither ends nor names."""
    requested = study_record.cancel_under_way(study)
    if requested:
        raise NotReadyError(
            f"study {spec.study.name!r} is being cancelled (`hpo cancel` since "
            f"{time.strftime('%H:%M:%S', time.localtime(requested))}): a launch now would run beside it",
            "relaunch once `hpo cancel` has returned",
        )


def rerun_set_up_failures(study: optuna.Study, log: Log) -> None:
    """Queue again the enqueued configurations a set-up mistake failed (``hpo.requeue.rerun_set_up_failures``),
    saying so: the launch after the fix runs them first."""
    numbers = requeue.rerun_set_up_failures(study)
    if numbers:
        log(
            f"{len(numbers)} enqueued configuration(s) that a set-up mistake failed on an earlier launch "
            f"(trial {', '.join(map(str, numbers))}) run again first"
        )


def summarize(study: optuna.Study, spec: StudySpec, log: Log = print, since: float = 0.0) -> LaunchSummary:
    """The launch's closing lines; ``since`` (the launch's start) tells a cancel or a fail-fast
    verdict of this launch from an older one."""
    counts: dict[str, int] = {}
    for trial in tally.own_trials(study):
        state = record.shown_state(trial)
        counts[state] = counts.get(state, 0) + 1
    cancelled = study_record.cancel_requested_at(study) >= since > 0
    summary = LaunchSummary(
        counts=counts,
        best_number=None,
        best_value=None,
        best_params={},
        cancelled=cancelled,
        failing=admission.failing_line(study, since) if since > 0 else None,
    )
    log("trials: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    best = tally.best_trial(study, spec)
    if best is None:
        log("no trial completed: the study was cancelled (hpo cancel)" if cancelled else "no trial completed")
        return summary
    summary.best_number, summary.best_value, summary.best_params = (
        best.number,
        best.values[0],
        dict(best.params),
    )
    front = tally.pareto_front(study, spec)
    if front:
        log(f"Pareto front ({' vs '.join(search.objective_names(spec))}): " + ", ".join(
            f"trial {t.number} ({', '.join(tally.format_value(v) for v in t.values)})" for t in front
        ))  # fmt: skip
    log(
        f"best trial {best.number}: value={tally.format_value(best.values[0])} {tally.format_params(best.params)}"
    )
    return summary
