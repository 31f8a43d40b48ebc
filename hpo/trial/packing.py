"""What runs inside a packed job: several trials (or --workers workers) at once on one GPU.

A CIFAR-size trial uses a fraction of an A100/H100. ``resources.trials_per_gpu: k`` makes one job
run k members at once, each in its own process (its own CUDA context, its own torch threads), so
that a member that is pruned, fails or runs out of memory ends alone while the others go on.

The job's own process (what submitit runs) only starts the members and waits for them. Slurm's
signal before the time limit, or a preemption's, reaches it (``--signal=B:USR2@90``); it passes the
signal on to every member, which checkpoints and asks for the requeue as an unpacked trial does
(:meth:`hpo.trial.task.TrialTask.checkpoint`), and requeues the job once they have answered: on
the next run each trial resumes from its own checkpoint, and a trial that ended meanwhile is
skipped. Each member writes its own log beside the job's, ``<job>_slot<i>_log.out`` / ``.err``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import cloudpickle_dump, pickle_load

from hpo import joblog
from hpo.executors.jobs import member_log

log = logging.getLogger("hpo.trial.packing")  # also when run as __main__ (a member)

ENV_SLOT = "HPO_PACK_SLOT"
"""The member's place in its job (0 to k - 1), for its log and its trial's attributes."""
ENV_SIZE = "HPO_PACK_SIZE"
"""How many members its job runs: a member's share of the job's GPU is 1/size."""

REQUEUE_EXIT = 75
"""A member's exit status after it checkpointed for the requeue its job is about to get."""

ANSWER_WAIT_S = 60.0
"""How long the job waits for its members to checkpoint after the signal (which comes 90 s
before the time limit)."""

POLL_S = 0.5


@dataclasses.dataclass
class PackedJob:
    """k members (``TrialTask`` or ``WorkerTask``), each run in its own process."""

    members: list[Any]

    def __post_init__(self) -> None:
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._exits: dict[int, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"members": self.members}  # the processes are this run's

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.members = state["members"]
        self.__post_init__()

    def __call__(self) -> dict[str, Any]:
        joblog.to_stdout()
        env = submitit.JobEnvironment()
        folder = Path(env.paths.folder)
        job_id = str(env.job_id)
        for slot, member in enumerate(self.members):
            pickle_path = _member_pickle(folder, job_id, slot)
            cloudpickle_dump(member, pickle_path)
            with (
                open(member_log(folder, job_id, slot, False), "ab") as out,
                open(member_log(folder, job_id, slot, True), "ab") as err,
            ):
                self._procs[slot] = subprocess.Popen(
                    [sys.executable, "-u", "-m", "hpo.trial.packing", str(pickle_path)],
                    env={**os.environ, ENV_SLOT: str(slot), ENV_SIZE: str(len(self.members))},
                    stdout=out,
                    stderr=err,
                    preexec_fn=_member_started,
                )
        log.info(
            f"{len(self.members)} members started: pids {', '.join(str(p.pid) for p in self._procs.values())}"
        )
        while self._running():
            time.sleep(POLL_S)
        log.info(f"members ended, exit statuses {self._statuses()}")
        return {"exits": self._statuses()}

    def _statuses(self) -> list[int | None]:
        return [self._exits.get(slot) for slot in range(len(self.members))]

    def checkpoint(self) -> Any:
        """Slurm's signal before the time limit or a preemption: every member checkpoints (its own
        ``checkpoint()``, run in its process on the signal passed on), then the job requeues with
        the members as they left themselves. A member killed before it answered has not told its
        trial either: it is requeued as it was. Nothing to requeue for (every member ended, or
        none can resume): None, and the job ends."""
        deadline = time.monotonic() + ANSWER_WAIT_S
        while self._running() and time.monotonic() < deadline:
            # Again each second: a member still starting has not yet set its handler (it ignores
            # the signal until then).
            for slot, proc in self._procs.items():
                if slot not in self._exits:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGUSR2)
            time.sleep(1.0)
        requeue = [slot for slot, code in self._exits.items() if code == REQUEUE_EXIT or code < 0]
        log.info(f"members answered the signal: exit statuses {self._statuses()}; requeued: {requeue}")
        if not requeue:
            return None
        env = submitit.JobEnvironment()
        folder, job_id = Path(env.paths.folder), str(env.job_id)
        # A member that answered left itself in its pickle (its count of requeues without progress).
        members = [
            pickle_load(_member_pickle(folder, job_id, slot)) if slot in requeue else member
            for slot, member in enumerate(self.members)
        ]
        return submitit.helpers.DelayedSubmission(PackedJob(members))

    def _running(self) -> bool:
        """Reaps the members that ended (``os.waitpid``, which holds no lock: this also runs in
        the signal handler, which may interrupt the loop that calls it)."""
        for slot, proc in self._procs.items():
            if slot in self._exits:
                continue
            try:
                pid, status = os.waitpid(proc.pid, os.WNOHANG)
            except ChildProcessError:
                # Reaped by the loop this handler interrupted, its status lost: taken as killed
                # (requeued as it left itself; a trial it told is skipped on the next run).
                pid, status = proc.pid, signal.SIGKILL
            if pid:
                self._exits[slot] = os.waitstatus_to_exitcode(status)
                proc.returncode = self._exits[slot]  # Popen must not wait for it again
        return len(self._exits) < len(self._procs)


def _member_pickle(folder: Path, job_id: str, slot: int) -> Path:
    return folder / f"{job_id}_slot{slot}_member.pkl"


def _member_started() -> None:
    """In a member before it runs Python: it ends with its job's process (killed by the local
    executor's cancel, say: no trial trains on in a process nobody watches), and Slurm's signal
    (``scancel --full`` sends it to every process of the job) cannot kill it before its handler is
    set: it is ignored until then."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _run_member(pickle_path: Path) -> int:
    """One member, in its own process: its task run as submitit would run it, the job's signal
    answered as submitit would answer it."""
    from submitit.core.utils import UncompletedJobError

    joblog.to_stdout()
    member = pickle_load(pickle_path)

    def requeue(signum: int, frame: Any) -> None:
        # Once: the same signal from Slurm and from the job's process, or one during the exit
        # (when Python has put back the default handler, which would kill the process).
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        checkpoint = getattr(member, "checkpoint", None)
        delayed = checkpoint() if checkpoint is not None else None
        if delayed is None:
            # As submitit: the member cannot resume, its run ends here with an error it records.
            raise UncompletedJobError("Job not requeued: the member cannot resume from a checkpoint")
        cloudpickle_dump(delayed.function, pickle_path)
        log.info("checkpointed for the requeue of the job")
        sys.exit(REQUEUE_EXIT)

    signal.signal(signal.SIGUSR2, requeue)
    signal.signal(signal.SIGTERM, lambda signum, frame: log.warning("Bypassing signal SIGTERM"))
    try:
        member()
    except SystemExit as exit_:
        return 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(_run_member(Path(sys.argv[1])))
