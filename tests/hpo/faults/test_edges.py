"""What an ordinary session at a terminal does to the service: output piped into `head`, the ssh
session closed under a running launcher, a command trial retried after failing late. Local trial
processes and small standard-library scripts: seconds per test."""

from __future__ import annotations

import re
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from tests.hpo.helpers import (
    HPO,
    REPO,
    held_score_study,
    load_trials,
    processes_with,
    release_hold_at,
    run_hpo,
    score_study,
    start_hpo,
    trials_or_none,
    write_study,
)

# Reports "step N score X*N" for 4 steps, 0.5 s apart; the first run of each x fails after its
# last report (a crash at the end of training), its retry succeeds.
SCRIPT = r"""
import argparse, pathlib, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float)
parser.add_argument("--marker")
args = parser.parse_args()
for step in range(1, 5):
    time.sleep(0.5)
    print(f"step {step} score {args.x * step:.4f}", flush=True)
marker = pathlib.Path(args.marker)
if not marker.exists():
    marker.touch()
    sys.exit("crashed while saving the model")
"""


def _study(
    tmp_path: Path, n_trials: int, max_retries: int = 1, fail_first: bool = True
) -> tuple[dict[str, Any], Path]:
    (tmp_path / "train.py").write_text(SCRIPT)
    objective = {
        "steps": 4,
        # The trial's own folder exists: a marker there lets the first run succeed.
        "command": [
            "{python}",
            "train.py",
            "--x",
            "{x}",
            "--marker",
            "{trial_dir}/../ran-{x}" if fail_first else "{trial_dir}",
        ],
        "metric_pattern": r"^step (?P<step>\d+) score (?P<value>[0-9.]+)$",
    }
    document = score_study(
        tmp_path, "edges", objective, n_trials=n_trials, max_concurrent=1, max_retries=max_retries
    )
    return document, write_study(tmp_path / "study.yaml", document)


def test_a_retried_command_trial_reports_its_steps_again_without_a_warning_each(tmp_path: Path) -> None:
    document, study_file = _study(tmp_path, n_trials=1)

    proc = run_hpo("launch", str(study_file), timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    failed, retry = load_trials(document)
    assert (
        failed.state.name == "FAIL" and "crashed while saving the model" in failed.user_attrs["fail_reason"]
    )
    assert retry.state.name == "COMPLETE" and retry.user_attrs["retry_of"] == failed.number
    logs = "".join(path.read_text() for path in (tmp_path / "work" / "jobs").rglob("*_log.*"))
    assert "already reported" not in proc.stdout + proc.stderr + logs


def test_status_piped_into_a_reader_that_stops_early_says_nothing_more(tmp_path: Path) -> None:
    _, study_file = _study(tmp_path, n_trials=1, fail_first=False)
    assert run_hpo("launch", str(study_file), timeout=300).returncode == 0

    # `true` exits without reading: every write of hpo status meets a closed pipe.
    piped = subprocess.run(
        f"{HPO} status {study_file} | true; echo ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert piped.stderr == "", piped.stderr
    assert piped.stdout.strip() == "0"


def test_a_closed_terminal_stops_the_launcher_as_cleanly_as_ctrl_c(tmp_path: Path) -> None:
    document, study_file = _study(tmp_path, n_trials=3, fail_first=False)
    launcher = start_hpo("launch", str(study_file))
    deadline = time.monotonic() + 120
    while not (tmp_path / "work" / "trials").exists() or not any((tmp_path / "work" / "trials").rglob("*")):
        assert time.monotonic() < deadline and launcher.poll() is None, launcher.communicate()[0]
        time.sleep(0.2)

    launcher.send_signal(signal.SIGHUP)  # the ssh session or terminal went away
    output = launcher.communicate(timeout=120)[0]

    assert launcher.returncode == 130, output
    assert "launcher stopped while trials 0 ran; `hpo launch` again resumes the study" in output, output
    assert "Traceback" not in output
    relaunch = run_hpo("launch", str(study_file), timeout=300)
    assert relaunch.returncode == 0, relaunch.stdout + relaunch.stderr
    assert all(t.state.is_finished() for t in load_trials(document))


SLOW_FUNCTION = """
import time

def objective(params, trial):
    time.sleep(40)  # one step that fits the trial's 1 minute, past submitit's local 30 s signal
    trial.report(1, params["x"])
    return params["x"]
"""


def test_a_local_trial_gets_its_whole_time_limit(tmp_path: Path) -> None:
    (tmp_path / "slow_objective.py").write_text(SLOW_FUNCTION)
    document, study_file = _study(tmp_path, n_trials=1, max_retries=0)
    document["objective"] = {"steps": 1, "function": "slow_objective:objective"}
    document["resources"]["time"] = "1m"
    write_study(study_file, document)

    proc = run_hpo("launch", str(study_file), timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    [trial] = load_trials(document)
    assert trial.state.name == "COMPLETE" and trial.user_attrs.get("restarts", 0) == 0, trial.user_attrs


# A progress bar of 65,519 characters and its \r, then the metric line: the service reads output
# in pieces of 64 KiB (65,536 bytes), so the first piece ends in "step 1 score 0.3".
LONG_BAR = r"""
import sys
sys.stdout.write("#" * 65519 + "\r")
sys.stdout.write("step 1 score 0.323456\n")
"""


def test_a_metric_line_cut_by_the_read_boundary_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "bar.py").write_text(LONG_BAR)
    document, study_file = _study(tmp_path, n_trials=1, max_retries=0)
    document["objective"].update(steps=1, command=["{python}", "bar.py"])
    write_study(study_file, document)

    proc = run_hpo("launch", str(study_file), timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    [trial] = load_trials(document)
    assert trial.value == 0.323456 and trial.intermediate_values == {1: 0.323456}


def test_a_relaunch_adopts_the_local_workers_a_killed_launcher_left(tmp_path: Path) -> None:
    # The workers' trials wait after their step 2 (the `hold` file) until the relaunch has adopted
    # them: the refused relaunches before it take seconds on a busy machine.
    document, study_file, hold = held_score_study(
        tmp_path, "adopt", steps=4, step_s=1.5, hold_after=2, n_trials=6, max_concurrent=2
    )
    first = start_hpo("launch", str(study_file), "--workers", "2")
    deadline = time.monotonic() + 120
    while True:  # both workers in a trial
        journal = (tmp_path / "work" / "optuna.journal").exists()  # not created by this reader
        trials = (trials_or_none(document) if journal else None) or []  # None: no study in it yet
        if sum(1 for t in trials if t.state.name == "RUNNING" and t.intermediate_values) == 2:
            break
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()[0]
        time.sleep(0.3)
    first.kill()  # SIGKILL: no word to the workers, which run on
    first.wait()
    assert first.stdout is not None
    first.stdout.close()  # the workers hold the pipe's other end: reading it would wait for them
    # Relaunched in another mode meanwhile (per-trial, the Ray backend): refused in one line naming
    # the workers, which neither would count in max_concurrent; none of their trials failed.
    for mode in ([], ["--backend", "ray"]):
        other = run_hpo("launch", str(study_file), *mode, timeout=300)
        assert other.returncode == 3, other.stdout + other.stderr
        assert re.search(r"another launch mode \(local job \d+ \(workers\): trial", other.stderr), (
            other.stderr
        )
    assert "FAIL" not in {t.state.name for t in load_trials(document)}

    relaunch = start_hpo("launch", str(study_file), "--workers", "2")
    output = release_hold_at(relaunch, "workers of an earlier launch still run", hold)
    output += relaunch.communicate(timeout=300)[0]

    assert relaunch.returncode == 0, output
    assert "2 workers of an earlier launch still run" in output, output
    trials = [t for t in load_trials(document) if not t.user_attrs.get("surplus")]
    assert len(trials) == 6 and all(t.state.name == "COMPLETE" for t in trials), [
        (t.number, t.state.name, t.user_attrs) for t in trials
    ]
    assert len({t.params["x"] for t in trials}) == 6


# Starts a daemon in a session of its own (outside the command's process group, as `setsid`,
# a service's own start script or a detached tensorboard do), then reports below the threshold.
DAEMONIZING = r"""
import subprocess, sys, time
subprocess.Popen(["setsid", sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])
time.sleep(0.5)
print("step 1 score 0.1", flush=True)
time.sleep(60)
"""


def test_a_pruned_command_leaves_no_process_even_one_in_its_own_session(tmp_path: Path) -> None:
    marker = f"daemon-{uuid.uuid4().hex[:8]}"
    (tmp_path / "daemonizing.py").write_text(DAEMONIZING)
    document, study_file = _study(tmp_path, n_trials=1, max_retries=0)
    document["objective"].update(steps=4, command=["{python}", "daemonizing.py", marker])
    document["study"]["pruner"] = {"name": "threshold", "options": {"lower": 0.5}}
    write_study(study_file, document)

    proc = run_hpo("launch", str(study_file), timeout=300)

    [trial] = load_trials(document)
    assert trial.state.name == "PRUNED", proc.stdout + proc.stderr
    assert processes_with(marker) == []
