"""Inside a trial, seen from the service: real trials on a Slurm cluster of this host (the fault
cluster's nodes) and PostgreSQL store where their steps' time went, their peak memory and images/s; `hpo status` and the report
show them and flag an input-bound study with the setting to change; the loader sweep's
recommendation, put into the study file, at least halves the wait (the flag follows); a profiled trial's trace is where
`hpo logs --trace` says; each trial's TensorBoard events hold its per-epoch values and its
parameters."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.observe.views import INPUT_BOUND_SHARE
from tests.hpo.helpers import REPO, load_trials, run_hpo, study_document, write_study

# A slow shared filesystem (4 ms per image) read in the trial's main process: the model waits for
# about half of each step (a batch read in 0.26 s, a model step of about 0.24 s at width 16 on
# this CPU), and still a third when load beside it slows the model twice (at 2 ms a run waited
# 24% of its steps so). The trainer's own throttle, so the starvation is the same on every
# machine. One batch size for the trials and the sweep (the sweep measures the section's).
STARVED = {
    "num_workers": 0,
    "load_delay_ms": 4,
    "width": 16,
    "batch_size": 64,
    "epochs": 2,
    "max_steps_per_epoch": 15,  # a profiled trial's schedule takes 7 (wait 1, warm-up 1, active 5)
}


def measured_study(name: str, workdir: Path, trainer: dict[str, Any], **study: Any) -> dict[str, Any]:
    document = study_document(
        name,
        workdir,
        study={"n_trials": 2, "max_concurrent": 2, "enqueue": [], "pruner": {"name": "none"}, **study},
        resources={"executor": "slurm", "time": "10m"},
    )
    del document["search_space"]["batch_size"]
    document["trainer"].update(trainer)
    return document


def loader_recommendation(trainer: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """What `python -m trainer --tune-loader` recommends for this trainer section."""
    section = tmp_path / "trainer.yaml"
    section.write_text(yaml.safe_dump(trainer))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--tune-loader",
            "--tune-loader-batches",
            "5",
            "--config",
            str(section),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("recommended"))
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    recommended: dict[str, Any] = yaml.safe_load("\n".join(block))
    assert set(recommended) >= {"num_workers", "prefetch_factor", "persistent_workers"}, proc.stdout
    return recommended


@pytest.mark.slow
def test_trials_measure_themselves_and_an_input_bound_study_is_flagged_until_the_sweeps_setting(
    fault_cluster: str, fresh_database: str, tmp_path: Path
) -> None:
    # On the fault cluster's two nodes, one such test at a time, so that the local cluster stays
    # free for the other tests. Their load still shares the CPUs: the thresholds allow for it.
    storage = ["--storage", fresh_database]
    starved = measured_study("starved", tmp_path / "starved", STARVED, profile_trials=1)
    study_file = write_study(tmp_path / "starved.yaml", starved)
    proc = run_hpo("launch", str(study_file), *storage)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    trials = load_trials(starved, fresh_database)
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    for trial in trials:
        attrs = trial.user_attrs
        assert attrs["data_wait_share"] > 0.3, attrs
        assert set(attrs["step_ms"]) == {"data", "forward", "backward", "optimizer"}
        assert attrs["peak_memory_mib"] > 100 and attrs["images_per_s_per_gpu"] > 0
        assert "gpu_utilization" not in attrs  # CPU trials: nothing to sample

    status = run_hpo("status", str(study_file), *storage)
    assert status.returncode == 0, status.stderr
    header = next(line for line in status.stdout.splitlines() if line.startswith("#"))
    assert "data wait" in header and "img/s/GPU" in header and "peak MiB" in header
    [flag] = [line for line in status.stdout.splitlines() if line.startswith("input-bound:")]
    assert "in 2 of 2 trials: set trainer.num_workers above 0" in flag, flag
    assert "python -m trainer --tune-loader" in flag

    report = run_hpo("report", str(study_file), *storage, "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["input"]["input_bound"] == [0, 1] and summary["input"]["measured"] == 2
    assert set(summary["measurements"]) == {"0", "1"}
    assert summary["measurements"]["0"]["data_wait_share"] == trials[0].user_attrs["data_wait_share"]
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Inside the trials" in page and "input-bound: data wait" in page

    # Trial 0 was profiled (study.profile_trials: 1), trial 1 was not.
    trace = run_hpo("logs", str(study_file), "0", "--trace", *storage)
    assert trace.returncode == 0, trace.stderr
    [path] = [line for line in trace.stdout.splitlines() if line.endswith(".pt.trace.json")]
    events = json.loads(Path(path).read_text())["traceEvents"]
    assert any(str(e.get("name", "")).startswith("ProfilerStep#") for e in events)
    none = run_hpo("logs", str(study_file), "1", "--trace", *storage)
    assert none.returncode == 1 and "study.profile_trials is 1" in none.stderr, none.stderr

    # Each trial's TensorBoard run: its per-epoch values are those the study stored, and its
    # parameters are in the HParams view.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    for trial in trials:
        events_dir = Path(trial.user_attrs["tensorboard_dir"])
        assert str(events_dir).startswith(str(tmp_path / "starved"))  # under the study's workdir
        accumulator = EventAccumulator(str(events_dir))
        accumulator.Reload()
        curve = {s.step: s.value for s in accumulator.Scalars("epoch/val_accuracy")}
        assert curve == pytest.approx(trial.intermediate_values, abs=1e-6)
        content = accumulator.PluginTagToContent("hparams")["_hparams_/session_start_info"]
        hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
        assert hparams["lr"].number_value == pytest.approx(trial.params["lr"])
        assert hparams["trial"].string_value == str(trial.number)

    # The sweep's recommendation, in the same study file under another name: not input-bound.
    recommended = loader_recommendation(starved["trainer"], tmp_path)
    assert recommended["num_workers"] > 0
    # Epochs of 45 steps, not 15: unless the sweep chose persistent workers, each epoch starts its
    # loader's workers again, a fill no loader setting hides (real epochs have hundreds of steps).
    fed_trainer = {**STARVED, **recommended, "max_steps_per_epoch": 45}
    fed = measured_study("fed", tmp_path / "fed", fed_trainer, n_trials=1, max_concurrent=1)
    fed_file = write_study(tmp_path / "fed.yaml", fed)
    proc = run_hpo("launch", str(fed_file), *storage)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shares = [t.user_attrs["data_wait_share"] for t in load_trials(fed, fresh_database)]
    starved_shares = [t.user_attrs["data_wait_share"] for t in trials]
    print(
        f"\nstarved: data wait {[round(s, 3) for s in starved_shares]}; with {recommended}: {[round(s, 3) for s in shares]}"
    )
    # The sweep's setting (the fewest workers within 5% of the best throughput it measured) at
    # least halves the wait: 0.80 to 0.23 on an idle machine. Whether what is left crosses the
    # flag's 0.3 depends on the load beside it (0.31 once, under the whole suite), so the flag is
    # checked against what the trial measured, not against a fixed answer.
    assert max(shares) < min(starved_shares) / 2, (starved_shares, shares)
    status = run_hpo("status", str(fed_file), *storage)
    flagged = [line for line in status.stdout.splitlines() if line.startswith("input-bound:")]
    assert bool(flagged) == (max(shares) >= INPUT_BOUND_SHARE), status.stdout
    if not flagged:
        [verdict] = [line for line in status.stdout.splitlines() if line.startswith("input: ")]
        assert "not input-bound" in verdict, status.stdout


def test_profile_trials_and_tensorboard_dirs_are_the_services_to_set(tmp_path: Path) -> None:
    for key, instead in (("tensorboard_dir", "study.tensorboard"), ("profile_dir", "study.profile_trials")):
        document = copy.deepcopy(study_document("bad", tmp_path / "work"))
        document["trainer"][key] = str(tmp_path / "x")
        study_file = write_study(tmp_path / "bad.yaml", document)
        proc = run_hpo("launch", str(study_file), timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert f"trainer.{key}: is set by the service for each trial (under workdir): use {instead}" in line
        assert not (tmp_path / "work").exists()  # nothing created, nothing submitted


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda d: d["study"].update(profile_trials=1, backend="ray"),
            "study.profile_trials: profiles trials of backend optuna",
        ),
        (
            lambda d: d["study"].update(profile_trials=1, warm_start={"studies": ["earlier"]}),
            "study.profile_trials: counts trials from 0, which a warm start's imported trials take",
        ),
        (
            lambda d: (
                d["study"].update(backend="ray", pruner={"name": "pbt"}),
                d["search_space"].update(momentum={"type": "float", "low": 0.85, "high": 0.95}),
                d["trainer"].pop("momentum"),
                d["trainer"].update(cycle_momentum=True),
            ),
            "trainer.cycle_momentum: OneCycle's momentum cycle would overwrite the momentum PBT perturbs",
        ),
        (
            lambda d: (
                d["search_space"].update(momentum={"type": "float", "low": 0.8, "high": 0.95}),
                d["trainer"].pop("momentum"),
                d["trainer"].update(cycle_momentum=True),
            ),
            "search_space.momentum: base_momentum 0.85 is above momentum 0.8",
        ),
    ],
)
def test_measurement_settings_that_would_do_nothing_or_fail_trials_are_refused(
    tmp_path: Path, change: Any, problem: str
) -> None:
    document = study_document("bad", tmp_path / "work")
    change(document)
    study_file = write_study(tmp_path / "bad.yaml", document)
    proc = run_hpo("launch", str(study_file), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert problem in line, line
    assert not (tmp_path / "work").exists()


def test_the_trainer_refuses_an_unwritable_trace_or_event_folder_before_training(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    for flag in ("--tensorboard-dir", "--profile-dir"):
        proc = subprocess.run(
            [sys.executable, "-m", "trainer", flag, str(blocked / "sub")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith(f"python -m trainer: error: {flag} ") and "Not a directory" in line, line
