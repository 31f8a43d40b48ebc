"""Datasets, transforms and DataLoaders.

Augmentation is a pure function of (seed, epoch, sample index): the sampler hands the dataset the
epoch with each index, and each sample's transform runs under its own seed. The data a step sees
therefore does not depend on the number of workers, on worker restarts or on where a run was
resumed, which is what lets a resumed run continue exactly like an uninterrupted one.
"""

from __future__ import annotations

import gzip
import itertools
import random
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from trainer.config import TrainConfig
from trainer.errors import ConfigError
from trainer.sources import FASHION_MNIST_FILES, check_data_available, find_fashion_mnist_file

# torchvision is imported where a dataset or transform of its own is used, not here: its modules cost
# about 0.4 s of CPU in every trial process (bench/first_report.py), most of which read Fashion-MNIST's
# idx files by hand. (The dynamo and sympy it imports load anyway: torch's optimizers import them.)
if TYPE_CHECKING:
    from torchvision import datasets as tv_datasets

FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# Images up to this size get CIFAR-style augmentation (pad-and-crop, flip) instead of ImageNet's.
SMALL_IMAGE_MAX = 64

Transform = Callable[[Any], torch.Tensor]


@dataclass
class DataBundle:
    train: Dataset[tuple[torch.Tensor, int]]
    val: Dataset[tuple[torch.Tensor, int]]
    train_size: int
    val_size: int
    num_classes: int
    in_channels: int
    normalize: Normalize
    """Applied to each uint8 batch once it is on the device."""


# --- raw sources ---------------------------------------------------------------------------------
def read_idx(path: Path) -> np.ndarray:
    """Read an idx file (the MNIST family's format), gzip-compressed or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte idx file")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


class InMemoryImages(Dataset[tuple[torch.Tensor, int]]):
    """Small grayscale images held as one uint8 tensor (N, 1, H, W)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images = torch.from_numpy(images.copy()).unsqueeze(1)
        self.labels = torch.from_numpy(labels.astype(np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])

    def resize(self, size: int) -> None:
        resized = F.interpolate(self.images.float(), size=(size, size), mode="bilinear", antialias=True)
        self.images = resized.round().clamp(0, 255).to(torch.uint8)


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """Random images and labels, for throughput measurements and tests.

    A small pool of distinct images is generated once and reused, so that producing a sample costs
    nothing and the measurement is of the model, not of the data.
    """

    POOL = 256

    def __init__(self, size: int, channels: int, image_size: int, num_classes: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        pool = min(size, self.POOL)
        self.size = size
        self.images = torch.randint(
            0, 256, (pool, channels, image_size, image_size), dtype=torch.uint8, generator=generator
        )
        self.labels = torch.randint(0, num_classes, (size,), generator=generator)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index % len(self.images)], int(self.labels[index])


def load_fashion_mnist(config: TrainConfig) -> tuple[InMemoryImages, InMemoryImages]:
    root = Path(config.resolved_data_root or ".")
    if config.download and not find_fashion_mnist_file(root, FASHION_MNIST_FILES["train"][0]):
        from torchvision import datasets as tv_datasets

        for train in (True, False):
            tv_datasets.FashionMNIST(str(root), train=train, download=True)
    splits = []
    for split in ("train", "val"):
        paths = [find_fashion_mnist_file(root, stem) for stem in FASHION_MNIST_FILES[split]]
        if paths[0] is None or paths[1] is None:
            raise ConfigError(f"data_root {str(root)!r} does not hold Fashion-MNIST {split} files")
        splits.append(InMemoryImages(read_idx(paths[0]), read_idx(paths[1])))
    return splits[0], splits[1]


# --- transforms ----------------------------------------------------------------------------------
# Datasets yield uint8 images; conversion to float and normalization run per batch on the device
# (see Normalize), which moves a quarter of the bytes to the GPU and vectorizes the arithmetic.


class PadCropFlip:
    """CIFAR-style light augmentation of a uint8 tensor: zero-pad, random crop, random horizontal flip.

    Written by hand rather than with torchvision's transforms because it takes an explicit random
    generator (no global RNG to seed per sample) and costs ~10 µs per 28 px image instead of ~120 µs.
    """

    def __init__(self, size: int, padding: int) -> None:
        self.size = size
        self.padding = padding

    def __call__(self, image: torch.Tensor, rng: random.Random) -> torch.Tensor:
        p = self.padding
        padded = F.pad(image, (p, p, p, p))
        top = rng.randrange(padded.shape[-2] - self.size + 1)
        left = rng.randrange(padded.shape[-1] - self.size + 1)
        crop = padded[..., top : top + self.size, left : left + self.size]
        return crop.flip(-1).contiguous() if rng.random() < 0.5 else crop.contiguous()


class TorchvisionRandom:
    """A torchvision transform (which draws from torch's global RNG) run under a per-sample seed."""

    def __init__(self, transform: Callable[[Any], torch.Tensor]) -> None:
        self.transform = transform

    def __call__(self, image: Any, rng: random.Random) -> torch.Tensor:
        seed = rng.getrandbits(63)
        if torch.utils.data.get_worker_info() is not None:
            torch.manual_seed(seed)  # a worker's generator is its own
            return self.transform(image)
        with torch.random.fork_rng(devices=[]):  # loading in the main process: keep its RNG untouched
            torch.manual_seed(seed)
            return self.transform(image)


RandomTransform = Callable[[Any, random.Random], torch.Tensor]


def imagenet_transforms(image_size: int, val_size: int) -> tuple[RandomTransform, Transform]:
    """The reference ImageNet recipe: RandomResizedCrop + flip to train, resize + center crop to validate."""
    from torchvision.transforms import v2

    to_uint8 = [v2.ToImage(), v2.ToDtype(torch.uint8)]
    train = v2.Compose(
        [v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip(), *to_uint8]
    )
    val = v2.Compose([v2.Resize(round(val_size / 0.875), antialias=True), v2.CenterCrop(val_size), *to_uint8])
    return TorchvisionRandom(train), val


def small_folder_transforms(image_size: int, val_size: int) -> tuple[RandomTransform, Transform]:
    """Small images read from folders: decode and resize, then the light augmentation."""
    from torchvision.transforms import v2

    def decode(size: int) -> Transform:
        return v2.Compose(
            [v2.ToImage(), v2.Resize(size, antialias=True), v2.CenterCrop(size), v2.ToDtype(torch.uint8)]
        )

    return DecodeThenAugment(decode(image_size), PadCropFlip(image_size, image_size // 8)), decode(val_size)


class DecodeThenAugment:
    def __init__(self, decode: Transform, augment: PadCropFlip) -> None:
        self.decode = decode
        self.augment = augment

    def __call__(self, image: Any, rng: random.Random) -> torch.Tensor:
        return self.augment(self.decode(image), rng)


class Normalize:
    """uint8 batch on the device -> float, scaled to [0, 1] and standardized per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(1, -1, 1, 1) * 255
        self.inv_std = 1 / (torch.tensor(std).view(1, -1, 1, 1) * 255)

    def to(self, device: torch.device) -> Normalize:
        self.mean, self.inv_std = self.mean.to(device), self.inv_std.to(device)
        return self

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return (images.float() - self.mean) * self.inv_std


class SeededTransform(Dataset[tuple[torch.Tensor, int]]):
    """Applies a transform; a random one runs under a generator seeded with (seed, epoch, index).

    Training indices arrive as ``(epoch, index)`` pairs from :class:`EpochSampler`; evaluation
    indices as plain ints, with a deterministic transform.
    """

    def __init__(
        self,
        base: Dataset[tuple[Any, int]],
        transform: RandomTransform | Transform | None,
        seed: int,
        load_delay_s: float = 0.0,
    ) -> None:
        self.base = base
        self.transform = transform
        self.seed = seed
        self.load_delay_s = load_delay_s

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key if isinstance(key, tuple) else (None, key)
        if self.load_delay_s:
            time.sleep(self.load_delay_s)  # a slow filesystem's latency: waits, spends no CPU
        image, label = self.base[index]
        if self.transform is None:
            return image, label
        if epoch is None:
            return self.transform(image), label  # type: ignore[call-arg]
        # hash() of a tuple of ints is the same in every process (no PYTHONHASHSEED salt).
        rng = random.Random(hash((self.seed, epoch, index)))
        return self.transform(image, rng), label  # type: ignore[call-arg]


# --- samplers ------------------------------------------------------------------------------------
class EpochSampler(Sampler[tuple[int, int]]):
    """DistributedSampler over a fixed subset of indices, yielding (epoch, index) pairs; at most
    ``limit`` of them per epoch (the first of the epoch's shuffled order), so that loader workers
    never prefetch batches past an epoch cut short by max_steps_per_epoch, which persistent workers
    would otherwise load, and the next epoch wait for, before its own first batch."""

    def __init__(
        self,
        indices: Sequence[int],
        rank: int,
        world_size: int,
        seed: int,
        drop_last: bool,
        limit: int | None = None,
    ) -> None:
        self.indices = list(indices)
        self.limit = limit
        self.inner: DistributedSampler[int] = DistributedSampler(
            self.indices,  # type: ignore[arg-type]  # it only needs len()
            num_replicas=world_size,
            rank=rank,
            shuffle=True,
            seed=seed,
            drop_last=drop_last,
        )
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((self.epoch, self.indices[i]) for i in itertools.islice(self.inner, self.limit))

    def __len__(self) -> int:
        return len(self.inner) if self.limit is None else min(len(self.inner), self.limit)


class ShardSampler(Sampler[int]):
    """Every rank evaluates a disjoint share, without DistributedSampler's padding duplicates,
    so that metrics summed across ranks are exact."""

    def __init__(self, indices: Sequence[int], rank: int, world_size: int) -> None:
        self.indices = list(indices)[rank::world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def fixed_subset(size: int, fraction: float, seed: int) -> list[int]:
    """A subset of ``fraction`` of the indices, the same for a given seed on every rank and run."""
    if fraction >= 1:
        return list(range(size))
    count = max(1, int(size * fraction))
    generator = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(size, generator=generator)[:count].tolist())


# --- assembly ------------------------------------------------------------------------------------
def build_datasets(config: TrainConfig) -> DataBundle:
    check_data_available(config)
    size, val_size = config.resolved_image_size, config.resolved_val_image_size
    train_base: Dataset[tuple[Any, int]]
    val_base: Dataset[tuple[Any, int]]
    train_tf: RandomTransform | None
    val_tf: Transform | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    if config.dataset == "fashion-mnist":
        train_base, val_base = load_fashion_mnist(config)
        # Resized once as a whole in memory, not every sample every epoch.
        if size != 28:
            train_base.resize(size)
        if val_size != 28:
            val_base.resize(val_size)
        train_tf, val_tf = PadCropFlip(size, size // 8), None
        mean, std, num_classes, channels = FASHION_MNIST_MEAN, FASHION_MNIST_STD, 10, 1
    elif config.dataset in ("imagefolder", "imagenet"):
        train_folder, val_folder = _open_folders(config)
        train_base, val_base = train_folder, val_folder
        if size <= SMALL_IMAGE_MAX:
            train_tf, val_tf = small_folder_transforms(size, val_size)
        else:
            train_tf, val_tf = imagenet_transforms(size, val_size)
        mean, std, num_classes, channels = IMAGENET_MEAN, IMAGENET_STD, len(train_folder.classes), 3
    else:
        classes = config.synthetic_num_classes
        train_base = SyntheticImages(config.synthetic_train_samples, 3, size, classes, config.seed)
        val_base = SyntheticImages(config.synthetic_val_samples, 3, val_size, classes, config.seed + 1)
        train_tf = val_tf = None
        mean, std, num_classes, channels = (127.5 / 255,) * 3, (64 / 255,) * 3, classes, 3
    return DataBundle(
        train=SeededTransform(train_base, train_tf, config.seed, config.load_delay_ms / 1000),
        val=SeededTransform(val_base, val_tf, config.seed),
        train_size=len(train_base),  # type: ignore[arg-type]
        val_size=len(val_base),  # type: ignore[arg-type]
        num_classes=num_classes,
        in_channels=channels,
        normalize=Normalize(mean, std),
    )


def _open_folders(config: TrainConfig) -> tuple[tv_datasets.ImageFolder, tv_datasets.ImageFolder]:
    """The train and val class folders; unusable ones are a one-line ConfigError, not a traceback."""
    from torchvision import datasets as tv_datasets

    root = config.resolved_data_root or "."
    try:
        if config.dataset == "imagefolder":
            train = tv_datasets.ImageFolder(str(Path(root) / "train"))
            val = tv_datasets.ImageFolder(str(Path(root) / "val"))
        else:
            train = tv_datasets.ImageNet(root, split="train")
            val = tv_datasets.ImageNet(root, split="val")
    except (FileNotFoundError, RuntimeError) as err:
        raise ConfigError(f"data_root {root!r}: {str(err).splitlines()[0]}") from None
    if train.classes != val.classes:
        # ImageFolder numbers classes by sorted folder name: a class missing on one side would
        # shift every label after it and make the validation accuracy meaningless.
        differ = sorted(set(train.classes) ^ set(val.classes))
        raise ConfigError(f"data_root {root!r}: train/ and val/ hold different classes (e.g. {differ[0]!r})")
    return train, val


def build_loaders(
    config: TrainConfig, bundle: DataBundle, rank: int, world_size: int, use_cuda: bool
) -> tuple[DataLoader[Any], EpochSampler, DataLoader[Any]]:
    train_sampler = EpochSampler(
        fixed_subset(bundle.train_size, config.train_fraction, config.seed),
        rank,
        world_size,
        config.seed,
        config.drop_last,
        limit=None if config.max_steps_per_epoch is None else config.max_steps_per_epoch * config.batch_size,
    )
    val_sampler = ShardSampler(
        fixed_subset(bundle.val_size, config.val_fraction, config.seed), rank, world_size
    )
    workers = config.num_workers
    common: dict[str, Any] = {
        "num_workers": workers,
        "pin_memory": config.pin_memory and use_cuda,
    }
    if workers > 0:
        common["persistent_workers"] = config.persistent_workers
        common["prefetch_factor"] = config.prefetch_factor
    train_loader = DataLoader(
        bundle.train,
        batch_size=config.batch_size,
        sampler=train_sampler,
        drop_last=config.drop_last,
        **common,
    )
    val_loader = DataLoader(
        bundle.val, batch_size=config.val_batch_size or 2 * config.batch_size, sampler=val_sampler, **common
    )
    return train_loader, train_sampler, val_loader


def build_held_out_loader(
    config: TrainConfig, bundle: DataBundle, rank: int, world_size: int, use_cuda: bool
) -> DataLoader[Any]:
    """The validation split's images that ``val_fraction`` leaves out: a test set no epoch scored."""
    scored = set(fixed_subset(bundle.val_size, config.val_fraction, config.seed))
    rest = [index for index in range(bundle.val_size) if index not in scored]
    return DataLoader(
        bundle.val,
        batch_size=config.val_batch_size or 2 * config.batch_size,
        sampler=ShardSampler(rest, rank, world_size),
        pin_memory=config.pin_memory and use_cuda,
    )
