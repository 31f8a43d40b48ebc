"""Where datasets live on disk, checked without importing torch (bad input is reported at once)."""

from __future__ import annotations

import os
from pathlib import Path

from trainer.config import DSDIR_IMAGENET, TrainConfig
from trainer.errors import ConfigError

FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def find_fashion_mnist_file(root: Path, stem: str) -> Path | None:
    """Debian's package keeps the .gz files flat; torchvision's download uses FashionMNIST/raw/."""
    for folder in (root, root / "FashionMNIST" / "raw"):
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    return None


def dsdir_hint() -> str:
    """Why the Jean Zay default ($DSDIR/imagenet/RawImages) did not apply, for the error message."""
    dsdir = os.environ.get("DSDIR")
    why = f"{os.path.join(dsdir, DSDIR_IMAGENET)} does not exist" if dsdir else "DSDIR is not set"
    return f" (the default, $DSDIR/{DSDIR_IMAGENET} on Jean Zay, does not apply: {why})"


def check_data_available(config: TrainConfig) -> None:
    """Fail early, with a one-line ConfigError, when the dataset cannot be found."""
    root = config.resolved_data_root
    if config.dataset == "synthetic":
        return
    if root is None:
        raise ConfigError(f"data_root is required for dataset {config.dataset!r}{dsdir_hint()}")
    path = Path(root)
    if config.dataset == "fashion-mnist":
        missing = [
            s for pair in FASHION_MNIST_FILES.values() for s in pair if not find_fashion_mnist_file(path, s)
        ]
        if missing and not config.download:
            raise ConfigError(
                f"data_root {root!r} does not hold Fashion-MNIST (missing {missing[0]}[.gz]); "
                "install Debian's dataset-fashion-mnist, point data_root at the idx files, or set download"
            )
    elif config.dataset == "imagefolder":
        for split in ("train", "val"):
            if not (path / split).is_dir():
                raise ConfigError(f"data_root {root!r} has no {split}/ folder of class folders")
    elif config.dataset == "imagenet" and not path.is_dir():
        raise ConfigError(f"data_root {root!r} does not exist")
