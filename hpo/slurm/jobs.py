"""Slurm jobs through submitit, from a study's resources: submission, states, the queue.

submitit does the submission, the pickling of the task, job state through sacct and the logs;
this module only maps the study file's ``resources`` section onto its parameters, watches the
jobs through sacct and squeue, and re-creates job handles from stored job ids when a launcher
resumes a study. It is the one module that uses submitit's private ``_make_sbatch_string``: a
submitit release that changes it breaks here only. ``hpo.slurm.executor`` puts these functions
behind the executor protocol.
"""

from __future__ import annotations

import logging
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import submitit
from submitit.slurm.slurm import _make_sbatch_string

from hpo.errors import LaunchError, one_line
from hpo.executors.jobs import JOB_ROLES, SUBMIT_MODULE, job_name, jobs_folder
from hpo.paths import private_dir
from hpo.slurm import settings

T = TypeVar("T")

if TYPE_CHECKING:
    import submitit

    from hpo.config import StudySpec

SLURM_OUTAGE_TOLERANCE_S = 900.0
"""How long the launcher keeps trying sbatch while the Slurm controller does not answer (a restart,
a failover, an RPC rate limit) before it gives up on the submission."""

SIGNAL_DELAY_S = 90
"""How long before a Slurm job's time limit its process is told to checkpoint and requeue
(submitit's default)."""

UNKNOWN_GRACE_S = float(os.environ.get("HPO_UNKNOWN_GRACE_S", "300"))
"""How long a job that neither sacct nor squeue knows is given before the launcher takes it as
ended. ``HPO_UNKNOWN_GRACE_S`` overrides it (the fault tests shorten it to pass it quickly)."""

REQUEUE_GRACE_S = float(os.environ.get("HPO_REQUEUE_GRACE_S", "90"))
"""How long a job that ended NODE_FAIL or PREEMPTED is given to be requeued by Slurm before the
launcher takes it as ended and fails its trial. ``HPO_REQUEUE_GRACE_S`` overrides it (the local test
cluster requeues within seconds, and its fault tests shorten it)."""

# sbatch's words for a controller that is away or overloaded: worth trying again.
_CONTROLLER_AWAY = (
    "unable to contact slurm controller",
    "socket timed out",
    "resource temporarily unavailable",
    "slurm temporarily unable",
    "connection refused",
    "zero bytes were transmitted",
    "rpc rate limit",
    "backup controller",
)

_SLURM_ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "TIMEOUT", "REVOKED", "SPECIAL_EXIT"}  # fmt: skip
# Ends that Slurm follows with a requeue of a requeueable job (trial jobs are): sacct shows them
# until the requeued run's record appears, and submitit's watcher keeps NODE_FAIL as final.
_SLURM_MAY_REQUEUE = {"NODE_FAIL", "PREEMPTED"}


def slurm_executor(
    spec: StudySpec,
    job_name: str,
    array_parallelism: int | None = None,
    time_min: int | None = None,
    direct: bool = False,
) -> Any:
    """A submitit SlurmExecutor whose jobs get the study's per-trial resources (``time_min``
    overrides the time limit, for --workers jobs that run many trials; ``direct``: see
    :func:`runs_direct`)."""
    folder = private_dir(jobs_folder(spec))  # submitit's pickles are code
    direct = direct and runs_direct(spec)
    python = spec.resources.python or sys.executable
    slurm = submitit.SlurmExecutor(folder=folder / "%j", python=_interpreter(python, direct))
    slurm.update_parameters(**slurm_parameters(spec, job_name, array_parallelism, time_min, direct))
    # submitit sleeps a whole 0.2 s between two submissions. A job submitted before the job whose
    # CPU it takes has completed starts at the scheduling pass that completion triggers; one
    # submitted after waits for a pass its submission triggers, which slurmctld holds up to
    # batch_sched_delay (3 s) after the last. Trials that end together free their places within
    # a fraction of a second: the launcher's own work between two submissions (an ask, two
    # writes: ~0.1 s) already spaces them.
    slurm._throttling = 0.0
    return slurm


def runs_direct(spec: StudySpec) -> bool:
    """Whether a job of one process (a trial that is not a DDP run, a --workers worker) runs its
    Python in the batch script itself rather than in an srun step. An srun step costs slurmctld
    three RPCs per job (allocation info, step creation, step completion) for nothing one process
    needs. The script ``exec``s Python, so the signal before the time limit reaches it as the
    batch shell (``--signal=B:USR2@90``); ``scancel --full --signal=USR2`` reaches it by hand
    (a plain ``scancel --signal`` skips the batch step)."""
    return spec.resources.world_size == 1


def _interpreter(python: str, direct: bool) -> str:
    return f"exec {python}" if direct else python


def slurm_parameters(
    spec: StudySpec,
    job_name: str,
    array_parallelism: int | None = None,
    time_min: int | None = None,
    direct: bool = False,
) -> dict[str, Any]:
    res, slurm = spec.resources, settings.of(spec)
    params: dict[str, Any] = {
        "job_name": job_name,
        "time": time_min or res.time_min,
        "nodes": res.nodes,
        "ntasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.job_cpus_per_task,
        "setup": list(res.setup),
        # One failed rank ends the step at once instead of leaving the others in a collective
        # until the DDP timeout: GPU-hours are not spent waiting for a dead peer.
        "srun_args": ["--kill-on-bad-exit=1"],
        # Requeueable: after a preemption, a node failure, `scontrol requeue`, or submitit's
        # requeue at the time limit, the job runs again and resumes its trial from its checkpoint
        # (submitit's --open-mode=append keeps the earlier runs' logs).
        "additional_parameters": {"requeue": True, **slurm.sbatch},
    }
    if direct:
        params["use_srun"] = False
        # submitit's default (USR2@90) signals the job's steps, of which a direct job has none.
        params["additional_parameters"] = {
            "requeue": True,
            "signal": f"B:USR2@{SIGNAL_DELAY_S}",
            **slurm.sbatch,
        }
    if res.gpus_per_node:
        params["gpus_per_node"] = res.gpus_per_node
    if res.job_mem_gb is not None:
        params["mem"] = f"{int(res.job_mem_gb * 1024)}MB"
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(slurm, key)
        if value is not None:
            params[key] = value
    if array_parallelism is not None:
        params["array_parallelism"] = array_parallelism
    return params


def render_sbatch(
    spec: StudySpec,
    job_name: str,
    workers: int | None = None,
    time_min: int | None = None,
    direct: bool = False,
) -> str:
    """The sbatch script a trial job (or ``--workers`` job array) would be submitted with (for
    ``--dry-run``, and compared with reference files by the tests)."""

    direct = direct and runs_direct(spec)
    params = slurm_parameters(spec, job_name, workers, time_min, direct)
    if workers:  # a --workers job array: submitit numbers its tasks and caps how many run at once
        params["map_count"] = workers
    return sbatch_text(spec, params, jobs_folder(spec) / "%j")


def sbatch_text(spec: StudySpec, params: dict[str, Any], folder: Path) -> str:
    """The script submitit submits with ``params`` from ``folder``."""
    python = _interpreter(spec.resources.python or sys.executable, params.get("use_srun") is False)
    command = f"{python} -u -m {SUBMIT_MODULE} {shlex.quote(str(folder))}"
    # submitit renders the script at submission with this function; calling it directly works
    # where there is no srun (a SlurmExecutor refuses to exist there).
    text: str = _make_sbatch_string(command=command, folder=folder, **params)
    return text


def queued_jobs(spec: StudySpec) -> list[str]:
    """The ids of this user's pending and running Slurm jobs of the study (none without Slurm)."""
    if shutil.which("squeue") is None:
        return []
    names = ",".join(job_name(spec, role) for role in JOB_ROLES)
    user = pwd.getpwuid(os.getuid()).pw_name
    proc = subprocess.run(
        ["squeue", "-h", "-u", user, "--name", names, "-o", "%i"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise LaunchError(f"squeue failed: {proc.stderr.strip() or proc.returncode}")
    return parse_job_ids(proc.stdout)


def parse_job_ids(out: str) -> list[str]:
    """``squeue -h -o %i``: the job ids, one per line, as scancel and sacct take them: an array
    task as ``1562_0`` (with ``-r``), a pending array's tasks as one ``1562_[0-2]`` (without)."""
    return [line.strip() for line in out.splitlines() if line.strip()]


# sbatch's words for a job refused because the user's job limit is full (QOSMaxSubmitJobPerUserLimit,
# AssocMaxSubmitJobLimit, QOSGrpSubmitJobsLimit...): worth trying again once a job ends.
_JOB_LIMIT_FULL = ("maxsubmitjob", "grpsubmitjob")


def job_limit_full(err: BaseException) -> bool:
    """Whether a failed submission says the user's MaxSubmitJobs (of a QoS or an association) is full."""
    text = str(err).lower()
    return any(words in text for words in _JOB_LIMIT_FULL)


def controller_away(err: BaseException) -> bool:
    """Whether a failed submission says the Slurm controller is away, rather than refusing the job."""
    text = str(err).lower()
    return any(words in text for words in _CONTROLLER_AWAY)


def submit_when_controller_answers(
    submit: Callable[[], T],
    log: Callable[[str], None],
    pause: Callable[[float], None] = time.sleep,
    tolerance_s: float = SLURM_OUTAGE_TOLERANCE_S,
    still_wanted: Callable[[], None] = lambda: None,
) -> T:
    """``submit()``, tried again with backoff (5 s doubling to 60 s) for up to ``tolerance_s``
    while the controller is away or the user's job limit is full (the user's other jobs count
    against it too); ``still_wanted()`` before each new try raises if the submission
    is no longer wanted (a cancel, a launcher that lost the study meanwhile). Trying again cannot
    run a trial twice: a job whose sbatch answer was lost finds no pickle under its id (submitit
    moves it there only once sbatch answered) and ends within a minute without running anything."""
    delay = 5.0
    away_since = time.monotonic()
    while True:
        try:
            return submit()
        except Exception as err:
            away_s = time.monotonic() - away_since
            full = job_limit_full(err)
            if not (full or controller_away(err)) or away_s + delay > tolerance_s:
                raise
            what = "Slurm refuses more jobs of yours" if full else "Slurm controller unreachable"
            log(f"{what} ({one_line(err, last=True, name=False)}); sbatch again in "
                f"{delay:.0f} s (for {away_s:.0f} s now; the launcher waits up to {tolerance_s / 60:.0f} min)")  # fmt: skip
            pause(delay)
            delay = min(2 * delay, 60.0)
            still_wanted()


def user_queue() -> set[str] | None:
    """The ids of this user's jobs slurmctld lists (pending, running, completing; one per array
    task); None when squeue cannot tell (the controller away)."""
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-r", "-u", pwd.getpwuid(os.getuid()).pw_name, "-o", "%i"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return set(parse_job_ids(proc.stdout)) if proc.returncode == 0 else None


def slurm_job(spec: StudySpec, job_id: str) -> submitit.Job[Any]:

    return submitit.SlurmJob(folder=jobs_folder(spec) / "%j", job_id=job_id)


class SlurmStates:
    """Slurm states of the study's jobs, from one ``sacct`` call for all of them every few seconds.

    submitit's own ``done()`` polls sacct at most every 10 minutes once a job is old, and counts
    SUSPENDED as done and a job that sacct no longer shows (UNKNOWN) as running: neither fits a
    launcher that must notice a dead trial job quickly and never fail a suspended one.
    """

    def __init__(
        self,
        refresh_s: float = 10.0,
        unknown_grace_s: float = UNKNOWN_GRACE_S,
        requeue_grace_s: float = REQUEUE_GRACE_S,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.refresh_s = refresh_s
        self.unknown_grace_s = unknown_grace_s
        self.requeue_grace_s = requeue_grace_s
        self.log = log
        self._last_refresh = float("-inf")
        self._seen_since: dict[tuple[str, str], float] = {}
        self._queue: set[str] | None = None
        self._queue_read_at = float("-inf")
        self._queue_every_s = refresh_s
        self._vouched: set[str] = set()
        self._unknown_since: dict[str, float] = {}
        self._known_since: dict[str, float] = {}
        _quiet_repeated_sacct_warnings()

    def ended(self, job: Any) -> bool:
        """Whether the job will run no more: its rank 0 left a result, or Slurm says it ended."""
        if Path(job.paths.result_pickle).exists() and not self._requeued_after_error(job):
            return True
        now = time.monotonic()
        if now - self._last_refresh >= self.refresh_s:
            job.watcher.update()  # one sacct for every job registered with submitit's watcher
            self._last_refresh = now
        state = self.state(job)
        job_id = str(job.job_id)
        if state != "UNKNOWN":
            self._unknown_since.pop(job_id, None)
        elif self._listed_by_squeue(job_id) is not False:
            # sacct cannot tell (slurmdbd away, or the job too new for it), and slurmctld lists the
            # job, or is away too: nobody says it ended, so it has not.
            self._seen_since.pop((job_id, state), None)
            unknown_s = now - self._unknown_since.setdefault(job_id, now)
            # A job sacct has not learnt of yet is common for seconds: said only once it lasts.
            if (
                self.log is not None
                and job_id not in self._vouched
                and unknown_s > min(60.0, self.unknown_grace_s)
            ):
                self._vouched.add(job_id)
                self.log(f"sacct has not known job {job_id} for {unknown_s:.0f} s (slurmdbd away?); squeue "
                         "lists it, or cannot tell either: taken as running")  # fmt: skip
            return False
        # UNKNOWN: in neither sacct nor squeue; NODE_FAIL, PREEMPTED: maybe about to be
        # requeued. Either is an end only once it has lasted its grace period.
        grace = self.unknown_grace_s if state == "UNKNOWN" else self.requeue_grace_s
        if state == "UNKNOWN" or state in _SLURM_MAY_REQUEUE:
            first_seen = self._seen_since.setdefault((job_id, state), now)
            if now - first_seen <= grace:
                return False
            # submitit takes NODE_FAIL as final and stops asking sacct about the job, so the
            # cached state never shows Slurm's requeue: squeue listing the job (or unable to tell)
            # says it may run again, and a trial failed while its job runs would run twice.
            return state == "UNKNOWN" or self._listed_by_squeue(job_id) is False
        for key in [key for key in self._seen_since if key[0] == job_id]:
            del self._seen_since[key]
        return state in _SLURM_ENDED

    def _requeued_after_error(self, job: Any) -> bool:
        """Whether a run that left an error as its result was requeued, so that the job runs again.
        submitit's own ``scontrol requeue`` (the job signalled before its time limit) can be killed
        by the requeue's SIGTERM before it returns; submitit then writes that error as the job's
        result, while Slurm has the job pending again. squeue listing it says so (Slurm's state
        decides then); a success, or an error of a job squeue no longer lists, is the end."""
        try:
            outcome, _ = submitit.core.utils.pickle_load(job.paths.result_pickle)
        except Exception:  # being written, or unreadable: a result all the same
            return False
        return outcome == "error" and self.queued(str(job.job_id), self.refresh_s) is True

    def _listed_by_squeue(self, job_id: str) -> bool | None:
        known_since = self._known_since.setdefault(job_id, time.monotonic())
        listed = self.queued(job_id, self.refresh_s)
        if listed is False and self._queue_read_at < known_since:
            # A snapshot read before the launcher knew of the job (it was just submitted) cannot
            # say that the job is gone: read squeue again.
            listed = self.queued(job_id, 0.0)
        return listed

    def queued(self, job_id: str, max_age_s: float) -> bool | None:
        """Whether squeue lists the job (pending, running or completing), from one squeue of all
        the user's jobs read at most ``max_age_s`` ago; None when squeue cannot tell."""
        now = time.monotonic()
        every = max_age_s if self._queue is not None else self._queue_every_s
        if now - self._queue_read_at >= every:
            # Stamped after the call: a squeue that takes its 60 s timeout is not asked again at once.
            self._queue = user_queue()
            self._queue_read_at = time.monotonic()
            # A controller that does not answer (down, overloaded, rate-limiting) is asked less
            # often, up to once a minute, until it answers again.
            failed = self._queue is None
            self._queue_every_s = min(60.0, 2 * self._queue_every_s) if failed else self.refresh_s
        return None if self._queue is None else job_id in self._queue

    @staticmethod
    def state(job: Any) -> str:
        """The job's Slurm state word (``COMPLETED``, ``CANCELLED``, ...; ``UNKNOWN`` if sacct cannot tell)."""
        return str(job.watcher.get_state(str(job.job_id), mode="cache") or "UNKNOWN").split()[0].upper()


class _OncePerWindow(logging.Filter):
    """Lets one of submitit's "Bypassing sacct error" warnings through per window: with slurmdbd
    away, submitit warns at every poll (every 10 s for hours)."""

    def __init__(self, window_s: float = 600.0) -> None:
        super().__init__()
        self.window_s = window_s
        self._shown_at = float("-inf")

    def filter(self, record: logging.LogRecord) -> bool:
        if "Bypassing sacct error" not in record.getMessage():
            return True
        now = time.monotonic()
        if now - self._shown_at < self.window_s:
            return False
        self._shown_at = now
        record.msg = f"{record.getMessage()} (said once per {self.window_s / 60:.0f} min while it lasts)"
        record.args = ()
        return True


def _quiet_repeated_sacct_warnings() -> None:
    submitit_logger = logging.getLogger("submitit")
    if not any(isinstance(f, _OncePerWindow) for f in submitit_logger.filters):
        submitit_logger.addFilter(_OncePerWindow())
