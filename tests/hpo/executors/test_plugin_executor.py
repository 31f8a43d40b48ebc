"""A scheduler the service does not know: the FIFO queue of tests/plugins/fifo_executor, a package
of its own installed beside the service and found only through the ``hpo.executors`` entry points,
runs per-trial studies end to end through its own queue (a daemon that starts real processes in
the order they came): submission, states, a failed job, the cost the queue measured, and
``hpo cancel`` and ``hpo delete`` asking its queue as they ask Slurm's."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from hpo import executors
from tests.hpo.helpers import (
    held_score_study,
    load_trials,
    run_hpo,
    score_study,
    start_hpo,
    wait_for_trials,
    write_study,
)

REPO = Path(__file__).resolve().parents[3]
PLUGIN = REPO / "tests" / "plugins" / "fifo_executor"

# The trial with x above 1.5 fails in its job; the others report x * step.
FAILS_ABOVE = """
import time

def objective(params, trial):
    if params["x"] > 1.5:
        raise RuntimeError("this configuration fails on purpose")
    for step in (1, 2):
        time.sleep(0.2)
        trial.report(step, params["x"] * step)
    return params["x"] * 2
"""


@pytest.fixture
def fifo_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The plugin's queue with a spool of this test's own (inherited by the launcher and by the
    queue's daemon); its jobs' records read back through the plugin's own module."""
    monkeypatch.setenv("HPO_FIFO_SPOOL", str(tmp_path / "spool"))
    monkeypatch.setenv("HPO_FIFO_SLOTS", "2")
    from hpo_fifo import queue  # installed by `make setup`, as a user installs a plugin

    return queue


@pytest.mark.fast
def test_no_file_of_the_service_names_the_plugin() -> None:
    """Registered by its own package: no module of the service names it, and the service's
    pyproject.toml does not register it (its mypy settings check the plugin's types, nothing more)."""
    assert "fifo" in executors.names()
    naming = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "hpo").rglob("*.py"))
        if "hpo_fifo" in p.read_text() or '"fifo"' in p.read_text()
    ]
    assert not naming, naming
    assert not re.search(r'=\s*"hpo_fifo[.:]', (REPO / "pyproject.toml").read_text())
    assert (PLUGIN / "pyproject.toml").read_text().count('fifo = "hpo_fifo.executor:FifoExecutor"') == 1


@pytest.mark.fast
def test_the_architecture_pages_executor_row_is_what_the_plugin_did() -> None:
    """docs/architecture.md's "where a change goes" says what a new executor takes; the plugin did
    exactly that: the entry-point groups its pyproject.toml registers under are those the row
    names, it implements the protocol the row names (tests/hpo/executors/test_registry.py checks
    every installed executor against it), and no file of hpo/ changed (the test above)."""
    page = (REPO / "docs" / "architecture.md").read_text()
    section = page.split("## Where a change goes", 1)[1].split("\n## ", 1)[0]
    row = " ".join(next(item for item in section.split("\n- ") if item.startswith("A new executor")).split())
    assert "changes no file of `hpo/`" in row and "`hpo/executors/base.py`'s `Executor`" in row, row
    assert (
        f"`{PLUGIN.relative_to(REPO).as_posix()}/`" in row and f"`{Path(__file__).relative_to(REPO)}`" in row
    )
    plugin = (PLUGIN / "pyproject.toml").read_text()
    groups = {a or b for a, b in re.findall(r'^\[project\.entry-points\.(?:"([^"]+)"|(\w+))\]', plugin, re.M)}
    assert groups == {"hpo.executors", "submitit"}
    assert all(f"`{group}`" in row for group in groups), row


def test_a_per_trial_study_runs_on_a_scheduler_that_is_a_plugin(tmp_path: Path, fifo_queue: Any) -> None:
    (tmp_path / "my_objective.py").write_text(FAILS_ABOVE)
    document = score_study(
        tmp_path, "on-fifo", {"steps": 2, "function": "my_objective:objective"},
        n_trials=3, max_concurrent=2, max_retries=0, enqueue=[{"x": 1.0}, {"x": 1.9}, {"x": 0.6}],
    )  # fmt: skip
    document["resources"]["executor"] = "fifo"
    study_file = write_study(tmp_path / "study.yaml", document)

    launched = run_hpo("launch", str(study_file), timeout=300)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    trials = {t.params["x"]: t for t in load_trials(document)}
    assert {x: t.state.name for x, t in trials.items()} == {1.0: "COMPLETE", 1.9: "FAIL", 0.6: "COMPLETE"}
    assert "this configuration fails on purpose" in trials[1.9].user_attrs["fail_reason"]
    job_ids = {x: str(t.user_attrs["job_id"]) for x, t in trials.items()}
    assert all(t.user_attrs["executor"] == "fifo" for t in trials.values())
    # The queue ran each trial as its own job, and says how each ended.
    records = {job["id"]: job for job in fifo_queue.jobs()}
    assert sorted(records) == sorted(job_ids.values())
    assert [records[job_ids[x]]["state"] for x in (1.0, 1.9, 0.6)] == ["COMPLETED", "FAILED", "COMPLETED"]
    # The cost is the queue's measure (start to end of each job, times its CPUs), not an estimate.
    cost = executors.get("fifo").cost(job_ids.values())
    assert set(cost) == set(job_ids.values()) and all(u.measured and u.seconds > 0 for u in cost.values())
    status = run_hpo("status", str(study_file))
    assert status.returncode == 0 and "[measured]" in status.stdout, status.stdout


def test_cancel_and_delete_ask_the_plugins_queue(tmp_path: Path, fifo_queue: Any, local_cluster: str) -> None:
    """Its launcher killed, the study's two trials still run as jobs of the FIFO queue: `hpo delete`
    refuses, naming them; `hpo cancel` stops them in that queue; then the study can be deleted.
    Both commands ask every installed executor's queue, Slurm's too (the local cluster's squeue)."""
    document, study_file, hold = held_score_study(
        tmp_path, "cancel-on-fifo", steps=2, step_s=0.1, hold_after=1, n_trials=2, max_concurrent=2
    )
    document["resources"]["executor"] = "fifo"
    write_study(study_file, document)
    launcher = start_hpo("launch", str(study_file))
    try:
        wait_for_trials(
            document, None, launcher,  # type: ignore[arg-type]  (None: the study's default journal)
            lambda trials: len(trials) == 2 and all(t.intermediate_values for t in trials),
        )  # fmt: skip
    finally:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.communicate(timeout=60)
    job_ids = sorted(str(t.user_attrs["job_id"]) for t in load_trials(document))
    assert [fifo_queue.job(j)["state"] for j in job_ids] == ["RUNNING", "RUNNING"]

    refused = run_hpo("delete", str(study_file), "--yes")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"has 2 jobs in FIFO's queue ({', '.join(job_ids)})" in refused.stderr, refused.stderr

    cancelled = run_hpo("cancel", str(study_file))
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    deadline = time.monotonic() + 60
    while any(fifo_queue.job(j)["state"] == "RUNNING" for j in job_ids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [fifo_queue.job(j)["state"] for j in job_ids] == ["CANCELLED", "CANCELLED"]
    assert [t.state.name for t in load_trials(document)] == ["FAIL", "FAIL"]
    hold.unlink()

    deleted = run_hpo("delete", str(study_file), "--yes")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
