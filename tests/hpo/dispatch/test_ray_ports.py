"""The ports a node's Ray is started on: below the kernel's ephemeral range, free, distinct."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hpo.dispatch.ray import ports


def _ephemeral_low() -> int:
    return int(ports.EPHEMERAL_RANGE.read_text().split()[0])


def test_ports_are_drawn_below_the_ephemeral_range_that_outgoing_connections_take_from() -> None:
    pool = ports.pool()
    assert pool is not None and pool.start == ports.LOWEST and pool.stop == _ephemeral_low()
    chosen = ports.free_ports(9)
    assert len(set(chosen)) == 9 and all(ports.LOWEST <= p < _ephemeral_low() for p in chosen), chosen
    for port in chosen:  # each is free: bindable now
        with socket.socket() as sock:
            sock.bind(("", port))
    low = ports.free_range(65, avoid=frozenset(chosen))
    assert low >= ports.LOWEST and low + 65 <= _ephemeral_low()
    assert not set(range(low, low + 65)) & set(chosen)


def test_a_taken_port_is_never_chosen() -> None:
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        # A pool of the taken port alone: no draw may return it.
        with pytest.raises(RuntimeError, match="no 1 free ports"):
            ports.free_ports(1, ports=range(port, port + 1))
        with pytest.raises(RuntimeError, match="no 1 consecutive free ports"):
            ports.free_range(1, ports=range(port, port + 2))


def test_a_narrow_range_below_the_ephemeral_one_falls_back_to_the_kernels_choice(tmp_path: Path) -> None:
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text("11000\t60999\n")  # only 1000 ports below it
    assert ports.pool(narrow) is None
    assert ports.pool(tmp_path / "absent") is None  # not Linux: the kernel's choice
    chosen = ports.free_ports(3, range_file=narrow)
    assert len(set(chosen)) == 3 and all(p >= _ephemeral_low() for p in chosen), chosen  # the kernel's choice
