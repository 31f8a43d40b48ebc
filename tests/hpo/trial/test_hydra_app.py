"""A Hydra app tuned unchanged (examples/hydra): each trial's values reach it as Hydra overrides
through placeholders inside command elements ("optimizer.lr={lr}"), and Hydra's own record of the
run (.hydra/ in the trial's folder) holds exactly the trial's parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.hpo.helpers import REPO, load_trials, run_hpo

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "hydra" / "study.yaml"


def test_a_hydra_app_gets_each_trials_values_as_its_overrides(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    sets = [f"study.workdir={workdir}", "study.n_trials=3"]
    proc = run_hpo("launch", str(EXAMPLE), *(arg for s in sets for arg in ("--set", s)), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    document = yaml.safe_load(EXAMPLE.read_text())
    document["study"]["workdir"] = str(workdir)
    trials = load_trials(document)
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" for t in trials), proc.stdout
    for trial in trials:
        [record] = workdir.glob(f"trials/*/{trial.number}/hydra/.hydra/overrides.yaml")
        overrides = dict(line.split("=", 1) for line in yaml.safe_load(record.read_text()))
        assert float(overrides["optimizer.lr"]) == trial.params["lr"], overrides
        assert float(overrides["optimizer.weight_decay"]) == trial.params["weight_decay"], overrides
        assert int(overrides["data.batch_size"]) == trial.params["batch_size"], overrides
        assert trial.intermediate_values.keys() == {1, 2, 3}  # each printed epoch was a report


@pytest.mark.fast
def test_the_hydra_page_shows_the_example_study_file() -> None:
    page = (REPO / "docs" / "hydra.md").read_text()
    shown = yaml.safe_load(page.split("```yaml\n")[1].split("```")[0])
    example = yaml.safe_load(EXAMPLE.read_text())
    for section in ("search_space", "objective"):
        assert shown[section] == example[section], section
    assert shown["study"] == example["study"]
