"""One vocabulary of end states in every view: a study holding a trial of each state (COMPLETE,
PRUNED, DIVERGED, INFEASIBLE, FAIL) is named the same by the launcher's closing line, `hpo status`
(its header and its rows), `hpo studies`, the report (trials.csv and summary.json) and the trials'
user attributes that optuna-dashboard shows."""

from __future__ import annotations

import csv
import json
import re
import uuid
from collections import Counter
from pathlib import Path

import pytest

from hpo import record
from tests.hpo.helpers import load_trials, run_hpo, score_study, write_study

# Each enqueued `kind` ends its trial one way; the threshold pruner stops the one below 0.5.
OBJECTIVE = """
import math

def objective(params, trial):
    kind = params["kind"]
    first = {"complete": 0.9, "prune": 0.1, "diverge": 0.8, "oom": 0.7, "fail": 0.6}[kind]
    if trial.report(1, first):
        return None
    if kind == "oom":
        raise MemoryError("out of memory allocating the activations")
    if kind == "fail":
        raise ValueError("the loader found an empty shard")
    value = math.nan if kind == "diverge" else 0.95
    trial.report(2, value)
    return value
"""
KINDS = {
    "complete": "COMPLETE",
    "prune": "PRUNED",
    "diverge": "DIVERGED",
    "oom": "INFEASIBLE",
    "fail": "FAIL",
}


@pytest.mark.slow
def test_every_view_names_each_end_state_the_same(tmp_path: Path) -> None:
    (tmp_path / "kinds.py").write_text(OBJECTIVE)
    document = score_study(
        tmp_path,
        f"states-{uuid.uuid4().hex[:6]}",
        {"function": "kinds:objective", "steps": 2},
        n_trials=5,
        max_concurrent=1,
        max_retries=0,
        pruner={"name": "threshold", "options": {"lower": 0.5}},
        enqueue=[{"kind": kind} for kind in KINDS],
    )
    document["search_space"] = {"kind": {"type": "categorical", "choices": list(KINDS)}}
    study_file = write_study(tmp_path / "study.yaml", document)
    launched = run_hpo("launch", str(study_file))
    assert launched.returncode == 0, launched.stdout + launched.stderr

    trials = load_trials(document)
    expected = {t.number: KINDS[t.params["kind"]] for t in trials}
    assert sorted(expected.values()) == sorted(KINDS.values()), expected
    assert {t.number: record.shown_state(t) for t in trials} == expected
    in_words = ", ".join(f"1 {state}" for state in sorted(KINDS.values()))

    # The launcher's closing line.
    assert f"trials: {in_words}" in launched.stdout, launched.stdout
    # hpo status: its header and each trial's row.
    status = run_hpo("status", str(study_file))
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0].endswith(f"5 of 5 trials; {in_words}"), status.stdout
    for number, state in expected.items():
        assert re.search(rf"^{number}\s+{state}\s", status.stdout, re.M), (number, state, status.stdout)
    # hpo studies (the study's line, found through the registry of launched studies).
    listed = run_hpo("studies")
    assert listed.returncode == 0, listed.stderr
    [line] = [line for line in listed.stdout.splitlines() if document["study"]["name"] in line]
    assert in_words in line, line
    # The report: trials.csv's state column and summary.json's counts.
    out = tmp_path / "report"
    report = run_hpo("report", str(study_file), "--out", str(out))
    assert report.returncode == 0, report.stderr
    with (out / "trials.csv").open() as rows:
        assert {int(row["number"]): row["state"] for row in csv.DictReader(rows)} == expected
    assert json.loads((out / "summary.json").read_text())["states"] == dict(Counter(expected.values()))
    # optuna-dashboard shows Optuna's state (PRUNED, COMPLETE) beside the trial's user attributes.
    for trial in trials:
        if expected[trial.number] in ("DIVERGED", "INFEASIBLE"):
            assert trial.user_attrs[record.ATTR_STATE] == expected[trial.number], trial.user_attrs
