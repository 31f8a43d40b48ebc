"""Starting Ray on a node of an allocation: a real `ray start`, as the Ray job's first task runs it."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from hpo.config import load_study
from hpo.dispatch.ray import cluster
from hpo.dispatch.ray import ports as ray_ports
from tests.hpo.helpers import processes_with, study_document, write_study


def test_a_ray_start_whose_port_was_taken_meanwhile_starts_again_on_other_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # What flaked on the local cluster: a port chosen free was bound by another process (another
    # Ray cluster starting, or the other emulated node) before Ray bound it, and the job failed.
    spec = load_study(write_study(tmp_path / "study.yaml", study_document("ray-start", tmp_path / "work")))
    taken = socket.create_server(("", 0))
    calls = []

    def first_choice_taken(count: int, avoid: frozenset[int] = frozenset()) -> list[int]:
        ports = real_free_ports(count, avoid)
        if not calls:  # the GCS port of the first start
            ports[0] = taken.getsockname()[1]
        calls.append(count)
        return ports

    real_free_ports = ray_ports.free_ports
    monkeypatch.setattr(ray_ports, "free_ports", first_choice_taken)
    temp_dir = f"/tmp/ray-test-{uuid.uuid4().hex[:6]}"
    try:
        ports = cluster._ray_start(
            ["--head", "--include-dashboard=false"], cluster._PORT_NAMES, "127.0.0.1", temp_dir, spec
        )(lambda: False)
        assert ports["port"] != taken.getsockname()[1]
        # The first start failed on its GCS port (a later one may meet another clash: retried too).
        retried = [
            r.getMessage() for r in caplog.records if "starting again on other ports" in r.getMessage()
        ]
        assert "ray start failed on" in retried[0] and "GCS" in retried[0], retried
        assert not any("\x1b[" in line for line in retried), retried
        with socket.socket() as probe:  # the GCS of the start that succeeded listens
            assert probe.connect_ex(("127.0.0.1", ports["port"])) == 0
    finally:
        cluster._stop_ray(temp_dir, whole_job=False)
        taken.close()


def test_a_node_still_starting_when_the_study_ends_leaves_at_once(tmp_path: Path) -> None:
    # On a loaded node Ray's agents can come up later than the raylet waits for them, and the start
    # is tried again; meanwhile the head may finish the study and stop. A worker's `ray start` then
    # waits for a GCS that is gone (minutes): it must give up when told the study has ended, and
    # leave no process behind, instead of holding its node of the allocation.
    spec = load_study(write_study(tmp_path / "study.yaml", study_document("ray-gone", tmp_path / "work")))
    with socket.create_server(("", 0)) as gone:
        address = f"127.0.0.1:{gone.getsockname()[1]}"  # closed below: no GCS will answer there
    names = [n for n in cluster._PORT_NAMES if n not in ("port", "dashboard-port", "ray-client-server-port")]
    temp_dir = f"/tmp/ray-test-{uuid.uuid4().hex[:6]}"
    ended = threading.Event()
    try:
        starting = cluster._ray_start([f"--address={address}"], names, "127.0.0.1", temp_dir, spec)
        deadline = time.monotonic() + 30
        while not processes_with(temp_dir):  # the start is under way
            assert time.monotonic() < deadline, "ray start did not begin"
            time.sleep(0.1)
        threading.Timer(2.0, ended.set).start()
        with pytest.raises(cluster.StudyEnded):
            starting(ended.is_set)
        assert processes_with(temp_dir) == []
    finally:
        cluster._stop_ray(temp_dir, whole_job=False)


def test_a_head_whose_ray_stops_mid_study_says_so_at_once(tmp_path: Path) -> None:
    # What failed a Ray job in CI: Ray said it had started, then its raylet went down (its
    # runtime-env agent's port had been taken meanwhile); the driver waited a minute for the GCS and
    # exited with no line the launcher could report. The head now hears it as it happens.
    spec = load_study(write_study(tmp_path / "study.yaml", study_document("ray-lost", tmp_path / "work")))
    temp_dir = f"/tmp/ray-test-{uuid.uuid4().hex[:6]}"
    reasons: list[str] = []
    told = threading.Event()

    def lost(reason: str) -> None:
        reasons.append(reason)
        told.set()

    try:
        cluster._ray_start(
            ["--head", "--include-dashboard=false"], cluster._PORT_NAMES, "127.0.0.1", temp_dir, spec, lost
        )(lambda: False)
        assert not told.wait(2), reasons  # up and staying up
        [raylet] = [
            int(entry.parent.name)
            for entry in Path("/proc").glob("[0-9]*/cmdline")
            if (line := entry.read_bytes().split(b"\0"))[0].endswith(b"/raylet")
            and temp_dir.encode() in b" ".join(line)
        ]
        os.kill(raylet, signal.SIGKILL)  # as the kernel's OOM killer would
        assert told.wait(60), "the end of the node's Ray went unnoticed"
        assert re.fullmatch(
            r"Some Ray subprocesses exited unexpectedly: raylet \[exit code=-9\]", reasons[0]
        ), reasons
    finally:
        cluster._stop_ray(temp_dir, whole_job=False)
