"""``python -m trainer``: dlojz-style flags, an optional ``--config FILE.yaml``, DDP under srun.

Every config field has a flag (``weight_decay`` -> ``--weight-decay``), generated from the
dataclass so that the two cannot drift apart; dlojz's short names (``--wd``, ``--mom``,
``--image_size``, ``-b``, ``-e``) are aliases. Flags override the file.

``--tune-loader`` trains nothing: it measures the training DataLoader of the same config over a grid
of loader settings and prints a recommendation (``trainer.loader_sweep``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from trainer import loader_sweep
from trainer.config import TrainConfig, field_types, unwrap_optional
from trainer.errors import ConfigError, TrialOutOfMemory
from trainer.sources import check_data_available
from trainer.yamlfile import load_yaml_mapping

# Options of the command itself, not config keys.
COMMAND_OPTIONS = ("config", "result_json", "tune_loader", "tune_loader_batches")

EXIT_BAD_INPUT = 2
EXIT_OUT_OF_MEMORY = 3

ALIASES = {
    "batch_size": ["-b"],
    "epochs": ["-e"],
    "weight_decay": ["--wd"],
    "momentum": ["--mom"],
    "image_size": ["--image_size"],
}


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags end with one line and exit status 2, not argparse's usage block (``hpo`` uses it too)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _optional(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "null") else convert(text)

    parse.__name__ = convert.__name__  # argparse names the type in its error message
    return parse


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m trainer",
        description="Train a ResNet (AMP, channels_last, DDP under srun or torchrun) and print the result.",
    )
    parser.add_argument("--config", type=Path, help="YAML file of config keys; flags override it.")
    parser.add_argument("--result-json", type=Path, help="Also write the result to this JSON file.")
    parser.add_argument(
        "--tune-loader",
        action="store_true",
        help="Train nothing: measure the training DataLoader's images/s over num_workers, "
        "prefetch_factor, persistent_workers and pin_memory, and print the fastest cheap setting.",
    )
    parser.add_argument(
        "--tune-loader-batches",
        type=_at_least(2),
        metavar="N",
        help="With --tune-loader: batches read per pass, 2 passes per setting "
        f"(default: {loader_sweep.DEFAULT_BATCHES_PER_PASS}).",
    )
    types = field_types()
    for field in dataclasses.fields(TrainConfig):
        flags = ["--" + field.name.replace("_", "-"), *ALIASES.get(field.name, [])]
        base, optional = unwrap_optional(types[field.name])
        help_text = f"{field.metadata['help']} (default: {field.default})"
        if base is bool:
            parser.add_argument(
                *flags,
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        convert: Callable[[str], Any] = _optional(base) if optional else base
        parser.add_argument(*flags, dest=field.name, type=convert, default=argparse.SUPPRESS, help=help_text)
    return parser


def parse_config(argv: Sequence[str] | None = None) -> tuple[TrainConfig, argparse.Namespace]:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k not in COMMAND_OPTIONS}
    if args.config is not None:
        values = load_yaml_mapping(args.config)
        values.update(overrides)
        return TrainConfig.from_mapping(values, source=str(args.config)), args
    return TrainConfig.from_mapping(overrides), args


def _check_writable(path: Path) -> None:
    """Found out before training, not after it, that the result could not be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--result-json {str(path)!r}: {err.strerror or err}") from None
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"--result-json {str(path)!r}: Permission denied")


def _check_writable_folder(flag: str, folder: Path) -> None:
    """A trace or event folder that cannot be written is found out before training."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{flag} {str(folder)!r}: {err.strerror or err}") from None
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"{flag} {str(folder)!r}: Permission denied")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[trainer] %(message)s", stream=sys.stdout, force=True)
    try:
        config, args = parse_config(argv)
        check_data_available(config)
        if args.result_json is not None:
            _check_writable(args.result_json)
        for flag, folder in (
            ("--profile-dir", config.profile_dir),
            ("--tensorboard-dir", config.tensorboard_dir),
        ):
            if folder is not None:
                _check_writable_folder(flag, Path(folder))
        if args.tune_loader_batches is not None and not args.tune_loader:
            raise ConfigError("--tune-loader-batches needs --tune-loader")
        if args.tune_loader:
            batches = args.tune_loader_batches or loader_sweep.DEFAULT_BATCHES_PER_PASS
            loader_sweep.run(config, batches, args.result_json)
            return 0
        # Imported here: torch takes seconds to import, and bad input should be reported at once.
        from trainer import distributed
        from trainer.loop import train

        result = train(config)
    except ConfigError as err:
        print(f"python -m trainer: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TrialOutOfMemory as err:
        print(f"python -m trainer: error: {err}", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    if not distributed.detect().is_main:
        return 0
    summary = result.to_dict()
    summary.pop("history")
    print("result: " + json.dumps(summary), flush=True)
    if args.result_json is not None:
        args.result_json.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return 0
