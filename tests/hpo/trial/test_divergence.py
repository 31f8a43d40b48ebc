"""A trial whose metric turns NaN or infinite ends DIVERGED (stored PRUNED with its reason and the
step it diverged at), its finite values kept as its curve; it is never the best, never retried,
never taken for a set-up mistake, and the launch runs its whole budget.

The probe scripts are the ones a high learning rate produces: a good value then inf/nan, only
non-finite values, a NaN through the ``hpo.trial`` API, the program's own "loss is nan" exit; each
minimized and maximized, as local processes and as Slurm jobs, and on the Ray backend.
"""

from __future__ import annotations

import io
import json
import math
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo import record
from hpo.trial import command_objective
from hpo.trial.objective import TrialDiverged, check_finite
from tests.hpo.helpers import load_trials, run_hpo, score_study, write_study

# The trial with x above 1.5 diverges in the way --mode says; the others print x * epoch.
SCRIPT = r"""
import argparse, sys
from hpo import trial
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float, required=True)
parser.add_argument("--mode", required=True)
args = parser.parse_args()
good = args.x <= 1.5
for epoch in range(1, 5):
    value = args.x * epoch
    if args.mode == "after-good" and not good and epoch > 1:
        value = float("inf") if epoch == 2 else float("nan")
    if args.mode == "only-nan" and not good:
        value = float("nan")
    if args.mode == "api":
        if trial.report(epoch, value if good or epoch < 3 else float("nan")):
            sys.exit(0)
        continue
    if args.mode == "exits" and not good and epoch == 2:
        sys.exit("RuntimeError: loss is nan")
    print(f"epoch {epoch} metric {value}", flush=True)
"""
PATTERN = r"^epoch (?P<step>\d+) metric (?P<value>\S+)$"
# The value group a user copies from a tutorial: it matches neither "inf" nor "nan".
NARROW_PATTERN = r"^epoch (?P<step>\d+) metric (?P<value>[0-9.]+)"
DIVERGED_AT = {"after-good": 2, "only-nan": 1, "api": 3, "exits": 2}


def _study(
    tmp_path: Path, mode: str, direction: str, executor: str, pattern: str = PATTERN, **study: Any
) -> tuple[dict[str, Any], Path]:
    (tmp_path / "train.py").write_text(SCRIPT)
    document = score_study(
        tmp_path,
        f"div-{uuid.uuid4().hex[:6]}",
        {
            "command": ["{python}", "train.py", "--x", "{x}", "--mode", mode],
            **({} if mode == "api" else {"metric_pattern": pattern}),
            "steps": 4,
        },
        **{"n_trials": 3, "max_concurrent": 3, "max_retries": 1, "direction": direction, **study},
        # The diverging trial would be the best of both directions by its first value.
        enqueue=[{"x": 1.0}, {"x": 1.9}, {"x": 0.6}],
    )
    document["resources"] = {"executor": executor, "time": "5m", "cpus_per_task": 1}
    return document, write_study(tmp_path / "study.yaml", document)


def _assert_diverged(document: dict[str, Any], mode: str, direction: str, proc: Any) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = {t.params["x"]: t for t in load_trials(document)}
    assert sorted(trials) == [0.6, 1.0, 1.9], [(t.number, t.params) for t in trials.values()]  # none retried
    diverged = trials[1.9]
    step = DIVERGED_AT[mode]
    assert diverged.state == optuna.trial.TrialState.PRUNED, diverged.state
    assert diverged.user_attrs[record.ATTR_DIVERGED_AT] == step, diverged.user_attrs
    reason = diverged.user_attrs[record.ATTR_FAIL_REASON]
    assert reason.startswith(f"diverged at step {step}: "), reason
    # Its finite values are its curve; nothing non-finite is stored.
    assert diverged.intermediate_values == {s: 1.9 * s for s in range(1, step)}, diverged.intermediate_values
    if document["study"].get("backend") != "ray":  # the Ray driver logs Tune's own table
        assert f"trial {diverged.number} DIVERGED: diverged at step {step}" in proc.stdout, proc.stdout
    assert "failed the same way" not in proc.stdout + proc.stderr
    assert "objective.steps" not in proc.stdout  # no advice about the steps: it diverged
    best = 1.0 if direction == "maximize" else 0.6
    assert [t.state.name for t in trials.values() if t.params["x"] != 1.9] == ["COMPLETE", "COMPLETE"]
    shown = run_hpo("best", str(Path(document["study"]["workdir"]).parent / "study.yaml"))
    assert shown.returncode == 0 and f"x={best}" in shown.stdout.replace(f"x={best:.4g}", f"x={best}"), (
        shown.stdout
    )
    status = run_hpo("status", str(Path(document["study"]["workdir"]).parent / "study.yaml"))
    assert "1 DIVERGED" in status.stdout and f"[diverged at step {step}" in status.stdout, status.stdout
    # The same in the machine-readable view: the state by its one name, strict JSON.
    as_json = run_hpo("status", str(Path(document["study"]["workdir"]).parent / "study.yaml"), "--json")
    rows = json.loads(as_json.stdout, parse_constant=lambda name: pytest.fail(f"{name} in --json"))[
        "trial_list"
    ]
    [row] = [row for row in rows if row["state"] == "DIVERGED"]
    assert row["params"] == {"x": 1.9} and row["fail_reason"] == reason, row


@pytest.mark.parametrize(
    ("mode", "direction", "pattern"),
    [
        ("after-good", "minimize", PATTERN),
        ("only-nan", "maximize", PATTERN),
        ("api", "maximize", PATTERN),
        ("exits", "minimize", PATTERN),
        # Its last good value would be the best: the inf and nan its value group misses count.
        ("after-good", "maximize", NARROW_PATTERN),
    ],
    ids=["after-good", "only-nan", "api", "exits", "after-good-narrow-pattern"],
)
def test_a_diverging_trial_of_a_local_study_is_diverged_never_the_best(
    tmp_path: Path, mode: str, direction: str, pattern: str
) -> None:
    document, study_file = _study(tmp_path, mode, direction, "local", pattern)
    proc = run_hpo("launch", str(study_file), timeout=300)
    _assert_diverged(document, mode, direction, proc)
    if pattern == NARROW_PATTERN:
        trial = next(t for t in load_trials(document) if t.params["x"] == 1.9)
        log = run_hpo("logs", str(study_file), str(trial.number))
        assert "objective.metric_pattern's value group does not match 'inf'" in log.stdout, log.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "direction"),
    [("after-good", "maximize"), ("only-nan", "minimize"), ("api", "minimize"), ("exits", "maximize")],
)
def test_a_diverging_trial_of_a_slurm_study_is_diverged_never_the_best(
    tmp_path: Path, local_cluster: str, mode: str, direction: str
) -> None:
    document, study_file = _study(tmp_path, mode, direction, "slurm")
    _assert_diverged(document, mode, direction, run_hpo("launch", str(study_file), timeout=600))


@pytest.mark.parametrize(("mode", "direction"), [("after-good", "minimize"), ("exits", "maximize")])
def test_a_diverging_trial_of_a_ray_study_is_diverged_never_the_best(
    tmp_path: Path, mode: str, direction: str
) -> None:
    # With a retry allowed: the program's own "loss is nan" exit is DIVERGED, never retried by Tune.
    document, study_file = _study(tmp_path, mode, direction, "local", backend="ray")
    _assert_diverged(document, mode, direction, run_hpo("launch", str(study_file), timeout=600))


@pytest.mark.fast
def test_a_non_finite_report_is_a_divergence_and_a_bad_value_one_clear_error() -> None:
    check_finite(3, {"val_loss": 0.5, "train_loss": 1.0})
    with pytest.raises(TrialDiverged, match=r"^diverged at step 3: train_loss=nan$"):
        check_finite(3, {"val_loss": 0.5, "train_loss": math.nan})
    from hpo.trial import client

    by_hand = client.Trial(key=None, number=None, params={}, checkpoint_dir=None, ask=None)
    asked: list[tuple[int, float]] = []
    in_study = client.Trial(
        key="0", number=0, params={}, checkpoint_dir=None, ask=lambda s, v, m: bool(asked.append((s, v)))
    )
    for trial in (by_hand, in_study):
        with pytest.raises(TypeError, match=r"^hpo.trial.report: value must be a number, got 'abc'$"):
            trial.report(1, "abc")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"step must be an integer, got 'x'"):
            trial.report("x", 0.5)  # type: ignore[arg-type]
        assert trial.report(2, math.nan) is False  # the study, not the call, decides on NaN
    assert len(asked) == 1 and asked[0][0] == 2 and math.isnan(asked[0][1])


# Two matches on one line (the first counts) and a step printed twice (the first value counts).
REPEATS = r"""
print("epoch 1 metric 0.5 | epoch 1 metric 0.9", flush=True)
print("epoch 2 metric 0.6", flush=True)
print("epoch 2 metric 0.7", flush=True)
print("epoch 3 metric 0.8 | epoch 3 metric 0.1", flush=True)
"""


def test_a_report_the_study_does_not_take_gets_one_warning_line_per_kind(tmp_path: Path) -> None:
    (tmp_path / "repeats.py").write_text(REPEATS)
    document = score_study(
        tmp_path,
        f"rep-{uuid.uuid4().hex[:6]}",
        {
            "command": ["{python}", "repeats.py"],
            "metric_pattern": r"epoch (?P<step>\d+) metric (?P<value>\S+)",
            "steps": 3,
        },
        n_trials=1,
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    assert run_hpo("launch", str(study_file), timeout=300).returncode == 0
    [trial] = load_trials(document)
    assert trial.intermediate_values == {1: 0.5, 2: 0.6, 3: 0.8}
    log = run_hpo("logs", str(study_file), "0").stdout
    warnings = [line for line in log.splitlines() if line.startswith("hpo: warning: ")]
    assert len(warnings) == 2, log
    assert "matched this line more than once; the first match counts" in warnings[0]
    assert "step 2 was reported again (0.6, then 0.7); the study keeps the first value" in warnings[1]


class _YieldingStream(io.StringIO):
    """A log whose every write lets another thread run first, as a flush to a file can."""

    def write(self, text: str) -> int:
        time.sleep(0)
        return super().write(text)


def test_lines_written_from_two_threads_into_one_log_stay_whole() -> None:
    # The command's output is echoed by reader threads while the main thread writes the warnings
    # and reports; with print's two writes (text, then newline), a warning landed inside a line.
    log = _YieldingStream()

    def write(tag: str) -> None:
        for i in range(1000):
            command_objective._log_line(f"{tag} {i}", log)

    threads = [threading.Thread(target=write, args=(tag,)) for tag in ("epoch", "hpo: warning:")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2000
    assert all(re.fullmatch(r"(epoch|hpo: warning:) \d+", line) for line in lines), lines[:5]
