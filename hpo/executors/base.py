"""The executor protocol: what the service asks of wherever a study's jobs run.

A launcher makes a submitit executor for its jobs, watches each job to its end, tells how it
ended, cancels it, reads its log and its cost; a trial's process asks the executor that started
it who it is (job id, nodes, rank), what it was given, and whether its job is being ended. Each
executor answers these in its own module of this package; the dispatch modes, the views and the
trial code ask through this protocol and never test which executor they have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from hpo.budget.usage import Usage
    from hpo.config import StudySpec

Log = Callable[[str], None]
T = TypeVar("T")

ENV_EXECUTOR = "SUBMITIT_EXECUTOR"
"""submitit's name, in a job's environment, of the executor that started it (slurm, local)."""


@dataclasses.dataclass(frozen=True)
class JobShape:
    """What one job of a launch asks for: its nodes, and the GPUs and CPUs on each."""

    nodes: int
    gpus_per_node: int
    cpus_per_node: int


@dataclasses.dataclass(frozen=True)
class SiteRoom:
    """What the site's limits on a user's jobs leave a study (``Executor.site_room``)."""

    jobs: int
    """How many of the study's jobs may be queued at once (at most the number asked)."""
    why: str
    """The limit that sets it, in one phrase; empty where none is below the number asked."""
    at_job_limit: bool
    """A limit that refuses submissions (not only holds them) is full at that number."""


class Executor(Protocol):
    name: ClassVar[str]
    """Its name in the study file (``resources.executor``) and on the trials it ran."""
    measured_cost: ClassVar[bool]
    """Whether its jobs' cost is measured (sacct) rather than estimated from elapsed time."""
    outlives_trial: ClassVar[bool]
    """Whether a job stays in a queue, holding resources, after its trial told its result."""
    on_this_machine: ClassVar[bool]
    """Whether its jobs run on the launcher's machine (its cores, its data, no shared folder)."""
    queue_name: ClassVar[str]
    """How its messages name it ("Slurm")."""
    settings: ClassVar[type[Any] | None]
    """The config dataclass of its own section of resources (``resources.slurm``); None: none."""
    former_keys: ClassVar[tuple[str, ...]]
    """Keys of its section that an older study file has directly under resources (read there too)."""

    def __init__(self, log: Log | None = None) -> None:
        """``log``: where it says what its jobs' states leave in doubt (a launch's log)."""

    # --- the launcher's side ----------------------------------------------------------------
    def submitter(
        self,
        spec: StudySpec,
        *,
        job_name: str,
        array_parallelism: int | None = None,
        time_min: int | None = None,
        direct: bool = False,
    ) -> Any:
        """The submitit executor for a study's jobs (``direct``: one process, no srun step)."""

    def submit_with_retries(
        self,
        submit: Callable[[], T],
        log: Log,
        pause: Callable[[float], None],
        still_wanted: Callable[[], None],
    ) -> T:
        """``submit()``, tried again while the executor's queue is away or full for a while (a
        controller restart, the user's job limit); ``pause`` waits between tries, ``still_wanted()``
        raises once the submission is no longer wanted."""

    def job(self, spec: StudySpec, job_id: str) -> Any | None:
        """A handle on a job from its stored id (a relaunch); None where the job is watched by id."""

    def ended(self, job_id: str, job: Any | None) -> bool:
        """Whether the job will run no more."""

    def end_state(self, job: Any | None) -> str:
        """How an ended job ended, in the executor's words (``TIMEOUT``, ``exited``)."""

    def killed_for_memory(self, job: Any | None) -> bool:
        """Whether the executor ended the job for exceeding its memory."""

    def still_queued(self, job_id: str, job: Any | None, max_age_s: float | None) -> bool:
        """Whether a job whose trial has told still holds its place (``max_age_s``: read the queue
        itself, at most that long ago; None: the job's own state)."""

    def cancel(self, spec: StudySpec, job_id: str) -> None:
        """Stop the job (a no-op for one that has ended)."""

    def log(
        self, spec: StudySpec, job_id: str, task: int = 0, slot: int | None = None, stderr: bool = True
    ) -> Path:
        """The job's log of task ``task``, or that of member ``slot`` of a packed job."""

    def cost(self, job_ids: Iterable[str], since: datetime | None = None) -> dict[str, Usage]:
        """What the jobs cost, by job id, where the executor measures it (else nothing)."""

    def queued_jobs(self, spec: StudySpec) -> list[str]:
        """The ids of the study's jobs in the executor's queue, found by their names (a job that
        no trial records yet); none where jobs have no queue."""

    def preflight(self, spec: StudySpec, shape: JobShape) -> None:
        """Raise ``NotReadyError`` (or ``StudyFileError``) where the study's jobs of this ``shape``
        cannot run (no way to submit from here, a partition too small, data not on disk), before
        anything is submitted; add to ``spec.warnings`` what may go wrong."""

    def site_room(self, spec: StudySpec, wanted_jobs: int, job_array: bool) -> SiteRoom:
        """What the site's limits on a user's jobs leave the study of ``wanted_jobs`` at once
        (``job_array``: as one array, --workers); all of them where the executor has no limits."""

    def job_time_limit(self, spec: StudySpec, wanted_min: int, what: str, log: Log) -> int:
        """A job's computed time limit (a --workers job's, the Ray allocation's) within the longest
        the site lets a job ask for; ``log`` says why where it lowers it."""

    def interrupted_line(self, numbers: str) -> str:
        """What a launcher stopped while trials ``numbers`` run says of them."""

    def dry_run_lines(self, spec: StudySpec) -> list[str]:
        """What ``hpo launch --dry-run`` shows of the jobs it would submit."""

    # --- the job's side ---------------------------------------------------------------------
    def identity(self) -> tuple[str, str]:
        """This process's job id and the nodes it runs on, as the trial records them."""

    def node(self) -> str:
        """The node this process runs on, as the executor names it (Slurm's node name, which may
        differ from the host name)."""

    def current_job(self) -> str | None:
        """The id of the job this process runs in (an array task's as ``1562_3``); None outside one."""

    def rank(self) -> int:
        """This process's rank among its job's tasks (where the trainer cannot read the executor's
        own variables, exported as torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``)."""

    def restart_count(self) -> int:
        """How many times this process's job was requeued (0 for its first run)."""

    def leave_step(self) -> None:
        """Make this process stand alone: a Ray worker inherits the variables of the job step it
        was started in, and would take itself for one rank of that step."""

    def allocation(self, spec: StudySpec, share: int) -> tuple[float, float]:
        """(GPUs, CPUs) one trial of this process's job holds, the job shared by ``share`` trials."""

    def job_ending(self) -> bool:
        """Whether the executor is ending this process's job (cancelled, requeued, at its limit)."""
