"""Validation of the trainer's configuration, from Python, YAML and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_trainer_cli
from trainer.config import TrainConfig, field_names
from trainer.errors import ConfigError
from trainer.sources import check_data_available


def test_defaults_are_valid_and_every_field_is_documented() -> None:
    config = TrainConfig()
    assert config.resolved_image_size == 28
    import dataclasses

    for field in dataclasses.fields(TrainConfig):
        assert field.metadata.get("help"), f"{field.name} has no help text"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"model": "resnet9000"}, "model must be one of resnet18, "),
        (
            {"dataset": "cifar10"},
            "dataset must be one of fashion-mnist, imagefolder, imagenet, synthetic; got 'cifar10'",
        ),
        ({"batch_size": 0}, "batch_size must be > 0, got 0"),
        ({"batch_size": -8}, "batch_size must be > 0, got -8"),
        ({"lr": 0.0}, "lr must be > 0, got 0.0"),
        ({"lr": -0.1}, "lr must be > 0, got -0.1"),
        ({"pct_start": 1.0}, "pct_start must be in (0, 1), got 1.0"),
        ({"pct_start": 0}, "pct_start must be in (0, 1), got 0.0"),
        ({"momentum": 1.0}, "momentum must be in [0, 1), got 1.0"),
        ({"weight_decay": -1e-4}, "weight_decay must be >= 0, got -0.0001"),
        ({"amp": "fp8"}, "amp must be one of auto, off, fp16, bf16; got 'fp8'"),
        ({"train_fraction": 1.5}, "train_fraction must be in (0, 1], got 1.5"),
        ({"batch_size": True}, "batch_size must be a int, got True"),
        ({"lr": "fast"}, "lr must be a float, got 'fast'"),
        ({"width": 32, "model": "resnet50"}, "width applies to the CIFAR-style models"),
        ({"learning_rate": 0.1}, "unknown key 'learning_rate'; valid keys: model, width, dataset,"),
    ],
)
def test_invalid_values_are_rejected_naming_the_field(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_mapping(values)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_ints_are_accepted_for_floats() -> None:
    config = TrainConfig.from_mapping({"lr": 1, "weight_decay": 0})
    assert isinstance(config.lr, float) and config.lr == 1.0


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    bad_key = tmp_path / "bad_key.yaml"
    bad_key.write_text("lr: 0.1\nbatchsize: 64\n")
    with pytest.raises(ConfigError, match=rf"^{bad_key}: unknown key 'batchsize'; valid keys: "):
        TrainConfig.from_yaml(bad_key)
    bad_value = tmp_path / "bad_value.yaml"
    bad_value.write_text("pct_start: 2\n")
    with pytest.raises(ConfigError, match=rf"^{bad_value}: pct_start must be in \(0, 1\), got 2.0$"):
        TrainConfig.from_yaml(bad_value)
    not_yaml = tmp_path / "broken.yaml"
    not_yaml.write_text("lr: [0.1\n")
    with pytest.raises(ConfigError, match=rf"^{not_yaml}: not valid YAML"):
        TrainConfig.from_yaml(not_yaml)
    with pytest.raises(ConfigError, match="cannot read config file"):
        TrainConfig.from_yaml(tmp_path / "missing.yaml")


def test_yaml_floats_without_dot_or_exponent_sign_are_floats(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-3\nweight_decay: 5.0e-4\nfinal_div_factor: 1.0e4\ndiv_factor: 25\n")
    config = TrainConfig.from_yaml(path)
    assert (config.lr, config.weight_decay, config.final_div_factor, config.div_factor) == (
        1e-3,
        5e-4,
        1e4,
        25.0,
    )


def test_yaml_overrides_win(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model: resnet56\nlr: 0.4\n")
    config = TrainConfig.from_yaml(path, overrides={"lr": 0.05})
    assert (config.model, config.lr) == ("resnet56", 0.05)


def test_missing_dataset_root_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"data_root '{tmp_path}' does not hold Fashion-MNIST"):
        check_data_available(TrainConfig(data_root=str(tmp_path)))
    with pytest.raises(ConfigError, match="has no train/ folder"):
        check_data_available(TrainConfig(dataset="imagefolder", data_root=str(tmp_path)))
    with pytest.raises(ConfigError, match="data_root is required for dataset 'imagefolder'"):
        check_data_available(TrainConfig(dataset="imagefolder"))


def test_every_field_has_a_flag() -> None:
    from trainer.cli import build_parser

    options = {a.dest for a in build_parser()._actions}
    assert set(field_names()) <= options


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "resnet9000"], "model must be one of"),
        (["--dataset", "cifar10"], "dataset must be one of"),
        (["--batch-size", "0"], "batch_size must be > 0, got 0"),
        (["--lr", "-1"], "lr must be > 0, got -1.0"),
        (["--pct-start", "1.5"], "pct_start must be in (0, 1), got 1.5"),
        (
            ["--data-root", "/nonexistent/fmnist"],
            "data_root '/nonexistent/fmnist' does not hold Fashion-MNIST",
        ),
        (["--config", "/nonexistent/run.yaml"], "/nonexistent/run.yaml: cannot read config file"),
        (["--batch-size", "many"], "argument --batch-size/-b: invalid int value: 'many'"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_status_2(args: list[str], message: str) -> None:
    proc = run_trainer_cli(*args, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


def test_cli_config_file_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "trial.yaml"
    path.write_text("model: resnet20\nlearning_rate: 0.1\n")
    proc = run_trainer_cli("--config", str(path), timeout=120)
    assert proc.returncode == 2
    assert f"{path}: unknown key 'learning_rate'; valid keys:" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_rejects_an_unwritable_result_path_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_trainer_cli("--result-json", str(blocker / "result.json"), timeout=120)
    assert proc.returncode == 2
    assert f"--result-json '{blocker}/result.json': File exists" in proc.stderr
    assert "training" not in proc.stdout


def test_config_file_keys_must_be_names(tmp_path: Path) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text("1: 2\nlr: 0.1\n")
    with pytest.raises(ConfigError, match=rf"^{path}: keys must be names, got 1$"):
        TrainConfig.from_yaml(path)
