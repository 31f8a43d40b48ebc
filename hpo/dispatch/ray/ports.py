"""Ports for a node's Ray, chosen free at its start.

A port found free is released before Ray binds it, so another process can take it meanwhile. In
the kernel's ephemeral range (``net.ipv4.ip_local_port_range``) any outgoing connection may: the
local port of a database client, of Ray's own gRPC clients, of another job's. Ray then fails: the
GCS at once (the start is tried again), or its runtime-env agent a moment after Ray has said it
started, which takes the raylet down with it mid-study. So ports are drawn at random below that
range, where only a process binding that very port competes (another Ray start drawing the same
one out of some 20,000), and each is checked free by binding it.
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000  # below: the well-known and registered ports of services (PostgreSQL, slurmd, Ray's 6379)
_MIN_POOL = 2000  # a narrower pool below the ephemeral range: draw from the kernel's choice instead
_DRAWS = 200

_random = random.SystemRandom()  # a seeded global `random` would draw the same ports on every node


def pool(range_file: Path = EPHEMERAL_RANGE) -> range | None:
    """The ports below the ephemeral range, or None where that leaves too few."""
    try:
        low = int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(LOWEST, low) if low - LOWEST >= _MIN_POOL else None


def free_ports(
    count: int,
    avoid: frozenset[int] = frozenset(),
    ports: range | None = None,
    range_file: Path = EPHEMERAL_RANGE,
) -> list[int]:
    """``count`` distinct ports free now, outside ``avoid``, from ``ports`` (by default the pool
    below the ephemeral range ``range_file`` gives, else the kernel's choice)."""
    ports = ports if ports is not None else pool(range_file)
    with contextlib.ExitStack() as stack:
        held: list[int] = []
        for _ in range(_DRAWS):
            if len(held) == count:
                return held
            port = 0 if ports is None else _random.choice(ports)
            if port in avoid or port in held:
                continue
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("", port))
            except OSError:
                continue
            held.append(sock.getsockname()[1])
        if len(held) == count:
            return held
    raise RuntimeError(f"no {count} free ports found in {_DRAWS} draws")


def free_range(
    count: int,
    avoid: frozenset[int] = frozenset(),
    ports: range | None = None,
    range_file: Path = EPHEMERAL_RANGE,
) -> int:
    """The first of ``count`` consecutive ports free now, none in ``avoid`` (Ray's worker ports),
    drawn as ``free_ports`` draws."""
    ports = ports if ports is not None else pool(range_file)
    for _ in range(_DRAWS):
        low = free_ports(1)[0] if ports is None else _random.randrange(ports.start, ports.stop - count)
        candidates = range(low, low + count)
        if low + count > 65535 or avoid.intersection(candidates):
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in candidates:
                    stack.enter_context(socket.socket()).bind(("", port))
        except OSError:
            continue
        return low
    raise RuntimeError(f"no {count} consecutive free ports found in {_DRAWS} draws")
