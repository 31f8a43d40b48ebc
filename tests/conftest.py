"""Shared fixtures. Tests train on the real Fashion-MNIST that `make setup` installs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.config import DEFAULT_FASHION_MNIST_ROOT, TrainConfig
from trainer.sources import FASHION_MNIST_FILES, find_fashion_mnist_file

REPO = Path(__file__).resolve().parents[1]

# Same thread count in every process: CPU kernels then give the same bits, run after run.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def fashion_mnist_root() -> str:
    root = Path(DEFAULT_FASHION_MNIST_ROOT)
    missing = [
        s for pair in FASHION_MNIST_FILES.values() for s in pair if not find_fashion_mnist_file(root, s)
    ]
    assert not missing, f"Fashion-MNIST is not installed under {root}: run `make setup` (missing {missing})"
    return str(root)


def tiny_config(**overrides: object) -> TrainConfig:
    """A narrow ResNet on a slice of the real Fashion-MNIST: seconds per epoch on one core."""
    values: dict[str, object] = {
        "model": "resnet8",
        "width": 8,
        "dataset": "fashion-mnist",
        "batch_size": 32,
        "lr": 0.2,
        "epochs": 2,
        "max_steps_per_epoch": 30,
        "val_fraction": 0.1,
        "num_workers": 0,
        "log_every": 0,
    }
    values.update(overrides)
    return TrainConfig.from_mapping(values)


def run_trainer_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`python -m trainer ARGS` in a fresh process, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Two groups for `pytest -n 2 --dist loadgroup` (the test command): the tests of the shared
    local Slurm cluster and PostgreSQL run one after another on one worker, since they inject
    faults into them (a lost node, a killed slurmd) that a test running beside would suffer; the
    tests that share nothing with those run on the other worker. Without -n the marks do nothing."""
    for item in items:
        shared = "local_cluster" in item.fixturenames or item.get_closest_marker("shares_host") is not None
        if item.get_closest_marker("isolated") is not None:
            shared = False
        item.add_marker(pytest.mark.xdist_group("shared-cluster" if shared else "beside"))
