"""The resources section (what one trial gets) and the launcher section (where `hpo launch --detach` runs)."""

from __future__ import annotations

import math
from typing import Any

from hpo.config.values import (
    ACCOUNT,
    SBATCH_OPTION,
    check_safe_name,
    check_simple_command,
    check_single_line,
    parse_duration_min,
)
from hpo.executors import names as installed_executors
from trainer.fields import KeyProblem, config_dataclass, field


@config_dataclass()
class Resources:
    executor: str = field(
        "local",
        "slurm (one Slurm job per trial, through submitit), local (processes here), or the name of an "
        "installed executor plugin (the hpo.executors entry-point group).",
    )
    nodes: int = field(1, "Nodes per trial.", ge=1)
    tasks_per_node: int = field(
        1,
        "Processes per node (one per GPU for DDP). With the Ray backend, N > 1 makes each trial a DDP "
        "run of N Ray Train workers (TorchTrainer), each with cpus_per_task CPUs and gpus_per_node / N "
        "GPUs (nodes is then the size of the allocation the trials share).",
        ge=1,
    )
    gpus_per_node: int = field(0, "GPUs per node.", ge=0)
    cpus_per_task: int = field(1, "CPU cores per process (also the trainer's torch threads).", ge=1)
    trials_per_gpu: int = field(
        1,
        "Trials run at once on each job's GPU, each its own process (with its own CUDA context): a "
        "per-trial job holds this many trials, a --workers job this many workers. A short CIFAR-size "
        "trial uses a fraction of an A100/H100. The job gets cpus_per_task and mem_gb once per trial; "
        "with gpus_per_node 0 the trials share the job's CPUs. One-process trials only.",
        ge=1,
    )
    mem_gb: float | None = field(None, "Memory per node in GB (default: the partition's).", gt=0)
    time: str | int = field("01:00:00", "Time limit of one trial's job (minutes, 30m, 2h, 1-00:00:00).")
    worker_time: str | int | None = field(
        None,
        "Time limit of a --workers job (default: time x its share of the trials, at most 24 h).",
    )
    setup: list[str] = field(
        factory=list,
        help="Shell lines run in the job before the trial (module load ..., conda activate ...).",
    )
    python: str | None = field(None, "Python interpreter on the compute nodes (default: this one).")

    def __post_init__(self) -> None:
        if self.executor not in installed_executors():
            installed = ", ".join(installed_executors())
            raise KeyProblem(
                "executor", f"no executor {self.executor!r} is installed; installed: {installed}"
            )
        parse_duration_min("time", self.time)
        if self.worker_time is not None:
            parse_duration_min("worker_time", self.worker_time)
        for index, line in enumerate(self.setup):
            check_simple_command(f"setup[{index}]", line)
        if self.executor == "local" and self.nodes > 1:
            raise KeyProblem("nodes", f"the local executor runs on this machine only; got nodes={self.nodes}")
        if self.python is not None:
            check_single_line("python", self.python)
        if self.trials_per_gpu > 1 and self.gpus_per_node > 1:
            raise KeyProblem(
                "trials_per_gpu",
                f"packs trials of one GPU; gpus_per_node is {self.gpus_per_node} (a one-process trial "
                "uses one GPU: set gpus_per_node to 1)",
            )

    @property
    def time_min(self) -> int:
        return max(1, math.ceil(parse_duration_min("time", self.time)))

    @property
    def worker_time_min(self) -> int | None:
        if self.worker_time is None:
            return None
        return max(1, math.ceil(parse_duration_min("worker_time", self.worker_time)))

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def packed(self) -> bool:
        """Whether a job runs several trials at once (``trials_per_gpu`` > 1)."""
        return self.trials_per_gpu > 1

    @property
    def job_cpus_per_task(self) -> int:
        """CPUs per process of a trial's (or worker's) job: each packed trial gets its own."""
        return self.cpus_per_task * self.trials_per_gpu

    @property
    def job_mem_gb(self) -> float | None:
        """Memory per node of a trial's (or worker's) job: each packed trial gets its own."""
        return None if self.mem_gb is None else self.mem_gb * self.trials_per_gpu


def check_placement(
    partition: str | None, account: str | None, qos: str | None, sbatch: dict[str, Any]
) -> None:
    """Names that go into a job script: nothing that needs quoting, one line each."""
    for key, value in (("partition", partition), ("qos", qos)):
        if value is not None:
            check_safe_name(key, value)
    # Jean Zay's accounts look like abc@a100.
    if account is not None and not ACCOUNT.fullmatch(account):
        raise KeyProblem(
            "account", f"may contain only letters, digits, '.', '_', '-' and '@', got {account!r}"
        )
    for option, value in sbatch.items():
        if not SBATCH_OPTION.fullmatch(option):
            raise KeyProblem(f"sbatch.{option}", "is not an sbatch long option name (like mail-type)")
        if not isinstance(value, str | int | float | bool):
            raise KeyProblem(f"sbatch.{option}", f"must be a single value, got {value!r}")
        check_single_line(f"sbatch.{option}", str(value))


@config_dataclass()
class LauncherSection:
    """Where ``hpo launch --detach`` runs the launcher: a small CPU job that mostly sleeps."""

    partition: str | None = field(None, "Partition of the launcher's job (a CPU one; Jean Zay: prepost).")
    account: str | None = field(None, "Account of the launcher's job (Jean Zay: your CPU account, abc@cpu).")
    qos: str | None = field(None, "QoS of the launcher's job.")
    time: str | int = field(
        "20h", "Time limit of one run of the launcher's job; shortly before it, the job requeues itself."
    )
    cpus_per_task: int = field(1, "CPU cores of the launcher's job.", ge=1)
    sbatch: dict[str, Any] = field(factory=dict, help="Extra sbatch options of the launcher's job.")

    def __post_init__(self) -> None:
        check_placement(self.partition, self.account, self.qos, self.sbatch)
        parse_duration_min("time", self.time)

    @property
    def time_min(self) -> int:
        return max(1, math.ceil(parse_duration_min("time", self.time)))
