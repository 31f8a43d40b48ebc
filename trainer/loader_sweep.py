"""``python -m trainer --tune-loader``: measure the training DataLoader's images/s over a grid of settings.

The training dataset is built exactly as :func:`trainer.loop.train` builds it (same dataset,
transforms, ``train_fraction``, ``batch_size``, ``image_size``, through :func:`trainer.data.build_datasets`
and :func:`trainer.data.build_loaders`); nothing is trained. The grid:

- ``num_workers``: 0, 1, 2, 4, ... up to 2x the CPUs this process may use (``os.sched_getaffinity``:
  under Slurm, the job's or task's CPUs, not the node's);
- ``prefetch_factor``: 2 and 4, when ``num_workers > 0``;
- ``persistent_workers``: false and true, when ``num_workers > 0``;
- ``pin_memory``: false and true when CUDA is available (batches are then copied to the GPU, as in
  training, so that pinning has something to speed up), false only otherwise.

The config's own setting is measured too when it is not in the grid. Each setting reads two passes
(epochs) of at most ``--tune-loader-batches`` batches. The first pass is a warm-up left out of the
rate (worker start-up, first page faults, and the batches workers prefetch while the first one is
made, which would make a short pass look fast); the second pass is counted
whole, its start included, since restarting workers each epoch is what ``persistent_workers`` saves.
The grid is measured twice, in turn, and each setting keeps its faster round, so that a burst of
load from another process on the node rarely decides the ranking.

Recommendation rule: take the fastest setting; among the settings within 5% of it, recommend the
one with the fewest workers, then the smallest ``prefetch_factor`` (workers and prefetched batches
cost CPU and memory that trials sharing a node compete for), then the fastest.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config import TrainConfig
from trainer.errors import ConfigError

if TYPE_CHECKING:  # torch takes seconds to import: the command imports it once input is checked
    import torch

    from trainer.data import DataBundle

log = logging.getLogger("trainer")

DEFAULT_BATCHES_PER_PASS = 40
PASSES = 2
ROUNDS = 2
PREFETCH_FACTORS = (2, 4)
# Settings this much slower than the fastest count as equally fast: below the run-to-run noise of a
# shared node, and not worth extra workers.
TOLERANCE = 0.05


@dataclass(frozen=True)
class LoaderSetting:
    num_workers: int
    prefetch_factor: int | None  # None: without workers the DataLoader takes none
    persistent_workers: bool
    pin_memory: bool

    def as_trainer_keys(self) -> dict[str, Any]:
        """The keys of a study file's ``trainer:`` section that select this setting."""
        keys: dict[str, Any] = {"num_workers": self.num_workers}
        if self.prefetch_factor is not None:
            keys["prefetch_factor"] = self.prefetch_factor
        keys["persistent_workers"] = self.persistent_workers
        keys["pin_memory"] = self.pin_memory
        return keys

    def describe(self) -> str:
        return ", ".join(f"{k}={_yaml_scalar(v)}" for k, v in self.as_trainer_keys().items())


@dataclass(frozen=True)
class Measurement:
    setting: LoaderSetting
    images_per_s: float
    second_pass_start_s: float
    """Time from the start of the second pass to its first batch: worker start-up, unless persistent."""


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def worker_counts(cpus: int) -> list[int]:
    """0, 1, 2, 4, ... up to 2 x cpus, that bound included even when it is not a power of two."""
    top = 2 * max(1, cpus)
    counts = [0]
    n = 1
    while n < top:
        counts.append(n)
        n *= 2
    counts.append(top)
    return counts


def grid(cpus: int, cuda: bool) -> list[LoaderSetting]:
    pins = (False, True) if cuda else (False,)
    settings = [LoaderSetting(0, None, False, pin) for pin in pins]
    for workers in worker_counts(cpus)[1:]:
        for prefetch in PREFETCH_FACTORS:
            for persistent in (False, True):
                settings.extend(LoaderSetting(workers, prefetch, persistent, pin) for pin in pins)
    return settings


def current_setting(config: TrainConfig, cuda: bool) -> LoaderSetting:
    """The config's setting, as :func:`trainer.data.build_loaders` applies it."""
    if config.num_workers == 0:
        return LoaderSetting(0, None, False, config.pin_memory and cuda)
    return LoaderSetting(
        config.num_workers, config.prefetch_factor, config.persistent_workers, config.pin_memory and cuda
    )


def recommend(rows: Sequence[Measurement]) -> Measurement:
    """The rule of the module docstring: fewest workers, then smallest prefetch, within 5% of the best."""
    if not rows:
        raise ValueError("no measurements to recommend from")
    best = max(row.images_per_s for row in rows)
    close = [row for row in rows if row.images_per_s >= (1 - TOLERANCE) * best]
    return min(
        close,
        key=lambda row: (row.setting.num_workers, row.setting.prefetch_factor or 0, -row.images_per_s),
    )


# --- measuring -----------------------------------------------------------------------------------
def _setting_config(config: TrainConfig, setting: LoaderSetting) -> TrainConfig:
    return dataclasses.replace(
        config,
        num_workers=setting.num_workers,
        prefetch_factor=setting.prefetch_factor or config.prefetch_factor,
        persistent_workers=setting.persistent_workers,
        pin_memory=setting.pin_memory,
    )


def measure(
    config: TrainConfig, bundle: DataBundle, setting: LoaderSetting, batches: int, device: torch.device
) -> Measurement:
    """Images/s of the training DataLoader under ``setting`` (see the module docstring)."""
    import torch

    from trainer.data import build_loaders

    cuda = device.type == "cuda"
    loader, sampler, _ = build_loaders(_setting_config(config, setting), bundle, 0, 1, cuda)
    per_pass = min(batches, len(loader), config.max_steps_per_epoch or len(loader))
    if per_pass == 0:
        raise ConfigError(
            f"batch_size {config.batch_size} exceeds the {len(sampler.indices)} training samples "
            "selected (with drop_last)"
        )
    images = 0
    seconds = 0.0
    second_pass_start = 0.0
    iterator: Iterator[Any] | None = None
    for epoch in range(PASSES):
        sampler.set_epoch(epoch)
        began = time.perf_counter()
        # Dropping the previous pass's iterator shuts its workers down unless they are persistent:
        # counted, as training pays it at the end of every epoch.
        iterator = None
        iterator = iter(loader)
        for step in range(per_pass):
            batch_images, _labels = next(iterator)
            if cuda:  # copied as training copies them, so that pin_memory has its effect
                batch_images.to(device, non_blocking=config.non_blocking)
            if step == 0 and epoch == 1:
                second_pass_start = time.perf_counter() - began
            if epoch > 0:
                images += len(batch_images)
        if cuda:
            torch.cuda.synchronize(device)
        if epoch > 0:
            seconds += time.perf_counter() - began
    # Persistent workers live as long as the loader: end them now, outside the measured time, so
    # that they do not compete with the next setting's.
    del iterator, loader, sampler
    gc.collect()
    return Measurement(setting, images / seconds if seconds > 0 else 0.0, second_pass_start)


def sweep(config: TrainConfig, batches: int = DEFAULT_BATCHES_PER_PASS) -> dict[str, Any]:
    """Measure the grid and the config's own setting; return rows, recommendation and context."""
    from trainer import distributed
    from trainer.data import build_datasets
    from trainer.loop import resolve_device

    device = resolve_device(config, distributed.detect())
    cuda = device.type == "cuda"
    cpus = usable_cpus()
    settings = grid(cpus, cuda)
    current = current_setting(config, cuda)
    if current not in settings:
        settings.append(current)
    bundle = build_datasets(config)
    log.info(
        "measuring %d DataLoader settings, best of %d rounds: dataset %s, batch_size %d, image_size %d, "
        "%d x %d batches each, %d usable CPUs, %s",
        len(settings),
        ROUNDS,
        config.dataset,
        config.batch_size,
        config.resolved_image_size,
        PASSES,
        batches,
        cpus,
        f"CUDA ({device})" if cuda else "no CUDA",
    )
    with warnings.catch_warnings():
        # More workers than CPUs is a point of the grid, not a mistake for torch to warn about.
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        fastest: dict[LoaderSetting, Measurement] = {}
        for _ in range(ROUNDS):
            for setting in settings:
                row = measure(config, bundle, setting, batches, device)
                if setting not in fastest or row.images_per_s > fastest[setting].images_per_s:
                    fastest[setting] = row
    rows = [fastest[setting] for setting in settings]
    return {
        "rows": rows,
        "recommended": recommend(rows),
        "current": next(row for row in rows if row.setting == current),
        "cpus": cpus,
        "cuda": cuda,
        "batches_per_pass": batches,
        "passes": PASSES,
        "rounds": ROUNDS,
    }


# --- output --------------------------------------------------------------------------------------
def _yaml_scalar(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


COLUMNS = (
    "num_workers",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory",
    "images/s",
    "vs_best",
    "pass2_start_s",
)


def format_report(result: dict[str, Any]) -> str:
    rows: list[Measurement] = result["rows"]
    recommended: Measurement = result["recommended"]
    current: Measurement = result["current"]
    best = max(row.images_per_s for row in rows)
    table = [list(COLUMNS)]
    marks = []
    for row in rows:
        s = row.setting
        table.append(
            [
                str(s.num_workers),
                "-" if s.prefetch_factor is None else str(s.prefetch_factor),
                _yaml_scalar(s.persistent_workers),
                _yaml_scalar(s.pin_memory),
                f"{row.images_per_s:.0f}",
                f"{row.images_per_s / best:.2f}" if best > 0 else "-",
                f"{row.second_pass_start_s:.3f}",
            ]
        )
        notes = [name for name, which in (("recommended", recommended), ("current", current)) if row is which]
        marks.append(f"  <- {', '.join(notes)}" if notes else "")
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(table[0], widths, strict=True)).rstrip()]
    for line, mark in zip(table[1:], marks, strict=True):
        lines.append("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) + mark)
    lines.append("")
    lines.append("recommended (in the study file's trainer: section):")
    lines.extend(
        f"  {key}: {_yaml_scalar(value)}" for key, value in recommended.setting.as_trainer_keys().items()
    )
    lines.append("")
    lines.append(_comparison(current, recommended))
    return "\n".join(lines)


def _comparison(current: Measurement, recommended: Measurement) -> str:
    head = f"your current setting: {current.setting.describe()}: {current.images_per_s:.0f} images/s"
    if current is recommended:
        return f"{head}, which is the recommendation."
    if current.images_per_s <= 0:
        return f"{head}; the recommendation reads {recommended.images_per_s:.0f} images/s."
    ratio = recommended.images_per_s / current.images_per_s
    if ratio >= 1:
        return f"{head}, the recommendation is {ratio:.2f}x faster."
    # The recommendation may trade a few percent for fewer workers or less prefetching.
    return (
        f"{head}, the recommendation is {1 / ratio:.2f}x slower, within {TOLERANCE:.0%} of the "
        "fastest, with fewer workers or a smaller prefetch_factor."
    )


def to_json(result: dict[str, Any]) -> dict[str, Any]:
    def row(m: Measurement) -> dict[str, Any]:
        return {
            **dataclasses.asdict(m.setting),
            "images_per_s": m.images_per_s,
            "second_pass_start_s": m.second_pass_start_s,
        }

    return {
        "rows": [row(m) for m in result["rows"]],
        "recommended": result["recommended"].setting.as_trainer_keys(),
        "current": row(result["current"]),
        **{key: result[key] for key in ("cpus", "cuda", "batches_per_pass", "passes", "rounds")},
    }


def run(config: TrainConfig, batches: int, result_json: Path | None) -> None:
    """The command: sweep, print the table and the recommendation, optionally write JSON."""
    result = sweep(config, batches)
    print(format_report(result), flush=True)
    if result_json is not None:
        result_json.write_text(json.dumps(to_json(result), indent=2) + "\n")
