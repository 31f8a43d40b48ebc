"""What a run measures of itself, on real training: where each step's time went (data wait,
forward, backward, optimizer), peak memory, a torch.profiler trace that TensorBoard's profiler
plugin loads, TensorBoard event files with per-epoch values and HParams; and the options that came
with them (OneCycle's momentum cycling, a validation size above the training size, a loader
throttle that makes a run input-bound)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_config
from trainer import ConfigError, TrainResult, train
from trainer.checkpoint import check_fingerprint
from trainer.data import build_datasets


def test_each_epoch_measures_where_its_steps_time_went(fashion_mnist_root: str) -> None:
    result = train(tiny_config())
    for metrics in result.history:
        parts = [
            metrics.data_time_s,
            metrics.forward_time_s,
            metrics.backward_time_s,
            metrics.optimizer_time_s,
        ]
        assert all(p is not None and p > 0 for p in parts), parts
        share = metrics.data_wait_share
        assert share is not None and 0 < share < 1
        assert metrics.peak_memory_bytes is not None and metrics.peak_memory_bytes > 100 * 2**20
        assert metrics.gpu_utilization is None  # no GPU here: nothing sampled, nothing invented
    assert result.time.optimizer > 0
    total = sum(m.train_time_s for m in result.history)
    measured = sum(
        (m.data_time_s or 0) + (m.forward_time_s or 0) + (m.backward_time_s or 0) + (m.optimizer_time_s or 0)
        for m in result.history
    )
    # The phases cover the training steps: what is left is the loop's own bookkeeping.
    assert 0.8 * total < measured <= total, (measured, total)


def test_a_throttled_loader_in_the_main_process_is_input_bound_and_workers_hide_it(
    fashion_mnist_root: str,
) -> None:
    """A slow filesystem (load_delay_ms) read in the main process leaves the model waiting for most
    of each step; six workers prefetching in parallel hide the same latency. Sized so that one
    process reads a batch (64 x 3 ms = 192 ms) in about four model steps on a CPU (about 45 ms at
    width 8, one thread) and six workers in two thirds of one: a machine busy with other work (the tests
    run three at a time) slows the model more than the sleeping workers, and the starved run still
    waits most of its steps."""
    throttled = {"width": 8, "batch_size": 64, "max_steps_per_epoch": 30, "load_delay_ms": 3}
    starved = train(tiny_config(**throttled, num_workers=0))
    fed = train(tiny_config(**throttled, num_workers=6, prefetch_factor=4, persistent_workers=True))

    def shares(result: TrainResult) -> list[float]:
        measured = [m.data_wait_share for m in result.history]
        assert all(s is not None for s in measured)
        return [s for s in measured if s is not None]

    starved_shares, fed_shares = shares(starved), shares(fed)
    assert min(starved_shares) > 0.5, starved_shares
    # The fed run's last epoch: its persistent workers are up (the first epoch also waits for six
    # processes to start, which a loaded machine stretches).
    assert fed_shares[-1] < min(starved_shares) / 2, (fed_shares, starved_shares)
    print(f"\nstarved {starved_shares}, fed {fed_shares}")


def test_a_profiled_run_leaves_a_trace_tensorboards_profiler_plugin_loads(
    fashion_mnist_root: str, tmp_path: Path
) -> None:
    folder = tmp_path / "profile"
    train(tiny_config(epochs=2, profile_dir=str(folder)))
    [trace] = list(folder.glob("rank0.*.pt.trace.json"))  # the first epoch only, one file per rank
    events = json.loads(trace.read_text())["traceEvents"]
    steps = sorted({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})
    assert steps == [f"ProfilerStep#{n}" for n in range(2, 7)]  # wait 1, warm-up 1, active 5
    assert any(e.get("name") == "[memory]" for e in events)  # profile_memory
    assert any("Input Dims" in e.get("args", {}) for e in events)  # record_shapes
    # TensorBoard's profiler plugin (torch-tb-profiler) parses it into its views. It runs its own
    # worker processes, so it is driven from a script of its own.
    script = tmp_path / "load_trace.py"
    script.write_text(
        textwrap.dedent(f"""
        from torch_tb_profiler.io.cache import Cache
        from torch_tb_profiler.profiler.loader import RunLoader

        if __name__ == "__main__":
            with Cache() as cache:
                run = RunLoader("trial", {str(folder)!r}, cache).load()
            [profile] = run.profiles.values()
            ops = [row["name"] for row in profile.operation_table_by_name["data"]]
            print(profile.worker, len(ops), "aten::convolution" in ops, profile.memory_snapshot is not None)
        """)
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    worker, op_count, has_conv, has_memory = proc.stdout.split()[-4:]
    assert worker == "rank0" and int(op_count) > 10 and has_conv == "True" and has_memory == "True", (
        proc.stdout
    )


def test_tensorboard_event_files_hold_each_epoch_and_the_hparams(
    fashion_mnist_root: str, tmp_path: Path
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    folder = tmp_path / "tb"
    result = train(
        tiny_config(epochs=3, tensorboard_dir=str(folder)),
        hparams={"trial": "7", "lr": 0.2, "batch_size": 32},
    )
    events = EventAccumulator(str(folder))
    events.Reload()
    accuracy = [(s.step, s.value) for s in events.Scalars("epoch/val_accuracy")]
    assert [step for step, _ in accuracy] == [1, 2, 3]
    assert [v for _, v in accuracy] == pytest.approx([m.val_accuracy for m in result.history], abs=1e-6)
    for tag in ("epoch/lr", "speed/images_per_s", "speed/data_wait_share", "speed/peak_memory_mib"):
        assert len(events.Scalars(tag)) == 3, tag
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["trial"].string_value == "7"
    assert hparams["lr"].number_value == pytest.approx(0.2)
    assert hparams["batch_size"].number_value == 32
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    assert "epoch/val_accuracy" in [m.name.tag for m in experiment.experiment.metric_infos]


def test_onecycle_momentum_cycling_is_an_option(fashion_mnist_root: str) -> None:
    """Off, SGD keeps the momentum being tuned; on, OneCycle moves it from momentum down to
    base_momentum at the peak LR and back, as dlojz.py's schedule does."""
    from trainer import distributed
    from trainer.loop import _Run

    def momenta(**overrides: object) -> list[float]:
        config = tiny_config(epochs=1, max_steps_per_epoch=40, momentum=0.95, **overrides)
        run = _Run(config, distributed.detect(), torch.device("cpu"), None)
        seen = []
        for _ in range(run.steps_per_epoch):
            seen.append(run.optimizer.param_groups[0]["momentum"])
            run.optimizer.step()
            run.scheduler.step()
        return seen

    assert set(momenta()) == {0.95}
    cycled = momenta(cycle_momentum=True, base_momentum=0.85)
    assert cycled[0] == pytest.approx(0.95) and min(cycled) == pytest.approx(0.85, abs=1e-3)
    assert cycled[-1] > 0.94
    with pytest.raises(ConfigError, match=r"base_momentum 0\.9 is above momentum 0\.8"):
        tiny_config(cycle_momentum=True, momentum=0.8, base_momentum=0.9)


def test_validation_may_run_at_a_larger_size_than_training(fashion_mnist_root: str) -> None:
    """The course's ImageNet recipe trains at 176 px and validates at 224; here 28 and 36."""
    config = tiny_config(image_size=28, val_image_size=36)
    bundle = build_datasets(config)
    train_image, _ = bundle.train[(0, 0)]
    val_image, _ = bundle.val[0]
    assert tuple(train_image.shape[-2:]) == (28, 28) and tuple(val_image.shape[-2:]) == (36, 36)
    result = train(config)
    assert result.history[-1].val_accuracy > 0.1


def test_a_checkpoint_from_before_a_setting_existed_resumes_with_its_default(tmp_path: Path) -> None:
    saved = tiny_config().training_fingerprint()
    current = dict(saved)
    del saved["cycle_momentum"], saved["val_image_size"]  # written by an older trainer
    check_fingerprint(tmp_path / "checkpoint.pt", saved, current)
    current["cycle_momentum"] = True
    with pytest.raises(ConfigError, match="cycle_momentum is True but the checkpoint"):
        check_fingerprint(tmp_path / "checkpoint.pt", saved, current)
