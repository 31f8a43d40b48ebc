"""A per-phase timer that does not stall the GPU.

On CUDA, timing a phase with the host clock needs a synchronize per phase, which costs throughput;
instead an event is recorded at each phase boundary and the events are resolved once per epoch.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch


class PhaseTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.totals: dict[str, float] = defaultdict(float)
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._last_event: torch.cuda.Event | None = None
        self._last_time = 0.0

    def start(self) -> None:
        """Open a new sequence of phases (after a pause that must not be attributed to any phase)."""
        if self.cuda:
            self._last_event = torch.cuda.Event(enable_timing=True)
            self._last_event.record()
        else:
            self._last_time = time.perf_counter()

    def mark(self, phase: str) -> None:
        """The time since the previous mark (or start) belongs to ``phase``."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            assert self._last_event is not None, "mark() before start()"
            self._pending.append((phase, self._last_event, event))
            self._last_event = event
        else:
            now = time.perf_counter()
            self.totals[phase] += now - self._last_time
            self._last_time = now

    def collect(self) -> dict[str, float]:
        """Seconds per phase so far (synchronizes once on CUDA)."""
        if self._pending:
            self._pending[-1][2].synchronize()
            for phase, begin, end in self._pending:
                self.totals[phase] += begin.elapsed_time(end) / 1000.0
            self._pending.clear()
        return dict(self.totals)
