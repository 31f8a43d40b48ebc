"""Training throughput of the trainer, side by side with two references, in one run.

- trainer: ``trainer.train`` with its tuned settings (AMP where the device has it, channels_last,
  DataLoader workers, pinned memory, non-blocking copies), reporting to a reporter and writing a
  checkpoint after every epoch, with its per-step measurements (data wait, forward, backward,
  optimizer; peak memory; GPU utilization where NVML is), which are always on;
- trainer+tb: the same, also writing TensorBoard event files (what a study's trials do);
- naive: the same trainer configured like the unoptimized reference script (fp32, NCHW,
  num_workers=0, no pinning, blocking copies);
- bare: a hand-written loop over the same model, data and settings as "trainer", with none of the
  trainer's bookkeeping (no metrics, no reporting, no logging, no checkpoints).

trainer/bare and trainer+tb/bare measure the trainer's own overhead (target: at most 5%); trainer/naive
what the tuned settings buy. Each repeat runs the three back to back, in a rotating order, and
the ratios are taken within a repeat and then their median across repeats: a shared machine's
speed drifts by several percent from one minute to the next, and pairing cancels most of that.

    python -m bench.throughput                 # CPU: resnet20 on the real Fashion-MNIST
    python -m bench.throughput --preset gpu    # one GPU: ResNet-50, 224 px, bf16, channels_last
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer import Decision, EpochMetrics, TrainConfig, train
from trainer.data import build_datasets, build_loaders
from trainer.distributed import DistEnv
from trainer.loop import resolve_amp, resolve_device
from trainer.models import build_model

PRESETS: dict[str, dict[str, Any]] = {
    # 2-core CPU: one loader worker leaves a core to the model.
    "cpu": {"model": "resnet20", "dataset": "fashion-mnist", "batch_size": 128, "num_workers": 1},
    # One A100/H100: the reference ResNet-50 ImageNet-size workload, data generated in memory so
    # that the number measures the GPU, not the filesystem.
    "gpu": {
        "model": "resnet50",
        "dataset": "synthetic",
        "image_size": 224,
        "synthetic_num_classes": 1000,
        "batch_size": 256,
        "amp": "bf16",
        "num_workers": 8,
        "device": "cuda",
    },
}
NAIVE = {
    "amp": "off",
    "channels_last": False,
    "num_workers": 0,
    "pin_memory": False,
    "non_blocking": False,
    "persistent_workers": False,
}


class KeepGoing:
    def report(self, metrics: EpochMetrics) -> Decision:
        return Decision.CONTINUE


def trainer_throughput(config: TrainConfig, warmup_epochs: int) -> float:
    """Images/s of the epochs after the warm-up, counting checkpoint writes as training time."""
    result = train(config, KeepGoing())
    measured = result.history[warmup_epochs:]
    images = sum(m.images_per_s * m.train_time_s for m in measured)
    seconds = sum(m.train_time_s for m in measured)
    checkpoint_share = result.time.checkpoint * len(measured) / len(result.history)
    return images / (seconds + checkpoint_share)


def bare_loop_throughput(config: TrainConfig, warmup_epochs: int) -> float:
    """The same work, written as the shortest correct loop: forward, backward, step."""
    device = resolve_device(config, DistEnv())
    amp_dtype = resolve_amp(config.amp, device)
    memory_format = torch.channels_last if config.channels_last else torch.preserve_format
    torch.manual_seed(config.seed)
    bundle = build_datasets(config)
    normalize = bundle.normalize.to(device)
    loader, sampler, _ = build_loaders(config, bundle, 0, 1, device.type == "cuda")
    steps = min(len(loader), config.max_steps_per_epoch or len(loader))
    model = build_model(config.model, bundle.num_classes, bundle.in_channels, config.width).to(device)
    model = model.to(memory_format=memory_format)
    if config.compile:
        model = torch.compile(model)  # type: ignore[assignment]
    criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, config.lr, total_steps=config.epochs * steps, cycle_momentum=False
    )
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    images = 0
    seconds = 0.0
    model.train()
    for epoch in range(config.epochs):
        sampler.set_epoch(epoch)
        began = time.perf_counter()
        for _, (x, y) in zip(range(steps), loader, strict=False):
            x = normalize(x.to(device, non_blocking=config.non_blocking, memory_format=memory_format))
            y = y.to(device, non_blocking=config.non_blocking)
            with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                loss = criterion(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if epoch >= warmup_epochs:
            images += steps * config.batch_size
            seconds += time.perf_counter() - began
    return images / seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps per measured epoch")
    parser.add_argument(
        "--epochs", type=int, default=2, help="epochs per measurement, the first one a warm-up"
    )
    parser.add_argument("--repeats", type=int, default=5, help="repeats; medians are reported")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (trainer and bare)")
    parser.add_argument("--output", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()

    base = {
        **PRESETS[args.preset],
        "epochs": args.epochs,
        "max_steps_per_epoch": args.steps,
        "val_fraction": 0.02,
        "log_every": 0,
        "compile": args.compile,
    }
    tuned = TrainConfig.from_mapping(base)
    naive = TrainConfig.from_mapping({**base, **NAIVE})
    with tempfile.TemporaryDirectory() as scratch:
        figures = measure(tuned, naive, args.repeats, scratch)
    median = {name: statistics.median(values) for name, values in figures.items()}
    ratios = report_figures(tuned, figures, median)
    if args.output:
        report = {"median": median, "repeats": figures, "ratios": ratios, "preset": args.preset}
        args.output.write_text(json.dumps(report, indent=2))
    return 0


def measure(tuned: TrainConfig, naive: TrainConfig, repeats: int, scratch: str) -> dict[str, list[float]]:
    """Images/s of each variant (the trainer, with TensorBoard, the naive configuration, the bare
    loop), ``repeats`` times each, in an order that rotates each repeat."""
    figures: dict[str, list[float]] = {"trainer": [], "trainer+tb": [], "naive": [], "bare": []}
    for repeat in range(repeats):
        # A fresh checkpoint directory each time: a resumed run would train nothing.
        ckpt = dataclasses.replace(tuned, checkpoint_dir=f"{scratch}/trainer-{repeat}")
        logged = dataclasses.replace(
            tuned,
            checkpoint_dir=f"{scratch}/tb-{repeat}",
            tensorboard_dir=f"{scratch}/tb-{repeat}/events",
        )
        runs: dict[str, Callable[[], float]] = {
            "trainer": functools.partial(trainer_throughput, ckpt, warmup_epochs=1),
            "trainer+tb": functools.partial(trainer_throughput, logged, warmup_epochs=1),
            "naive": functools.partial(trainer_throughput, naive, warmup_epochs=1),
            "bare": functools.partial(bare_loop_throughput, tuned, warmup_epochs=1),
        }
        # Rotate the order, so that no variant always runs first (or right after another).
        order = list(runs)[repeat % len(runs) :] + list(runs)[: repeat % len(runs)]
        for name in order:
            gc.collect()  # the previous run's loader workers end here, not during this run
            figures[name].append(runs[name]())
        print(f"repeat {repeat + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in figures.items()))
    return figures


def report_figures(
    tuned: TrainConfig, figures: dict[str, list[float]], median: dict[str, float]
) -> dict[str, list[float]]:
    """Print the medians and the paired ratios against the naive configuration and the bare loop;
    the ratios, repeat by repeat."""
    device = resolve_device(tuned, DistEnv())
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    print(f"\n{tuned.model} on {tuned.dataset}, batch {tuned.batch_size}, {name}, torch {torch.__version__}")
    print(
        f"  amp={resolve_amp(tuned.amp, device) or 'off'} channels_last={tuned.channels_last} workers={tuned.num_workers}"
    )
    print(f"{'run':<12}{'images/s (median)':>18}")
    for run, value in median.items():
        print(f"{run:<12}{value:>18.1f}")

    def paired(run: str, other: str) -> list[float]:
        return [t / o for t, o in zip(figures[run], figures[other], strict=True)]

    ratios = {"naive": paired("trainer", "naive"), "bare": paired("trainer", "bare")}
    ratios["tb_bare"] = paired("trainer+tb", "bare")
    for key, (run, other) in {
        "naive": ("trainer", "naive"),
        "bare": ("trainer", "bare"),
        "tb_bare": ("trainer+tb", "bare"),
    }.items():
        values = ratios[key]
        spread = f"repeats {min(values):.3f} to {max(values):.3f}"
        print(f"{run} / {other + ':':<7}{statistics.median(values):.3f}  ({spread})")
    overhead = 1 - statistics.median(ratios["bare"])
    print(f"trainer overhead against the bare loop, measurements on: {100 * overhead:+.1f}% (target <= 5%)")
    overhead_tb = 1 - statistics.median(ratios["tb_bare"])
    print(
        f"trainer overhead against the bare loop, TensorBoard on too: {100 * overhead_tb:+.1f}% (target <= 5%)"
    )
    return ratios


if __name__ == "__main__":
    raise SystemExit(main())
