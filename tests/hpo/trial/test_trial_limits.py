"""A trial that cannot go on, on the local Slurm cluster: its checkpoint's disk is full, or its
job is requeued again and again before it finishes an epoch. Each ends the trial with a reason a
user can act on, and prints a ``FAULT`` line.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hpo.helpers import (
    GOOD,
    fault_line,
    final_sacct_states,
    launch_in_background,
    load_trials,
    stand_in_study,
    study_document,
    wait_for_trials,
    write_study,
)

pytestmark = pytest.mark.slow


ONE_TRIAL = {
    "n_trials": 1,
    "max_concurrent": 1,
    "enqueue": [GOOD],
    "pruner": {"name": "none"},
    "max_retries": 1,
}


def one_trial(tmp_path: Path, **trainer: Any) -> dict[str, Any]:
    document = study_document(
        f"limits-{uuid.uuid4().hex[:6]}", tmp_path / "work", study=ONE_TRIAL, resources={"executor": "slurm"}
    )
    document["trainer"].update(trainer)
    return document


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB filesystem (tmpfs) with 16 KiB left: a trial's checkpoint does not fit."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True, timeout=30)
    try:
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={mount / 'filler'}", "bs=4k", f"count={(2048 - 16) // 4}"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], timeout=30)


def test_a_full_disk_ends_the_trial_with_the_path_and_no_partial_file(
    tmp_path: Path, fresh_database: str, fashion_mnist_root: str, full_disk: Path
) -> None:
    document = one_trial(tmp_path, epochs=1, max_steps_per_epoch=20)
    # The trials' folders (their checkpoints) on the full disk; the rest of the workdir elsewhere.
    workdir = Path(document["study"]["workdir"])
    workdir.mkdir(parents=True)
    (workdir / "trials").symlink_to(full_disk)
    launcher = launch_in_background(write_study(tmp_path / "study.yaml", document), fresh_database)
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == 1 and "no trial of study" in output, output

    trials = load_trials(document, fresh_database)
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"], [(t.number, t.user_attrs) for t in trials]
    for trial in trials:
        reason = trial.user_attrs["fail_reason"]
        [folder] = (workdir / "trials").glob(f"*/{trial.number}")  # trials/<study>-<storage>/<number>
        path = folder / "checkpoint" / "checkpoint.pt"
        assert f"No space left on device: {path}" in reason, reason
    assert trials[1].user_attrs["retry_of"] == 0  # retried as other failures are
    assert not list(full_disk.rglob("*.tmp.*")), list(full_disk.rglob("*"))
    fault_line(
        "the disk of a trial's checkpoint full",
        "the trial failed with `No space left on device: <checkpoint path>`, its partial file removed; "
        "retried once like other failures",
        0,
        None,
    )


def test_a_job_requeued_twice_without_finishing_an_epoch_fails_its_trial(
    tmp_path: Path, fresh_database: str
) -> None:
    """USR2 is Slurm's signal before a time limit (and a preemption's): a time limit shorter than
    an epoch sends it before every epoch ends, and submitit would requeue forever. The trial is the
    torch-free stand-in (helpers.py), whose one epoch never ends here."""
    document = stand_in_study(
        tmp_path,
        f"limits-{uuid.uuid4().hex[:6]}",
        epochs=1,
        epoch_s=3600.0,
        study=ONE_TRIAL,
        resources={"executor": "slurm"},
    )
    launcher = launch_in_background(write_study(tmp_path / "study.yaml", document), fresh_database)
    started = time.monotonic()
    for run in range(2):
        [trial] = wait_for_trials(
            document,
            fresh_database,
            launcher,
            lambda trials, run=run: (
                bool(trials)
                and "started_at" in trials[0].user_attrs
                and trials[0].user_attrs.get("restarts", 0) == run
            ),
            timeout=300,
        )
        time.sleep(2)  # the trial is in its first epoch
        subprocess.run(
            ["scancel", "--full", "--signal=USR2", str(trial.user_attrs["job_id"])], check=True, timeout=30
        )
    output = launcher.communicate(timeout=300)[0]
    stopped = time.monotonic() - started
    assert launcher.returncode == 1, output
    [trial] = load_trials(document, fresh_database)  # not retried: the same time limit would fail again
    reason = trial.user_attrs["fail_reason"]
    assert trial.state.name == "FAIL" and reason.startswith(
        "no epoch finished between requeues: requeued 2 times after epoch 0; the job's time limit (10 min)"
    ), reason
    assert trial.user_attrs["restarts"] == 1
    # The job ends by itself (it is not requeued a third time); it may still be exiting now.
    deadline = time.monotonic() + 60
    while queue := subprocess.run(
        ["squeue", "-h", "-j", str(trial.user_attrs["job_id"])], capture_output=True, text=True
    ).stdout.strip():
        assert time.monotonic() < deadline, queue
        time.sleep(1)
    # slurmdbd records the end a moment after the job leaves squeue (seen: RUNNING in sacct then).
    job_id = str(trial.user_attrs["job_id"])
    final = final_sacct_states([job_id])[job_id]
    assert final == "FAILED", final
    fault_line(
        "a trial job requeued twice before its first epoch ended (USR2, as a time limit shorter than an epoch sends)",
        "the trial failed: `no epoch finished between requeues ... raise resources.time`; not retried, not requeued again",
        0,
        stopped,
    )
