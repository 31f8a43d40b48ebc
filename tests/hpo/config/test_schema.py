"""The study file's JSON schema (hpo.config.schema.json_schema, committed as docs/study.schema.json):
the shipped studies validate, unknown keys do not, and the committed file is the generated one."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from hpo.config.schema import json_schema
from trainer.yamlfile import load_yaml_mapping

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "docs" / "study.schema.json"
REGENERATE = (
    "python -c 'import json; from hpo.config.schema import json_schema; "
    "print(json.dumps(json_schema(), indent=2))' > docs/study.schema.json"
)
# studies/ also holds a trainer config (python -m trainer --config), which is no study file.
STUDIES = sorted(
    [p for p in (REPO / "studies").glob("*.yaml") if p.name != "trainer-fashion-mnist.yaml"]
    + list((REPO / "examples").glob("*/*.yaml"))
)


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = json_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def quickstart() -> dict[str, Any]:
    return copy.deepcopy(load_yaml_mapping(REPO / "studies" / "quickstart.yaml"))


def problems(validator: Draft202012Validator, document: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_the_committed_schema_is_the_generated_one() -> None:
    assert json.loads(COMMITTED.read_text()) == json_schema(), (
        f"{COMMITTED.relative_to(REPO)} is out of date; regenerate it: {REGENERATE}"
    )


def test_the_study_files_point_editors_at_the_schema() -> None:
    assert STUDIES
    for path in STUDIES:
        first = path.read_text().splitlines()[0]
        assert first == f"# yaml-language-server: $schema={os.path.relpath(COMMITTED, path.parent)}", path


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_study_file_validates(validator: Draft202012Validator, path: Path) -> None:
    assert problems(validator, load_yaml_mapping(path)) == []


@pytest.mark.parametrize(
    ("section", "key"),
    [
        (None, "searchspace"),
        ("study", "n_trial"),
        ("resources", "gpus"),
        ("launcher", "partitions"),
        ("trainer", "epoch"),
        ("trainer", "checkpoint_dir"),  # the service sets it for each trial
    ],
)
def test_an_unknown_key_is_rejected(validator: Draft202012Validator, section: str | None, key: str) -> None:
    document = quickstart()
    (document if section is None else document.setdefault(section, {}))[key] = 1
    found = problems(validator, document)
    assert found and all("Additional properties are not allowed" in p for p in found), found
    assert any(repr(key) in p for p in found), found


def test_an_unknown_key_of_a_parameter_is_rejected(validator: Draft202012Validator) -> None:
    document = quickstart()
    document["search_space"]["lr"]["lowest"] = 0.001
    assert problems(validator, document) == [
        "search_space.lr: Additional properties are not allowed ('lowest' was unexpected)"
    ]


@pytest.mark.parametrize("key", ["lrr", "seed", "num_workers", "checkpoint_dir"])
def test_a_search_space_key_must_be_a_tunable_trainer_key(validator: Draft202012Validator, key: str) -> None:
    document = quickstart()
    document["search_space"][key] = {"type": "int", "low": 1, "high": 4}
    found = problems(validator, document)
    assert len(found) == 1 and f"{key!r} is not one of" in found[0], found


def test_a_variable_may_stand_for_any_scalar(validator: Draft202012Validator) -> None:
    document = quickstart()
    document["study"]["n_trials"] = "${N_TRIALS:-20}"
    document["study"]["sampler"]["name"] = "${SAMPLER}"
    document["search_space"]["lr"]["log"] = "${LOG_LR:-true}"
    document["trainer"]["lr"] = "${LR}"
    assert problems(validator, document) == []
    document["study"]["n_trials"] = "twenty"
    assert len(problems(validator, document)) == 1


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("study", "n_trials", 0),
        ("study", "metric", "accuracy"),
        ("resources", "executor", ["slurm"]),
        ("trainer", "pct_start", 1.5),
        ("trainer", "batch_size", True),
        ("search_space", "lr", {"type": "uniform", "low": 0.01, "high": 1.0}),
    ],
)
def test_types_choices_and_bounds_are_those_of_the_keys(
    validator: Draft202012Validator, section: str, key: str, value: Any
) -> None:
    document = quickstart()
    document[section][key] = value
    found = problems(validator, document)
    assert len(found) == 1 and found[0].startswith(f"{section}.{key}"), found


def test_a_study_needs_a_name(validator: Draft202012Validator) -> None:
    document = quickstart()
    del document["study"]["name"]
    assert problems(validator, document) == ["study: 'name' is a required property"]
