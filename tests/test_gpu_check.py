"""The GPU check (``python -m bench gpu``) is ready before a GPU machine comes: on this machine it
says in one line that there is no GPU and exits 0 without writing a result, and every one of its
checks runs, tiny, on the CPU (the same code paths but CUDA's: the trainer's ResNet runs against a
bare loop, a study through `hpo launch`, the profiled trial's trace, a 2-process DDP trial over
gloo, packed trials at k = 1 and 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.fast
def test_without_a_gpu_the_check_says_so_in_one_line_and_exits_0(tmp_path: Path) -> None:
    # No GPU visible, also on a machine that has one (CUDA then sees none).
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "gpu", "--out", str(tmp_path), "--doc", str(tmp_path / "doc.md")],
        capture_output=True, text=True, cwd=REPO, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("gpu: no CUDA GPU visible") and len(proc.stdout.splitlines()) == 1, (
        proc.stdout
    )
    assert list(tmp_path.iterdir()) == []  # nothing pretends to be a measurement


@pytest.mark.slow
def test_every_gpu_check_rehearses_on_the_cpu(tmp_path: Path, fashion_mnist_root: str) -> None:
    result = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--rehearse-on-cpu", "--json", str(result)],
        capture_output=True, text=True, cwd=REPO, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    checks = json.loads(result.read_text())["checks"]
    names = ["devices", "resnet50-bf16", "resnet50-fp16", "study", "profile", "ddp", "packing"]
    assert [c["name"] for c in checks] == names and all(c["ok"] for c in checks), proc.stdout
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[: len(names)]] == names, proc.stdout
    assert lines[-1].startswith("gpu check: 7 of 7 ok"), proc.stdout
    study = next(c for c in checks if c["name"] == "study")["figures"]
    assert all(0 <= share < 1 for share in study["data_wait_share"]) and min(study["peak_memory_mib"]) > 0
    packing = next(c for c in checks if c["name"] == "packing")["figures"]
    # Each packed trial has a CPU of its own: k = 4 runs where there are 4.
    assert set(packing["trials_per_gpu_hour"]) == {str(k) for k in (1, 2, 4) if k <= (os.cpu_count() or 1)}
