"""The sbatch scripts the service submits, compared line by line with reference files (as
submitit's own tests do): a per-trial job on one CPU, a 2-node DDP trial with Jean Zay's account,
QoS, constraint and module line, and a `--workers` job array. A change to what reaches Slurm shows
up here as a diff, reviewed before it lands.

To regenerate the references after an intended change: HPO_REGENERATE_GOLDEN=1 pytest
tests/hpo/test_sbatch_golden.py, then read the diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hpo.config.schema import build_spec
from hpo.slurm import executors

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "sbatch"
BASE: dict[str, Any] = {
    "study": {"name": "golden", "workdir": "/work/runs/golden", "metric": "val_accuracy"},
    "search_space": {"lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True}},
    "trainer": {"model": "resnet20", "epochs": 3},
}
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "per-trial-cpu": (
        {"executor": "slurm", "cpus_per_task": 2, "time": "20m", "python": "/venv/bin/python"},
        {},
    ),
    "ddp-jean-zay": (
        {
            "executor": "slurm",
            "nodes": 2,
            "tasks_per_node": 4,
            "gpus_per_node": 4,
            "cpus_per_task": 10,
            "time": "1h",
            "account": "abc@a100",
            "qos": "qos_gpu_a100-dev",
            "constraint": "a100",
            "setup": ["module purge", "module load arch/a100 pytorch-gpu/py3/2.6.0"],
            "python": "/work/abc/venvs/hpo/bin/python",
        },
        {},
    ),
    "workers-array": (
        {
            "executor": "slurm",
            "partition": "gpu_p5",
            "gpus_per_node": 1,
            "cpus_per_task": 8,
            "time": "30m",
            "python": "/venv/bin/python",
        },
        {"workers": 4, "time_min": 240, "role": "worker"},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_sbatch_script_is_the_reference_one(case: str) -> None:
    resources, options = CASES[case]
    spec = build_spec({**BASE, "resources": resources}, "golden.yaml")
    role = options.pop("role", "") if options else ""
    text = executors.render_sbatch(spec, executors.job_name(spec, role), **options)
    reference = GOLDEN / f"{case}.sbatch"
    if os.environ.get("HPO_REGENERATE_GOLDEN"):
        reference.write_text(text)
    assert reference.exists(), f"no reference for {case}: HPO_REGENERATE_GOLDEN=1 pytest {__file__}"
    assert text == reference.read_text(), (
        f"{case}: the sbatch script differs from {reference}; if intended, regenerate it with "
        f"HPO_REGENERATE_GOLDEN=1 pytest {__file__} and review the diff"
    )
