"""Jean Zay's shared ImageNet: with no data_root, imagefolder and imagenet read $DSDIR/imagenet/RawImages
where DSDIR is set and that folder exists; otherwise the one-line error asks for data_root."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.config.loading import load_study
from hpo.errors import StudyFileError
from hpo.executors.this_machine import check_local_data
from trainer.config import TrainConfig
from trainer.errors import ConfigError
from trainer.sources import check_data_available


def shared_imagenet(dsdir: Path) -> Path:
    """The layout of Jean Zay's copy: train/ and val/, one folder per class in each."""
    root = dsdir / "imagenet" / "RawImages"
    for split in ("train", "val"):
        (root / split / "n01440764").mkdir(parents=True)
    return root


@pytest.mark.parametrize("dataset", ["imagefolder", "imagenet"])
def test_dsdir_is_the_default_data_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dataset: str
) -> None:
    root = shared_imagenet(tmp_path)
    monkeypatch.setenv("DSDIR", str(tmp_path))
    config = TrainConfig.from_mapping({"dataset": dataset})
    assert config.resolved_data_root == str(root)
    check_data_available(config)
    assert config.data_root is None  # resolved where the run reads it, not stored in the config


def test_a_given_data_root_wins_over_dsdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared_imagenet(tmp_path)
    monkeypatch.setenv("DSDIR", str(tmp_path))
    mine = tmp_path / "mine"
    assert TrainConfig(dataset="imagefolder", data_root=str(mine)).resolved_data_root == str(mine)
    assert TrainConfig(dataset="fashion-mnist").resolved_data_root == "/usr/share/datasets/fashion-mnist"


def test_without_dsdir_data_root_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSDIR", raising=False)
    config = TrainConfig(dataset="imagefolder")
    assert config.resolved_data_root is None
    with pytest.raises(ConfigError) as caught:
        check_data_available(config)
    message = str(caught.value)
    assert message.startswith("data_root is required for dataset 'imagefolder'")
    assert "$DSDIR/imagenet/RawImages" in message and "DSDIR is not set" in message
    assert "\n" not in message


def test_dsdir_without_imagenet_is_no_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSDIR", str(tmp_path))  # set, but holds no imagenet/RawImages
    config = TrainConfig(dataset="imagenet")
    assert config.resolved_data_root is None
    with pytest.raises(ConfigError, match="data_root is required for dataset 'imagenet'") as caught:
        check_data_available(config)
    assert f"{tmp_path}/imagenet/RawImages does not exist" in str(caught.value)


def test_local_trials_on_synthetic_data_need_no_data_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Synthetic images are generated, so the launch's data check asks for no folder (a GPU node
    with no dataset installed runs the GPU check on them); a real dataset still needs one."""
    monkeypatch.delenv("DSDIR", raising=False)
    study = tmp_path / "study.yaml"
    for dataset, refused in (("synthetic", False), ("imagefolder", True)):
        study.write_text(
            f"study: {{name: data, workdir: {tmp_path / 'work'}}}\n"
            "search_space: {lr: {type: float, low: 0.01, high: 0.1}}\n"
            f"trainer: {{dataset: {dataset}}}\nresources: {{executor: local}}\n"
        )
        spec = load_study(study)
        if refused:
            with pytest.raises(
                StudyFileError, match=r"trainer.data_root: is required for dataset 'imagefolder'"
            ):
                check_local_data(spec)
        else:
            check_local_data(spec)
