"""DDP on gloo across real processes: rank detection, rendezvous, metric reduction, stopping."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from trainer.distributed import DistEnv, detect, expand_hostlist
from trainer.reporting import PER_RANK_FIELDS, Decision, EpochMetrics

SPAWN = mp.get_context("spawn")


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        (
            "jean-zay-iam[01-03,07],login1",
            ["jean-zay-iam01", "jean-zay-iam02", "jean-zay-iam03", "jean-zay-iam07", "login1"],
        ),
        ("gpu[008-010]", ["gpu008", "gpu009", "gpu010"]),
        ("a1,b[3,5]", ["a1", "b3", "b5"]),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


def test_detect_reads_srun_torchrun_and_batch_environments() -> None:
    srun = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "8",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "gpu[12-13]",
        "SLURM_RESTART_COUNT": "2",
        "SLURM_STEP_NUM_NODES": "2",
    }
    assert detect(srun) == DistEnv(5, 1, 8, "gpu12", None, "slurm-4242.0.2", "slurm", num_nodes=2)
    torchrun = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29400"}
    assert detect(torchrun) == DistEnv(1, 1, 2, "h", 29400, "torchrun", "torchrun")
    # The batch script of a 4-task job runs once: it must not wait for 3 ranks that never come.
    batch_script = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "4242"}
    assert detect(batch_script) == DistEnv()


class StopAfter:
    """Rank 0's reporter: records what it is shown, stops after ``epochs`` epochs."""

    def __init__(self, epochs: int, fail: bool = False) -> None:
        self.epochs = epochs
        self.fail = fail
        self.seen: list[EpochMetrics] = []

    def report(self, metrics: EpochMetrics) -> Decision:
        self.seen.append(metrics)
        if self.fail:
            raise RuntimeError("reporter exploded")
        return Decision.STOP if metrics.epoch >= self.epochs else Decision.CONTINUE


def _srun_like_rank(
    rank: int, world: int, job_id: str, config: dict[str, Any], stop_after: int, fail: bool, results: Any
) -> None:
    """One task of a simulated srun step: the environment srun gives each task, then train()."""
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR", "LOCAL_RANK"):
        os.environ.pop(name, None)
    os.environ.update(
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank),
        SLURM_NTASKS=str(world),
        SLURM_STEP_NUM_TASKS=str(world),
        SLURM_JOB_ID=job_id,
        SLURM_STEP_ID="0",
        SLURM_STEP_NODELIST="localhost",
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    from trainer import TrainConfig, train

    reporter = StopAfter(stop_after, fail) if rank == 0 else None
    try:
        result = train(TrainConfig.from_mapping(config), reporter)
        results.put(
            (job_id, rank, "ok", result.to_dict(), [m.to_dict() for m in reporter.seen] if reporter else [])
        )
    except Exception as err:
        results.put((job_id, rank, type(err).__name__, str(err), []))
    # The result is out (the queue flushed): exit without the interpreter's teardown, where gloo's
    # worker threads, still holding tensors, occasionally abort the process (pytorch#179291).
    results.close()
    results.join_thread()
    os._exit(0)


def _run_ranks(
    jobs: dict[str, int], config: dict[str, Any], stop_after: int, fail: bool = False
) -> dict[tuple[str, int], tuple[Any, ...]]:
    results = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_srun_like_rank, args=(rank, world, job, config, stop_after, fail, results))
        for job, world in jobs.items()
        for rank in range(world)
    ]
    collected = {(job, rank): tuple(rest) for (job, rank, *rest) in _gather(procs, results)}
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return collected


def _gather(procs: list[Any], results: Any) -> list[tuple[Any, ...]]:
    """Start the ranks, take one result from each, and make sure none is left running."""
    for p in procs:
        p.start()
    gathered: list[tuple[Any, ...]] = []
    try:
        for _ in procs:
            gathered.append(tuple(results.get(timeout=300)))
    except queue.Empty:
        pytest.fail(f"ranks hung: only {len(gathered)} of {len(procs)} finished")
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return gathered


def _metrics(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reduced metrics of each epoch, without the timings that each rank measures for itself."""
    return [{k: v for k, v in m.items() if k not in PER_RANK_FIELDS} for m in history]


def _ddp_config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    os.environ["HPO_RENDEZVOUS_DIR"] = str(tmp_path)  # inherited by the spawned ranks
    config = {
        "model": "resnet8",
        "width": 8,
        "batch_size": 32,
        "lr": 0.2,
        "epochs": 3,
        "max_steps_per_epoch": 15,
        "val_fraction": 0.05,
        "num_workers": 0,
        "log_every": 0,
    }
    config.update(overrides)
    return config


def test_ddp_reduces_metrics_and_a_stop_ends_every_rank(tmp_path: Path, fashion_mnist_root: str) -> None:
    results = _run_ranks({"7001": 2}, _ddp_config(tmp_path), stop_after=1)
    (s0, r0, seen), (s1, r1, _) = results[("7001", 0)], results[("7001", 1)]
    assert s0 == s1 == "ok", (r0, r1)
    for result in (r0, r1):
        assert result["world_size"] == 2
        assert result["epochs_completed"] == 1 and result["stopped_early"] is True
    # Each rank evaluated half of the 500 validation images; equal metrics on both ranks, and equal
    # to what the reporter saw, prove that the sums were reduced across ranks.
    assert _metrics(r0["history"]) == _metrics(r1["history"]) == _metrics(seen)
    assert r0["last_val_accuracy"] > 0.1
    assert not list(tmp_path.glob("rendezvous-*")), "the published port file must be removed"


def test_a_failing_reporter_stops_the_other_ranks_instead_of_hanging(
    tmp_path: Path, fashion_mnist_root: str
) -> None:
    results = _run_ranks({"7002": 2}, _ddp_config(tmp_path), stop_after=3, fail=True)
    assert results[("7002", 0)][:2] == ("RuntimeError", "reporter exploded")
    assert results[("7002", 1)][0] == "StopRequested"


def test_two_trials_on_one_node_do_not_collide(tmp_path: Path, fashion_mnist_root: str) -> None:
    """Two 2-rank trials start at once on one host with no MASTER_PORT: each rank 0 gets its own port."""
    config = _ddp_config(tmp_path, epochs=1, max_steps_per_epoch=10)
    results = _run_ranks({"7003": 2, "7004": 2}, config, stop_after=1)
    assert {status for status, _, _ in results.values()} == {"ok"}
    for job in ("7003", "7004"):
        assert _metrics(results[(job, 0)][1]["history"]) == _metrics(results[(job, 1)][1]["history"])


def test_a_rank_with_no_validation_share_does_not_hang(tmp_path: Path, fashion_mnist_root: str) -> None:
    """One validation image for two ranks: rank 1 evaluates nothing and must not block rank 0."""
    config = _ddp_config(tmp_path, epochs=1, max_steps_per_epoch=10, val_fraction=0.0001)
    results = _run_ranks({"7005": 2}, config, stop_after=1)
    assert {status for status, _, _ in results.values()} == {"ok"}
    assert results[("7005", 0)][1]["last_val_accuracy"] in (0.0, 1.0)


def test_torchrun_launches_ddp_through_the_cli(tmp_path: Path, fashion_mnist_root: str) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "trainer", "--model", "resnet8", "--width", "8", "--epochs", "1", "--batch-size", "32",
            "--max-steps-per-epoch", "10", "--val-fraction", "0.05", "--num-workers", "0",
            "--result-json", str(tmp_path / "result.json"),
        ],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("result: ") == 1, "only rank 0 prints the result"
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == 2 and result["steps"] == 10


def test_detect_takes_a_process_group_that_is_already_up(tmp_path: Path) -> None:
    """Ray Train sets the group up before the worker function runs, and exports torchrun's
    variables besides: the group decides, and the trainer neither joins nor creates another."""
    import torch.distributed as dist

    from trainer.distributed import init_process_group

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        exported = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_PORT": "1"}
        env = detect(exported)
        assert env == DistEnv(0, 1, 1, "127.0.0.1", None, "external", "external")
        assert init_process_group(env, "gloo", 10, None) is False
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()
    assert detect(exported).launcher == "torchrun"


class EveryRankRecorder:
    """A reporter given to every rank, as the Ray backend's DDP trials give theirs."""

    every_rank = True

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def report(self, metrics: EpochMetrics) -> Decision:
        self.epochs.append(metrics.epoch)
        return Decision.CONTINUE


def _rank_in_a_ready_group(rank: int, world: int, store: str, config: dict[str, Any], results: Any) -> None:
    """One worker as Ray Train starts it: the gloo group is up, torchrun's variables are set."""
    for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"):
        os.environ.pop(name, None)
    # A MASTER_PORT nobody serves: joining through env:// would fail (and initializing twice raises).
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
        MASTER_PORT="1", OMP_NUM_THREADS="1",
    )  # fmt: skip
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    from trainer import TrainConfig, train

    reporter = EveryRankRecorder()
    try:
        env = detect()
        result = train(TrainConfig.from_mapping(config), reporter)
        # The group is still up after train() and still carries collectives: it is its owner's.
        total = torch.tensor([rank + 1])
        dist.all_reduce(total)
        results.put((rank, "ok", (env.launcher, env.rank, env.world_size, result.world_size),
                     int(total.item()), reporter.epochs, _metrics(result.to_dict()["history"])))  # fmt: skip
    except Exception as err:
        results.put((rank, type(err).__name__, str(err), 0, [], []))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_run_inside_a_ready_process_group_uses_it_and_leaves_it_up(
    tmp_path: Path, fashion_mnist_root: str
) -> None:
    config = _ddp_config(tmp_path, epochs=2, max_steps_per_epoch=5)
    results = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_rank_in_a_ready_group, args=(rank, 2, str(tmp_path / "store"), config, results))
        for rank in range(2)
    ]
    collected = {rank: tuple(rest) for (rank, *rest) in _gather(procs, results)}
    for rank in (0, 1):
        status, seen_env, total, epochs, _ = collected[rank]
        assert status == "ok", collected[rank]
        assert seen_env == ("external", rank, 2, 2)
        assert total == 3
        # Called on rank 1 too (it asked to be), once per epoch on each rank.
        assert epochs == [1, 2]
    assert collected[0][4] == collected[1][4], "metrics reduced across the two ranks"
