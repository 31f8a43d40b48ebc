"""What the service reads from Slurm's commands, parsed from their recorded output with no cluster
to ask: sacct's elapsed time and allocation per job (every run of a requeued job summed, GPUs
typed or not), squeue's job ids (array tasks), sacctmgr's QoS time limits and sinfo's nodes (the
pre-flight checks). Files under tests/golden/ say in their first lines where they come from."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.config.values import parse_duration_min
from hpo.slurm import accounting, jobs, limits, preflight

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def _recorded(name: str, command: str = "sacct") -> str:
    return "".join(
        line for line in (GOLDEN / command / name).read_text().splitlines(True) if not line.startswith("#")
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


def test_squeue_ids_keep_array_tasks_apart_and_a_pending_array_whole() -> None:
    assert jobs.parse_job_ids(_recorded("user-jobs-r.txt", "squeue")) == [
        "1563",
        "1562_0",
        "1562_1",
        "1562_2",
    ]
    # Without -r (the study's jobs that `hpo cancel` hands to scancel): the array as one id.
    assert jobs.parse_job_ids(_recorded("study-jobs.txt", "squeue")) == ["1563", "1562_[0-2]"]
    assert jobs.parse_job_ids("\n") == []


def test_sacctmgr_qos_limits_read_with_and_without_days() -> None:
    local = limits.parse_qos_walls(_recorded("qos-local.txt", "sacctmgr"))
    assert local == {"normal": "", "short5": "00:05:00"}
    assert parse_duration_min("MaxWall", local["short5"]) == 5
    walls = limits.parse_qos_walls(_recorded("qos-days.txt", "sacctmgr"))
    assert parse_duration_min("MaxWall", walls["qos_gpu-t4"]) == 4 * 24 * 60
    assert parse_duration_min("MaxWall", walls["qos_gpu-t3"]) == 20 * 60
    assert walls["normal"] == ""  # no limit


def test_sinfo_nodes_of_the_default_or_the_named_partition_with_their_gpus() -> None:
    local = _recorded("nodes-local.txt", "sinfo")
    assert preflight.parse_node_capacity(local, None) == {"n1": (2, 0), "n2": (2, 0)}
    assert preflight.parse_node_capacity(local, "isolated")["n3"] == (2, 0)
    gpu = _recorded("nodes-gpu.txt", "sinfo")
    assert preflight.parse_node_capacity(gpu, None) == {"gpu001": (40, 4), "gpu002": (40, 4)}
    assert preflight.parse_node_capacity(gpu, "gpu_p5")["gpu100"] == (64, 8)


def test_a_job_submitted_after_the_last_squeue_is_not_taken_as_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sacct away (every state UNKNOWN) and squeue read just before the job's submission: that
    snapshot cannot say the job is gone, so squeue is read again, and the job runs on."""
    from types import SimpleNamespace

    snapshots = iter([{"41"}, {"41", "42"}])  # squeue before job 42's submission, then after it
    monkeypatch.setattr(jobs, "user_queue", lambda: next(snapshots))
    watcher = SimpleNamespace(update=lambda: None, get_state=lambda job_id, mode: None)  # sacct: nothing

    def job(job_id: str) -> SimpleNamespace:
        return SimpleNamespace(
            job_id=job_id, watcher=watcher, paths=SimpleNamespace(result_pickle=tmp_path / job_id)
        )

    states = jobs.SlurmStates(unknown_grace_s=0.0)
    assert not states.ended(job("41"))  # reads the first snapshot
    assert not states.ended(job("42"))  # not in it: a second read lists it
    assert not states.ended(job("42"))


def test_an_error_left_by_a_run_slurm_requeued_is_not_the_jobs_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submitit's `scontrol requeue`, killed by the requeue's own SIGTERM before it returned, leaves
    its error as the job's result while Slurm has the job pending again (seen in a fresh-clone run:
    two packed trials failed "job N UNKNOWN without telling a result", then their job completed
    them). While squeue lists the job, Slurm's state decides; a success, or an error of a job squeue
    no longer lists, is the end."""
    from types import SimpleNamespace

    from submitit.core.utils import cloudpickle_dump

    queue: set[str] = {"51"}
    monkeypatch.setattr(jobs, "user_queue", lambda: set(queue))
    sacct = {"51": "PENDING"}
    watcher = SimpleNamespace(update=lambda: None, get_state=lambda job_id, mode: sacct.get(job_id))
    result = tmp_path / "51_result.pkl"
    job = SimpleNamespace(job_id="51", watcher=watcher, paths=SimpleNamespace(result_pickle=result))
    cloudpickle_dump(("error", "CalledProcessError: scontrol requeue died with SIGTERM"), result)

    states = jobs.SlurmStates(refresh_s=0.0)
    assert not states.ended(job)  # pending again: it runs again
    sacct["51"] = "RUNNING"
    assert not states.ended(job)
    cloudpickle_dump(("success", None), result)
    assert states.ended(job)  # the requeued run's own result
    # An error of a job that is gone from the queue is its end, whatever sacct says yet.
    cloudpickle_dump(("error", "RuntimeError: boom"), result)
    queue.clear()
    assert states.ended(job)


def test_a_node_fail_job_that_squeue_lists_again_is_not_taken_as_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submitit's watcher keeps NODE_FAIL as final (it stops asking sacct), so after Slurm's requeue
    the cached state still says NODE_FAIL while the requeued run trains (seen in CI: the launcher
    failed the trial after its grace and its retry resumed from that run's last epoch). Past the
    grace, squeue decides: listed (or unable to tell), the job runs on; gone, it ended."""
    from types import SimpleNamespace

    queue: set[str] | None = {"61"}
    monkeypatch.setattr(jobs, "user_queue", lambda: None if queue is None else set(queue))
    watcher = SimpleNamespace(update=lambda: None, get_state=lambda job_id, mode: "NODE_FAIL")
    job = SimpleNamespace(job_id="61", watcher=watcher, paths=SimpleNamespace(result_pickle=tmp_path / "61"))

    states = jobs.SlurmStates(refresh_s=0.0, requeue_grace_s=0.0)
    assert not states.ended(job)  # first seen: within its grace
    assert not states.ended(job)  # past it, but squeue lists the requeued job
    queue = None
    assert not states.ended(job)  # squeue cannot tell: not ended on a guess
    queue = set()
    assert states.ended(job)
