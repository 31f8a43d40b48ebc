"""A Ray cluster inside one Slurm allocation, started by a submitit job with one task per node.

Task 0 (the first node) starts the Ray head and the Tune driver; the other tasks start Ray
workers that join it. What makes this work on shared nodes and shared filesystems:

- every port is chosen free on its node at start, so that two Ray clusters (two studies, or the
  two emulated nodes of one host) never collide;
- the temp dir is short (``/tmp/ray-<job>-<task>``): Ray's AF_UNIX socket paths must fit in 107 bytes;
- the head publishes its address in the study's workdir (shared across nodes) and starts the Tune
  driver at once (trials start on the head while the workers join); workers wait for the address
  with a bound and mark when they have joined; a node whose Ray does not start ends the job (srun
  --kill-on-bad-exit) with one clear log line, which the launcher reports;
- the dashboard listens on 127.0.0.1 of the head only (Ray's token authentication is on); `hpo
  tunnel` prints the ssh command that reaches it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import submitit

from hpo import executors, joblog
from hpo.dispatch.ray import driver
from hpo.dispatch.ray import ports as ray_ports
from hpo.storage import StorageRef
from hpo.trial.objective import Objective

if TYPE_CHECKING:
    from hpo.config import StudySpec

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 180
STOP_GRACE_S = 1.0
RAY_START_ATTEMPTS = 3
RAY_START_TIMEOUT_S = 300
_PORT_NAMES = (
    "port",
    "node-manager-port",
    "object-manager-port",
    "dashboard-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
    "ray-client-server-port",
)
_WORKER_PORTS = 64


def rendezvous_path(spec: StudySpec, job_id: str) -> Path:
    return spec.workdir / "ray" / f"{job_id}.json"


def read_rendezvous(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def cpus_per_trial(spec: StudySpec) -> int:
    """A trial's CPUs: one process, or tasks_per_node Ray Train workers (a DDP trial)."""
    return spec.resources.cpus_per_task * spec.resources.tasks_per_node


def slots_per_node(spec: StudySpec) -> int:
    """Trials each node of the allocation runs at once (max_concurrent spread over the nodes)."""
    return -(-spec.study.max_concurrent // spec.resources.nodes)


def gpus_per_node(spec: StudySpec) -> int:
    """GPUs each node of the allocation holds for its trials: with ``trials_per_gpu`` k, Ray's
    fractional GPUs put k trials (k actor processes) on each."""
    return -(-spec.resources.gpus_per_node * slots_per_node(spec) // spec.resources.trials_per_gpu)


@dataclasses.dataclass
class RayClusterTask:
    """Run on every node of the allocation (one submitit task per node)."""

    spec: StudySpec
    storage: StorageRef
    objective: Objective | None = None  # None: the trainer, as the driver sets it up

    def __call__(self) -> dict[str, Any]:
        joblog.to_stdout()
        env = submitit.JobEnvironment()
        job_id, rank, nodes = str(env.job_id), env.global_rank, env.num_tasks
        temp_dir = f"/tmp/ray-{job_id}-{rank}"
        node_ip = _node_ip()
        rdv = rendezvous_path(self.spec, job_id)
        # Ray's token authentication, with a token of this job's own, readable by its user only.
        token = rdv.with_suffix(".token")
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        if rank == 0:
            rdv.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            token.touch(mode=0o600)
            token.write_text(secrets.token_hex(32))
            return self._head(job_id, nodes, node_ip, temp_dir, rdv)
        return self._worker(job_id, rank, node_ip, temp_dir, rdv)

    def _head(self, job_id: str, nodes: int, node_ip: str, temp_dir: str, rdv: Path) -> dict[str, Any]:
        ending = threading.Event()

        def lost(reason: str) -> None:
            # The head's Ray is gone mid-study: the driver would wait a minute for its GCS, then exit
            # without a Python line. The job ends now, with a line the launcher reports.
            if not ending.is_set():
                print(f"{RayStoppedError.__name__}: Ray on {_node_name()} stopped while the study ran: {reason}",
                      file=sys.stderr, flush=True)  # fmt: skip
                os._exit(1)

        # The head starts while the driver opens the study (seconds each, on different processes).
        starting = _ray_start(
            ["--head", "--dashboard-host=127.0.0.1", "--include-dashboard=true"],
            _PORT_NAMES,
            node_ip,
            temp_dir,
            self.spec,
            on_lost=lost,
        )
        address = ""

        def head_up() -> str:
            nonlocal address
            if address:
                return address
            named = starting(lambda: False)  # the head has no one to wait for
            address = f"{node_ip}:{named['port']}"
            rdv.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write_json(rdv, {"address": address, "head": _node_name(), "dashboard_port": named["dashboard-port"],
                              "job_id": job_id, "done": False})  # fmt: skip
            log.info(
                f"ray head on {_node_name()} ({address}), dashboard on 127.0.0.1:{named['dashboard-port']}"
            )
            threading.Thread(target=_report_joined, args=(rdv, nodes), daemon=True).start()
            return address

        try:
            driver.run(self.spec, self.storage, objective=self.objective, cluster=head_up)
        finally:
            ending.set()
            with contextlib.suppress(RuntimeError):
                head_up()  # a study with nothing left to run never connected: the head is stopped all the same
            data = read_rendezvous(rdv) or {}
            _write_json(rdv, {**data, "done": True})  # a node still starting leaves at once
            if (joined := _joined(rdv, nodes)) < nodes:
                log.warning(f"ray cluster: the study ended with {joined} of {nodes} nodes joined")
            _stop_ray(temp_dir)
        return {"rank": 0}

    def _worker(self, job_id: str, rank: int, node_ip: str, temp_dir: str, rdv: Path) -> dict[str, Any]:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while (data := read_rendezvous(rdv)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"ray cluster: no head address in {rdv} after {JOIN_TIMEOUT_S} s")
            time.sleep(0.2)
        # A worker has no GCS, dashboard or client server of its own.
        names = [n for n in _PORT_NAMES if n not in ("port", "dashboard-port", "ray-client-server-port")]
        starting = _ray_start([f"--address={data['address']}"], names, node_ip, temp_dir, self.spec)
        try:
            starting(lambda: bool((read_rendezvous(rdv) or {}).get("done")))
        except StudyEnded:
            # A node slow to start (Ray's agents get 15 s to come up on a loaded node; a failed
            # start is tried again) must not hold its allocation after the head is gone.
            log.warning(f"ray cluster: the study ended before {_node_name()} joined; no trial ran on it")
            return {"rank": "worker"}
        log.info(f"ray worker on {_node_name()} joined {data['address']}")
        joined_marker(rdv, rank).touch()
        try:  # stay until the head is done: the job ends when every task has returned
            while not (read_rendezvous(rdv) or {}).get("done"):
                time.sleep(0.5)
        finally:
            _stop_ray(temp_dir)
        return {"rank": "worker"}


class StudyEnded(Exception):
    """The study ended while this node's Ray was starting."""


class RayStoppedError(RuntimeError):
    """The head's Ray stopped while the study ran (named in the job's log for the launcher)."""


class _Start:
    """One ``ray start --block``: it stays in the foreground as the parent of the node's Ray
    processes, which stay in the job step's process tree (Slurm signals and kills the whole tree
    on a cancel, even where it tracks processes by parentage alone), and with Ray's reaper they
    die with it however it ends. Its output is read as it comes: ready when Ray says started."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.output: collections.deque[str] = collections.deque(maxlen=50)  # a failure's last lines
        self.ready = threading.Event()
        self.exit_lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        after_exit = 0
        for line in self.proc.stdout:  # read to the end: a blocked pipe would stall Ray's start
            self.output.append(line)
            if "Ray runtime started" in line:
                self.ready.set()
            # Ray's line on which of its processes ended, and the next (the process and its exit
            # code), kept apart: the log lines Ray prints after them push them out of ``output``.
            after_exit = 2 if "exited unexpectedly" in line else after_exit
            if after_exit and line.strip():
                self.exit_lines.append(_plain(line).split(" -- ", 1)[-1])  # without Ray's log prefix
                after_exit -= 1

    def stop(self) -> None:
        """End it at once (Ray's reaper then kills what it started) and reap it."""
        self.proc.kill()
        self.proc.wait()

    def when_ended(self, then: Callable[[str], None]) -> None:
        """Wait for the command to exit, then call ``then`` with why (Ray's own line on it)."""
        self.proc.wait()
        self._reader.join(timeout=5)
        then(" ".join(self.exit_lines) or _last_lines("".join(self.output)))

    def ended(self) -> bool:
        """The command has exited and its output is all read."""
        return self.proc.poll() is not None and not self._reader.is_alive()


def _ray_start(
    extra: list[str],
    port_names: Sequence[str],
    node_ip: str,
    temp_dir: str,
    spec: StudySpec,
    on_lost: Callable[[str], None] | None = None,
) -> Callable[[Callable[[], bool]], dict[str, int]]:
    """``ray start --block`` begun on ports free now; the function returned waits until Ray is up
    and gives the ports it listens on, or raises StudyEnded as soon as its argument says to give
    up. A start can fail: a port taken between its choice and Ray's bind (another cluster starting
    on the node, or the other emulated node of this host), or Ray's agents slower to come up than
    the raylet waits for them on a loaded node (15 s). Ray then fails after half a minute with
    processes left behind, which are stopped before a start on fresh ports. ``on_lost(reason)`` is
    called if this node's Ray stops after it started (``ray start --block`` exits when any of its
    processes does)."""

    def begin() -> tuple[dict[str, int], _Start]:
        ports = dict(zip(port_names, ray_ports.free_ports(len(port_names)), strict=True))
        return ports, _Start(
            _start_args(extra, ports, node_ip, temp_dir, spec), {**os.environ, **driver.RAY_NODE_ENV}
        )

    ports, start = begin()

    def wait(give_up: Callable[[], bool]) -> dict[str, int]:
        nonlocal ports, start
        for attempt in range(1, RAY_START_ATTEMPTS + 1):
            deadline = time.monotonic() + RAY_START_TIMEOUT_S
            while not start.ready.wait(timeout=1) and not start.ended():
                if give_up():
                    start.stop()
                    _stop_ray(temp_dir, whole_job=False)
                    raise StudyEnded
                if time.monotonic() > deadline:
                    start.stop()
                    _stop_ray(temp_dir, whole_job=False)
                    raise RuntimeError(
                        f"ray start did not return within {RAY_START_TIMEOUT_S} s on {_node_name()}"
                    )
            if start.ready.is_set():
                if on_lost is not None:
                    threading.Thread(target=start.when_ended, args=(on_lost,), daemon=True).start()
                return ports
            failure = f"ray start failed on {_node_name()}: {_last_lines(''.join(start.output))}"
            if attempt == RAY_START_ATTEMPTS:
                raise RuntimeError(failure)
            log.warning(f"{failure}; starting again on other ports")
            _stop_ray(temp_dir, whole_job=False)
            if give_up():
                raise StudyEnded
            ports, start = begin()
        raise AssertionError("unreachable")

    return wait


def _start_args(
    extra: list[str], ports: dict[str, int], node_ip: str, temp_dir: str, spec: StudySpec
) -> list[str]:
    """The ``ray start --block`` command line: its node's share of the allocation, on ``ports``
    and a range of worker ports free now."""
    low = ray_ports.free_range(_WORKER_PORTS + 1, avoid=frozenset(ports.values()))
    return [
        _ray(),
        "start",
        "--block",
        *extra,
        f"--node-ip-address={node_ip}",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={cpus_per_trial(spec) * slots_per_node(spec)}",
        f"--num-gpus={gpus_per_node(spec)}",
        f"--min-worker-port={low}",
        f"--max-worker-port={low + _WORKER_PORTS}",
        "--disable-usage-stats",
        # The driver takes no worker output (log_to_driver=False; each trial writes its own
        # log): a node's log monitor, a process that imports Ray on the CPUs Ray is starting
        # on, would stream it to the GCS for no one. The dashboard reads logs from the files.
        "--include-log-monitor=false",
        *(f"--{name}={port}" for name, port in ports.items()),
    ]


def _last_lines(output: str, count: int = 3) -> str:
    """The last lines of a command's output on one line, without the terminal's colour codes."""
    lines = [line.strip() for line in _plain(output).splitlines() if line.strip()]
    return " | ".join(lines[-count:])


def _plain(text: str) -> str:
    """``text`` without the terminal's colour codes, stripped."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text).strip()


def joined_marker(rdv: Path, rank: int) -> Path:
    return rdv.with_name(f"{rdv.stem}.joined-{rank}")


def _joined(rdv: Path, nodes: int) -> int:
    return 1 + sum(1 for rank in range(1, nodes) if joined_marker(rdv, rank).exists())


def _report_joined(rdv: Path, nodes: int) -> None:
    """Log when every node has joined, or, past the bound, how many did (the trials run on those)."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while True:
        joined = _joined(rdv, nodes)
        if joined == nodes:
            log.info(f"ray cluster: {nodes} of {nodes} nodes up")
            return
        if time.monotonic() > deadline:
            log.warning(f"ray cluster: only {joined} of {nodes} nodes joined within {JOIN_TIMEOUT_S} s")
            return
        time.sleep(0.5)


def _stop_ray(temp_dir: str, whole_job: bool = True) -> None:
    """Stop this node's Ray processes of this job only. `ray stop` would kill every Ray process
    on the node, another study's cluster included; ours are the ones whose command line names our
    temp dir (their workers die with their raylet). ``whole_job`` adds the processes under this
    task (Ray's agents rename their command line) and those whose environment names the job's
    token: on one host emulating two nodes, the other node's too."""
    own = _descendants(os.getpid()) if whole_job else []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            marker = f"RAY_AUTH_TOKEN_PATH={os.environ.get('RAY_AUTH_TOKEN_PATH', temp_dir)}".encode()
            ours = temp_dir.encode() in (entry / "cmdline").read_bytes() or (
                whole_job and marker in (entry / "environ").read_bytes()
            )
            if ours and int(entry.name) not in own:
                own.append(int(entry.name))
        except OSError:
            continue
    # Stopped means gone. Nothing of a node's Ray outlives the study (its record is in the study's
    # storage): a second's grace, then killed. Ray's processes end one after another on SIGTERM
    # (the GCS and `ray start --block` took all of a 5 s grace), holding the allocation meanwhile.
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        for pid in own:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while wait_s and time.monotonic() < deadline and any(_running(pid) for pid in own):
            time.sleep(0.2)


def _descendants(root: int) -> list[int]:
    """The processes under ``root``, read before any is stopped: a raylet killed first leaves its
    agents to init, where nothing names them ours (they rename their command line)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit():
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _running(pid: int) -> bool:
    """The process exists and has not exited (`ray start --block` is our child: once it exits,
    it stays a zombie until it is reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _node_name() -> str:
    return executors.here().node()


def _node_ip() -> str:
    try:
        return socket.gethostbyname(_node_name())
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _ray() -> str:
    return str(Path(sys.executable).parent / "ray")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
