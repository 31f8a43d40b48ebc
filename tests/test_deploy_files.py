"""The Jean Zay files agree: one environment module line for the study, the resources profile and the
sbatch scripts (the trials run the launcher's python, so its venv must be made on that module), and
studies/resnet.yaml finds Jean Zay's shared ImageNet without IMAGENET_ROOT."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpo.config import load_study
from tests.conftest import REPO
from trainer.yamlfile import load_yaml_mapping

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`

STUDY = REPO / "studies" / "resnet.yaml"
PROFILE = REPO / "deploy" / "profiles" / "jean-zay.yaml"
SBATCH = [REPO / "deploy" / "slurm" / name for name in ("train-ddp.sbatch", "launcher.sbatch")]
# A command line of a shell script (not a comment), its trailing comment left out.
_MODULE_LINE = re.compile(r"^\s*(module\s+(?:load|purge)\b[^#]*?)\s*(?:#.*)?$")


def module_lines(path: Path) -> list[str]:
    """The `module ...` commands a file runs, in order, with single spaces."""
    if path.suffix == ".yaml":
        lines = [str(line) for line in load_yaml_mapping(path)["resources"]["setup"]]
    else:
        lines = [m.group(1) for m in map(_MODULE_LINE.match, path.read_text().splitlines()) if m]
    return [" ".join(line.split()) for line in lines if line.split()[:1] == ["module"]]


def test_the_module_lines_agree() -> None:
    found = {path.relative_to(REPO).as_posix(): module_lines(path) for path in [STUDY, PROFILE, *SBATCH]}
    expected = module_lines(STUDY)
    assert expected[0] == "module purge" and len(expected) == 2, expected
    assert expected[1].startswith("module load arch/a100 pytorch-gpu/"), expected  # constraint: a100
    assert all(lines == expected for lines in found.values()), found


def test_resnet_study_needs_no_imagenet_root_on_jean_zay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPO_STORAGE", f"journal:{tmp_path}/resnet.journal")
    monkeypatch.setenv("HPO_ACCOUNT", "abc@a100")
    monkeypatch.setenv("SCRATCH", str(tmp_path))
    monkeypatch.delenv("IMAGENET_ROOT", raising=False)
    spec = load_study(STUDY)
    assert spec.trainer["data_root"] is None  # the trainer's default, resolved on the compute node
    shared = tmp_path / "imagenet" / "RawImages"
    shared.mkdir(parents=True)
    monkeypatch.setenv("DSDIR", str(tmp_path))
    assert spec.trainer_config({}).resolved_data_root == str(shared)

    monkeypatch.setenv("IMAGENET_ROOT", str(tmp_path / "mine"))
    spec = load_study(STUDY)
    assert spec.trainer_config({}).resolved_data_root == str(tmp_path / "mine")
