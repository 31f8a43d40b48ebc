"""Process-group set-up for runs launched by srun, by torchrun, or as a single process; or a
process group that the caller already set up (Ray Train initializes it before calling the worker
function), which the run takes as it is and leaves to its owner.

The rendezvous port: trials of an HPO study often share a node, and a port computed from the job
id collides when two such numbers coincide modulo the port range, or when there is no job id at
all (two local trials). Instead rank 0 lets the operating system pick a free port for its TCPStore
and publishes ``host:port`` in a small file that the other ranks wait for. The file's name is
unique to the job, step and restart, and lives in a directory all ranks see (the checkpoint
directory, which a multi-node run needs on a shared filesystem anyway).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.errors import ConfigError

RENDEZVOUS_DIR_ENV = "HPO_RENDEZVOUS_DIR"


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in its job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    """Set when the launcher chose it (torchrun, or MASTER_PORT exported); None: rank 0 picks one."""
    rendezvous_key: str = "single"
    """Unique to this job step and restart: names the file that publishes rank 0's port."""
    launcher: str = "single"
    num_nodes: int = 1

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand Slurm's compressed host list: ``"gpu[01-03,07],login1"`` -> gpu01, gpu02, gpu03, gpu07, login1.

    Written by hand because calling ``scontrol show hostnames`` needs Slurm's client on the
    compute node and one extra process per rank.
    """
    hosts: list[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", hostlist):
        prefix, ranges = match.group(1), match.group(2)
        if ranges is None:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            if not last:
                hosts.append(prefix + first)
                continue
            width = len(first)
            hosts.extend(f"{prefix}{n:0{width}d}" for n in range(int(first), int(last) + 1))
    return hosts


def detect(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Take an already initialized process group, else read ranks from torchrun's variables, else
    from an srun step's, else run as a single process."""
    env = os.environ if environ is None else environ
    if dist.is_available() and dist.is_initialized():
        # Ray Train also exports RANK, WORLD_SIZE and MASTER_PORT: the group, not those, is the truth.
        return DistEnv(
            rank=dist.get_rank(),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=dist.get_world_size(),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            rendezvous_key="external",
            launcher="external",
        )
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_PORT" in env:
        return DistEnv(
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=int(env["WORLD_SIZE"]),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env["MASTER_PORT"]),
            rendezvous_key="torchrun",
            launcher="torchrun",
        )
    # SLURM_STEP_NUM_TASKS exists only inside an srun step; in the batch script itself SLURM_NTASKS
    # is set too, but no other task will ever join.
    if "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        key = "slurm-{}.{}.{}".format(
            env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "0"), env.get("SLURM_RESTART_COUNT", "0")
        )
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            local_rank=int(env.get("SLURM_LOCALID", "0")),
            world_size=int(env["SLURM_STEP_NUM_TASKS"]),
            master_addr=env.get("MASTER_ADDR") or expand_hostlist(nodelist)[0],
            master_port=int(env["MASTER_PORT"]) if "MASTER_PORT" in env else None,
            rendezvous_key=key,
            launcher="slurm",
            num_nodes=int(env.get("SLURM_STEP_NUM_NODES", "1")),
        )
    return DistEnv()


def rendezvous_dir(checkpoint_dir: str | None) -> Path:
    explicit = os.environ.get(RENDEZVOUS_DIR_ENV)
    if explicit:
        return Path(explicit)
    if checkpoint_dir:
        return Path(checkpoint_dir)
    return Path(tempfile.gettempdir())


def init_process_group(env: DistEnv, backend: str, timeout_s: int, checkpoint_dir: str | None) -> bool:
    """Join the job's process group; True if this call created it (and so its caller destroys it).

    A no-op for a single process and for a group the caller set up (``launcher == "external"``).
    """
    if not env.is_distributed or env.launcher == "external":
        return False
    timeout = timedelta(seconds=timeout_s)
    if env.launcher == "torchrun":
        # torchrun's agent already serves a store on MASTER_PORT; env:// joins it.
        dist.init_process_group(
            backend, init_method="env://", rank=env.rank, world_size=env.world_size, timeout=timeout
        )
        return True
    if env.master_port is not None:
        store = dist.TCPStore(
            env.master_addr,
            env.master_port,
            env.world_size,
            env.is_main,
            timeout=timeout,
            wait_for_workers=False,
        )
    else:
        if env.num_nodes > 1 and not (checkpoint_dir or os.environ.get(RENDEZVOUS_DIR_ENV)):
            raise ConfigError(
                f"a DDP run over {env.num_nodes} nodes needs checkpoint_dir (or {RENDEZVOUS_DIR_ENV}) on a "
                "filesystem all nodes share: rank 0 publishes its rendezvous port there"
            )
        store = _published_port_store(env, rendezvous_dir(checkpoint_dir), timeout_s)
    dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout)
    return True


def _published_port_store(env: DistEnv, directory: Path, timeout_s: int) -> dist.TCPStore:
    directory.mkdir(parents=True, exist_ok=True)
    published = directory / f"rendezvous-{env.rendezvous_key}"
    timeout = timedelta(seconds=timeout_s)
    if env.is_main:
        store = dist.TCPStore("0.0.0.0", 0, env.world_size, True, timeout=timeout, wait_for_workers=False)
        tmp = published.with_name(published.name + ".tmp")
        # Slurm's name for the node rank 0 actually runs on, unless the user chose an address.
        host = os.environ.get("MASTER_ADDR") or os.environ.get("SLURMD_NODENAME") or env.master_addr
        tmp.write_text(f"{host}:{store.port}\n")
        os.replace(tmp, published)  # atomic: a reader never sees half a line
        # Once everybody has connected the file is useless; a restart uses a new key anyway.
        store.add("joined", 1)
        _wait_for_count(store, "joined", env.world_size, timeout_s)
        published.unlink(missing_ok=True)
        return store
    deadline = time.monotonic() + timeout_s
    while not published.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"rank 0 did not publish its rendezvous port in {published} within {timeout_s}s"
            )
        time.sleep(0.05)
    host, _, port = published.read_text().strip().rpartition(":")
    store = dist.TCPStore(host, int(port), env.world_size, False, timeout=timeout)
    store.add("joined", 1)
    return store


def _wait_for_count(store: dist.TCPStore, key: str, count: int, timeout_s: int) -> None:
    deadline = time.monotonic() + timeout_s
    while store.add(key, 0) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {store.add(key, 0)} of {count} ranks joined within {timeout_s}s")
        time.sleep(0.05)


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_from_main(value: int, device: torch.device) -> int:
    """Rank 0's value on every rank: how the reporter's decision reaches all of them."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.broadcast(tensor, src=0)
    return int(tensor.item())
