"""A storage that cannot be opened, in the launch registry's way (hpo.launch_history): a launch that
fails to open its storage is not recorded, so the commands after it keep the study of the last
launch that worked, and `hpo studies` lists every study it can reach with one line for each
recorded storage it cannot (which, masked, and why), on a real PostgreSQL beside a dead port."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.hpo.helpers import HPO, fault_line, score_study, sleeping_objective, write_study

DEAD = "postgresql://nobody@127.0.0.1:1/none"  # nothing listens on port 1: connection refused


def _hpo(*args: str, cwd: Path, state: Path) -> subprocess.CompletedProcess[str]:
    """`hpo ARGS` run in ``cwd``, with its own launch registry under ``state`` (XDG_STATE_HOME)."""
    env = {**os.environ, "XDG_STATE_HOME": str(state), "OMP_NUM_THREADS": "1"}
    return subprocess.run([HPO, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _study_file(tmp_path: Path, name: str) -> Path:
    (tmp_path / "my_objective.py").write_text(sleeping_objective(steps=2, step_s=0.05))
    document = score_study(
        tmp_path / name, name, {"function": "my_objective:objective", "steps": 2}, n_trials=2
    )
    document["objective"]["cwd"] = str(tmp_path)
    return write_study(tmp_path / f"{name}.yaml", document)


def _registry(state: Path) -> dict[str, dict[str, str]]:
    entries: dict[str, dict[str, str]] = json.loads((state / "hpo" / "launches.json").read_text())
    return entries


def test_a_launch_whose_storage_cannot_be_opened_leaves_the_last_working_one(
    tmp_path: Path, fresh_database: str
) -> None:
    state = tmp_path / "state"
    _study_file(tmp_path, "kept")
    worked = _hpo("launch", "kept.yaml", "--storage", fresh_database, cwd=tmp_path, state=state)
    assert worked.returncode == 0, worked.stdout + worked.stderr

    failed = _hpo("launch", "kept.yaml", "--storage", DEAD, cwd=tmp_path, state=state)
    print(f"\nfailed launch: exit {failed.returncode}: {failed.stderr.strip()}")
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert f"cannot open {DEAD}" in failed.stderr, failed.stderr
    [entry] = _registry(state).values()
    assert entry["storage"] == fresh_database, entry

    # Without --storage: the study of the launch that worked, said where.
    for command, first in (("status", "study kept: 2 of 2 trials; 2 COMPLETE"), ("best", "best trial")):
        shown = _hpo(command, "kept.yaml", cwd=tmp_path, state=state)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith(first), shown.stdout
        assert f"the study of its last launch, in {fresh_database}" in shown.stderr, shown.stderr

    listed = _hpo("studies", cwd=tmp_path, state=state)
    print(f"hpo studies: exit {listed.returncode}\n{listed.stdout}{listed.stderr}")
    assert listed.returncode == 0 and not listed.stderr, listed.stdout + listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["kept"], listed.stdout
    fault_line(
        "`hpo launch --storage` of a PostgreSQL that cannot be opened (port 1), after a launch that worked",
        "exit 3 naming the server and the driver's reason; not recorded: `hpo status`, `best` and "
        "`studies` without --storage read the study of the launch that worked",
        0,
        None,
    )


def test_studies_lists_what_it_reaches_and_one_line_per_storage_it_cannot(
    tmp_path: Path, fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    _study_file(tmp_path, "alive")
    worked = _hpo("launch", "alive.yaml", "--storage", fresh_database, cwd=tmp_path, state=state)
    assert worked.returncode == 0, worked.stdout + worked.stderr
    # A study launched while its server answered, the server gone since (a registry holds no password).
    from hpo import launch_history

    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    launch_history.record(_study_file(tmp_path, "gone"), "gone", DEAD, tmp_path / "gone" / "work")
    assert len(_registry(state)) == 2

    started = time.monotonic()
    listed = _hpo("studies", cwd=tmp_path, state=state)
    took = time.monotonic() - started
    print(f"\nhpo studies ({took:.1f} s): exit {listed.returncode}\n{listed.stdout}{listed.stderr}")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["alive"], listed.stdout
    assert fresh_database in listed.stdout and DEAD not in listed.stdout, listed.stdout
    [line] = listed.stderr.splitlines()
    assert line.startswith(f"hpo studies: cannot read {DEAD}: "), line
    assert "refused" in line.lower(), line  # the driver's reason, not Optuna's wrapper
    assert "max length" not in line and "Traceback" not in line and len(line) < 300, line

    # Nothing to list and a storage that failed: not a success.
    (tmp_path / "alive.yaml").unlink()  # its registry entry is dropped at the next record
    launch_history.record(tmp_path / "gone.yaml", "gone", DEAD, tmp_path / "gone" / "work")
    only_dead = _hpo("studies", cwd=tmp_path, state=state)
    print(f"hpo studies, only the dead one: exit {only_dead.returncode}\n{only_dead.stderr}")
    assert only_dead.returncode == 3 and not only_dead.stdout, only_dead.stdout + only_dead.stderr
    [line] = only_dead.stderr.splitlines()
    assert line.startswith(f"hpo studies: error: cannot read {DEAD}: "), line
    assert "max length" not in line, line

    # Two that fail, nothing listed: one line each, then the error.
    other = "postgresql://nobody@127.0.0.1:2/none"
    launch_history.record(
        _study_file(tmp_path, "also-gone"), "also-gone", other, tmp_path / "also-gone" / "work"
    )
    both = _hpo("studies", cwd=tmp_path, state=state)
    print(f"hpo studies, two dead ones: exit {both.returncode}\n{both.stderr}")
    assert both.returncode == 3 and not both.stdout, both.stdout + both.stderr
    lines = both.stderr.splitlines()
    assert sorted(line.split(": ")[1] for line in lines[:2]) == [
        f"cannot read {DEAD}",
        f"cannot read {other}",
    ]
    assert lines[2].startswith("hpo studies: error: no study listed: 2 of 2 storages could not be read")
    assert len(lines) == 3, lines
