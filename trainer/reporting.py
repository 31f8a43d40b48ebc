"""How a run talks to whoever drives it: per-epoch metrics in, a continue/stop decision out.

The trainer knows nothing of Optuna or Ray; the HPO layer adapts its trial objects to
:class:`Reporter`.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


class Decision(enum.IntEnum):
    CONTINUE = 0
    STOP = 1


# EpochMetrics fields each rank measures for itself (the others are reduced across ranks).
PER_RANK_FIELDS = (
    "images_per_s",
    "train_time_s",
    "epoch_time_s",
    "data_time_s",
    "forward_time_s",
    "backward_time_s",
    "optimizer_time_s",
    "peak_memory_bytes",
    "gpu_utilization",
)


@dataclass
class EpochMetrics:
    """One epoch's metrics, already reduced across all ranks."""

    epoch: int
    """1-based: the number of epochs completed."""
    step: int
    """Optimizer steps completed so far."""
    train_loss: float
    train_accuracy: float
    val_loss: float
    val_accuracy: float
    lr: float
    """The learning rate at the end of the epoch."""
    images_per_s: float
    """Training throughput of the epoch, all ranks together."""
    train_time_s: float
    """Seconds of the training phase of the epoch (the span ``images_per_s`` is measured over)."""
    epoch_time_s: float
    """Seconds of the whole epoch: training and validation."""
    test_loss: float | None = None
    test_accuracy: float | None = None
    """On the held-out test images, after the last epoch only and with ``test_held_out`` only."""
    # Where the training steps' time went, on rank 0 (None in a history written before they were
    # measured). "data" is the wait for the next batch and its copy to the device: on a GPU, the
    # time the GPU sat idle for it. Under DDP another rank's data wait shows in rank 0's backward,
    # where the gradients' all-reduce waits for it.
    data_time_s: float | None = None
    forward_time_s: float | None = None
    backward_time_s: float | None = None
    optimizer_time_s: float | None = None
    peak_memory_bytes: int | None = None
    """So far in the run: CUDA's maximum allocated on a GPU, the process's peak RSS on CPU (rank 0)."""
    gpu_utilization: float | None = None
    """Mean NVML utilization (%) of rank 0's GPU during the epoch's training; None without NVML."""

    @property
    def data_wait_share(self) -> float | None:
        """The share of the training steps' time spent waiting for data."""
        parts = (self.data_time_s, self.forward_time_s, self.backward_time_s, self.optimizer_time_s)
        if any(p is None for p in parts):
            return None
        total = sum(p for p in parts if p is not None)
        return (self.data_time_s or 0.0) / total if total > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Reporter(Protocol):
    """Called on rank 0 after each epoch; STOP ends the run on every rank.

    A reporter with a true ``checkpoint_before_report`` attribute is called after the epoch's
    checkpoint is written (it passes the checkpoint on), instead of before. One with a true
    ``every_rank`` attribute is called on every rank it is given to (Ray Train's report is a
    barrier for all workers); rank 0's answer decides.
    """

    def report(self, metrics: EpochMetrics) -> Decision | None: ...


@dataclass
class TimeBreakdown:
    """Seconds spent in each phase, summed over the run (rank 0), like the course's Chronometer."""

    data: float = 0.0
    """Waiting for the next batch and copying it to the device."""
    forward: float = 0.0
    backward: float = 0.0
    optimizer: float = 0.0
    """The optimizer step, the gradient scaler's update and the schedule's step."""
    validation: float = 0.0
    checkpoint: float = 0.0
    total: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass
class TrainResult:
    """What a run returns to its caller (on every rank)."""

    epochs_completed: int
    steps: int
    stopped_early: bool
    """True when the reporter asked to stop before the last epoch."""
    resumed_from_epoch: int
    """Epochs loaded from a checkpoint at start (0 for a fresh run)."""
    best_val_accuracy: float
    best_val_loss: float
    last_val_accuracy: float
    last_val_loss: float
    train_images_per_s: float
    """Mean training throughput over the epochs this process ran, all ranks together."""
    peak_memory_bytes: int
    """Peak allocated device memory on CUDA; peak resident set size of the process on CPU."""
    world_size: int
    device: str
    time: TimeBreakdown = field(default_factory=TimeBreakdown)
    history: list[EpochMetrics] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
