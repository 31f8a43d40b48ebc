"""A task of another optimizer for the replay's tables: an MLP on Fashion-MNIST (Debian's
dataset-fashion-mnist, read from its idx files), trained with AdamW under OneCycle (which cycles
Adam's first beta as it would SGD's momentum) for a given number of epochs. Its learning rates
live two decades below the SGD tasks', so a portfolio that transfers must speak of the space, not
of absolute values.

The split is fixed: the first 4,000 training images to train, the last 2,000 of the training
file to validate, the first 2,000 of the test file held out. Images are pooled to 14x14 (2x2
means) to keep an epoch under a second on one CPU. ``--seed`` changes only the initialization and
the order of the batches. A script as a user writes one: flags in, one line per epoch out;
``bench/curves/fmnist-mlp-adamw-12ep`` tunes it through ``objective.command``.

    python bench/tasks/fmnist_mlp_adamw.py --lr 0.003 --hidden 256 --epochs 12
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DATA = Path(os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (OneCycle)")
    parser.add_argument("--wd", type=float, default=1e-2, help="AdamW's decoupled weight decay")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256, help="units of each of the two hidden layers")
    parser.add_argument("--pct-start", type=float, default=0.3, help="OneCycle warm-up fraction")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def idx(name: str, offset: int) -> np.ndarray:
    with gzip.open(DATA / f"{name}.gz") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def images(name: str, count: int, tail: bool = False) -> torch.Tensor:
    raw = idx(name, 16).reshape(-1, 28, 28)
    raw = raw[-count:] if tail else raw[:count]
    x = torch.from_numpy(raw.astype(np.float32) / 255.0).unsqueeze(1)
    return F.avg_pool2d(x, 2).flatten(1)  # 14x14: 196 inputs


def labels(name: str, count: int, tail: bool = False) -> torch.Tensor:
    raw = idx(name, 8)
    return torch.from_numpy((raw[-count:] if tail else raw[:count]).astype(np.int64))


def splits() -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    train_x, train_y = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"
    test_x, test_y = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"
    return (
        TensorDataset(images(train_x, 4000), labels(train_y, 4000)),
        TensorDataset(images(train_x, 2000, tail=True), labels(train_y, 2000, tail=True)),
        TensorDataset(images(test_x, 2000), labels(test_y, 2000)),
    )


def accuracy(model: nn.Module, data: TensorDataset) -> float:
    model.eval()
    with torch.no_grad():
        inputs, targets = data.tensors
        return float((model(inputs).argmax(1) == targets).float().mean())


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_set, val_set, test_set = splits()
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=generator)
    model = nn.Sequential(
        nn.Linear(196, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, 10),
    )  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.wd)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, epochs=args.epochs, steps_per_epoch=len(loader), pct_start=args.pct_start
    )
    for epoch in range(1, args.epochs + 1):
        began = time.perf_counter()
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)
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
