"""The `hpo` console script, as installed by `pip install -e .`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hpo

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`

HPO = str(Path(sys.executable).parent / "hpo")


def test_console_script_reports_its_version() -> None:
    proc = subprocess.run([HPO, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"hpo {hpo.__version__}"


def test_train_forwards_to_the_trainer_with_its_error_handling() -> None:
    proc = subprocess.run([HPO, "train", "--pct-start", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "python -m trainer: error: pct_start must be in (0, 1), got 0.0"


def test_unknown_command_is_rejected() -> None:
    proc = subprocess.run([HPO, "lunch"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "invalid choice: 'lunch'" in proc.stderr


def test_schema_prints_the_study_files_json_schema() -> None:
    from hpo.config.schema import json_schema

    proc = subprocess.run([HPO, "schema"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json_schema()
    assert json_schema()["additionalProperties"] is False
