"""What Slurm can tell before a study's first job is submitted: a job no node of the partition can
hold (it would pend forever), a time limit above the QoS's MaxWall, and a study file on a disk
the compute nodes may not see. Asked through the Slurm executor's ``preflight``."""

from __future__ import annotations

import re
import subprocess
from typing import TYPE_CHECKING

from hpo.config import parse_duration_min
from hpo.errors import NotReadyError, StudyFileError
from hpo.slurm import limits, settings

if TYPE_CHECKING:
    from hpo.config import StudySpec
    from hpo.executors.base import JobShape


def check_qos_wall(spec: StudySpec) -> None:
    """Refuse a trial whose time limit is longer than its QoS allows (sacctmgr's MaxWall): Slurm
    would leave every such job pending (QOSMaxWallDurationPerJobLimit) or reject it."""

    qos = settings.of(spec).qos
    if not qos:
        return
    walls = limits.qos_walls()
    if not walls:
        return  # no accounting to ask: let sbatch judge
    if qos not in walls:
        raise StudyFileError(
            f"{spec.source}: resources.slurm.qos: no QoS {qos!r} on this cluster; it has {', '.join(sorted(walls))}"
        )
    wall = walls[qos].strip()
    if not wall:
        return  # no MaxWall on this QoS
    limit_min = parse_duration_min("MaxWall", wall)
    if spec.resources.time_min > limit_min:
        raise StudyFileError(
            f"{spec.source}: resources.time: {spec.resources.time} ({spec.resources.time_min:g} min) is longer "
            f"than QoS {qos}'s MaxWall {wall} ({limit_min:g} min); lower it or use another qos"
        )


def parse_node_capacity(out: str, partition: str | None) -> dict[str, tuple[int, int]]:
    """``sinfo -h -N -o %N|%c|%G|%P``: node -> (CPUs, GPUs), of ``partition`` (sinfo was asked
    for it) or else of the default partition, the one sinfo marks with ``*``. GPUs are counted
    from the GRES, typed (``gpu:a100:8``) or not (``gpu:4``), socket bindings (``(S:0-1)``) aside."""
    capacity: dict[str, tuple[int, int]] = {}
    for line in out.splitlines():
        name, cpus, gres, in_partition = [*line.split("|"), "", "", ""][:4]
        if not partition and not in_partition.endswith("*"):
            continue  # sbatch without --partition uses the default one
        gpus = sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", gres))
        capacity[name] = (int(cpus) if cpus.isdigit() else 0, gpus)
    return capacity


def check_partition_capacity(spec: StudySpec, shape: JobShape) -> None:
    """Refuse, before submitting, a job that the partition can never run (it would pend forever)."""
    partition = settings.of(spec).partition
    args = ["sinfo", "-h", "-N", "-o", "%N|%c|%G|%P"]
    if partition:
        args += ["-p", partition]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return  # no sinfo answer: let sbatch judge
    capacity = parse_node_capacity(out, partition)
    where = f"partition {partition}" if partition else "the default partition"
    if not capacity:
        raise NotReadyError(
            f"{spec.source}: resources.slurm.partition: {where} has no nodes",
            "`sinfo -s` lists the partitions; set resources.slurm.partition",
        )
    nodes, gpus_per_node, cpus_per_node = shape.nodes, shape.gpus_per_node, shape.cpus_per_node
    fitting = [n for n, (cpus, gpus) in capacity.items() if cpus >= cpus_per_node and gpus >= gpus_per_node]
    if len(fitting) < nodes:
        most_gpus = max(gpus for _, gpus in capacity.values())
        most_cpus = max(cpus for cpus, _ in capacity.values())
        res = spec.resources
        packed = (
            f" ({res.trials_per_gpu} packed trials of {res.cpus_per_task})"
            if res.packed and not spec.study.on_ray
            else ""
        )
        raise NotReadyError(
            f"{spec.source}: resources: a job needs {nodes} nodes with {gpus_per_node} GPUs and "
            f"{cpus_per_node} CPUs each{packed}; {where} has {len(capacity)} nodes, {len(fitting)} of them "
            f"big enough (at most {most_gpus} GPUs and {most_cpus} CPUs per node)",
            "ask for less in resources, or choose another resources.slurm.partition",
        )
