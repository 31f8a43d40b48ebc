"""Checkpoints: a run killed after an epoch resumes and ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, tiny_config
from trainer import ConfigError, Decision, EpochMetrics, train
from trainer.checkpoint import checkpoint_path

RUN = ["--model", "resnet8", "--width", "8", "--batch-size", "32", "--lr", "0.2", "--epochs", "3",
       "--max-steps-per-epoch", "40", "--val-fraction", "0.1", "--log-every", "0"]  # fmt: skip


def _trainer(checkpoint_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", *RUN, "--checkpoint-dir", str(checkpoint_dir),
         "--result-json", str(checkpoint_dir / "result.json"), *extra],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def test_killed_run_resumes_as_if_never_interrupted(tmp_path: Path, fashion_mnist_root: str) -> None:
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    # The interrupted run loads with a worker process, the reference in the main process: the data
    # a step sees must not depend on that.
    assert _trainer(reference, "--num-workers", "0").wait(timeout=600) == 0

    proc = _trainer(interrupted, "--num-workers", "1")
    deadline = time.monotonic() + 300
    while not checkpoint_path(interrupted).exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_after = torch.load(checkpoint_path(interrupted), weights_only=False)["epoch"]
    assert killed_after < 3, "the run was meant to be killed before its end"

    resumed = _trainer(interrupted, "--num-workers", "1")
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output
    assert f"resumed after epoch {killed_after}" in output

    expected = json.loads((reference / "result.json").read_text())
    got = json.loads((interrupted / "result.json").read_text())
    assert got["resumed_from_epoch"] == killed_after
    for mine, theirs in zip(got["history"], expected["history"], strict=True):
        for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-7), (mine["epoch"], key)
    final_ref = torch.load(checkpoint_path(reference), weights_only=False)
    final_got = torch.load(checkpoint_path(interrupted), weights_only=False)
    for name, tensor in final_ref["model"].items():
        torch.testing.assert_close(final_got["model"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    assert not list(interrupted.glob("*.tmp.*")), "temporary checkpoint files are renamed or gone"


def test_changed_settings_refuse_a_stale_checkpoint(tmp_path: Path, fashion_mnist_root: str) -> None:
    train(tiny_config(epochs=1, max_steps_per_epoch=5, checkpoint_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"lr is 0.5 but the checkpoint .* was written with 0.2"):
        train(tiny_config(epochs=1, max_steps_per_epoch=5, checkpoint_dir=str(tmp_path), lr=0.5))
    # Settings that only change speed may differ.
    result = train(tiny_config(epochs=1, max_steps_per_epoch=5, checkpoint_dir=str(tmp_path), num_workers=1))
    assert result.resumed_from_epoch == 1 and result.epochs_completed == 1


class StopAt:
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def report(self, metrics: EpochMetrics) -> Decision:
        return Decision.STOP if metrics.epoch >= self.epoch else Decision.CONTINUE


def test_a_stopped_run_stays_stopped_when_started_again(tmp_path: Path, fashion_mnist_root: str) -> None:
    """A pruned trial whose job is requeued must not train on."""
    config = tiny_config(epochs=3, max_steps_per_epoch=8, checkpoint_dir=str(tmp_path))
    first = train(config, StopAt(1))
    assert (first.epochs_completed, first.stopped_early) == (1, True)
    again = train(config)
    assert (again.epochs_completed, again.stopped_early, again.resumed_from_epoch) == (1, True, 1)
    assert again.history == first.history


def test_the_tuned_momentum_is_the_one_used(tmp_path: Path, fashion_mnist_root: str) -> None:
    train(tiny_config(epochs=1, max_steps_per_epoch=8, momentum=0.5, checkpoint_dir=str(tmp_path)))
    saved = torch.load(checkpoint_path(tmp_path), weights_only=False)
    assert [g["momentum"] for g in saved["optimizer"]["param_groups"]] == [0.5]


def test_a_stop_at_the_last_epoch_is_not_an_early_stop_after_a_restart(
    tmp_path: Path, fashion_mnist_root: str
) -> None:
    config = tiny_config(epochs=2, max_steps_per_epoch=8, checkpoint_dir=str(tmp_path))
    first = train(config, StopAt(2))
    again = train(config)
    assert (first.stopped_early, again.stopped_early) == (False, False)
    assert again.epochs_completed == 2


class FailAfterSaving:
    """Stands for a run interrupted right after its epoch-1 checkpoint (as PBT pauses one)."""

    checkpoint_before_report = True

    def report(self, metrics: EpochMetrics) -> Decision:
        raise RuntimeError("interrupted")


def test_a_resumed_run_takes_up_the_optimizer_changes_it_allows(
    tmp_path: Path, fashion_mnist_root: str
) -> None:
    """Population Based Training continues one run's checkpoint with a perturbed lr and weight decay."""
    settings = {"epochs": 2, "max_steps_per_epoch": 6, "lr": 0.2, "weight_decay": 1e-4}
    for folder in ("same", "changed"):
        with pytest.raises(RuntimeError, match="interrupted"):
            train(tiny_config(**settings, checkpoint_dir=str(tmp_path / folder)), FailAfterSaving())
        assert checkpoint_path(tmp_path / folder).exists()
    same = train(tiny_config(**settings, checkpoint_dir=str(tmp_path / "same")))
    changed = train(
        tiny_config(
            **{**settings, "lr": 0.4, "weight_decay": 5e-4},
            checkpoint_dir=str(tmp_path / "changed"),
            resume_may_change="lr,weight_decay",
        )
    )
    assert same.resumed_from_epoch == changed.resumed_from_epoch == 1
    # The schedule goes on from where it stood, twice as high.
    assert changed.history[-1].lr == pytest.approx(2 * same.history[-1].lr)
    saved = torch.load(checkpoint_path(tmp_path / "changed"), weights_only=False)
    assert [g["weight_decay"] for g in saved["optimizer"]["param_groups"]] == [5e-4]
    assert saved["fingerprint"]["lr"] == 0.4


def test_only_optimizer_settings_may_change_on_resume() -> None:
    with pytest.raises(ConfigError, match="resume_may_change: 'batch_size' cannot change mid-run"):
        tiny_config(resume_may_change="lr,batch_size")
