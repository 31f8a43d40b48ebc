"""What the service reads from Slurm's commands, parsed from their recorded output: sacct's
elapsed time and allocation per job (every run of a requeued job summed, GPUs typed or not), with
no cluster to ask."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.slurm import accounting

RECORDED = Path(__file__).resolve().parents[1] / "golden" / "sacct"


def _recorded(name: str) -> str:
    return "".join(
        line for line in (RECORDED / name).read_text().splitlines(True) if not line.startswith("#")
    )


def test_a_requeued_jobs_runs_are_summed() -> None:
    usage = accounting.parse_usage(_recorded("requeued.txt"))
    assert usage["571"].seconds == 108 and usage["571"].cpus == 1 and usage["571"].gpus == 0
    assert usage["571"].cpu_hours == pytest.approx(108 / 3600)
    assert usage["569"].seconds == 0 and usage["569"].cpu_hours == 0


def test_gpus_are_read_typed_or_not_and_an_unfinished_line_is_skipped() -> None:
    usage = accounting.parse_usage(_recorded("gpu.txt"))
    assert usage["8812"].gpu_hours == pytest.approx(4.0) and usage["8812"].cpu_hours == pytest.approx(40.0)
    assert usage["8813"].gpu_hours == pytest.approx(0.5)  # gres/gpu:a100=1 only
    assert usage["8814_3"].gpu_hours == pytest.approx(600 / 3600)  # an array task keeps its id
    assert "8815" not in usage  # no elapsed time yet
