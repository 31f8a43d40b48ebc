"""Several trials at once on one GPU (``resources.trials_per_gpu``): each its own process in one
job, pruned, requeued and accounted separately. Everything but the GPU itself is tested here, on
the local Slurm cluster (CPU nodes of 2 CPUs: packs of 2 one-CPU trials) and with PostgreSQL."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo.budget.cost import packed_shares, study_cost
from hpo.budget.usage import trial_estimate, trial_gpus
from hpo.config import load_study
from hpo.slurm import accounting, jobs
from tests.hpo.helpers import (
    fault_line,
    final_sacct_states,
    launch_in_background,
    load_trials,
    max_overlap,
    run_hpo,
    score_study,
    wait_for_trials,
    write_study,
)

STEPS = 8

# A trial of the user's own code that checkpoints its step, so that a requeued job resumes it.
# While a file `hold` lies beside it, a trial waits after its step 2: a test signals jobs whose
# trials are all mid-run, however the jobs' starts were spread (a job whose trials finished first
# could not be signalled).
CHECKPOINTED_OBJECTIVE = f"""
import time
from pathlib import Path

HOLD = Path(__file__).parent / "hold"

def objective(params, trial):
    step_file = trial.checkpoint_dir() / "step"
    start = int(step_file.read_text()) if step_file.exists() else 0
    if start:
        print(f"trial {{trial.number}}: resumed from step {{start}}", flush=True)
    for step in range(start + 1, {STEPS} + 1):
        time.sleep(1.5)
        step_file.write_text(str(step))
        if trial.report(step, params["x"] * step):
            return None
        while step == 2 and HOLD.exists():
            time.sleep(0.2)
    return params["x"] * {STEPS}
"""


def _packed_study(tmp_path: Path, executor: str, k: int = 2, **study: Any) -> dict[str, Any]:
    (tmp_path / "my_objective.py").write_text(CHECKPOINTED_OBJECTIVE)
    document = score_study(
        tmp_path,
        f"packed-{uuid.uuid4().hex[:6]}",
        {"function": "my_objective:objective", "steps": STEPS},
        # x=0.5 reports 0.5 at step 1, under the threshold: pruned while its job mate goes on.
        pruner={"name": "threshold", "options": {"lower": 0.8}},
        **study,
    )
    document["resources"] = {"executor": executor, "time": "10m", "trials_per_gpu": k}
    return document


def _refusal(tmp_path: Path, resources: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    document = score_study(tmp_path, "refused", {"function": "my_objective:objective"}, n_trials=2)
    document["resources"] = {"executor": "local", **resources}
    (tmp_path / "my_objective.py").write_text("def objective(params, trial):\n    return 1.0\n")
    return run_hpo("launch", str(write_study(tmp_path / "study.yaml", document)), *extra)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("resources", "extra", "words"),
    [
        ({"trials_per_gpu": 2, "tasks_per_node": 2}, (), "packs one-process trials; these are DDP runs of 2"),
        ({"trials_per_gpu": 2, "gpus_per_node": 2}, (), "packs trials of one GPU; gpus_per_node is 2"),
        ({"trials_per_gpu": 0}, (), "trials_per_gpu"),
        ({"trials_per_gpu": 512}, (), "512 trials of 1 CPUs each need 512 CPUs; this machine has"),
        ({"trials_per_gpu": 2, "tasks_per_node": 2}, ("--workers", "2"), "packs one-process trials"),
    ],
)
def test_a_pack_that_cannot_work_is_refused_in_one_line(
    tmp_path: Path, resources: dict[str, Any], extra: tuple[str, ...], words: str
) -> None:
    proc = _refusal(tmp_path, resources, *extra)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert words in proc.stderr and "resources.trials_per_gpu" in proc.stderr, proc.stderr
    assert not (tmp_path / "work" / "jobs").exists()  # nothing submitted


@pytest.mark.fast
def test_a_packed_job_asks_slurm_for_each_trials_cpus_and_memory_and_one_gpu(tmp_path: Path) -> None:
    document = _packed_study(tmp_path, "slurm", k=4)
    document["resources"].update(cpus_per_task=2, gpus_per_node=1, mem_gb=8)
    spec = load_study(write_study(tmp_path / "study.yaml", document))
    params = jobs.slurm_parameters(spec, "hpo-x", direct=True)
    assert (params["cpus_per_task"], params["gpus_per_node"], params["mem"]) == (8, 1, "32768MB")
    # What one trial is charged where sacct cannot split a job (a --workers job): a quarter of the
    # GPU, or its share of a smaller last pack.
    assert trial_gpus(spec) == 0.25
    alone = optuna.trial.create_trial(value=1.0, user_attrs={"elapsed_s": 3600.0})
    assert trial_estimate(spec, alone).gpu_hours == pytest.approx(0.25)
    assert trial_estimate(spec, _frozen(0, "9", 3600.0)).gpu_hours == pytest.approx(0.5)


@pytest.mark.fast
def test_packed_trials_share_their_jobs_sacct_cost_by_their_own_time() -> None:
    trials = [_frozen(0, "7", 10.0), _frozen(1, "7", 30.0), _frozen(2, "8", 5.0, pack=1)]
    assert packed_shares(trials) == {0: 0.25, 1: 0.75}  # trial 2 had its job to itself
    assert packed_shares([_frozen(0, "9", 0.0), _frozen(1, "9", 0.0)]) == {0: 0.5, 1: 0.5}
    # A mate still running counts its time so far: 10 s told, about 30 s running.
    running = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING,
        user_attrs={"job_id": "6", "pack_size": 2, "executor": "slurm",
                    "started_at": (datetime.now(timezone.utc) - timedelta(seconds=30)).isoformat()},
    )  # fmt: skip
    running.number = 1
    shares = packed_shares([_frozen(0, "6", 10.0), running])
    assert shares[0] == pytest.approx(0.25, abs=0.02) and sum(shares.values()) == pytest.approx(1.0)


def _frozen(number: int, job: str, elapsed: float, pack: int = 2) -> optuna.trial.FrozenTrial:
    frozen = optuna.trial.create_trial(
        value=1.0, user_attrs={"job_id": job, "elapsed_s": elapsed, "pack_size": pack, "executor": "slurm"}
    )
    frozen.number = number
    return frozen


@pytest.mark.slow
def test_packed_trials_on_slurm_prune_requeue_resume_and_share_the_cost_of_their_job(
    tmp_path: Path, fresh_database: str
) -> None:
    """Two jobs of two trials: in the first, one trial is pruned at step 1 while the other goes
    on; that job is then signalled as before a time limit and requeued, and each of its trials
    resumes from its own checkpoint; each job's sacct cost is split between its trials."""
    document = _packed_study(
        tmp_path,
        "slurm",
        n_trials=4,
        max_concurrent=4,
        enqueue=[{"x": 0.5}, {"x": 1.5}, {"x": 1.8}, {"x": 2.0}],
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    hold = tmp_path / "hold"
    hold.touch()  # the trials wait after their step 2 until both jobs are signalled
    launcher = launch_in_background(study_file, fresh_database)
    trials = wait_for_trials(
        document,
        fresh_database,
        launcher,
        lambda trials: (
            len(trials) == 4
            and trials[0].state.name == "PRUNED"
            and all(len(t.intermediate_values) == 2 for t in trials[1:])
        ),
        timeout=300,
    )
    job_id, other_job = trials[1].user_attrs["job_id"], trials[2].user_attrs["job_id"]
    assert trials[0].user_attrs["job_id"] == job_id != other_job == trials[3].user_attrs["job_id"]
    # Slurm's signal before the time limit (or a preemption's), to the batch shell as --signal=B:USR2@90.
    for job in (job_id, other_job):
        subprocess.run(["scancel", "--full", "--signal=USR2", job], check=True, timeout=30)
    hold.unlink()
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == 0, output

    pruned, resumed, *others = load_trials(document, fresh_database)
    assert pruned.state.name == "PRUNED" and sorted(pruned.intermediate_values) == [1], output
    for trial in [resumed, *others]:
        assert trial.state.name == "COMPLETE", output
        assert sorted(trial.intermediate_values) == list(range(1, STEPS + 1)), trial.intermediate_values
    assert [t.user_attrs["pack_slot"] for t in (pruned, resumed, *others)] == [0, 1, 0, 1]
    for trial in (resumed, *others):  # each from its own checkpoint, in its own log
        job, slot = trial.user_attrs["job_id"], trial.user_attrs["pack_slot"]
        assert trial.user_attrs.get("restarts") == 1, trial.user_attrs
        log = (tmp_path / "work" / "jobs" / job / f"{job}_slot{slot}_log.out").read_text()
        steps = re.findall(rf"trial {trial.number}: resumed from step (\d+)", log)
        assert len(steps) == 1 and int(steps[0]) == 2, log
    logs = tmp_path / "work" / "jobs" / job_id
    # The pruned trial was not run again by the requeued job: it was finished.
    assert "already finished in the study; nothing to run" in (logs / f"{job_id}_slot0_log.out").read_text()
    assert set(final_sacct_states([job_id, others[0].user_attrs["job_id"]]).values()) == {"COMPLETED"}

    # Each job's sacct cost, shared by its trials in proportion to their own time.
    spec = load_study(study_file)
    trials = load_trials(document, fresh_database)
    cost = study_cost(spec, trials)
    usage = accounting.sacct_usage({t.user_attrs["job_id"] for t in trials})
    for job in {t.user_attrs["job_id"] for t in trials}:
        mine = [t for t in trials if t.user_attrs["job_id"] == job]
        assert len(mine) == 2
        total = sum(cost.of(cost.per_trial[t.number]) for t in mine)
        assert total == pytest.approx(usage[job].cpu_hours, rel=1e-9), (job, total, usage[job])
    assert cost.of(cost.per_trial[0]) < cost.of(cost.per_trial[1])  # pruned after one step

    status = run_hpo("status", str(study_file), "--storage", fresh_database)
    assert status.returncode == 0, status.stderr
    rows = {line.split()[0]: line for line in status.stdout.splitlines() if line[:1].isdigit()}
    assert "shared its job with 1" in rows["0"] and "shared its job with 0" in rows["1"], status.stdout
    assert "requeued 1x" in rows["1"], status.stdout
    log = run_hpo("logs", str(study_file), "1", "--storage", fresh_database)
    assert "trial 1: resumed from step" in log.stdout, log.stdout[-2000:]
    report = run_hpo(
        "report", str(study_file), "--storage", fresh_database, "--out", str(tmp_path / "report")
    )
    assert report.returncode == 0, report.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["packed_jobs"] == {job_id: [0, 1], other_job: [2, 3]}, summary["packed_jobs"]
    assert "shared its job with 1" in (tmp_path / "report" / "index.html").read_text()
    fault_line(
        "USR2 to two packed jobs of 2 trials each (`trials_per_gpu: 2`), one trial already pruned",
        "each job passed the signal on, its running trials checkpointed and the job requeued; each "
        "resumed from its own checkpoint, COMPLETE; the pruned one was skipped; sacct's cost of each "
        "job shared by its trials",
        0,
        None,
    )


@pytest.mark.slow
def test_a_pack_bigger_than_every_node_of_the_partition_is_refused_before_submission(
    tmp_path: Path, local_cluster: str
) -> None:
    document = _packed_study(tmp_path, "slurm", k=3, n_trials=3)  # the nodes have 2 CPUs
    proc = run_hpo("launch", str(write_study(tmp_path / "study.yaml", document)))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "a job needs 1 nodes with 0 GPUs and 3 CPUs each (3 packed trials of 1)" in proc.stderr, (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr and not (tmp_path / "work" / "jobs").exists()


@pytest.mark.slow
def test_packed_workers_on_slurm_run_two_trials_at_once_in_one_job(
    tmp_path: Path, fresh_database: str
) -> None:
    document = _packed_study(tmp_path, "slurm", n_trials=6, max_concurrent=1)
    document["study"]["pruner"] = {"name": "none"}
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file), "--storage", fresh_database, "--workers", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 workers submitted as slurm jobs" in proc.stdout and "2 workers per job" in proc.stdout, (
        proc.stdout
    )
    trials = load_trials(document, fresh_database)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6, proc.stdout
    assert len({t.user_attrs["job_id"] for t in trials}) == 1  # one job ran all six
    assert {t.user_attrs["pack_slot"] for t in trials} == {0, 1}
    assert max_overlap(trials) == 2, [(t.datetime_start, t.datetime_complete) for t in trials]
    assert len({tuple(t.params.items()) for t in trials}) == 6  # the two workers sample apart
    status = run_hpo("status", str(study_file), "--storage", fresh_database)
    assert "worker 1 of 2 sharing its job" in status.stdout, status.stdout
    assert "worker 2 of 2 sharing its job" in status.stdout, status.stdout
