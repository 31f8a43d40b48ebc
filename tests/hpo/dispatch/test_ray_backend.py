"""The Ray backend on a local Ray instance: real trainer trials, ASHA, results in the Optuna storage."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.hpo.helpers import (
    BAD,
    GOOD,
    launch_in_background,
    load_trials,
    processes_with,
    run_hpo,
    score_study,
    stand_in_study,
    study_document,
    wait_for_trials,
    write_study,
)

pytestmark = [pytest.mark.slow, pytest.mark.ray_ports]


def test_local_ray_backend_runs_a_study_with_asha_into_the_optuna_storage(tmp_path: Path) -> None:
    # The torch-free stand-in's trials (helpers.py): ASHA and the storage are the subject here; the
    # trainer's own trials on Ray are the PBT and DDP tests' below.
    document = stand_in_study(
        tmp_path,
        "ray-study",
        study={"backend": "ray", "n_trials": 6, "enqueue": [GOOD, {**GOOD, "lr": 0.2}, BAD]},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document)
    states = [t.state.name for t in trials]
    assert len(trials) == 6 and set(states) <= {"COMPLETE", "PRUNED"}, states
    # ASHA (the study's successive_halving) stopped some trials; the others ran all 3 epochs.
    assert "PRUNED" in states and "COMPLETE" in states, states
    for trial in trials:
        epochs = sorted(trial.intermediate_values)
        assert epochs == list(range(1, len(epochs) + 1)), trial.intermediate_values
        assert (trial.user_attrs["executor"], trial.user_attrs["dispatch"]) == ("local", "ray")
        assert len(epochs) == 3 if trial.state.name == "COMPLETE" else len(epochs) < 3
    status = run_hpo("status", str(study_file))
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("study ray-study: 6 of 6 trials;")
    # `hpo studies` counts the local Ray trials' CPU time too (each trial's elapsed x its CPUs).
    listed = run_hpo("studies", "--storage", f"journal:{tmp_path / 'work' / 'optuna.journal'}")
    [line] = [line for line in listed.stdout.splitlines() if "ray-study" in line]
    hours = float(re.search(r"([0-9.e-]+) CPU-h", line).group(1))  # type: ignore[union-attr]
    elapsed = sum(t.user_attrs["elapsed_s"] for t in trials) / 3600
    assert hours == pytest.approx(elapsed, rel=0.01), (line, elapsed)

    # Launched again, the study is complete: nothing runs twice.
    again = run_hpo("launch", str(study_file))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "6 of 6 trials stored" in again.stdout
    assert len(load_trials(document)) == 6


def _slurm_ray_document(name: str, folder: Path, workdir: Path) -> dict[str, Any]:
    """A Ray study in a Slurm allocation of both nodes, of the torch-free stand-in's trials
    (helpers.py, 3 epochs of ``1.5 s``): the Ray job's handling is the subject (the trainer's trials
    on Ray are the local tests' here; a torch script's on Ray in Slurm, test_objective_cluster.py).
    These tests run on the fault cluster (nodes f1 and f2): a job that takes every node of the
    local cluster would keep every other test's jobs waiting."""
    study = {"backend": "ray", "n_trials": 6, "enqueue": [GOOD, {**GOOD, "lr": 0.2}, BAD]}
    resources = {"executor": "slurm", "nodes": 2, "cpus_per_task": 1}
    return stand_in_study(folder, name, epoch_s=1.5, workdir=workdir, study=study, resources=resources)


def test_ray_cluster_inside_one_slurm_job_spanning_both_nodes_beside_a_second_ray_study(
    tmp_path: Path, fault_cluster: str, fresh_database: str
) -> None:
    name = f"ray-slurm-{uuid.uuid4().hex[:6]}"
    document = _slurm_ray_document(name, tmp_path, tmp_path / "work")
    # Trials start on the head while the worker joins; on a loaded machine the worker's start can
    # take longer than this short study (Ray's agents get 15 s to come up, a failed start is tried
    # again). The trials wait after their first epoch until the worker has joined.
    document["objective"]["fixed"]["hold_after"] = 1
    (tmp_path / "hold").touch()
    study_file = write_study(tmp_path / "study.yaml", document)
    launcher = launch_in_background(study_file, fresh_database)
    # A second, short Ray study on the same two nodes meanwhile (its trials never hold): two Ray
    # clusters side by side, each with its own ports, temp dir and study, neither clashing.
    beside = _slurm_ray_document(f"ray-beside-{uuid.uuid4().hex[:6]}", tmp_path, tmp_path / "work-beside")
    beside["study"].update(n_trials=2, enqueue=[GOOD])
    beside_launcher = launch_in_background(write_study(tmp_path / "beside.yaml", beside), fresh_database)
    # While it runs: `hpo tunnel` names the head and the dashboard port, and the dashboard answers.
    deadline = time.monotonic() + 180
    while True:
        # Asked once the head has written where it listens (work/ray/JOB.json): each `hpo tunnel`
        # costs a second of CPU, a glob nothing.
        if list((tmp_path / "work" / "ray").glob("*.json")):
            tunnel = run_hpo("tunnel", str(study_file), "--storage", fresh_database)
            if tunnel.returncode == 0:
                break
            assert time.monotonic() < deadline and launcher.poll() is None, tunnel.stderr
        assert time.monotonic() < deadline and launcher.poll() is None, "the Ray head never wrote its address"
        time.sleep(1)
    match = re.search(r"ssh -N -L 8265:127\.0\.0\.1:(\d+) -J \S+ (f1|f2)", tunnel.stdout)
    assert match, tunnel.stdout
    with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}/", timeout=30) as response:
        assert response.status == 200
    deadline = time.monotonic() + 300
    while not list((tmp_path / "work" / "ray").glob("*.joined-1")):
        assert time.monotonic() < deadline and launcher.poll() is None, "the worker node did not join"
        time.sleep(0.5)
    (tmp_path / "hold").unlink()
    output = launcher.communicate(timeout=600)[0]
    assert launcher.returncode == 0, output
    beside_output = beside_launcher.communicate(timeout=600)[0]
    assert beside_launcher.returncode == 0, beside_output

    trials = load_trials(document, fresh_database)
    states = [t.state.name for t in trials]
    assert len(trials) == 6 and set(states) <= {"COMPLETE", "PRUNED"}, states
    assert "PRUNED" in states and "COMPLETE" in states, states
    # Both nodes joined the one Ray cluster (whether a trial ran on the worker is Ray's choice).
    assert {t.user_attrs["nodes"] for t in trials} <= {"f1", "f2"}
    [job_id] = {t.user_attrs["job_id"] for t in trials}  # all in the one Ray job
    head_log = (tmp_path / "work" / "jobs" / job_id / f"{job_id}_0_log.out").read_text()
    assert "ray cluster: 2 of 2 nodes up" in head_log, head_log[-3000:]
    proc = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,NNodes", "--name", f"hpo-{name}:ray", "-S", "now-1hour"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert proc.stdout.split() == [f"{job_id}|2"]
    status = run_hpo("status", str(study_file), "--storage", fresh_database)
    assert status.returncode == 0 and status.stdout.startswith(f"study {name}: 6 of 6 trials;"), status.stdout
    # The second study: its own trials, in its own Ray job, none of the first's.
    beside_trials = load_trials(beside, fresh_database)
    assert len(beside_trials) == 2, [(t.number, t.state.name) for t in beside_trials]
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in beside_trials)
    assert {t.user_attrs["job_id"] for t in beside_trials}.isdisjoint({job_id})


def test_relaunch_after_the_ray_job_is_cancelled_resumes_without_counting_a_trial_twice(
    tmp_path: Path, fault_cluster: str, fresh_database: str
) -> None:
    name = f"ray-resume-{uuid.uuid4().hex[:6]}"
    document = _slurm_ray_document(name, tmp_path, tmp_path / "work")
    # Long enough to be caught mid-trial (3 epochs of 3 s), and no pruning: trials that end at their
    # first epoch let Tune ask all 6 before `hpo cancel` (a few seconds to start) lands on a busy machine.
    document["objective"]["fixed"]["epoch_s"] = 3.0
    document["study"]["pruner"] = {"name": "none"}
    study_file = write_study(tmp_path / "study.yaml", document)
    launcher = launch_in_background(study_file, fresh_database)
    # Cancel once a trial has finished and others are running.
    wait_for_trials(
        document,
        fresh_database,
        launcher,
        lambda trials: (
            any(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
            and any(t.state.name == "RUNNING" for t in trials)
        ),
    )
    # The launcher is killed; its Ray job runs on. A relaunch on the Optuna backend meanwhile is
    # refused in one line naming the job, and fails none of the trials the job still runs.
    launcher.kill()
    launcher.communicate(timeout=60)
    running = {t.number for t in load_trials(document, fresh_database) if t.state.name == "RUNNING"}
    other = run_hpo("launch", str(study_file), "--storage", fresh_database, "--backend", "optuna")
    assert other.returncode == 3, other.stdout + other.stderr
    [refusal] = other.stderr.strip().splitlines()
    assert re.search(
        r"trials running in jobs of another launch mode \(slurm job \d+ \(ray\): trial", refusal
    ), refusal
    states = {t.number: t.state.name for t in load_trials(document, fresh_database)}
    assert all(states[n] in ("RUNNING", "COMPLETE", "PRUNED") for n in running), states  # none failed
    cancel = run_hpo("cancel", str(study_file), "--storage", fresh_database)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert re.search(r"^Ray job \d+: cancelled$", cancel.stdout, re.M), cancel.stdout
    cut_short = load_trials(document, fresh_database)
    before = {t.number: t.state.name for t in cut_short}
    # Nothing of the cancelled job's Ray outlives it (its GCS once did: `ray start` without
    # --block leaves the node's Ray processes outside the job's process tree, which Slurm kills).
    [cancelled_job] = {t.user_attrs["job_id"] for t in cut_short if "job_id" in t.user_attrs}
    deadline = time.monotonic() + 120
    while left := processes_with(f"/tmp/ray-{cancelled_job}-"):
        assert time.monotonic() < deadline, left
        time.sleep(1)

    again = run_hpo("launch", str(study_file), "--storage", fresh_database, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    trials = load_trials(document, fresh_database)
    assert len(trials) == 6, [(t.number, t.state.name) for t in trials]
    assert all(t.state.is_finished() for t in trials)
    # What had finished before stays as it was; what the cancel cut short is a FAIL, counted once.
    for trial in trials:
        if before.get(trial.number) in ("COMPLETE", "PRUNED"):
            assert trial.state.name == before[trial.number]
    # The trials the relaunch added ran in its own, new Ray job. A trial the first launch asked for
    # and the cancel caught before Tune started it never had a job: it is closed FAIL.
    first = [t for t in trials if t.number in before]
    assert all(t.state.name == "FAIL" for t in first if "job_id" not in t.user_attrs)
    first_job = {t.user_attrs["job_id"] for t in first if "job_id" in t.user_attrs}
    added = [t for t in trials if t.number not in before]
    # On a loaded machine Tune may have asked for all 6 before the cancel landed: nothing to add.
    assert added or len(before) == 6, before
    assert all(t.user_attrs["job_id"] not in first_job for t in added)
    proc = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "--name", f"hpo-{name}:ray", "-S", "now-1hour"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    # The cancelled job, and the relaunch's own where it had trials to add.
    assert len(proc.stdout.splitlines()) == (2 if added else 1), proc.stdout


def test_population_based_training_records_each_member_and_what_it_took_from_others(
    tmp_path: Path, fashion_mnist_root: str
) -> None:
    """PBT (a Ray-only scheduler): a bad member takes the good one's weights and perturbed lr."""
    document = study_document(
        "ray-pbt",
        tmp_path / "work",
        study={
            "backend": "ray",
            "n_trials": 2,
            "enqueue": [GOOD, BAD],
            "pruner": {
                "name": "pbt",
                "options": {"perturbation_interval": 1, "quantile_fraction": 0.5, "mutations": ["lr"]},
            },
        },
        trainer={"epochs": 4, "max_steps_per_epoch": 10, "val_fraction": 0.03, "test_held_out": True},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document)
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    good, bad = trials
    assert (good.params["lr"], bad.params["lr"]) == (GOOD["lr"], BAD["lr"])  # what each started with
    for trial in trials:
        epochs = sorted(trial.intermediate_values)
        # A member that takes the weights of one ahead of it skips to its epoch.
        assert epochs[-1] == 4 and epochs == sorted(set(epochs)), trial.intermediate_values
        assert trial.user_attrs["epochs_completed"] == 4
        assert 0 < trial.user_attrs["test_accuracy"] <= 1  # on the held-out test images, at the end
    schedule = bad.user_attrs["pbt_schedule"]
    assert schedule and schedule[0]["weights_of_trial"] == good.number, schedule
    for change in schedule:
        assert 0.001 <= change["params"]["lr"] <= 1.0 and change["params"]["batch_size"] == GOOD["batch_size"]
    assert bad.user_attrs["pbt_final_params"] == schedule[-1]["params"]
    # Having taken the good member's weights, the bad one ends near it instead of near chance.
    assert bad.value > 0.5 * good.value, (bad.value, good.value)
    best = run_hpo("best", str(study_file))
    assert best.returncode == 0, best.stderr
    best_trial = max(trials, key=lambda t: t.value)
    assert best.stdout.startswith(f"best trial {best_trial.number}:"), best.stdout
    if best_trial is bad:  # its own params and those PBT gave it, and a command with the latter
        assert "PBT, after epoch" in best.stdout and "params at the end:" in best.stdout, best.stdout


def test_each_ray_trial_is_a_ddp_run_of_ray_train_workers_that_a_tune_stop_frees(
    tmp_path: Path, fashion_mnist_root: str
) -> None:
    """tasks_per_node: 2 makes each Tune trial a TorchTrainer of 2 workers (1 CPU each). ASHA stops
    the good trial at its last epoch (max_t) and the bad one after epoch 1: each stop must end the
    trial's Train run and free its 2 CPUs (all this machine may have) at once, or the next trial
    never starts."""
    import torch

    from trainer.checkpoint import checkpoint_path

    document = study_document(
        "ray-ddp-asha",
        tmp_path / "work",
        study={"backend": "ray", "n_trials": 2, "max_concurrent": 1, "enqueue": [GOOD, BAD]},
        trainer={"epochs": 2, "max_steps_per_epoch": 8, "train_fraction": 0.05, "val_fraction": 0.05},
        resources={"executor": "local", "tasks_per_node": 2, "cpus_per_task": 1},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Could not re-use actor" not in proc.stderr, proc.stderr
    good, bad = load_trials(document)
    assert (good.state.name, sorted(good.intermediate_values)) == ("COMPLETE", [1, 2])
    assert (bad.state.name, sorted(bad.intermediate_values)) == ("PRUNED", [1])
    # One result per epoch reached Tune and the study: rank 0's, not one per worker.
    for trial in (good, bad):
        assert (trial.user_attrs["executor"], trial.user_attrs["dispatch"]) == ("local", "ray")
        assert trial.user_attrs["epochs_completed"] == len(trial.intermediate_values)
        assert trial.user_attrs["nodes"]  # the "node" key of the result, as for single-process trials
        # What the trial measured of itself (its last epoch's), per rank: 2 DDP workers.
        assert 0 < trial.user_attrs["data_wait_share"] < 1 and trial.user_attrs["peak_memory_mib"] > 0
        assert trial.user_attrs["images_per_s_per_gpu"] > 0
    # Each trial trained as 2 ranks: its checkpoint was written for a world of 2 (the trainer's
    # fingerprint), in the folder named after its Tune trial.
    folders = sorted((tmp_path / "work" / "trials").glob("*/ray-*/checkpoint"))
    assert len(folders) == 2, folders
    epochs = []
    for folder in folders:
        saved = torch.load(checkpoint_path(folder), weights_only=False)
        assert saved["fingerprint"]["world_size"] == 2
        epochs.append(saved["epoch"])
    # The good trial's last is its epoch 2. (The bad one's Train workers may finish the epoch they
    # were in when Tune's stop reached them: its report is dropped, its checkpoint kept.)
    assert max(epochs) == 2 and min(epochs) >= 1, epochs


def test_a_python_function_objective_runs_on_the_local_ray_backend(tmp_path: Path) -> None:
    """The user's own function as the objective of Ray Tune trials: its reports reach Tune's
    scheduler and the Optuna storage, as the trainer's epochs do. The variable Tune gives its trial
    actors reaches them, though from the workers' environment (``hpo.dispatch.ray.driver``)."""
    (tmp_path / "my_objective.py").write_text(
        "import os\n"
        "def objective(params, trial):\n"
        "    assert os.environ.get('PL_DISABLE_FORK') == '1', 'no PL_DISABLE_FORK in the trial'\n"
        "    for step in range(1, 5):\n"
        "        if trial.report(step, params['x'] * step):\n"
        "            return None\n"
        "    return params['x'] * 4\n"
    )
    document = {
        "study": {"name": "ray-function", "workdir": str(tmp_path / "work"), "backend": "ray",
                  "metric": "score", "direction": "maximize", "n_trials": 3, "max_concurrent": 1,
                  "pruner": {"name": "none"}, "enqueue": [{"x": 1.0}, {"x": 0.5}]},
        "search_space": {"x": {"type": "float", "low": 0.1, "high": 2.0}},
        "objective": {"function": "my_objective:objective", "steps": 4},
    }  # fmt: skip
    study_file = write_study(tmp_path / "study.yaml", document)

    proc = run_hpo("launch", str(study_file))

    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3, proc.stdout
    for trial in trials:
        assert (trial.user_attrs["executor"], trial.user_attrs["dispatch"]) == ("local", "ray")
        assert trial.intermediate_values == {s: pytest.approx(trial.params["x"] * s) for s in range(1, 5)}
        assert trial.value == pytest.approx(trial.params["x"] * 4)


def test_the_ray_backend_starts_no_trial_past_the_compute_budget(tmp_path: Path) -> None:
    """A local Ray instance: trials charged their own elapsed time x one CPU (an estimate; in a
    Slurm allocation, the allocation's hours from sacct). The trials are the torch-free stand-in
    (helpers.py, 3 epochs of 2 s): an idle second costs the budget what a busy one does."""
    document = stand_in_study(
        tmp_path,
        "ray-budget",
        epoch_s=2.0,
        study={"backend": "ray", "n_trials": 30, "enqueue": [], "pruner": {"name": "none"}, "budget": 0.004},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = run_hpo("launch", str(study_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compute budget reached: " in proc.stdout, proc.stdout
    trials = load_trials(document)
    assert 2 <= len(trials) < 30 and all(t.state.name == "COMPLETE" for t in trials), len(trials)
    spent = sum(float(t.user_attrs["elapsed_s"]) for t in trials) / 3600
    one_trial = max(float(t.user_attrs["elapsed_s"]) for t in trials) / 3600
    # Two trials in flight when the budget is reached: both finish.
    assert spent <= 0.004 + 2 * one_trial, (spent, one_trial)


USAGE_SCRIPT = r"""
import argparse, pathlib
with (pathlib.Path(__file__).parent / "runs.txt").open("a") as runs:
    runs.write("run\n")
parser = argparse.ArgumentParser(prog="train.py")
parser.add_argument("--x", type=float, required=True)
args = parser.parse_args()
print(f"epoch 1 score {args.x:.4f}", flush=True)
"""


def test_fail_fast_stops_a_ray_launch_whose_first_trials_fail_the_same_way(tmp_path: Path) -> None:
    """A command with a flag the script does not know, on a local Ray instance: the launch stops
    after 2 trials, as on the Optuna backend, with the same line and exit status, and Tune does
    not run them again (no rerun changes a usage error; before, each ran max_retries times more)."""
    (tmp_path / "train.py").write_text(USAGE_SCRIPT)
    document = score_study(
        tmp_path,
        f"ray-ff-{uuid.uuid4().hex[:6]}",
        {
            "command": ["{python}", "train.py", "--x", "{x}", "--hidden-size", "16"],
            "metric_pattern": r"^epoch (?P<step>\d+) score (?P<value>[0-9.]+)$",
            "steps": 1,
        },
        backend="ray",
        n_trials=6,
        max_concurrent=2,
        max_retries=1,
    )
    study_file = write_study(tmp_path / "study.yaml", document)

    proc = run_hpo("launch", str(study_file), timeout=600)

    assert (tmp_path / "runs.txt").read_text().split() == ["run", "run"], proc.stdout

    assert proc.returncode == 1, proc.stdout + proc.stderr
    [error] = proc.stderr.strip().splitlines()[-1:]
    assert error.startswith("hpo launch: error: trials 0 and 1 failed the same way"), error
    assert "unrecognized arguments: --hidden-size 16" in error and "objective.command" in error, error
    assert f"stopping: {error.removeprefix('hpo launch: error: ')}" in proc.stdout, proc.stdout
    trials = load_trials(document)
    assert [(t.number, t.state.name) for t in trials] == [(0, "FAIL"), (1, "FAIL")], proc.stdout
    status = run_hpo("status", str(study_file))
    assert "last launch stopped: trials 0 and 1 failed the same way" in status.stdout, status.stdout
