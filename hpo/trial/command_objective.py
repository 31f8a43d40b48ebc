"""The user's own program as a trial: ``objective.command``, run unchanged in the trial's job.

Each rank of the job runs the command once (the job's tasks are srun's, so a DDP script sees its
rank in ``SLURM_PROCID``, and in ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` as torchrun would set
them). On rank 0, each report reaches the study: a line of its output that ``metric_pattern``
matches, or a ``hpo.trial.report`` call over the socket the script inherits. When the pruner says
stop, a command that reports through its output gets SIGTERM on its process group, then SIGKILL
after ``stop_grace_s``; one that reports through ``hpo.trial`` is told and stops itself (the same
signals follow if it does not). The other ranks stop their command when rank 0 leaves a stop file
in the trial's folder, with the same grace where their script shares rank 0's answer.

Parameters become argv elements by substitution (``hpo.config.user_code``): no shell is involved.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from hpo import executors, record
from hpo.config.user_code import render
from hpo.paths import checkpoint_dir, private_dir, trial_dir
from hpo.trial import client
from hpo.trial.metric_lines import SUGGESTED_VALUE_GROUP, MetricPattern, Reading, not_a_number
from hpo.trial.objective import ObjectiveFailed, ObjectiveResult, StepReport, StepReporter, stop_at
from trainer.reporting import Decision

if TYPE_CHECKING:
    from hpo.config import StudySpec

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
"""Bytes of one output line that are read at once (a longer one is read in pieces)."""

STOP_FILE = "stop"
"""Left in the trial's folder by rank 0 when the trial is pruned: the other ranks stop too. It holds
``TOLD`` when rank 0's command was answered "stop" through ``hpo.trial``, whose answer every rank's
script shares: each then stops itself, and its signals wait the same grace as rank 0's."""

TOLD = "told"

WAIT_FOR_SLURM_KILL_S = 300.0
"""How long a job whose command Slurm terminated waits for its own end (requeue or cancel)."""

OWN_SIGNAL_GRACE_S = 0.5
"""How long a rank whose command died of a signal it did not send waits for a SIGTERM of its own
before asking Slurm whether the job is ending: a command killed alone (the kernel's out-of-memory
killer, a user's kill -9) fails its trial within this and one scontrol call."""

WAIT_FOR_OWN_SIGNAL_S = 30.0
"""How long it waits when Slurm says the job is ending (Slurm signals the step's processes one
after another, its SIGTERM may reach this rank after the command died of it)."""

DRAIN_S = 5.0
"""After the command ends, how long its output may still take to arrive."""


@dataclasses.dataclass
class CommandObjective:
    """Runs ``objective.command`` for one trial on this rank (see the module docstring)."""

    def __call__(
        self, spec: StudySpec, trial_key: int | str, params: dict[str, Any], reporter: StepReporter | None
    ) -> ObjectiveResult:
        assert spec.objective is not None and spec.objective.command is not None
        folder = private_dir(trial_dir(spec, trial_key))
        checkpoints = private_dir(checkpoint_dir(spec, trial_key))
        values = {
            **spec.objective.fixed,
            **params,
            "trial": trial_key,
            "checkpoint_dir": str(checkpoints),
            "trial_dir": str(folder),
            "python": sys.executable,
        }
        argv = render(spec.objective.command, values)
        env = {**os.environ, **trial_environment(spec, trial_key, params, checkpoints)}
        # As many threads as the job has CPUs (torch and numpy would take every core of the node),
        # and the number `hpo best` sets when it prints the command again.
        env.setdefault("OMP_NUM_THREADS", str(spec.resources.cpus_per_task))
        if spec.resources.world_size > 1:
            env.update(_torch_rank_environment())
        with _Command(argv, spec.objective_cwd, env, channel=reporter is not None) as command:
            return command.run(spec, reporter, folder / STOP_FILE)


def trial_environment(
    spec: StudySpec, trial_key: int | str, params: dict[str, Any], checkpoints: Path
) -> dict[str, str]:
    """What the user's code learns of its trial (hpo.trial reads it back)."""
    assert spec.objective is not None
    return {
        **spec.objective.env,
        client.ENV_KEY: str(trial_key),
        **({client.ENV_NUMBER: str(trial_key)} if isinstance(trial_key, int) else {}),
        # The fixed values too: a script that reads its settings through hpo.trial.params() and
        # not from its argv would otherwise run on its own defaults. Never stored as parameters.
        client.ENV_PARAMS: json.dumps({**spec.objective.fixed, **params}),
        client.ENV_CHECKPOINT_DIR: str(checkpoints),
        "HPO_STUDY_NAME": spec.study.name,
    }


def _stop_told(stop_file: Path) -> bool:
    """Whether rank 0 left ``stop_file`` after answering its script "stop" (see ``STOP_FILE``)."""
    with contextlib.suppress(OSError):
        return stop_file.read_text() == TOLD
    return False


def _torch_rank_environment() -> dict[str, str]:
    """torchrun's variables from the Slurm task (or submitit's local executor) this rank is."""
    import submitit

    dist_env = submitit.helpers.TorchDistributedEnvironment()
    return {
        "MASTER_ADDR": os.environ.get("MASTER_ADDR", dist_env.master_addr),
        "MASTER_PORT": str(dist_env.master_port),
        "RANK": str(dist_env.rank),
        "WORLD_SIZE": str(dist_env.world_size),
        "LOCAL_RANK": str(dist_env.local_rank),
        "LOCAL_WORLD_SIZE": str(dist_env.local_world_size),
    }


class _Command:
    """One run of the command: its process group, its output lines and reports as events."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], *, channel: bool) -> None:
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.last_line = {"stdout": "", "stderr": ""}
        self.stopped_by_us = False
        self._terminated = threading.Event()
        self._ended_at: float | None = None
        self._ours: socket.socket | None = None
        theirs: socket.socket | None = None
        if channel:
            self._ours, theirs = socket.socketpair()
            env = {**env, client.ENV_FD: str(theirs.fileno())}
        _become_subreaper()
        self._spared = _descendants()[0]  # processes this one ran before the command: not its own
        try:
            self.process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a stop reaches its children too
                pass_fds=(theirs.fileno(),) if theirs is not None else (),
            )
        except OSError as err:
            if self._ours is not None:
                self._ours.close()
            raise ObjectiveFailed(f"cannot run {argv[0]!r} in {cwd}: {err.strerror or err}") from None
        finally:
            if theirs is not None:
                theirs.close()
        assert self.process.stdout is not None and self.process.stderr is not None
        self._threads = [
            threading.Thread(target=self._read_lines, args=("stdout", self.process.stdout, sys.stdout), daemon=True),
            threading.Thread(target=self._read_lines, args=("stderr", self.process.stderr, sys.stderr), daemon=True),
        ]  # fmt: skip
        if self._ours is not None:
            self._threads.append(threading.Thread(target=self._read_reports, daemon=True))
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> _Command:
        self._previous_sigterm = _chain_sigterm(self._terminated)
        return self

    def __exit__(self, *exc: object) -> None:
        # Whatever ended the run (a stop, an exception, submitit's requeue), nothing stays running:
        # its process group, then what left it (a daemon started with setsid).
        self.stop(grace_s=0.0 if self.process.poll() is not None else 5.0)
        _end_descendants(self._spared)
        if self._ours is not None:
            self._ours.close()
        if self._previous_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._previous_sigterm)

    def run(self, spec: StudySpec, reporter: StepReporter | None, stop_file: Path) -> ObjectiveResult:
        assert spec.objective is not None
        grace_s = spec.objective.stop_grace_s
        reports = _Reports(spec, reporter, stop_file)
        while True:
            try:
                kind, payload = self.events.get(timeout=0.5)
            except queue.Empty:
                kind, payload = "", None
            if kind == "stdout" and reporter is not None and reports.on_line(payload):
                self.stop(grace_s)
                return reports.result(pruned=True)
            if kind == "report" and reporter is not None:
                self._reply(client.STOP if reports.on_report(*payload) else client.CONTINUE)
            if reports.stop_asked_at is not None and time.monotonic() - reports.stop_asked_at > grace_s:
                self.stop(grace_s)  # told to stop, it has not: the signals follow
            if reporter is None and reports.stop_asked_at is None and stop_file.exists():
                if _stop_told(stop_file):  # this rank's script has rank 0's answer: it stops itself
                    reports.stop_asked_at = time.monotonic()
                else:
                    self.stop(grace_s)  # rank 0's command was stopped: this rank's is too
                    return ObjectiveResult(value=float("nan"), pruned=True)
            if self.process.poll() is not None and self._drained():
                break
        return self._outcome(reports)

    def _drained(self) -> bool:
        """Once the command has ended: True when its output is all read, or still held open
        ``DRAIN_S`` later."""
        if self._ended_at is None:
            self._ended_at = time.monotonic()
            # Whatever it started that still holds its output open ends with it.
            _signal_group(self.process.pid, signal.SIGKILL)
        # Readers first, then the queue: a line queued as its reader ends is not lost.
        reading = self._reading()
        if not reading and self.events.empty():
            return True
        # Held open outside its process group (a daemon it started): stop reading.
        return reading and time.monotonic() - self._ended_at > DRAIN_S

    def _outcome(self, reports: _Reports) -> ObjectiveResult:
        """The trial's result once the command ended by itself (or after being told to stop)."""
        returncode = self.process.wait()
        if reports.stop_asked_at is not None:
            return reports.result(pruned=True)
        if reports.reporter is None and reports.stop_file.exists():
            return ObjectiveResult(value=float("nan"), pruned=True)
        if returncode < 0 or self._terminated.is_set():
            # Even a command that exits 0 on Slurm's SIGTERM has not finished its run.
            self._signalled(-returncode if returncode < 0 else signal.SIGTERM)
        if returncode != 0:
            line = self.last_line["stderr"] or self.last_line["stdout"]
            raise ObjectiveFailed(f"the command exited with status {returncode}: {line}".rstrip(": "))
        if reports.reporter is None:
            return ObjectiveResult(value=float("nan"), pruned=False)
        if reports.value() is None:
            if reports.unread is not None:  # lines matched, but no number was read from them
                raise ObjectiveFailed(f"no metric reported: {reports.unread}")
            raise ObjectiveFailed(f"no metric reported; last output line: {self.last_line['stdout']!r}")
        return reports.result(pruned=False)

    def _signalled(self, signum: int) -> None:
        """The command died of a signal this process did not send."""
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
        if self._terminated.wait(OWN_SIGNAL_GRACE_S) or (
            executors.here().job_ending() and self._terminated.wait(WAIT_FOR_OWN_SIGNAL_S)
        ):
            # Slurm is ending the job (scancel, scontrol requeue, preemption): the trial stays
            # RUNNING for the requeued job, or for the launcher to fail from Slurm's state.
            log.info(f"the command ended by {name} with its job; waiting for Slurm to end this job")
            time.sleep(WAIT_FOR_SLURM_KILL_S)
        raise ObjectiveFailed(
            f"the command was killed by {name}; last output line: {self.last_line['stdout']!r}"
        )

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the command's process group, SIGKILL after ``grace_s``."""
        self.stopped_by_us = True
        pgid = self.process.pid  # start_new_session: its group's id is its pid
        if self.process.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_s)
        _signal_group(pgid, signal.SIGKILL)  # and whatever it started that outlived it
        self.process.wait()

    def _reading(self) -> bool:
        return any(thread.is_alive() for thread in self._threads[:2])

    def _read_lines(self, kind: str, stream: IO[bytes], echo: IO[str]) -> None:
        # Bounded lines: a progress bar that never ends its line must not grow without limit. A
        # piece cut at MAX_LINE is whole only up to its last \r: the rest (maybe a metric line
        # whose value is cut) waits for the next piece, never read as a line of its own.
        carry = b""
        while True:
            raw = stream.readline(MAX_LINE)
            if not raw:
                if not carry:
                    return
                raw, carry = carry, b""  # the output's last line, without its newline
            elif not raw.endswith(b"\n"):
                pending = carry + raw
                cut = pending.rfind(b"\r") + 1
                raw, carry = pending[:cut], pending[cut:]
                if len(carry) > MAX_LINE:  # a line longer than a piece: its front goes to the log only
                    _log_line(carry[:-MAX_LINE].decode("utf-8", errors="replace"), echo, end="")
                    carry = carry[-MAX_LINE:]
                if not raw:
                    continue
            else:
                raw, carry = carry + raw, b""
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            _log_line(line, echo)  # the job's log keeps the command's output
            for part in line.split("\r"):  # \r-separated progress updates: each its own line
                if part.strip():
                    self.last_line[kind] = part.strip()[:500]
                self.events.put((kind, part))

    def _read_reports(self) -> None:
        assert self._ours is not None
        with contextlib.suppress(OSError), self._ours.makefile("r", encoding="utf-8") as lines:
            for line in lines:
                try:
                    message = json.loads(line)
                    step, value = int(message["step"]), float(message["value"])
                    metrics = dict(message.get("metrics") or {})
                    self.events.put(("report", (step, value, metrics)))
                except (ValueError, KeyError, TypeError):
                    _log_line(f"hpo.trial: ignored a malformed report {line.strip()!r}", sys.stderr)
                    self.events.put(("report", (0, None, {})))  # its sender waits for an answer

    def _reply(self, word: str) -> None:
        assert self._ours is not None
        with contextlib.suppress(OSError):
            self._ours.sendall((word + "\n").encode())


class _Reports:
    """Rank 0's side of a run: each report as it arrives (a matching output line, or a
    ``hpo.trial.report`` call), what the study says to it, and the value the trial ends with."""

    def __init__(self, spec: StudySpec, reporter: StepReporter | None, stop_file: Path) -> None:
        assert spec.objective is not None
        self.spec, self.reporter, self.stop_file = spec, reporter, stop_file
        objective = spec.objective
        self.pattern = (
            MetricPattern(objective.metric_pattern, "objective.metric_pattern")
            if objective.metric_pattern
            else None
        )
        self.final_pattern = (
            MetricPattern(objective.final_pattern, "objective.final_pattern")
            if objective.final_pattern
            else None
        )
        # Steps counted by matches go on from the trial's stored curve after a requeue.
        self.stored_steps = int(getattr(reporter, "last_epoch", 0) or 0)
        self.count = 0
        self.last: float | None = None
        self.final: float | None = None
        self.stop_asked_at: float | None = None
        """When a ``hpo.trial`` script was told to stop (it stops itself, within the grace)."""
        self.metrics: dict[str, dict[str, float]] = {}
        """The other metrics reported (hpo.record.ATTR_METRICS)."""
        self.steps: dict[int, float] = {}
        """The value each step was reported with in this run (a repeated step's later one is not
        the study's: Optuna keeps the first)."""
        self.warned: set[str] = set()
        """The warnings this trial's log has had (each once)."""
        self.unread: str | None = None
        """What the first matched line whose value group is not a number was told (its fix)."""

    def on_line(self, line: str) -> bool:
        """A line of the command's output; True when the study prunes the trial on it."""
        if self.final_pattern and (final := self.final_pattern.read(line)):
            self.final = self._read(final, self.final_pattern)
        if self.pattern is None or self.stop_asked_at is not None or not (reading := self.pattern.read(line)):
            return False
        found = reading.match
        value = self._read(reading, self.pattern)
        step = _step(found, self.stored_steps + self.count + 1)
        if value is None or step is None:
            return False
        if self.pattern.count(line) > 1:
            self._warn(
                "matches",
                f"objective.metric_pattern matched this line more than once; the first match counts: {line.strip()[:200]!r}",
            )
        self._keep(step, {k: v for k, v in found.groupdict().items() if k not in ("value", "step")})
        return self._decide(step, value)

    def on_report(self, step: int, value: float | None, metrics: dict[str, Any]) -> bool:
        """A ``hpo.trial.report`` call; True when the script is to stop (the answer it gets)."""
        self._keep(step, metrics)
        if self.stop_asked_at is not None or value is None:
            # Told to stop already (its later reports change nothing), or not a number.
            return self.stop_asked_at is not None
        stop = self._decide(step, value, told=True)
        if stop:
            self.stop_asked_at = time.monotonic()
        return stop

    def value(self) -> float | None:
        """The trial's value: the final line's, else the last report's."""
        value = self.final if self.final is not None else self.last
        if value is None and self.count == 0:
            # A run resumed from a checkpoint of its last step (a requeue, or a retry given its
            # failed trial's checkpoint and curve) has nothing left to report: its curve stands.
            value = getattr(self.reporter, "last_value", None)
        return value

    def result(self, pruned: bool) -> ObjectiveResult:
        value = self.last if pruned else self.value()
        result = ObjectiveResult(value=value if value is not None else float("nan"), pruned=pruned)
        if self.metrics:
            result.attrs[record.ATTR_METRICS] = self.metrics
        return result

    def _decide(self, step: int, value: float, told: bool = False) -> bool:
        assert self.reporter is not None
        if step in self.steps:
            self._warn(
                "steps",
                f"step {step} was reported again ({self.steps[step]:.6g}, then {value:.6g}); the study keeps the first value",
            )
        else:
            self.steps[step] = value
        self.count, self.last = self.count + 1, value
        stop = _decide(self.reporter, self.spec, step, value) == Decision.STOP
        if stop:  # the other ranks stop too; whole once it exists (they poll for it)
            partial = self.stop_file.with_suffix(".partial")
            partial.write_text(TOLD if told else "")
            os.replace(partial, self.stop_file)
        return stop

    def _read(self, reading: Reading, pattern: MetricPattern) -> float | None:
        """The number a matched line reports; None, said once in the trial's log (and in its fail
        reason should no line report one), when the value group's text is not a number."""
        value = _number(reading.value)
        if value is None and reading.value:
            self.unread = self.unread or not_a_number(pattern.key, reading.value)
            self._warn("not a number", self.unread)
        self._note(reading)
        return value

    def _note(self, reading: Reading) -> None:
        if reading.note is not None:
            self._warn(
                "whole", f"{reading.note}; a pattern such as {SUGGESTED_VALUE_GROUP!r} reads it as printed"
            )

    def _warn(self, kind: str, text: str) -> None:
        """One line in the trial's log, the first time only: a report the study does not take."""
        if kind not in self.warned:
            self.warned.add(kind)
            _log_line(f"hpo: warning: {text}")

    def _keep(self, step: int, metrics: dict[str, Any]) -> None:
        for name, raw in metrics.items():
            value = raw if isinstance(raw, float | int) else _number(raw)
            if value is not None and math.isfinite(float(value)):
                self.metrics.setdefault(name, {})[str(step)] = float(value)


_LOG_LOCK = threading.Lock()


def _log_line(text: str, stream: IO[str] | None = None, end: str = "\n") -> None:
    """One line in the job's log. The command's output is echoed from reader threads while the
    main thread writes the service's own lines to the same log: print's text and newline are two
    writes, and another thread's line could land between them (one line glued to another)."""
    out = stream if stream is not None else sys.stdout
    with _LOG_LOCK, contextlib.suppress(OSError, ValueError):  # a full disk under the job log
        out.write(text + end)
        out.flush()


def _decide(reporter: StepReporter, spec: StudySpec, step: int, value: float) -> Decision:
    decision = stop_at(
        spec,
        step,
        reporter.report(StepReport(epoch=step, values={spec.study.metric: value})) or Decision.CONTINUE,
    )
    # Rank 0's log says what reached the study (a DDP job's other ranks report nothing).
    _log_line(
        f"hpo: report of step {step}: {spec.study.metric}={value:.6g} ({'stop' if decision == Decision.STOP else 'go on'})"
    )
    return Decision.STOP if decision == Decision.STOP else Decision.CONTINUE


def _number(text: str | None) -> float | None:
    """The number a matched value reads as (nan and inf included: the study sees a divergence),
    or None for text that is not one."""
    try:
        return float(text or "")
    except ValueError:
        return None


def _step(found: re.Match[str], counted: int) -> int | None:
    """The step a metric line names, or the count of reports (stored ones included)."""
    if "step" not in found.groupdict():
        return counted
    try:
        return int(found.group("step") or "")
    except ValueError:
        return None


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def _become_subreaper() -> None:
    """Orphans of the command (a daemon it started with setsid, outside its process group, whose
    parent then exited) are re-parented to this process instead of init, where
    :func:`_end_descendants` finds them. Slurm's cgroup would end them with the job, but a
    --workers job or a local trial goes on after its command."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _descendants() -> tuple[set[int], set[int]]:
    """The processes below this one, and those of them that are its own children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    below: set[int] = set()
    todo = list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        below.add(pid)
        todo += children.get(pid, [])
    return below, set(children.get(os.getpid(), []))


def _end_descendants(spare: set[int], rounds: int = 5) -> None:
    """SIGKILL every process below this one but ``spare`` (those that were there before the
    command); reap those re-parented to it. A few rounds: a process killed in one may leave
    orphans that reach this process only then."""
    for _ in range(rounds):
        below, own = _descendants()
        below -= spare
        if not below:
            return
        for pid in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        for pid in own & below:  # not waited for: one stuck in the kernel (D state) must not hang this
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _chain_sigterm(flag: threading.Event) -> Any:
    """Note a SIGTERM sent to this process (Slurm ending the job), then do what was done before
    (submitit logs it and lets the job run on to its SIGKILL). None off the main thread."""
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        flag.set()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (a Ray Tune trial): Ray ends its workers itself
        return None
    return previous
