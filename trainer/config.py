"""The trainer's configuration: one validated dataclass, every field documented.

A field's ``help`` metadata is its documentation; the command line (``python -m trainer --help``)
and the HPO layer's error messages are generated from it, so there is one place to read.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union

from trainer.errors import ConfigError
from trainer.yamlfile import load_yaml_mapping

TORCHVISION_MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
# CIFAR-style ResNets (He et al. 2016, section 4.2): depth 6n+2, three stages, narrow. Cheap enough
# to train many short trials on a CPU or a small GPU slice.
CIFAR_MODELS = ("resnet8", "resnet14", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110")
MODELS = TORCHVISION_MODELS + CIFAR_MODELS
DATASETS = ("fashion-mnist", "imagefolder", "imagenet", "synthetic")
AMP_MODES = ("auto", "off", "fp16", "bf16")
DEVICES = ("auto", "cpu", "cuda")
ANNEAL_STRATEGIES = ("cos", "linear")

# Where Debian's package dataset-fashion-mnist puts the raw idx files.
DEFAULT_FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"

# Fields that do not change what is computed (only how fast, or where things go). A checkpoint
# written under different values of these may be resumed; any other difference is refused.
RUNTIME_ONLY_FIELDS = frozenset(
    {
        "data_root",
        "download",
        "num_workers",
        "pin_memory",
        "non_blocking",
        "persistent_workers",
        "prefetch_factor",
        "checkpoint_dir",
        "log_every",
        "dist_timeout_s",
        "compile",
        "cudnn_benchmark",
        "val_batch_size",
        "resume_may_change",
        "test_held_out",
    }
)
# What a resumed run may take up with a new value (Population Based Training hands a run another
# run's weights with perturbed settings): the optimizer's settings, changeable mid-schedule.
RESUMABLE_CHANGES = ("lr", "weight_decay", "momentum")


def _field(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines one short training run (one HPO trial)."""

    # --- model and data -------------------------------------------------------------------------
    model: str = _field("resnet20", f"Network: one of {', '.join(MODELS)}.")
    width: int = _field(16, "Channels of the first stage of a CIFAR-style ResNet (16 in the paper).")
    dataset: str = _field("fashion-mnist", f"Dataset: one of {', '.join(DATASETS)}.")
    data_root: str | None = _field(
        None,
        "Dataset directory. fashion-mnist: the raw idx(.gz) files (default "
        f"{DEFAULT_FASHION_MNIST_ROOT}); imagefolder: a folder with train/ and val/ class folders; "
        "imagenet: torchvision's ImageNet layout.",
    )
    download: bool = _field(False, "Download Fashion-MNIST into data_root if it is missing (needs internet).")
    image_size: int | None = _field(
        None, "Training crop size in pixels (default: 28 for fashion-mnist, 224 otherwise)."
    )
    synthetic_num_classes: int = _field(10, "Number of classes of the synthetic dataset.")
    synthetic_train_samples: int = _field(10_000, "Training-set size of the synthetic dataset.")
    synthetic_val_samples: int = _field(1_000, "Validation-set size of the synthetic dataset.")

    # --- length of the run ----------------------------------------------------------------------
    epochs: int = _field(1, "Number of epochs.")
    train_fraction: float = _field(
        1.0, "Fraction of the training set used, a fixed subset drawn with the seed; in (0, 1]."
    )
    max_steps_per_epoch: int | None = _field(None, "Cap on optimizer steps per epoch (default: no cap).")
    val_fraction: float = _field(1.0, "Fraction of the validation set evaluated each epoch; in (0, 1].")
    test_held_out: bool = _field(
        False,
        "After the last epoch, also evaluate on the validation-split images that val_fraction leaves "
        "out: a test set that no epoch's score (and so no search) has seen; needs val_fraction < 1.",
    )

    # --- optimization ---------------------------------------------------------------------------
    batch_size: int = _field(128, "Batch size per process (per GPU).")
    val_batch_size: int | None = _field(None, "Validation batch size per process (default: 2 x batch_size).")
    lr: float = _field(0.1, "Peak learning rate of the OneCycle schedule (its max_lr).")
    momentum: float = _field(0.9, "SGD momentum, in [0, 1).")
    nesterov: bool = _field(False, "Use Nesterov momentum.")
    weight_decay: float = _field(5e-4, "SGD weight decay (L2), >= 0.")
    label_smoothing: float = _field(0.1, "Label smoothing of the cross-entropy loss, in [0, 1).")
    pct_start: float = _field(0.25, "OneCycle: fraction of the steps spent increasing the LR, in (0, 1).")
    div_factor: float = _field(25.0, "OneCycle: initial LR = lr / div_factor; > 0.")
    final_div_factor: float = _field(1e4, "OneCycle: final LR = initial LR / final_div_factor; > 0.")
    anneal_strategy: str = _field("cos", "OneCycle annealing: cos or linear.")
    three_phase: bool = _field(False, "OneCycle: three phases (up, down symmetric, then annihilate).")

    # --- speed ----------------------------------------------------------------------------------
    amp: str = _field(
        "auto",
        "Mixed precision: off, fp16 (with a GradScaler), bf16, or auto (bf16 on a GPU that has it, "
        "fp16 on older GPUs, off on CPU).",
    )
    channels_last: bool = _field(True, "Use the channels_last memory format for the model and inputs.")
    compile: bool = _field(False, "Compile the model with torch.compile.")
    cudnn_benchmark: bool = _field(True, "Let cuDNN pick the fastest convolution algorithms.")
    num_workers: int = _field(4, "DataLoader worker processes per process (0: load in the main process).")
    pin_memory: bool = _field(True, "Pin host memory of batches (CUDA only).")
    non_blocking: bool = _field(True, "Copy batches to the GPU asynchronously.")
    persistent_workers: bool = _field(True, "Keep DataLoader workers alive between epochs.")
    prefetch_factor: int = _field(2, "Batches each DataLoader worker prepares in advance.")
    drop_last: bool = _field(True, "Drop the last incomplete training batch.")
    device: str = _field("auto", "Device: auto (CUDA if available), cpu or cuda.")

    # --- reproducibility, persistence, logging --------------------------------------------------
    seed: int = _field(0, "Seed of the model initialisation, the data order and the augmentation.")
    checkpoint_dir: str | None = _field(
        None, "Directory of the per-epoch checkpoint; the run resumes from it if it holds one."
    )
    resume_may_change: str = _field(
        "",
        "Comma-separated settings a resumed checkpoint may have been written with other values of "
        f"(any of {', '.join(RESUMABLE_CHANGES)}): the run goes on with the new ones; a new lr scales "
        "the rest of the OneCycle schedule.",
    )
    log_every: int = _field(50, "Print a progress line every this many steps on rank 0 (0: per epoch only).")
    dist_timeout_s: int = _field(600, "Timeout of collective operations across ranks, in seconds.")

    def __post_init__(self) -> None:
        _check_types(self)
        self._check_values()

    def _check_values(self) -> None:
        _choice("model", self.model, MODELS)
        _choice("dataset", self.dataset, DATASETS)
        _choice("amp", self.amp, AMP_MODES)
        _choice("device", self.device, DEVICES)
        _choice("anneal_strategy", self.anneal_strategy, ANNEAL_STRATEGIES)
        for name in ("epochs", "batch_size", "width", "prefetch_factor", "dist_timeout_s"):
            _positive(name, getattr(self, name))
        for name in ("synthetic_num_classes", "synthetic_train_samples", "synthetic_val_samples"):
            _positive(name, getattr(self, name))
        for name in ("image_size", "val_batch_size", "max_steps_per_epoch"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        for name in ("lr", "div_factor", "final_div_factor"):
            _positive(name, getattr(self, name))
        for name in ("num_workers", "log_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not 0 < self.pct_start < 1:
            raise ConfigError(f"pct_start must be in (0, 1), got {self.pct_start!r}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        for name in ("train_fraction", "val_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in (0, 1], got {getattr(self, name)!r}")
        if self.test_held_out and self.val_fraction >= 1:
            raise ConfigError(
                "test_held_out needs val_fraction < 1: the test images are those val_fraction leaves out"
            )
        for name in self.resume_changes:
            if name not in RESUMABLE_CHANGES:
                raise ConfigError(
                    f"resume_may_change: {name!r} cannot change mid-run; choose from {', '.join(RESUMABLE_CHANGES)}"
                )
        if self.nesterov and self.momentum == 0:
            raise ConfigError("nesterov needs momentum > 0, got momentum=0")
        if self.width != 16 and self.model not in CIFAR_MODELS:
            raise ConfigError(
                f"width applies to the CIFAR-style models ({', '.join(CIFAR_MODELS)}), not {self.model!r}"
            )

    # --- derived values -------------------------------------------------------------------------
    @property
    def resolved_image_size(self) -> int:
        if self.image_size is not None:
            return self.image_size
        return 28 if self.dataset == "fashion-mnist" else 224

    @property
    def resolved_data_root(self) -> str | None:
        if self.data_root is not None:
            return os.path.expanduser(self.data_root)
        if self.dataset == "fashion-mnist":
            return DEFAULT_FASHION_MNIST_ROOT
        return None

    @property
    def resume_changes(self) -> frozenset[str]:
        return frozenset(name.strip() for name in self.resume_may_change.split(",") if name.strip())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def training_fingerprint(self) -> dict[str, Any]:
        """The fields that define what is computed; a checkpoint must match them to be resumed."""
        return {k: v for k, v in self.to_dict().items() if k not in RUNTIME_ONLY_FIELDS}

    # --- construction from files and mappings ---------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str | None = None) -> TrainConfig:
        """Build a config from a mapping, rejecting unknown keys with the list of valid ones."""
        try:
            not_names = [k for k in values if not isinstance(k, str)]
            if not_names:
                raise ConfigError(f"keys must be names, got {not_names[0]!r}")
            unknown = sorted(set(values) - set(field_names()))
            if unknown:
                raise ConfigError(f"unknown key {unknown[0]!r}; valid keys: {', '.join(field_names())}")
            return cls(**values)
        except ConfigError as err:
            if source is None:
                raise
            raise ConfigError(f"{source}: {err}") from None

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
        """Read a flat YAML mapping of field names to values; ``overrides`` win over the file."""
        values = load_yaml_mapping(path)
        values.update(overrides or {})
        return cls.from_mapping(values, source=str(path))


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


@functools.cache
def field_types() -> dict[str, Any]:
    """The annotated type of each field, resolved (the module uses postponed annotations)."""
    return typing.get_type_hints(TrainConfig)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")


def _check_types(config: TrainConfig) -> None:
    """Reject values of the wrong type (YAML and Python callers bypass argparse's conversion).

    An int is accepted where a float is expected (``lr: 1`` in YAML) and converted.
    """
    for name, annotation in field_types().items():
        value = getattr(config, name)
        base, optional = unwrap_optional(annotation)
        if value is None:
            if optional:
                continue
            raise ConfigError(f"{name} must be a {base.__name__}, got None")
        if base is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(config, name, float(value))
            continue
        # bool is a subclass of int: `batch_size: true` must not pass as 1.
        if not isinstance(value, base) or (base is int and isinstance(value, bool)):
            raise ConfigError(f"{name} must be a {base.__name__}, got {value!r}")


def unwrap_optional(annotation: Any) -> tuple[type, bool]:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    if origin is Literal:
        return str, False
    return annotation, False
