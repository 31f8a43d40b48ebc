"""The user's own code as the objective, with local trial processes: a command read through its
output, the trial API, a Python function; what a pruned, failing or silent command leaves behind.

The scripts here are small and use the standard library only (seconds per trial); the tests on the
Slurm cluster, PostgreSQL and Ray, with the real example script, are in test_objective_cluster.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from hpo.config.user_code import TemplateError, placeholders, render
from tests.hpo.helpers import load_trials, processes_with, run_hpo, score_study, write_study

# Reports "epoch N score X*N" each 0.3 s for 4 epochs; leaves a helper process running in its
# process group (the kind of child a DataLoader or a launcher script starts); records its argv.
SCRIPT = r"""
import argparse, json, os, subprocess, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float)
parser.add_argument("--tag")
parser.add_argument("--out")
args = parser.parse_args()
with open(args.out, "w") as f:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "setting": os.environ.get("EXAMPLE_SETTING")}, f)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "helper-" + args.tag.split()[0]])
if args.tag.startswith("fail"):
    print("loading data", flush=True)
    sys.exit("boom: the data folder is empty")
if args.tag.startswith("silent"):
    print("training without a metric line", flush=True)
    sys.exit(0)
for epoch in range(1, 5):
    time.sleep(0.3)
    print(f"epoch {epoch} score {args.x * epoch:.4f}", flush=True)
"""


def _own_study(tmp_path: Path, name: str, objective: dict[str, Any], **study: Any) -> dict[str, Any]:
    settings = {
        # Deterministic: a trial whose first report is below 0.5 is pruned there.
        "pruner": {"name": "threshold", "options": {"lower": 0.5}},
        "max_retries": 0,
        **study,
    }
    document = score_study(tmp_path, name, {"steps": 4, **objective}, **settings)
    document["search_space"]["x"]["low"] = 0.01
    return document


def test_placeholders_fill_argv_elements_and_refuse_anything_else() -> None:
    assert placeholders("--lr={lr}") == ["lr"]
    assert placeholders("{{literal}} {a}{b}") == ["a", "b"]
    assert render(["--lr={lr}", "{{x}}", "{flag}"], {"lr": 0.5, "flag": True}) == ["--lr=0.5", "{x}", "true"]
    for bad in ("{lr", "lr}", "{lr:.3f}", "{a.b}", "{0}", "{}"):
        with pytest.raises(TemplateError):
            placeholders(bad)


def test_a_command_is_tuned_through_its_output_and_a_pruned_trial_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = f"hpo-{uuid.uuid4().hex[:8]}"
    (tmp_path / "train.py").write_text(SCRIPT)
    injected = f"$(touch {tmp_path}/pwned); touch {tmp_path}/pwned2 `touch {tmp_path}/pwned3`"
    document = _own_study(
        tmp_path,
        "own-command",
        {
            "command": [
                "{python}",
                "train.py",
                "--x",
                "{x}",
                "--tag",
                "{tag}",
                "--out",
                "{trial_dir}/argv.json",
            ],
            "metric_pattern": r"^epoch (?P<step>\d+) score (?P<value>[0-9.]+)$",
            "env": {"EXAMPLE_SETTING": "${HPO_TEST_SETTING}"},
        },
        n_trials=4,
        max_concurrent=2,
        enqueue=[
            {"x": 1.0, "tag": f"{marker} ok"},
            {"x": 0.1, "tag": f"{marker} {injected}"},  # pruned at epoch 1 (0.1 < 0.5)
            {"x": 1.0, "tag": f"fail-{marker}"},
            {"x": 1.0, "tag": f"silent-{marker}"},
        ],
    )
    document["search_space"]["tag"] = {
        "type": "categorical",
        "choices": [f"{marker} ok", f"{marker} {injected}", f"fail-{marker}", f"silent-{marker}"],
    }
    study_file = write_study(tmp_path / "study.yaml", document)

    monkeypatch.setenv("HPO_TEST_SETTING", "from the launcher's environment")  # the views read it too
    proc = run_hpo("launch", str(study_file), timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = load_trials(document)
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "FAIL", "FAIL"], proc.stdout
    complete, pruned, failed, silent = trials
    assert complete.value == pytest.approx(4.0) and complete.intermediate_values == {
        1: 1.0,
        2: 2.0,
        3: 3.0,
        4: 4.0,
    }
    assert pruned.intermediate_values == {1: 0.1}
    assert (
        failed.user_attrs["fail_reason"] == "the command exited with status 1: boom: the data folder is empty"
    )
    assert silent.user_attrs["fail_reason"] == (
        "no metric reported; last output line: 'training without a metric line'"
    )
    # The injected value reached the script as one argv element, and ran nothing.
    [argv_file] = (tmp_path / "work" / "trials").glob("own-command-*/1/argv.json")
    seen = json.loads(argv_file.read_text())
    assert seen["argv"] == ["--x", "0.1", "--tag", f"{marker} {injected}", "--out", str(argv_file)]
    # It ran in the study file's folder, with objective.env (its ${VAR} read at launch).
    assert seen["cwd"] == str(tmp_path) and seen["setting"] == "from the launcher's environment"
    assert not list(tmp_path.glob("pwned*"))
    # Neither the pruned command nor any helper its trials started is left running.
    assert processes_with(marker) == []
    best = run_hpo("best", str(study_file))
    assert best.returncode == 0, best.stderr
    command = best.stdout.splitlines()[-1].strip()
    assert command.startswith(f"cd {tmp_path} && env OMP_NUM_THREADS=1 "), best.stdout
    assert "--x 1.0 --tag" in command and "train.py" in command, best.stdout
    # The views read it as they read the trainer's trials.
    status = run_hpo("status", str(study_file))
    assert status.returncode == 0 and "boom: the data folder is empty" in status.stdout, status.stdout
    report = run_hpo("report", str(study_file), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["metric"] == "score" and summary["best"]["command"] == command, summary["best"]


TRIAL_API_SCRIPT = r"""
import os, sys, time
from hpo import trial
params = trial.params({"x": 0.7})
folder = trial.checkpoint_dir("alone-checkpoints")
assert str(folder) == os.environ.get("HPO_CHECKPOINT_DIR", "alone-checkpoints"), folder
start = int((folder / "epoch").read_text()) if (folder / "epoch").exists() else 0
for epoch in range(start + 1, 5):
    time.sleep(0.2)
    (folder / "epoch").write_text(str(epoch))
    if trial.report(epoch, params["x"] * epoch):
        print(f"stopped by the study after epoch {epoch}", flush=True)
        break
    print(f"epoch {epoch} done", flush=True)
"""


@pytest.mark.parametrize("mode", ["per-trial", "workers"])
def test_a_script_reports_through_the_trial_api_and_stops_itself_when_pruned(
    tmp_path: Path, mode: str
) -> None:
    (tmp_path / "train.py").write_text(TRIAL_API_SCRIPT)
    document = _own_study(
        tmp_path,
        f"own-api-{mode}",
        {"command": ["{python}", "train.py"]},
        n_trials=2,
        max_concurrent=1,
        enqueue=[{"x": 1.0}, {"x": 0.1}],
    )
    study_file = write_study(tmp_path / "study.yaml", document)

    proc = run_hpo("launch", str(study_file), *(["--workers", "1"] if mode == "workers" else []), timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("warning:") == 0, proc.stderr  # parameters read through hpo.trial
    complete, pruned = load_trials(document)
    assert complete.state.name == "COMPLETE" and complete.value == pytest.approx(4.0)
    assert pruned.state.name == "PRUNED" and pruned.intermediate_values == {1: 0.1}
    # It stopped itself: its checkpoint holds the epoch it was pruned at, and no later one.
    [epoch_file] = (tmp_path / "work" / "trials").glob(f"own-api-{mode}-*/1/checkpoint/epoch")
    assert epoch_file.read_text() == "1"

    # Run by hand, outside the service, the same script runs on its defaults.
    alone = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("HPO_")},
    )
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.splitlines()[-1] == "epoch 4 done"
    assert (tmp_path / "alone-checkpoints" / "epoch").read_text() == "4"


OTHER_RANK_SCRIPT = r"""
import sys, time
from pathlib import Path
folder = Path(sys.argv[1])
while not (folder / "stop").exists():  # rank 0's answer, as torch.distributed would share it
    time.sleep(0.05)
time.sleep(1.0)  # the rest of its epoch, then the barrier that waits for rank 0
(folder / "stopped-by-itself").write_text("yes")
"""


@pytest.mark.parametrize("told", [True, False], ids=["hpo.trial script", "metric-line command"])
def test_a_ddp_ranks_command_stops_itself_when_rank_0s_script_was_told_and_is_stopped_otherwise(
    tmp_path: Path, told: bool
) -> None:
    # Seen on the local cluster (a 2-task trial-API job): rank 1's wrapper sent SIGTERM as soon as
    # rank 0 left the stop file, while rank 1's script, which had the same answer, was on its way
    # to the barrier; rank 0's barrier then failed with "Connection reset by peer".
    from hpo.config import load_study
    from hpo.paths import trial_dir
    from hpo.trial import command_objective

    (tmp_path / "rank.py").write_text(OTHER_RANK_SCRIPT)
    document = _own_study(tmp_path, "other-rank", {"command": ["{python}", "rank.py", "{trial_dir}"]})
    spec = load_study(write_study(tmp_path / "study.yaml", document))
    folder = trial_dir(spec, 0)
    folder.mkdir(parents=True)
    (folder / command_objective.STOP_FILE).write_text(command_objective.TOLD if told else "")

    result = command_objective.CommandObjective()(spec, 0, {"x": 1.0}, reporter=None)

    assert result.pruned
    # Told, it finished on its own within the grace (10 s); otherwise it was stopped at once.
    assert (folder / "stopped-by-itself").exists() == told


FUNCTION_MODULE = r"""
def objective(params, trial):
    for step in range(1, 5):
        if trial.report(step, params["x"] * step):
            return None
    return params["x"] * 4 + 0.5  # a final value that is not the last report
"""


def test_a_python_function_is_the_objective(tmp_path: Path) -> None:
    (tmp_path / "my_objective.py").write_text(FUNCTION_MODULE)
    document = _own_study(
        tmp_path,
        "own-function",
        {"function": "my_objective:objective"},
        n_trials=2,
        max_concurrent=1,
        enqueue=[{"x": 1.0}, {"x": 0.1}],
    )
    study_file = write_study(tmp_path / "study.yaml", document)

    proc = run_hpo("launch", str(study_file), timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    complete, pruned = load_trials(document)
    assert complete.state.name == "COMPLETE" and complete.value == pytest.approx(4.5)
    assert complete.intermediate_values == {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}
    assert pruned.state.name == "PRUNED" and pruned.intermediate_values == {1: 0.1}
    best = run_hpo("best", str(study_file))
    assert "call it: my_objective:objective({'x': 1.0}, trial)" in best.stdout, best.stdout


def test_a_matched_value_that_is_not_a_number_is_named_with_its_fix(tmp_path: Path) -> None:
    """A pattern whose value group reads more than the number: the trial's fail reason names the
    text it read and what to leave outside the group, instead of a bare "no metric reported"
    (the texts' cases, a lone ``-`` among them, in test_metric_lines.py). Two trials fail the same
    way, so the launch stops there and says it."""
    (tmp_path / "train.py").write_text("import sys\nprint('epoch 1 val_loss', sys.argv[1], flush=True)\n")
    printed = ["1.5e-05,", "tensor(0.0123)"]
    document = _own_study(
        tmp_path,
        "not-a-number",
        {"command": ["{python}", "train.py", "{printed}"], "metric_pattern": r"val_loss (?P<value>\S+)"},
        pruner={"name": "none"},
        n_trials=4,
        max_concurrent=2,
        enqueue=[{"x": 1.0, "printed": text} for text in printed],
    )
    document["search_space"]["printed"] = {"type": "categorical", "choices": printed}
    proc = run_hpo("launch", str(write_study(tmp_path / "study.yaml", document)), timeout=300)

    reasons = {t.params["printed"]: t.user_attrs.get("fail_reason") for t in load_trials(document)}
    said = "no metric reported: objective.metric_pattern matched, but its value group read"
    assert reasons == {
        "1.5e-05,": f"{said} '1.5e-05,', which is not a number; the number in it is '1.5e-05': "
        "leave ',' outside the value group",
        "tensor(0.0123)": f"{said} 'tensor(0.0123)', which is not a number; the number in it is '0.0123': "
        "leave 'tensor(' and ')' outside the value group",
    }, proc.stdout
    assert "stopping: trials 0 and 1 failed the same way" in proc.stdout, proc.stdout
    assert "objective.metric_pattern read no number from the command's output" in proc.stdout


@pytest.mark.parametrize("kind", ["command", "function"])
def test_a_stop_at_a_full_runs_last_step_completes_the_trial(tmp_path: Path, kind: str) -> None:
    """A pruner that says stop only once the run has reported its last step (objective.steps)
    would throw a finished run away; the trial completes, as the trainer's last epoch does."""
    (tmp_path / "my_objective.py").write_text(FUNCTION_MODULE)
    (tmp_path / "script.py").write_text(SCRIPT)
    objective = (
        {"function": "my_objective:objective"}
        if kind == "function"
        else {
            "command": [
                "{python}",
                "script.py",
                "--x",
                "{x}",
                "--tag",
                "last",
                "--out",
                str(tmp_path / "argv.json"),
            ],
            "metric_pattern": r"^epoch (?P<step>\d+) score (?P<value>[0-9.]+)",
        }
    )
    document = _own_study(tmp_path, f"last-step-{kind}", objective, n_trials=1, enqueue=[{"x": 1.0}])
    # Every report is under the threshold, but the pruner looks only from step 4, the last.
    document["study"]["pruner"] = {"name": "threshold", "options": {"lower": 100.0, "n_warmup_steps": 4}}
    study_file = write_study(tmp_path / "study.yaml", document)

    proc = run_hpo("launch", str(study_file), timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    [trial] = load_trials(document)
    assert trial.state.name == "COMPLETE", proc.stdout
    assert sorted(trial.intermediate_values) == [1, 2, 3, 4]
    assert trial.value == pytest.approx(4.5 if kind == "function" else 4.0)


def test_the_same_study_file_on_two_storages_keeps_their_trials_folders_apart(tmp_path: Path) -> None:
    """Trial 0 of the study on a second storage must not resume from the finished checkpoint of
    trial 0 on the first (the same workdir, the same trial numbers)."""
    (tmp_path / "train.py").write_text(TRIAL_API_SCRIPT)
    document = _own_study(
        tmp_path, "own-two-storages", {"command": ["{python}", "train.py"]}, n_trials=1, enqueue=[{"x": 1.0}]
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    first = run_hpo("launch", str(study_file), timeout=300)
    other = f"journal:{tmp_path}/other.journal"
    second = run_hpo("launch", str(study_file), "--storage", other, timeout=300)

    assert first.returncode == 0 and second.returncode == 0, first.stdout + second.stdout
    for storage in (None, other.removeprefix("journal:")):
        [trial] = load_trials(document) if storage is None else _journal_trials(document, storage)
        assert trial.state.name == "COMPLETE" and trial.intermediate_values == {
            1: 1.0,
            2: 2.0,
            3: 3.0,
            4: 4.0,
        }
    assert len(list((tmp_path / "work" / "trials").glob("own-two-storages-*/0/checkpoint/epoch"))) == 2


def _journal_trials(document: dict[str, Any], path: str) -> list[Any]:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(path))
    return optuna.load_study(study_name=document["study"]["name"], storage=storage).get_trials()


def test_a_retry_resumed_at_its_last_step_keeps_the_failed_trials_curve(tmp_path: Path) -> None:
    """A run that crashes after its last checkpoint is retried from it: the retry has nothing left
    to report, and takes the failed trial's curve and last value instead of failing again."""
    crash_once = tmp_path / "crashed-once"
    (tmp_path / "train.py").write_text(
        TRIAL_API_SCRIPT
        + f"from pathlib import Path\nif not Path({str(crash_once)!r}).exists():\n"
        + f"    Path({str(crash_once)!r}).touch()\n    sys.exit('crashed while saving its results')\n"
    )
    document = _own_study(
        tmp_path,
        "own-retry",
        {"command": ["{python}", "train.py"]},
        n_trials=1,
        max_retries=1,
        enqueue=[{"x": 1.0}],
    )
    proc = run_hpo("launch", str(write_study(tmp_path / "study.yaml", document)), timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    failed, retry = load_trials(document)
    assert failed.state.name == "FAIL" and failed.user_attrs["fail_reason"].endswith(
        "crashed while saving its results"
    )
    assert retry.user_attrs["retry_of"] == 0 and retry.state.name == "COMPLETE", retry.user_attrs
    assert retry.intermediate_values == failed.intermediate_values == {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}
    assert retry.value == 4.0


def test_the_trial_api_never_writes_a_report_into_a_descriptor_that_is_not_its_socket(tmp_path: Path) -> None:
    """A process started by the script (a launcher's worker) sees HPO_TRIAL_FD without the socket:
    the number may be another file's. The API adopts only a socket, and takes the variable away."""
    victim = tmp_path / "checkpoint.pt"
    victim.write_bytes(b"weights")
    code = (
        "import os, sys\n"
        f"fd = os.open({str(victim)!r}, os.O_RDWR)\n"
        "os.environ.update(HPO_TRIAL_FD=str(fd), HPO_TRIAL_KEY='3', HPO_TRIAL_NUMBER='3')\n"
        "from hpo import trial\n"
        "print(trial.report(1, 0.5), trial.number(), 'HPO_TRIAL_FD' in os.environ)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "3", "False"]
    assert victim.read_bytes() == b"weights"
