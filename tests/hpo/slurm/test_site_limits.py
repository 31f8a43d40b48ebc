"""The site's limits on a user's jobs: read from sacctmgr's recorded output (no cluster), then
met on the local cluster, whose QoS dev3 refuses a fourth queued job of a user as a site's
development QoS does (deploy/local-cluster enforces limits)."""

from __future__ import annotations

import fcntl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpo.slurm import jobs, limits
from tests.conftest import shared_lock
from tests.hpo.helpers import load_trials, run_hpo, score_study, sleeping_objective, write_study

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "sacctmgr"


def _table(name: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    text = "".join(line for line in (GOLDEN / name).read_text().splitlines(True) if not line.startswith("#"))
    return limits.parse_table(text, fields)


QOS_FIELDS = ("Name", "MaxSubmitPU", "MaxJobsPU", "GrpSubmit", "GrpJobs")
ASSOC_FIELDS = ("Account", "User", "Partition", "DefaultQOS", "MaxSubmit", "MaxJobs")


@pytest.mark.fast
def test_the_limits_of_the_qos_and_the_association_a_job_falls_under() -> None:
    site, assocs = _table("qos-limits-site.txt", QOS_FIELDS), _table("assoc-site.txt", ASSOC_FIELDS)
    dev = limits.limits_from(assocs, site, "qos_gpu-dev", "abc@a100")
    assert [(x.jobs, x.name, x.refused) for x in dev] == [
        (300, "association abc@a100/alice's MaxSubmitJobs", True),
        (10, "QoS qos_gpu-dev's MaxSubmitJobsPerUser", True),
        (2, "QoS qos_gpu-dev's MaxJobsPerUser", False),
    ]
    # No qos asked: the association's default; no account asked: the first association listed.
    default = limits.limits_from(assocs, site, None, "xyz@h100")
    assert [(x.jobs, x.name) for x in default] == [(1000, "QoS qos_gpu-t3's MaxSubmitJobsPerUser")]
    grp = limits.limits_from(assocs, site, "qos_gpu-t4", None)
    assert [(x.jobs, x.per_user) for x in grp] == [(300, True), (200, False), (100, False)]
    local = limits.limits_from([], _table("qos-limits-local.txt", QOS_FIELDS), "dev3", None)
    assert [(x.jobs, x.qos) for x in local] == [(3, "dev3")]
    assert limits.limits_from([], _table("qos-limits-local.txt", QOS_FIELDS), None, None) == []


@pytest.mark.fast
def test_sbatch_words_for_a_full_job_limit_are_told_from_a_policy_refusal() -> None:
    full = RuntimeError(
        "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates "
        "accounting/QOS policy (job submit limit, user's size and/or time limits)"
    )
    assert jobs.job_limit_full(full) and not jobs.controller_away(full)
    too_long = RuntimeError(
        "sbatch: error: QOSMaxWallDurationPerJobLimit\nsbatch: error: Batch job submission failed: Job violates "
        "accounting/QOS policy (job submit limit, user's size and/or time limits)"
    )
    assert not jobs.job_limit_full(too_long)


@pytest.fixture
def dev3_alone(local_cluster: str) -> Iterator[None]:
    """QoS dev3 counts every job of the user: one test at a time fills it."""
    with shared_lock("qos-dev3", fcntl.LOCK_EX):
        yield


def _sbatch(*options: str) -> str:
    """The real sbatch; its refusal raised with its own words, as submitit raises it."""
    proc = subprocess.run(
        ["sbatch", "--parsable", "--qos=dev3", "--job-name=hpo-limit-test", "-o", "/dev/null", *options,
         "--wrap", "sleep 1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip())
    return proc.stdout.strip()


@pytest.mark.slow
def test_a_full_job_limit_refused_by_the_real_sbatch_is_waited_out_and_a_policy_refusal_is_not(
    dev3_alone: None,
) -> None:
    """Three held jobs fill dev3 (MaxSubmitJobsPerUser 3): the real sbatch refuses a fourth, the
    submission waits with backoff until one of them leaves, then goes through; a job of an account
    that does not exist is refused at once, no wait."""
    held = [_sbatch("--hold") for _ in range(3)]
    lines: list[str] = []
    try:
        with pytest.raises(RuntimeError) as refused:
            _sbatch()
        assert jobs.job_limit_full(refused.value) and not jobs.controller_away(refused.value), refused.value
        threading.Timer(3.0, lambda: subprocess.run(["scancel", held[0]], timeout=60)).start()
        job = jobs.submit_when_controller_answers(_sbatch, lines.append, tolerance_s=120)
        held.append(job)
        assert len(lines) == 1 and lines[0].startswith("Slurm refuses more jobs of yours ("), lines
        assert "sbatch again in 5 s" in lines[0], lines
        with pytest.raises(RuntimeError, match="Invalid account"):
            jobs.submit_when_controller_answers(lambda: _sbatch("--account=nosuchaccount"), lines.append)
        assert len(lines) == 1, lines  # refused at once: nothing waited for
    finally:
        subprocess.run(["scancel", *held], timeout=60)


class _QueueWatch(threading.Thread):
    """The largest number of the user's jobs in QoS dev3 that squeue listed at once, and of the
    study's own among them."""

    def __init__(self, study_jobs: set[str]) -> None:
        super().__init__(daemon=True)
        self.study_jobs = study_jobs
        self.peak_all = self.peak_study = self.polls = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            out = subprocess.run(
                ["squeue", "-h", "-r", "-q", "dev3", "-o", "%j"], capture_output=True, text=True, timeout=60
            ).stdout.split()
            self.peak_all = max(self.peak_all, len(out))
            self.peak_study = max(self.peak_study, sum(1 for name in out if name in self.study_jobs))
            self.polls += 1
            time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["per-trial", "workers"])
def test_a_study_above_its_qos_job_limit_runs_inside_it(tmp_path: Path, mode: str, dev3_alone: None) -> None:
    """max_concurrent (or --workers) 5 in a QoS that allows 3 queued jobs per user, one of them
    already taken by another job of the user: lowered to 2 with one line, no sbatch refused, every
    trial run once."""
    (tmp_path / "my_objective.py").write_text(sleeping_objective(3, 1.0))
    name = f"limits-{mode}-{uuid.uuid4().hex[:6]}"
    document: dict[str, Any] = score_study(
        tmp_path, name, {"steps": 3, "function": "my_objective:objective"}, n_trials=6, max_concurrent=5
    )
    document["resources"] = {"executor": "slurm", "time": "5m", "slurm": {"qos": "dev3"}}
    study_file = write_study(tmp_path / "study.yaml", document)
    other = subprocess.run(
        ["sbatch", "--parsable", "--qos=dev3", "--job-name=not-the-study", "-o", "/dev/null", "--wrap", "sleep 600"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    watch = _QueueWatch({f"hpo-{name}", f"hpo-{name}:worker"})
    watch.start()
    try:
        proc = run_hpo(
            "launch", str(study_file), *(["--workers", "5"] if mode == "workers" else []), timeout=600
        )
    finally:
        watch.stop.set()
        watch.join()
        subprocess.run(["scancel", other], timeout=60)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    what = "--workers 5" if mode == "workers" else "study.max_concurrent 5"
    [line] = [line for line in output.splitlines() if "lowered to" in line]
    assert line.endswith(
        f"{what} lowered to 2: QoS dev3's MaxSubmitJobsPerUser is 3 (1 other jobs already count against it)"
    ), line
    assert "Slurm refuses more jobs" not in output, output  # no sbatch was refused
    trials = load_trials(document)
    assert len(trials) == 6 and all(t.state.name == "COMPLETE" for t in trials), [t.state for t in trials]
    assert watch.polls > 10 and watch.peak_study <= 2 and watch.peak_all <= 3, vars(watch)
    if mode == "per-trial":  # one job per trial, none doubled
        assert len({t.user_attrs["job_id"] for t in trials}) == 6


@pytest.mark.slow
def test_a_worker_jobs_time_limit_is_kept_within_the_qos_maxwall(tmp_path: Path, local_cluster: str) -> None:
    """A --workers job asks for its share of the trials' time (3 trials of 2 min: 6 min); QoS
    short5 allows 5 min, which Slurm enforces here: lowered with one line, and the study runs."""
    (tmp_path / "my_objective.py").write_text(sleeping_objective(2, 0.5))
    name = f"limits-wall-{uuid.uuid4().hex[:6]}"
    document: dict[str, Any] = score_study(
        tmp_path, name, {"steps": 2, "function": "my_objective:objective"}, n_trials=3, max_concurrent=1
    )
    document["resources"] = {"executor": "slurm", "time": "2m", "slurm": {"qos": "short5"}}
    proc = run_hpo(
        "launch", str(write_study(tmp_path / "study.yaml", document)), "--workers", "1", timeout=600
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "workers: time limit 6 min lowered to 5 min: QoS short5's MaxWall is 00:05:00" in output, output
    assert "(5 min each)" in output, output
    trials = load_trials(document)
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" for t in trials), [t.state for t in trials]
