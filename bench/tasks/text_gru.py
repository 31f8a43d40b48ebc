"""A text task for the replay's tables, of another kind than image classification: a character
language model (an embedding, a one-layer GRU, a linear read-out) trained with AdamW under
OneCycle to predict the next character of English prose.

The corpus is the licence texts every Debian system ships in /usr/share/common-licenses (package
base-files): GPL-2, GPL-3, LGPL-2.1, Apache-2.0, MPL-2.0 and GFDL-1.3, about 130,000 characters,
read in that order. It is cut into 256-character blocks; of each ten, the ninth validates, the
tenth is held out, the others train. The metric is next-character accuracy (a value in [0, 1],
as the other tasks' accuracies), on windows of 64 characters. ``--seed`` changes only the
initialization, the dropout and the order of the batches. A script as a user writes one: flags
in, one line per epoch out; ``bench/curves/text-gru-10ep`` tunes it through ``objective.command``.

    python bench/tasks/text_gru.py --lr 0.01 --hidden 128 --epochs 10
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

LICENSES = Path(os.environ.get("COMMON_LICENSES", "/usr/share/common-licenses"))
TEXTS = ("GPL-2", "GPL-3", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "GFDL-1.3")
BLOCK, WINDOW = 256, 64


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (OneCycle)")
    parser.add_argument("--wd", type=float, default=1e-2, help="AdamW's decoupled weight decay")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128, help="units of the GRU")
    parser.add_argument("--dropout", type=float, default=0.1, help="on the GRU's outputs")
    parser.add_argument("--pct-start", type=float, default=0.3, help="OneCycle warm-up fraction")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def corpus() -> str:
    return "".join((LICENSES / name).read_text(encoding="utf-8") for name in TEXTS)


def windows(codes: torch.Tensor) -> TensorDataset:
    """Non-overlapping windows of WINDOW characters, each with the next character of every one."""
    usable = (len(codes) - 1) // WINDOW * WINDOW
    inputs = codes[:usable].view(-1, WINDOW)
    targets = codes[1 : usable + 1].view(-1, WINDOW)
    return TensorDataset(inputs, targets)


def splits() -> tuple[TensorDataset, TensorDataset, TensorDataset, int]:
    text = corpus()
    vocabulary = {c: i for i, c in enumerate(sorted(set(text)))}
    blocks = [text[i : i + BLOCK] for i in range(0, len(text), BLOCK)]
    parts: dict[int, list[str]] = {8: [], 9: [], 0: []}
    for number, block in enumerate(blocks):
        parts[number % 10 if number % 10 in (8, 9) else 0].append(block)

    def encoded(part: list[str]) -> torch.Tensor:
        return torch.tensor([vocabulary[c] for c in "".join(part)], dtype=torch.long)

    return windows(encoded(parts[0])), windows(encoded(parts[8])), windows(encoded(parts[9])), len(vocabulary)


class CharGRU(nn.Module):
    def __init__(self, vocabulary: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, 32)
        self.gru = nn.GRU(32, hidden, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, vocabulary)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        states, _ = self.gru(self.embed(inputs))
        return self.out(self.drop(states))


def accuracy(model: nn.Module, data: TensorDataset) -> float:
    model.eval()
    with torch.no_grad():
        inputs, targets = data.tensors
        return float((model(inputs).argmax(-1) == targets).float().mean())


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_set, val_set, test_set, vocabulary = splits()
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=generator)
    model = CharGRU(vocabulary, args.hidden, args.dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.wd)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, epochs=args.epochs, steps_per_epoch=len(loader), pct_start=args.pct_start
    )
    for epoch in range(1, args.epochs + 1):
        began = time.perf_counter()
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as char models are trained
            optimizer.step()
            scheduler.step()
        val, test = accuracy(model, val_set), accuracy(model, test_set)
        # A diverged run goes on at a uniform guess's accuracy: its curve says so.
        if not math.isfinite(float(loss.detach())):
            val = test = 1.0 / vocabulary
        print(
            f"epoch {epoch}/{args.epochs} loss {float(loss.detach()):.4f} val_acc {val:.4f} test_acc {test:.4f} "
            f"time {time.perf_counter() - began:.4f}s",
            flush=True,
        )


if __name__ == "__main__":
    main()
