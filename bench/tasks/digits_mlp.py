"""A small task of its own for the replay's tables: an MLP on scikit-learn's bundled digits
(1,797 images of 8x8 pixels), trained with SGD and OneCycle for a given number of epochs. A
script as a user writes one: flags in, one line per epoch out; ``bench/curves/digits-mlp-27ep``
tunes it through ``objective.command``.

The split is fixed (600 training, 600 validation, 597 held-out test images, drawn once with seed
0): ``--seed`` changes only the initialization and the order of the batches. Few training images,
so that the settings matter: a good one reaches about 0.97 on the validation images.

    python bench/tasks/digits_mlp.py --lr 0.1 --hidden 64 --epochs 27
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.1, help="peak learning rate (OneCycle)")
    parser.add_argument("--wd", type=float, default=1e-4, help="weight decay")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64, help="units of each of the two hidden layers")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--pct-start", type=float, default=0.3, help="OneCycle warm-up fraction")
    parser.add_argument("--epochs", type=int, default=27)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def splits() -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x = torch.from_numpy(digits.data[order].astype(np.float32) / 16.0)
    y = torch.from_numpy(digits.target[order].astype(np.int64))
    x = (x - x[:600].mean(0)) / (x[:600].std(0) + 1e-3)  # the training images' statistics
    return (
        TensorDataset(x[:600], y[:600]),
        TensorDataset(x[600:1200], y[600:1200]),
        TensorDataset(x[1200:], y[1200:]),
    )


def accuracy(model: nn.Module, data: TensorDataset) -> float:
    model.eval()
    with torch.no_grad():
        images, labels = data.tensors
        return float((model(images).argmax(1) == labels).float().mean())


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_set, val_set, test_set = splits()
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=generator)
    model = nn.Sequential(
        nn.Linear(64, args.hidden), nn.ReLU(), nn.Dropout(args.dropout),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Dropout(args.dropout),
        nn.Linear(args.hidden, 10),
    )  # fmt: skip
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=args.wd
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, epochs=args.epochs, steps_per_epoch=len(loader), pct_start=args.pct_start
    )
    for epoch in range(1, args.epochs + 1):
        began = time.perf_counter()
        model.train()
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
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
