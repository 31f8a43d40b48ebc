"""What a run measures about itself beyond its metrics: GPU utilization, peak memory, a profiler
trace on demand, TensorBoard event files.

All of it is cheap enough to stay on: utilization is sampled by a thread twice a second, memory is
read once per epoch, TensorBoard is written once per epoch (``bench/throughput.py`` measures the
cost against the bare loop). The profiler is the exception, and runs only when asked.
"""

from __future__ import annotations

import logging
import math
import resource
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from trainer.reporting import EpochMetrics

log = logging.getLogger("trainer")

# torch.profiler's schedule: skip 1 step, warm up 1, record 5 (the course's profiling recipe).
PROFILE_WAIT, PROFILE_WARMUP, PROFILE_ACTIVE = 1, 1, 5


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA's maximum allocated memory on a GPU; the process's peak resident set size on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class UtilizationSampler:
    """The GPU's utilization (NVML, the figure nvidia-smi shows), sampled every ``interval_s`` by
    a daemon thread; :meth:`take_mean` returns the mean since the last call. None where there is no
    GPU or no NVML binding (``pip install nvidia-ml-py``)."""

    def __init__(self, device: torch.device, interval_s: float = 0.5) -> None:
        self.device = device
        self.interval_s = interval_s
        self._samples: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if device.type == "cuda" and self._read() is not None:
            self._thread = threading.Thread(target=self._loop, name="gpu-utilization", daemon=True)
            self._thread.start()

    def _read(self) -> float | None:
        try:
            return float(torch.cuda.utilization(self.device))
        except Exception:  # no pynvml, no NVML library, a MIG slice NVML does not report on
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            value = self._read()
            if value is not None:
                with self._lock:
                    self._samples.append(value)

    def take_mean(self) -> float | None:
        with self._lock:
            samples, self._samples = self._samples, []
        return sum(samples) / len(samples) if samples else None

    def close(self) -> None:
        self._stop.set()


class StepProfiler:
    """torch.profiler over the first steps of a run, when ``profile_dir`` is set: the trace (shapes,
    memory, CPU and CUDA activity) goes to that folder, one file per rank, in the Chrome trace
    format TensorBoard's profiler plugin and Perfetto read."""

    def __init__(self, profile_dir: str | None, device: torch.device, rank: int) -> None:
        self.folder = Path(profile_dir) if profile_dir else None
        self._profiler: torch.profiler.profile | None = None
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=PROFILE_ACTIVE, repeat=1
            ),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(self.folder), f"rank{rank}"),
            record_shapes=True,
            profile_memory=True,
        )

    def epoch(self) -> AbstractContextManager[Any]:
        """The context of the first epoch trained (later epochs: nothing). Leaving it writes the
        trace even when the epoch had fewer steps than the schedule."""
        profiler, self._profiler = self._profiler, None
        return profiler if profiler is not None else nullcontext()

    @staticmethod
    def step(context: Any) -> bool:
        """Advance the profiler's schedule; True if a profiler ran this step."""
        if isinstance(context, torch.profiler.profile):
            context.step()
            return True
        return False


class TensorBoardLog:
    """Event files of one run: per-epoch metrics, learning rate, throughput and time shares, and the
    hyperparameters for TensorBoard's HParams view (written first, so a run cut short by a pruner or
    a preemption still shows them; the metric columns read the latest scalar of the same tag)."""

    METRICS = ("val_accuracy", "val_loss", "train_accuracy", "train_loss")

    def __init__(self, folder: str, hparams: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        self.writer: SummaryWriter = SummaryWriter(log_dir=folder)
        values = {k: _hparam_value(v) for k, v in hparams.items()}
        experiment, session_start, _ = hparams_summary(values, {f"epoch/{m}": math.nan for m in self.METRICS})
        file_writer = self.writer._get_file_writer()
        file_writer.add_summary(experiment)
        file_writer.add_summary(session_start)

    def epoch(self, metrics: EpochMetrics) -> None:
        step = metrics.epoch
        for name in self.METRICS:
            self.writer.add_scalar(f"epoch/{name}", getattr(metrics, name), step)
        if metrics.test_accuracy is not None:
            self.writer.add_scalar("epoch/test_accuracy", metrics.test_accuracy, step)
        self.writer.add_scalar("epoch/lr", metrics.lr, step)
        self.writer.add_scalar("speed/images_per_s", metrics.images_per_s, step)
        self.writer.add_scalar("speed/epoch_time_s", metrics.epoch_time_s, step)
        share = metrics.data_wait_share
        if share is not None:
            self.writer.add_scalar("speed/data_wait_share", share, step)
        if metrics.peak_memory_bytes is not None:
            self.writer.add_scalar("speed/peak_memory_mib", metrics.peak_memory_bytes / 2**20, step)
        if metrics.gpu_utilization is not None:
            self.writer.add_scalar("speed/gpu_utilization", metrics.gpu_utilization, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _hparam_value(value: Any) -> Any:
    """HParams takes numbers, strings and booleans; anything else is shown as its text."""
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)
