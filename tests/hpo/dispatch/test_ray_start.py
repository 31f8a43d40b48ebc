"""Starting Ray on a node of an allocation: a real `ray start`, as the Ray job's first task runs it."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from hpo.config import load_study
from hpo.dispatch.ray import cluster
from tests.hpo.helpers import study_document, write_study


def test_a_ray_start_whose_port_was_taken_meanwhile_starts_again_on_other_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # What flaked on the local cluster: a port chosen free was bound by another process (another
    # Ray cluster starting, or the other emulated node) before Ray bound it, and the job failed.
    spec = load_study(write_study(tmp_path / "study.yaml", study_document("ray-start", tmp_path / "work")))
    taken = socket.create_server(("", 0))
    calls = []

    def first_choice_taken(count: int) -> list[int]:
        ports = real_free_ports(count)
        if not calls:  # the GCS port of the first start
            ports[0] = taken.getsockname()[1]
        calls.append(count)
        return ports

    real_free_ports = cluster._free_ports
    monkeypatch.setattr(cluster, "_free_ports", first_choice_taken)
    temp_dir = f"/tmp/ray-test-{uuid.uuid4().hex[:6]}"
    try:
        ports = cluster._ray_start(
            ["--head", "--include-dashboard=false"], cluster._PORT_NAMES, "127.0.0.1", temp_dir, spec
        )()
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
