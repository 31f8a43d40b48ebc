"""What Slurm's accounting says a job cost: the elapsed time of every run of the job (a requeued
job runs several times; ``--duplicates`` lists each run) times the GPUs, or CPUs, allocated to it.
The cost model itself (``Usage``, a trial's estimate) is ``hpo.budget.usage``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from datetime import datetime

from hpo.budget.usage import Usage


def sacct_usage(job_ids: Iterable[str], since: datetime | None = None) -> dict[str, Usage]:
    """Elapsed time and allocation of Slurm jobs, every run of a requeued job summed.

    ``since`` (the study's first trial) keeps out older jobs that had the same id (sacct searches
    from the epoch when given job ids; ids restart after a wrap-around or a controller reset).
    """
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    window = ["-S", since.strftime("%Y-%m-%dT%H:%M:%S")] if since is not None else []
    try:
        out = subprocess.run(
            ["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,ElapsedRaw,AllocTRES", *window, "-j", ",".join(ids)],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}  # no accounting here: callers fall back to estimates
    return parse_usage(out)


def parse_usage(out: str) -> dict[str, Usage]:
    """``sacct -X -D -n -P -o JobID,ElapsedRaw,AllocTRES`` output: per job, its runs summed
    (seconds, GPU-seconds, CPU-seconds, each run with its own allocation)."""
    sums: dict[str, list[float]] = {}
    for line in out.splitlines():
        job_id, elapsed, tres = [*line.split("|"), "", ""][:3]
        if not elapsed.isdigit():
            continue
        run = sums.setdefault(job_id, [0.0, 0.0, 0.0])
        run[0] += float(elapsed)
        run[1] += float(elapsed) * _tres_count(tres, "gres/gpu")
        run[2] += float(elapsed) * _tres_count(tres, "cpu")
    return {
        job_id: Usage(secs, gpu_s / secs if secs else 0.0, cpu_s / secs if secs else 0.0, measured=True)
        for job_id, (secs, gpu_s, cpu_s) in sums.items()
    }


def _tres_count(tres: str, name: str) -> int:
    """``gres/gpu=4`` (else the sum of typed ``gres/gpu:a100=4``) or ``cpu=8`` from AllocTRES."""
    counts = {
        key: int(value)
        for key, _, value in (item.partition("=") for item in tres.split(","))
        if value.isdigit()
    }
    if name in counts:
        return counts[name]
    return sum(value for key, value in counts.items() if key.startswith(name + ":"))
