"""The study every dispatch benchmark launches (``bench/dispatch.py``, its wide run
``bench/dispatch_wide.py``, ``bench/scheduler_settings.py``), and the line each prints per mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def study_file(
    folder: Path, name: str, n_trials: int, concurrency: int, ray: bool, partition: str | None = None
) -> Path:
    document: dict[str, Any] = {
        "study": {
            "name": name,
            "workdir": str(folder / name),
            "sampler": {"name": "random", "seed": 0},
            "pruner": {"name": "none"},
            "n_trials": n_trials,
            "max_concurrent": concurrency,
        },
        "search_space": {"lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True}},
        "trainer": {"model": "resnet8"},
        "resources": {"executor": "slurm", "cpus_per_task": 1, "time": "30m"},
    }
    if partition:
        document["resources"]["slurm"] = {"partition": partition}
    if ray:  # one allocation of both nodes, the K trials spread over them
        document["study"]["backend"] = "ray"
        document["resources"]["nodes"] = 2
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def result_line(mode: str, result: dict[str, Any]) -> str:
    """One mode's figures on one line: makespan, the controller's load, the latencies."""
    gap, running = result["told_to_next_asked_s"], result["asked_to_running_s"]
    return (
        f"{mode:>14}: makespan {result['makespan_s']:.1f} s = {result['ratio']:.3f} x ideal"
        + f"; slurmctld RPCs {result['slurmctld_rpcs_per_trial']:.1f} per trial"
        + f" ({result['slurmctld_rpcs_per_min']:.0f}/min), sacct queries"
        + f" {result['sacct_queries_per_trial']:.2f} per trial"
        + (f"; asked->running median {running['median']:.2f} s (p90 {running['p90']:.2f})" if running else "")
        + f"; finished->told median {result['finished_to_told_s']['median']:.3f} s"
        + f"; first trial running after {result['startup_s']:.1f} s"
        + (
            f", {result['startup_in_job_s']:.1f} s after its job started"
            if "startup_in_job_s" in result
            else ""
        )
        + f" (after it: {result['after_startup_ratio']:.3f} x ideal)"
        + (f"; told->next asked median {gap['median']:.2f} s" if gap else "")
        + breakdown_line(result.get("breakdown_s"))
    )


def breakdown_line(steps: dict[str, dict[str, float]] | None) -> str:
    """Where the seconds from ask to run go (``bench.dispatch.BREAKDOWN``), medians (p90)."""
    if not steps:
        return ""
    return (
        "\n"
        + " " * 16
        + "asked->running by step, median (p90): "
        + ", ".join(f"{name} {s['median']:.2f} s ({s['p90']:.2f})" for name, s in steps.items())
    )
