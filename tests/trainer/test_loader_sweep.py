"""``python -m trainer --tune-loader``: the DataLoader sweep, on the real Fashion-MNIST and on a folder
of JPEG files, run as a user runs it; and its recommendation rule on hand-made rows."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from tests.conftest import run_trainer_cli
from trainer.config import TrainConfig, field_names
from trainer.loader_sweep import LoaderSetting, Measurement, recommend, worker_counts

HEADER = "num_workers  prefetch_factor  persistent_workers  pin_memory  images/s  vs_best  pass2_start_s"
BLOCK = "recommended (in the study file's trainer: section):"

Row = tuple[str, str, str, str]  # num_workers, prefetch_factor, persistent_workers, pin_memory


def _expected_grid() -> set[Row]:
    """Written out independently of the module: 0, 1, 2, 4, ... up to 2x the usable CPUs."""
    top = 2 * len(os.sched_getaffinity(0))
    workers = [0, *[2**i for i in range(top.bit_length()) if 2**i < top], top]
    pins = ("false", "true") if torch.cuda.is_available() else ("false",)
    rows = {("0", "-", "false", pin) for pin in pins}
    for w in workers[1:]:
        for prefetch in ("2", "4"):
            for persistent in ("false", "true"):
                rows |= {(str(w), prefetch, persistent, pin) for pin in pins}
    return rows


def _parse(stdout: str) -> tuple[dict[Row, tuple[float, float, str]], dict[str, object], str]:
    """The table's rows (images/s, ratio to the best, marks), the recommendation, the comparison line."""
    lines = stdout.splitlines()
    start = lines.index(HEADER) + 1
    end = lines.index("", start)
    rows: dict[Row, tuple[float, float, str]] = {}
    for line in lines[start:end]:
        cells = line.split()
        key = (cells[0], cells[1], cells[2], cells[3])
        assert key not in rows, f"row measured twice: {line}"
        rows[key] = (float(cells[4]), float(cells[5]), " ".join(cells[7:]))
    block_start = lines.index(BLOCK) + 1
    block_end = lines.index("", block_start)
    recommended = yaml.safe_load(textwrap.dedent("\n".join(lines[block_start:block_end])))
    comparison = lines[block_end + 1]
    return rows, recommended, comparison


def _check_report(stdout: str, expected: set[Row]) -> dict[str, object]:
    rows, recommended, comparison = _parse(stdout)
    assert set(rows) == expected, stdout
    assert all(rate > 0 for rate, _, _ in rows.values()), stdout
    assert max(ratio for _, ratio, _ in rows.values()) == 1.0
    # The block pastes into a study's trainer: section: valid keys and values of TrainConfig.
    assert isinstance(recommended, dict) and set(recommended) <= set(field_names()), recommended
    TrainConfig.from_mapping(recommended)
    key: Row = (
        str(recommended["num_workers"]),
        str(recommended.get("prefetch_factor", "-")),
        str(recommended["persistent_workers"]).lower(),
        str(recommended["pin_memory"]).lower(),
    )
    assert key in rows, (key, stdout)
    assert "recommended" in rows[key][2]
    # Within 5% of the fastest, and no row as fast with fewer workers.
    assert rows[key][1] >= 0.95
    assert not [k for k, (_, ratio, _) in rows.items() if ratio >= 0.95 and int(k[0]) < int(key[0])]
    assert comparison.startswith("your current setting: "), comparison
    assert "images/s" in comparison
    return recommended


def test_sweep_on_fashion_mnist(tmp_path: Path, fashion_mnist_root: str) -> None:
    result_json = tmp_path / "sweep.json"
    proc = run_trainer_cli(
        "--tune-loader", "--tune-loader-batches", "4", "--train-fraction", "0.02", "--batch-size", "32",
        "--num-workers", "1", "--prefetch-factor", "2", "--no-persistent-workers",
        "--data-root", fashion_mnist_root, "--result-json", str(result_json),
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    print(proc.stdout)
    assert "dataset fashion-mnist, batch_size 32, image_size 28" in proc.stdout
    assert "epoch" not in proc.stdout, "nothing is trained"
    recommended = _check_report(proc.stdout, _expected_grid())
    rows, _, comparison = _parse(proc.stdout)
    # The config's own setting is in the grid: marked there, not measured twice.
    assert "current" in rows[("1", "2", "false", "false")][2]
    assert "num_workers=1, prefetch_factor=2, persistent_workers=false, pin_memory=false" in comparison
    written = json.loads(result_json.read_text())
    assert len(written["rows"]) == len(rows)
    assert written["recommended"] == recommended
    assert written["batches_per_pass"] == 4 and written["passes"] == 2


def _write_jpeg_folder(root: Path, per_class: int, size: int) -> None:
    """train/ and val/ of three class folders of JPEG files, drawn with pillow."""
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("val", 2)):
        for cls in range(3):
            folder = root / split / f"class{cls}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                pixels[:, :, cls] = 255  # each class its own tint
                Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)


def test_sweep_on_an_image_folder_of_jpegs(tmp_path: Path) -> None:
    _write_jpeg_folder(tmp_path, per_class=16, size=48)
    proc = run_trainer_cli(
        "--tune-loader", "--tune-loader-batches", "3", "--dataset", "imagefolder",
        "--data-root", str(tmp_path), "--image-size", "32", "--batch-size", "8",
        "--num-workers", "3", "--prefetch-factor", "3",
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    assert "dataset imagefolder, batch_size 8, image_size 32" in proc.stdout
    # A current setting outside the grid is measured as one more row.
    current: Row = ("3", "3", "true", "true" if torch.cuda.is_available() else "false")
    _check_report(proc.stdout, _expected_grid() | {current})
    rows, _, _ = _parse(proc.stdout)
    assert "current" in rows[current][2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-workers", "-1"], "num_workers must be >= 0, got -1"),
        (["--dataset", "imagefolder", "--data-root", "/nonexistent/images"], "has no train/ folder"),
        (["--tune-loader-batches", "1"], "argument --tune-loader-batches: must be an integer >= 2, got '1'"),
        (["--batch-size", "100000"], "batch_size 100000 exceeds the 60000 training samples"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(args: list[str], message: str) -> None:
    proc = run_trainer_cli("--tune-loader", *args, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_an_image_folder_without_classes_is_exit_status_2(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    proc = run_trainer_cli(
        "--tune-loader", "--dataset", "imagefolder", "--data-root", str(tmp_path), timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert f"data_root '{tmp_path}': Couldn't find any class folder" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_batches_flag_needs_the_sweep() -> None:
    proc = run_trainer_cli("--tune-loader-batches", "5", timeout=120)
    assert proc.returncode == 2
    assert "--tune-loader-batches needs --tune-loader" in proc.stderr


def _row(workers: int, prefetch: int | None, persistent: bool, rate: float) -> Measurement:
    return Measurement(LoaderSetting(workers, prefetch, persistent, False), rate, 0.0)


def test_recommendation_prefers_fewest_workers_then_smallest_prefetch_within_5_percent() -> None:
    rows = [
        _row(0, None, False, 100.0),
        _row(1, 2, False, 150.0),
        _row(4, 4, True, 200.0),  # the fastest
        _row(2, 4, False, 199.0),
        _row(2, 2, True, 193.0),  # within 5%, as few workers and the smallest prefetch
        _row(2, 2, False, 191.0),  # the same, slower
    ]
    assert recommend(rows).setting == LoaderSetting(2, 2, True, False)
    # Outside 5% of the fastest, fewer workers do not win.
    assert recommend([_row(1, 2, True, 189.0), _row(4, 2, True, 200.0)]).setting.num_workers == 4
    # Without workers there is no prefetch_factor; 0 workers within 5% wins over any.
    assert recommend([_row(0, None, False, 96.0), _row(1, 2, True, 100.0)]).setting.num_workers == 0


def test_worker_counts_double_up_to_twice_the_cpus() -> None:
    assert worker_counts(1) == [0, 1, 2]
    assert worker_counts(2) == [0, 1, 2, 4]
    assert worker_counts(3) == [0, 1, 2, 4, 6]
    assert worker_counts(8) == [0, 1, 2, 4, 8, 16]
