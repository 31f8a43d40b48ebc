"""The sbatch scripts the service submits, compared line by line with reference files (as
submitit's own tests do): a per-trial job on one CPU, a 2-node DDP trial with Jean Zay's account,
QoS, constraint and module line, a `--workers` job array, the `--detach` launcher's CPU job, and
a Ray backend's 2-node allocation. A change to what reaches Slurm shows up here as a diff,
reviewed before it lands.

To regenerate the references after an intended change: HPO_REGENERATE_GOLDEN=1 pytest
tests/hpo/slurm/test_sbatch_golden.py, then read the diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hpo.config.schema import build_spec
from hpo.dispatch.ray.allocation import allocation_spec
from hpo.executors.jobs import job_name
from hpo.slurm import detach, jobs

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "sbatch"
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
            "slurm": {"account": "abc@a100", "qos": "qos_gpu_a100-dev", "constraint": "a100"},
            "setup": ["module purge", "module load arch/a100 pytorch-gpu/py3/2.6.0"],
            "python": "/work/abc/venvs/hpo/bin/python",
        },
        {},
    ),
    "workers-array": (
        {
            "executor": "slurm",
            "slurm": {"partition": "gpu_p5"},
            "gpus_per_node": 1,
            "cpus_per_task": 8,
            "time": "30m",
            "python": "/venv/bin/python",
        },
        {"workers": 4, "time_min": 240, "role": "worker"},
    ),
}


JEAN_ZAY_A100 = CASES["ddp-jean-zay"][0]
OTHER_JOBS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # The detached launcher: one CPU task on the launcher section's partition and account.
    "launcher-jean-zay": (
        {"launcher": {"partition": "prepost", "account": "abc@cpu", "time": "20h", "cpus_per_task": 2}},
        JEAN_ZAY_A100,
    ),
    # The Ray allocation: 2 nodes of 4 GPUs, one task each holding its share of 8 trials in flight.
    "ray-allocation": (
        {"study": {**BASE["study"], "backend": "ray", "max_concurrent": 8, "n_trials": 40}},
        {**JEAN_ZAY_A100, "tasks_per_node": 1, "gpus_per_node": 1, "cpus_per_task": 10, "nodes": 2},
    ),
}


def _render(case: str) -> str:
    if case in CASES:
        resources, options = CASES[case]
        spec = build_spec({**BASE, "resources": resources}, "golden.yaml")
        role = options.pop("role", "") if options else ""
        # Trial and worker jobs as the dispatchers submit them (a one-process job runs without srun).
        return jobs.render_sbatch(spec, job_name(spec, role), direct=True, **options)
    sections, resources = OTHER_JOBS[case]
    spec = build_spec({**BASE, "resources": resources, **sections}, "golden.yaml")
    if case.startswith("launcher"):
        return detach.render_sbatch(spec)
    allocation, time_min = allocation_spec(spec, remaining=spec.study.n_trials)
    return jobs.render_sbatch(allocation, job_name(spec, "ray"), time_min=time_min)


@pytest.mark.parametrize("case", sorted([*CASES, *OTHER_JOBS]))
def test_the_sbatch_script_is_the_reference_one(case: str) -> None:
    text = _render(case)
    reference = GOLDEN / f"{case}.sbatch"
    if os.environ.get("HPO_REGENERATE_GOLDEN"):
        reference.write_text(text)
    assert reference.exists(), f"no reference for {case}: HPO_REGENERATE_GOLDEN=1 pytest {__file__}"
    assert text == reference.read_text(), (
        f"{case}: the sbatch script differs from {reference}; if intended, regenerate it with "
        f"HPO_REGENERATE_GOLDEN=1 pytest {__file__} and review the diff"
    )
