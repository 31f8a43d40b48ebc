"""A short AMP/DDP ResNet training run: the unit of work of every HPO trial.

Importable (``train(config, reporter) -> TrainResult``) and runnable (``python -m trainer``).
It never imports Optuna or Ray: the HPO layer talks to it through :class:`Reporter`.
``train`` is imported on first use, so that validating a config does not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.config import TrainConfig
from trainer.errors import ConfigError, StopRequested, TrialOutOfMemory
from trainer.reporting import Decision, EpochMetrics, Reporter, TimeBreakdown, TrainResult

if TYPE_CHECKING:
    from trainer.loop import train

__all__ = [
    "ConfigError",
    "Decision",
    "EpochMetrics",
    "Reporter",
    "StopRequested",
    "TimeBreakdown",
    "TrainConfig",
    "TrainResult",
    "TrialOutOfMemory",
    "train",
]


def __getattr__(name: str) -> Any:
    if name == "train":
        from trainer.loop import train

        return train
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
