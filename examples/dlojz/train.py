"""A plain PyTorch training script, in the style of the course's dlojz.py: argparse flags, one line
per epoch, a checkpoint to resume from. It knows nothing of the HPO service (it imports nothing of
it); ``study.yaml`` next to it tunes it unchanged.

    python train.py --lr 0.05 --batch-size 64 --epochs 4

Data: Fashion-MNIST's IDX files (Debian's dataset-fashion-mnist puts them in
/usr/share/datasets/fashion-mnist); a slice of it keeps an epoch to seconds on one CPU core.
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.05, help="peak learning rate (OneCycle)")
    parser.add_argument("--wd", type=float, default=5e-4, help="weight decay")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--pct-start", type=float, default=0.3, help="OneCycle warm-up fraction")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--width", type=int, default=16, help="channels of the first convolution")
    parser.add_argument("--train-samples", type=int, default=4096)
    parser.add_argument("--val-samples", type=int, default=2048)
    parser.add_argument(
        "--data-root", default=os.environ.get("DATA_ROOT", "/usr/share/datasets/fashion-mnist")
    )
    parser.add_argument("--checkpoint-dir", default="", help="save each epoch here; resume from it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the same result anywhere)")
    return parser.parse_args()


def read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(root: Path, split: str, samples: int) -> TensorDataset:
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(root / f"{prefix}-images-idx3-ubyte.gz")[:samples]
    labels = read_idx(root / f"{prefix}-labels-idx1-ubyte.gz")[:samples]
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return TensorDataset((x - 0.286) / 0.353, torch.from_numpy(labels.astype(np.int64)))


class Net(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.fc = nn.Linear(2 * width * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    root = Path(args.data_root)
    train_set = load(root, "train", args.train_samples)
    val_set = load(root, "val", args.val_samples)
    generator = torch.Generator().manual_seed(args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=generator)
    val_loader = DataLoader(val_set, batch_size=512)
    model = Net(args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.wd)
    steps_per_epoch = math.ceil(len(train_set) / args.batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=args.lr,
        epochs=args.epochs,
        steps_per_epoch=steps_per_epoch,
        pct_start=args.pct_start,
    )

    start_epoch = 0
    checkpoint = Path(args.checkpoint_dir) / "last.pt" if args.checkpoint_dir else None
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["generator"])
        start_epoch = state["epoch"]
        print(f"resumed from {checkpoint} at epoch {start_epoch}", flush=True)

    for epoch in range(start_epoch + 1, args.epochs + 1):
        began = time.perf_counter()
        model.train()
        total_loss = 0.0
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total_loss += loss.item() * len(labels)
        model.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in val_loader:
                correct += (model(images).argmax(1) == labels).sum().item()
        if not math.isfinite(total_loss):
            raise SystemExit(f"training diverged at epoch {epoch} (lr {args.lr} too high?)")
        print(
            f"epoch {epoch}/{args.epochs} train_loss {total_loss / len(train_set):.4f} "
            f"val_acc {correct / len(val_set):.4f} time {time.perf_counter() - began:.1f}s",
            flush=True,
        )
        if checkpoint is not None:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "generator": generator.get_state(),
                "epoch": epoch,
            }
            torch.save(state, checkpoint.with_suffix(".tmp"))
            os.replace(checkpoint.with_suffix(".tmp"), checkpoint)  # never a half-written checkpoint


if __name__ == "__main__":
    main()
