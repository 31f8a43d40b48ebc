"""The trainer's configuration: one validated dataclass, every field documented.

Each field is declared once (``trainer.fields``): its type, default, bounds and help text. The help
text is its documentation; the command line (``python -m trainer --help``), the study file's JSON
schema and the HPO layer's error messages are generated from it, so there is one place to read.
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
from trainer.fields import build, config_dataclass, field
from trainer.yamlfile import load_yaml_mapping

TorchvisionModel = Literal["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]
# CIFAR-style ResNets (He et al. 2016, section 4.2): depth 6n+2, three stages, narrow. Cheap enough
# to train many short trials on a CPU or a small GPU slice.
CifarModel = Literal["resnet8", "resnet14", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110"]
Model = Literal[TorchvisionModel, CifarModel]
Dataset = Literal["fashion-mnist", "imagefolder", "imagenet", "synthetic"]
AmpMode = Literal["auto", "off", "fp16", "bf16"]
Device = Literal["auto", "cpu", "cuda"]
AnnealStrategy = Literal["cos", "linear"]

TORCHVISION_MODELS: tuple[str, ...] = typing.get_args(TorchvisionModel)
CIFAR_MODELS: tuple[str, ...] = typing.get_args(CifarModel)
MODELS = TORCHVISION_MODELS + CIFAR_MODELS
DATASETS: tuple[str, ...] = typing.get_args(Dataset)
AMP_MODES: tuple[str, ...] = typing.get_args(AmpMode)
DEVICES: tuple[str, ...] = typing.get_args(Device)
ANNEAL_STRATEGIES: tuple[str, ...] = typing.get_args(AnnealStrategy)

# Where Debian's package dataset-fashion-mnist puts the raw idx files.
DEFAULT_FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
# Where Jean Zay (IDRIS) shares ImageNet, under $DSDIR: train/ and val/ class folders. The default
# data root of imagefolder and imagenet wherever DSDIR is set and this folder exists.
DSDIR_IMAGENET = "imagenet/RawImages"

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
        "load_delay_ms",
        "profile_dir",
        "tensorboard_dir",
    }
)
# What a resumed run may take up with a new value (Population Based Training hands a run another
# run's weights with perturbed settings): the optimizer's settings, changeable mid-schedule.
RESUMABLE_CHANGES = ("lr", "weight_decay", "momentum")


@config_dataclass(flat=True, allow_inf_nan=True)
class TrainConfig:
    """Everything that defines one short training run (one HPO trial)."""

    # --- model and data -------------------------------------------------------------------------
    model: Model = field("resnet20", f"Network: one of {', '.join(MODELS)}.")
    width: int = field(16, "Channels of the first stage of a CIFAR-style ResNet (16 in the paper).", gt=0)
    dataset: Dataset = field("fashion-mnist", f"Dataset: one of {', '.join(DATASETS)}.")
    data_root: str | None = field(
        None,
        "Dataset directory. fashion-mnist: the raw idx(.gz) files (default "
        f"{DEFAULT_FASHION_MNIST_ROOT}); imagefolder: a folder with train/ and val/ class folders; "
        "imagenet: torchvision's ImageNet layout. For those two the default is $DSDIR/imagenet/RawImages "
        "where DSDIR is set and it exists (Jean Zay's shared datasets).",
    )
    download: bool = field(False, "Download Fashion-MNIST into data_root if it is missing (needs internet).")
    image_size: int | None = field(
        None, "Training crop size in pixels (default: 28 for fashion-mnist, 224 otherwise).", gt=0
    )
    val_image_size: int | None = field(
        None,
        "Validation size in pixels (default: the training size). Training at a lower resolution than "
        "validation is the course's ImageNet recipe (176 px to train, 224 px to validate): the random "
        "crops of training show objects larger than the center crops of validation do.",
        gt=0,
    )
    synthetic_num_classes: int = field(10, "Number of classes of the synthetic dataset.", gt=0)
    synthetic_train_samples: int = field(10_000, "Training-set size of the synthetic dataset.", gt=0)
    synthetic_val_samples: int = field(1_000, "Validation-set size of the synthetic dataset.", gt=0)

    # --- length of the run ----------------------------------------------------------------------
    epochs: int = field(1, "Number of epochs.", gt=0)
    train_fraction: float = field(
        1.0, "Fraction of the training set used, a fixed subset drawn with the seed; in (0, 1].", gt=0, le=1
    )
    max_steps_per_epoch: int | None = field(None, "Cap on optimizer steps per epoch (default: no cap).", gt=0)
    val_fraction: float = field(
        1.0, "Fraction of the validation set evaluated each epoch; in (0, 1].", gt=0, le=1
    )
    test_held_out: bool = field(
        False,
        "After the last epoch, also evaluate on the validation-split images that val_fraction leaves "
        "out: a test set that no epoch's score (and so no search) has seen; needs val_fraction < 1.",
    )

    # --- optimization ---------------------------------------------------------------------------
    batch_size: int = field(128, "Batch size per process (per GPU).", gt=0)
    val_batch_size: int | None = field(
        None, "Validation batch size per process (default: 2 x batch_size).", gt=0
    )
    lr: float = field(0.1, "Peak learning rate of the OneCycle schedule (its max_lr).", gt=0)
    momentum: float = field(0.9, "SGD momentum, in [0, 1).", ge=0, lt=1)
    nesterov: bool = field(False, "Use Nesterov momentum.")
    weight_decay: float = field(5e-4, "SGD weight decay (L2), >= 0.", ge=0)
    label_smoothing: float = field(0.1, "Label smoothing of the cross-entropy loss, in [0, 1).", ge=0, lt=1)
    pct_start: float = field(
        0.25, "OneCycle: fraction of the steps spent increasing the LR, in (0, 1).", gt=0, lt=1
    )
    div_factor: float = field(25.0, "OneCycle: initial LR = lr / div_factor; > 0.", gt=0)
    final_div_factor: float = field(1e4, "OneCycle: final LR = initial LR / final_div_factor; > 0.", gt=0)
    anneal_strategy: AnnealStrategy = field("cos", "OneCycle annealing: cos or linear.")
    three_phase: bool = field(False, "OneCycle: three phases (up, down symmetric, then annihilate).")
    cycle_momentum: bool = field(
        False,
        "OneCycle: cycle SGD's momentum inversely to the LR, from momentum down to base_momentum at the "
        "LR's peak and back (OneCycleLR's own default, left on by the course's dlojz.py). Off by default "
        "so that the momentum being tuned is the momentum used.",
    )
    base_momentum: float = field(
        0.85, "OneCycle with cycle_momentum: the momentum at the LR's peak, in [0, momentum].", ge=0, lt=1
    )

    # --- speed ----------------------------------------------------------------------------------
    amp: AmpMode = field(
        "auto",
        "Mixed precision: off, fp16 (with a GradScaler), bf16, or auto (bf16 on a GPU that has it, "
        "fp16 on older GPUs, off on CPU).",
    )
    channels_last: bool = field(True, "Use the channels_last memory format for the model and inputs.")
    compile: bool = field(False, "Compile the model with torch.compile.")
    cudnn_benchmark: bool = field(True, "Let cuDNN pick the fastest convolution algorithms.")
    num_workers: int = field(
        4, "DataLoader worker processes per process (0: load in the main process).", ge=0
    )
    pin_memory: bool = field(True, "Pin host memory of batches (CUDA only).")
    non_blocking: bool = field(True, "Copy batches to the GPU asynchronously.")
    persistent_workers: bool = field(True, "Keep DataLoader workers alive between epochs.")
    prefetch_factor: int = field(2, "Batches each DataLoader worker prepares in advance.", gt=0)
    drop_last: bool = field(True, "Drop the last incomplete training batch.")
    load_delay_ms: float = field(
        0.0,
        "Added wait per training image loaded, in ms: emulates a slow shared filesystem, to see what the "
        "DataLoader settings hide (python -m trainer --tune-loader) and what the data-wait share shows.",
        ge=0,
    )
    device: Device = field("auto", "Device: auto (CUDA if available), cpu or cuda.")

    # --- reproducibility, persistence, logging --------------------------------------------------
    seed: int = field(0, "Seed of the model initialisation, the data order and the augmentation.")
    checkpoint_dir: str | None = field(
        None, "Directory of the per-epoch checkpoint; the run resumes from it if it holds one."
    )
    resume_may_change: str = field(
        "",
        "Comma-separated settings a resumed checkpoint may have been written with other values of "
        f"(any of {', '.join(RESUMABLE_CHANGES)}): the run goes on with the new ones; a new lr scales "
        "the rest of the OneCycle schedule.",
    )
    log_every: int = field(
        50, "Print a progress line every this many steps on rank 0 (0: per epoch only).", ge=0
    )
    profile_dir: str | None = field(
        None,
        "Run torch.profiler over steps 2-6 of the first epoch trained (wait 1, warm-up 1, active 5), "
        "with shapes and memory, and write its trace into this folder (TensorBoard's profiler plugin "
        "or Perfetto read it).",
    )
    tensorboard_dir: str | None = field(
        None, "Write TensorBoard event files here: per-epoch metrics, learning rate, throughput, data wait."
    )
    dist_timeout_s: int = field(600, "Timeout of collective operations across ranks, in seconds.", gt=0)

    def __post_init__(self) -> None:
        """The checks that involve several keys (types, choices and bounds are the fields')."""
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
        if self.cycle_momentum and "momentum" in self.resume_changes:
            raise ConfigError(
                "resume_may_change: momentum cannot change mid-run with cycle_momentum, whose cycle sets it"
            )
        if self.cycle_momentum and self.base_momentum > self.momentum:
            raise ConfigError(
                f"base_momentum {self.base_momentum} is above momentum {self.momentum}: with cycle_momentum "
                "the momentum falls from momentum to base_momentum"
            )
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
    def resolved_val_image_size(self) -> int:
        return self.val_image_size if self.val_image_size is not None else self.resolved_image_size

    @property
    def resolved_data_root(self) -> str | None:
        if self.data_root is not None:
            return os.path.expanduser(self.data_root)
        if self.dataset == "fashion-mnist":
            return DEFAULT_FASHION_MNIST_ROOT
        if self.dataset in ("imagefolder", "imagenet") and os.environ.get("DSDIR"):
            shared = os.path.join(os.environ["DSDIR"], DSDIR_IMAGENET)
            if os.path.isdir(shared):
                return shared
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
            return build(cls, values)
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


# Settings that change what is computed, added after studies and checkpoints were first stored,
# with the value every run had before they existed. A stored fingerprint that lacks one compares as
# that value, so older studies and checkpoints stay resumable and a file that sets another value is
# a change. A new such field gets its entry here (its behaviour before, not its default, which may
# change later).
ADDED_SETTINGS: dict[str, Any] = {"val_image_size": None, "cycle_momentum": False, "base_momentum": 0.85}


@functools.cache
def field_types() -> dict[str, Any]:
    """The annotated type of each field, resolved (the module uses postponed annotations)."""
    return typing.get_type_hints(TrainConfig)


def unwrap_optional(annotation: Any) -> tuple[type, bool]:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    if origin is Literal:
        return str, False
    return annotation, False
