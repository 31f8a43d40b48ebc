"""A metric is shown as it is stored: values from 1e-8 to 1e4, some a few parts per hundred apart,
read back from every view (the launch's lines, `hpo status`, `hpo best`, `hpo studies` and the
report), each value the same text everywhere and no two values alike. One real study of the user's
own torch-free objective, which returns the value its one (categorical) parameter names: the views
are the subject."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hpo
from tests.hpo.helpers import run_hpo, score_study, write_study

pytestmark = pytest.mark.slow

# The stored value -> the one text every view must show for it. 4 fixed decimals showed the first
# five as 0.0000 or 0.0001, and the two accuracies as 0.7148.
SHOWN = {
    1e-08: "1e-08",
    2.3e-05: "2.3e-05",
    2.6e-05: "2.6e-05",
    7.7e-05: "7.7e-05",
    1.2e-04: "0.00012",
    0.714815: "0.714815",
    0.71482: "0.71482",
    1e4: "10000",
}


def test_every_view_tells_close_small_and_large_values_apart(tmp_path: Path) -> None:
    values = {f"v{number}": value for number, value in enumerate(SHOWN)}
    (tmp_path / "values.py").write_text(
        f"def objective(params, trial):\n    return {values!r}[params['name']]\n"
    )
    document = score_study(
        tmp_path,
        "numbers",
        {"function": "values:objective", "steps": 1},
        direction="minimize",
        n_trials=len(SHOWN),
        max_concurrent=4,
        enqueue=[{"name": name} for name in values],
    )
    # Each value a choice of its own: a float parameter's near-copies would not all run.
    document["search_space"] = {"name": {"type": "categorical", "choices": list(values)}}
    study_file = str(write_study(tmp_path / "study.yaml", document))
    launch = run_hpo("launch", study_file)
    assert launch.returncode == 0, launch.stdout + launch.stderr
    ended = [
        line.split("score=")[1].split()[0] for line in launch.stdout.splitlines() if " COMPLETE: " in line
    ]
    assert sorted(ended) == sorted(SHOWN.values()), launch.stdout
    assert "best trial 0: value=1e-08 " in launch.stdout, launch.stdout

    # `hpo status`: the value column of each trial's row (trial i ran the i-th enqueued value).
    status = run_hpo("status", study_file)
    assert status.returncode == 0, status.stderr
    assert _value_column(status.stdout) == dict(enumerate(SHOWN.values())), status.stdout

    best = run_hpo("best", study_file)
    assert best.returncode == 0, best.stderr
    assert "best trial 0: score=1e-08 " in best.stdout, best.stdout

    listed = run_hpo("studies", "--storage", f"journal:{tmp_path / 'work' / 'optuna.journal'}")
    [line] = [line for line in listed.stdout.splitlines() if line.startswith("numbers ")]
    assert " 1e-08 (trial 0) " in line, listed.stdout

    report = run_hpo("report", study_file, "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stdout + report.stderr
    page = (tmp_path / "report" / "index.html").read_text()
    assert "best trial 0: score=1e-08 " in page
    trials_table = page.split('<h2 id="trials">')[1]
    assert _value_column(trials_table) == dict(enumerate(SHOWN.values())), trials_table
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["best"]["value"] == 1e-08  # the stored value itself, not its text

    # The machine-readable views hold the stored floats themselves.
    listed_json = run_hpo("status", study_file, "--json")
    assert listed_json.returncode == 0, listed_json.stderr
    document = json.loads(listed_json.stdout)
    assert document["format"] == 1 and document["states"] == {"COMPLETE": len(SHOWN)}
    assert {t["number"]: t["value"] for t in document["trial_list"]} == dict(enumerate(SHOWN))
    assert all(t["params"] == {"name": f"v{t['number']}"} and t["job_id"] for t in document["trial_list"])
    best_json = json.loads(run_hpo("best", study_file, "--json").stdout)
    assert best_json["best"]["number"] == 0 and best_json["best"]["value"] == 1e-08
    assert best_json["best"]["command"] == "values:objective({'name': 'v0'}, trial)"
    # From a notebook: the study file opens the stored study as Optuna's own.
    study = hpo.open_study(study_file)
    assert sorted(study.trials_dataframe()["value_score"]) == sorted(SHOWN)  # named after the metric


def _value_column(table: str) -> dict[int, str]:
    """Trial number -> the value column of the status table's rows (its fourth column)."""
    return {
        int(cells[0]): cells[3]
        for cells in (line.split() for line in table.splitlines())
        if len(cells) > 3 and cells[0].isdigit() and cells[1] == "COMPLETE"
    }
