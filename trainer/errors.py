"""Errors the trainer raises on purpose, so that callers can tell them from crashes."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid. The message is one line naming the field (and file, if any)."""


class TrialOutOfMemory(RuntimeError):
    """The device ran out of memory, typically because the batch size is too large for it.

    The HPO layer records such a trial as infeasible rather than as a crash: retrying the same
    configuration would fail the same way.
    """

    def __init__(self, batch_size: int, device: str, detail: str) -> None:
        self.batch_size = batch_size
        self.device = device
        self.detail = detail
        first_line = detail.strip().splitlines()[0] if detail.strip() else "out of memory"
        super().__init__(f"out of memory on {device} with batch_size={batch_size}: {first_line}")


class StopRequested(RuntimeError):
    """Raised on ranks other than 0 when the reporter on rank 0 failed, so that no rank hangs."""
