"""Real training on CPU: the real Fashion-MNIST, image folders, synthetic data, AMP modes, models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import tiny_config
from trainer import ConfigError, Decision, EpochMetrics, TrainConfig, TrialOutOfMemory, train
from trainer.config import CIFAR_MODELS, TORCHVISION_MODELS
from trainer.data import build_datasets, build_held_out_loader, build_loaders, read_idx
from trainer.loop import oom_as_trial_error
from trainer.models import build_model
from trainer.sources import find_fashion_mnist_file


class Recorder:
    def __init__(self) -> None:
        self.seen: list[EpochMetrics] = []

    def report(self, metrics: EpochMetrics) -> Decision:
        self.seen.append(metrics)
        return Decision.CONTINUE


def test_a_few_hundred_steps_on_fashion_mnist_learn(fashion_mnist_root: str) -> None:
    recorder = Recorder()
    config = tiny_config(
        epochs=3, max_steps_per_epoch=100, train_fraction=0.2, val_fraction=0.2, test_held_out=True
    )
    result = train(config, recorder)
    assert result.steps == 300
    assert [m.epoch for m in recorder.seen] == [1, 2, 3]
    losses = [m.train_loss for m in recorder.seen]
    assert losses[-1] < losses[0] - 0.5, losses
    assert recorder.seen[-1].val_loss < 1.0  # chance: ln(10) = 2.30
    # Chance is 10% on these ten classes.
    assert result.last_val_accuracy > 0.70, result.last_val_accuracy
    assert result.best_val_accuracy >= result.last_val_accuracy
    assert result.train_images_per_s > 0
    assert result.time.forward > 0 and result.time.backward > 0 and result.time.validation > 0
    assert result.peak_memory_bytes > 0
    assert recorder.seen[-1].lr < config.lr / config.div_factor, "OneCycle ends far below its start"
    # The held-out test images are scored once, with the last epoch, near its validation score.
    assert [m.test_accuracy is None for m in recorder.seen] == [True, True, False]
    test_accuracy = recorder.seen[-1].test_accuracy
    assert test_accuracy is not None and abs(test_accuracy - result.last_val_accuracy) < 0.05


def test_held_out_test_images_are_the_validation_images_never_scored(fashion_mnist_root: str) -> None:
    config = tiny_config(val_fraction=0.3, test_held_out=True)
    bundle = build_datasets(config)
    _, _, val_loader = build_loaders(config, bundle, 0, 1, use_cuda=False)
    scored = list(val_loader.sampler)
    held_out = list(build_held_out_loader(config, bundle, 0, 1, use_cuda=False).sampler)
    assert len(scored) == 3000 and len(held_out) == 7000
    assert not set(scored) & set(held_out)
    with pytest.raises(ConfigError, match="test_held_out needs val_fraction < 1"):
        tiny_config(val_fraction=1.0, test_held_out=True)


def _write_image_folder(root: Path, fashion_mnist_root: str, per_class: int) -> None:
    """An ImageNet-style folder (train/ and val/ of class folders of PNG files) of real images."""
    images = read_idx(find_fashion_mnist_file(Path(fashion_mnist_root), "t10k-images-idx3-ubyte"))  # type: ignore[arg-type]
    labels = read_idx(find_fashion_mnist_file(Path(fashion_mnist_root), "t10k-labels-idx1-ubyte"))  # type: ignore[arg-type]
    for split, offset in (("train", 0), ("val", 5000)):
        for cls in range(3):
            folder = root / split / f"class{cls}"
            folder.mkdir(parents=True)
            picks = np.flatnonzero(labels[offset:] == cls)[:per_class] + offset
            for i in picks:
                Image.fromarray(np.stack([images[i]] * 3, axis=-1)).save(folder / f"{i}.png")


@pytest.mark.parametrize(("model", "image_size"), [("resnet8", 32), ("resnet18", 80)])
def test_imagefolder_reads_class_folders(
    tmp_path: Path, fashion_mnist_root: str, model: str, image_size: int
) -> None:
    """32 px takes the light-augmentation path, 80 px the RandomResizedCrop one."""
    _write_image_folder(tmp_path, fashion_mnist_root, per_class=20)
    config = TrainConfig(
        model=model, dataset="imagefolder", data_root=str(tmp_path), image_size=image_size, epochs=1,
        batch_size=10, num_workers=1, log_every=0, amp="off",
    )  # fmt: skip
    recorder = Recorder()
    result = train(config, recorder)
    assert result.steps == 6  # 60 training images, batches of 10
    assert 0 <= recorder.seen[0].val_accuracy <= 1
    assert recorder.seen[0].val_loss > 0


def test_unusable_image_folders_are_config_errors(tmp_path: Path, fashion_mnist_root: str) -> None:
    _write_image_folder(tmp_path, fashion_mnist_root, per_class=2)
    (tmp_path / "val" / "class2").rename(tmp_path / "val" / "class9")
    config = TrainConfig(dataset="imagefolder", data_root=str(tmp_path), image_size=32, num_workers=0)
    with pytest.raises(ConfigError, match=r"train/ and val/ hold different classes \(e.g. 'class2'\)"):
        train(config)
    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    (empty / "val").mkdir()
    with pytest.raises(ConfigError, match=f"data_root '{empty}': Couldn't find any class folder"):
        train(TrainConfig(dataset="imagefolder", data_root=str(empty), num_workers=0))


@pytest.mark.parametrize("amp", ["off", "bf16", "fp16"])
def test_amp_modes_and_torchvision_models_run(amp: str) -> None:
    config = TrainConfig(
        model="resnet18", dataset="synthetic", image_size=32, synthetic_train_samples=64, synthetic_val_samples=16,
        epochs=1, batch_size=8, num_workers=0, log_every=0, amp=amp, device="cpu",
    )  # fmt: skip
    result = train(config)
    assert result.steps == 8
    assert np.isfinite(result.last_val_loss)


@pytest.mark.parametrize("name", CIFAR_MODELS[:4] + TORCHVISION_MODELS[:3])
def test_models_build_for_grayscale_and_rgb(name: str) -> None:
    for channels in (1, 3):
        model = build_model(name, num_classes=7, in_channels=channels)
        assert model(torch.randn(2, channels, 32, 32)).shape == (2, 7)


def test_cifar_resnet20_has_the_paper_size() -> None:
    params = sum(p.numel() for p in build_model("resnet20", 10).parameters())
    assert 0.26e6 < params < 0.30e6, params  # 0.27M in the paper, plus two projection shortcuts


def test_too_few_steps_for_one_cycle_is_a_config_error() -> None:
    config = TrainConfig(
        dataset="synthetic", image_size=8, synthetic_train_samples=32, batch_size=8, epochs=1, num_workers=0
    )
    with pytest.raises(ConfigError, match=r"OneCycle over 4 steps with pct_start=0.25 leaves an empty phase"):
        train(config)


def test_out_of_memory_becomes_a_trial_error() -> None:
    with (
        pytest.raises(
            TrialOutOfMemory, match=r"out of memory on cuda:0 with batch_size=4096: CUDA out of memory"
        ),
        oom_as_trial_error(4096, "cuda:0"),
    ):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    with pytest.raises(ValueError), oom_as_trial_error(8, "cpu"):
        raise ValueError("other errors pass through")
