"""A task of another family for the replay's tables: a 1-D convolutional network on MNIST-1D
(Greydanus, 2020: ten digit templates as 40-sample signals, padded, translated, scaled, sheared
and noised), trained with SGD and OneCycle for a given number of epochs. The data are generated
by the ``mnist1d`` package's own code (no download), once, into a cache file that later runs read.

10,000 signals from the generator's seed 42: the first 2,000 for training (few, so that the
settings matter: the best reach about 0.9), the last 4,000 split into 2,000 for validation and
2,000 held out for the test. ``--seed`` changes only the initialization and the order of the
batches.
A script as a user writes one: flags in, one line per epoch out; ``bench/curves/mnist1d-cnn-18ep``
tunes it through ``objective.command``.

    python bench/tasks/mnist1d_cnn.py --lr 0.1 --width 16 --epochs 18
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES = 10_000
GENERATOR_SEED = 42


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.1, help="peak learning rate (OneCycle)")
    parser.add_argument("--wd", type=float, default=1e-4, help="weight decay")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=16, help="channels of each convolution")
    parser.add_argument("--pct-start", type=float, default=0.3, help="OneCycle warm-up fraction")
    parser.add_argument("--epochs", type=int, default=18)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def signals() -> tuple[np.ndarray, np.ndarray]:
    """The 10,000 signals and labels, generated once into the user's cache (seconds), then read."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hpo-bench"
    path = cache / f"mnist1d-{SAMPLES}-{GENERATOR_SEED}.npz"
    if not path.exists():
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples, args.seed, args.train_split = SAMPLES, GENERATOR_SEED, 1.0
        data = make_dataset(args)
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache, suffix=".npz", delete=False) as tmp:
            np.savez(tmp, x=data["x"].astype(np.float32), y=data["y"].astype(np.int64))
        os.replace(tmp.name, path)  # two trials generating at once: both write the same, one wins
    with np.load(path) as held:
        return held["x"], held["y"]


def splits() -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    x, y = (torch.from_numpy(a) for a in signals())
    x = x.unsqueeze(1)  # one channel
    return (
        TensorDataset(x[:2000], y[:2000]),
        TensorDataset(x[6000:8000], y[6000:8000]),
        TensorDataset(x[8000:], y[8000:]),
    )


def network(width: int) -> nn.Module:
    """Three convolutions of stride 2 over the 40 samples, then a linear layer (the MNIST-1D
    paper's CNN, with batch normalization and a chosen width)."""
    layers: list[nn.Module] = []
    channels = 1
    for _ in range(3):
        layers += [nn.Conv1d(channels, width, 5, stride=2, padding=2), nn.BatchNorm1d(width), nn.ReLU()]
        channels = width
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(width * 5, 10))


def accuracy(model: nn.Module, data: TensorDataset) -> float:
    model.eval()
    with torch.no_grad():
        inputs, labels = data.tensors
        return float((model(inputs).argmax(1) == labels).float().mean())


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_set, val_set, test_set = splits()
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=generator)
    model = network(args.width)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=args.wd
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, epochs=args.epochs, steps_per_epoch=len(loader), pct_start=args.pct_start
    )
    for epoch in range(1, args.epochs + 1):
        began = time.perf_counter()
        model.train()
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            scheduler.step()
        # A diverged run goes on at chance accuracy: its curve says so, as a real run's would.
        val, test = accuracy(model, val_set), accuracy(model, test_set)
        if not math.isfinite(float(loss.detach())):
            val = test = 0.1
        print(
            f"epoch {epoch}/{args.epochs} loss {float(loss.detach()):.4f} val_acc {val:.4f} test_acc {test:.4f} "
            f"time {time.perf_counter() - began:.4f}s",
            flush=True,
        )


if __name__ == "__main__":
    main()
