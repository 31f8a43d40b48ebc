"""Per-epoch checkpoints, written atomically, with everything needed to continue the run exactly.

Exactly means bit-for-bit on CPU; on GPUs, as far as the kernels are deterministic (cudnn_benchmark
picks algorithms by timing, and some CUDA kernels use atomics), the continuation matches an
uninterrupted run up to floating-point reordering.
"""

from __future__ import annotations

import io
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.config import ADDED_SETTINGS
from trainer.errors import ConfigError

CHECKPOINT_NAME = "checkpoint.pt"


@dataclass
class TrainingState:
    """The objects a checkpoint saves and restores."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler


def checkpoint_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / CHECKPOINT_NAME


def save(
    directory: str | os.PathLike[str],
    state: TrainingState,
    epoch: int,
    step: int,
    fingerprint: dict[str, Any],
    history: list[dict[str, Any]],
    stopped: bool = False,
) -> Path:
    """Write to a temporary file, then rename: a crash mid-write leaves the previous checkpoint.

    The payload is serialized in memory first, so that a full or failing disk raises the OS's own
    error with the path (torch.save's file writer reports only "unexpected pos"), and the partial
    file is removed."""
    path = checkpoint_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "epoch": epoch,
        "step": step,
        "fingerprint": fingerprint,
        "history": history,
        "stopped": stopped,
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "scaler": state.scaler.state_dict(),
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        },
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, f"{err.strerror or err}: {path}") from None
    return path


def load(path: Path, map_location: torch.device) -> dict[str, Any]:
    # weights_only=False: the payload holds numpy and Python RNG states; the file is our own.
    payload: dict[str, Any] = torch.load(path, map_location=map_location, weights_only=False)
    return payload


def check_fingerprint(
    path: Path, saved: dict[str, Any], current: dict[str, Any], may_differ: frozenset[str] = frozenset()
) -> None:
    """Refuse to continue a run whose training-defining settings changed since the checkpoint."""
    for key in sorted((set(saved) | set(current)) - may_differ):
        before = saved.get(key, ADDED_SETTINGS.get(key))
        now = current.get(key, ADDED_SETTINGS.get(key))
        if before != now:
            raise ConfigError(
                f"{key} is {now!r} but the checkpoint {path} was written with "
                f"{before!r}; use another checkpoint_dir or restore the setting"
            )


def restore(payload: dict[str, Any], state: TrainingState) -> None:
    state.model.load_state_dict(payload["model"])
    state.optimizer.load_state_dict(payload["optimizer"])
    state.scheduler.load_state_dict(payload["scheduler"])
    state.scaler.load_state_dict(payload["scaler"])
    rng = payload["rng"]
    torch.set_rng_state(rng["torch"].cpu())
    if rng["cuda"] and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])


def adopt_changes(
    optimizer: torch.optim.Optimizer, saved: dict[str, Any], current: dict[str, Any], names: frozenset[str]
) -> None:
    """Put the new values of ``names`` into a restored optimizer.

    A new peak learning rate scales the whole OneCycle schedule (its initial, peak and final
    rates live in the optimizer's parameter groups), so the run continues where the schedule
    stood, at the new height.
    """
    for group in optimizer.param_groups:
        if "lr" in names and saved.get("lr") != current["lr"]:
            ratio = float(current["lr"]) / float(saved["lr"])
            for key in ("lr", "initial_lr", "max_lr", "min_lr"):
                if key in group:
                    group[key] *= ratio
        for key in ("weight_decay", "momentum"):
            if key in names:
                group[key] = current[key]
