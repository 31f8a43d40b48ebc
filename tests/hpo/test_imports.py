"""What the service's light paths import: torch costs seconds on every process that loads it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`


def test_the_cli_and_the_ray_modules_load_without_torch() -> None:
    # `hpo status` and friends, and every Ray worker that unpickles the trainable, load these.
    modules = (
        "hpo.cli, hpo.commands, hpo.record, hpo.observe.views, hpo.dispatch.ray.driver, "
        "hpo.dispatch.ray.cluster, hpo.dispatch.ray.population, hpo.dispatch.ray.optuna_search"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, {modules}; print(sorted(m for m in ('torch', 'ray') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
