"""Where a study is, whatever folder a command runs in: the commands after `hpo launch` take the
storage and workdir of the study file's last launch (hpo.launch_history) when they name none, so a study
launched with `--storage` (PostgreSQL here) is found from another folder without repeating it, a
relaunch from there resumes it, and a study that is not where a command looks is reported with
where it looked and where the last launch put it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.hpo.helpers import HPO, load_trials, score_study, sleeping_objective, wait_for_trials, write_study


def _hpo(*args: str, cwd: Path, state: Path) -> subprocess.CompletedProcess[str]:
    """`hpo ARGS` run in ``cwd``, with its own launch record under ``state`` (XDG_STATE_HOME)."""
    env = {**os.environ, "XDG_STATE_HOME": str(state), "OMP_NUM_THREADS": "1"}
    return subprocess.run([HPO, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_study_launched_with_storage_is_found_from_another_folder(
    tmp_path: Path, fresh_database: str
) -> None:
    project, elsewhere, state = tmp_path / "project", tmp_path / "project" / "notebooks", tmp_path / "state"
    elsewhere.mkdir(parents=True)
    (project / "my_objective.py").write_text(sleeping_objective(steps=2, step_s=0.05))
    document = score_study(project, "located", {"function": "my_objective:objective", "steps": 2}, n_trials=2)
    document["study"].pop("workdir")  # the default: runs/located, relative to the folder of the launch
    write_study(project / "study.yaml", document)

    launched = _hpo("launch", "study.yaml", "--storage", fresh_database, cwd=project, state=state)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    record = json.loads((state / "hpo" / "launches.json").read_text())
    [entry] = record.values()
    assert entry["storage"] == fresh_database  # no password there to keep out

    # From a sub-folder, without --storage: the same study, said where.
    status = _hpo("status", "../study.yaml", cwd=elsewhere, state=state)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("study located: 2 of 2 trials; 2 COMPLETE"), status.stdout
    assert f"the study of its last launch, in {fresh_database}" in status.stderr, status.stderr
    # A relaunch there resumes it: nothing left to run, no second copy in a journal under notebooks/.
    again = _hpo("launch", "../study.yaml", cwd=elsewhere, state=state)
    assert again.returncode == 0 and "2 of 2 trials stored" in again.stdout, again.stdout + again.stderr
    assert not (elsewhere / "runs").exists()
    assert len(load_trials(document, fresh_database)) == 2

    # Another storage named on the command line: where it looked, and where the study is.
    journal = f"journal:{tmp_path}/other.journal"
    missing = _hpo("best", "study.yaml", "--storage", journal, cwd=project, state=state)
    [line] = missing.stderr.strip().splitlines()[-1:]
    assert missing.returncode == 2 and f"no study 'located' in {journal}" in line, line
    assert "its last launch" in line and f"--storage {fresh_database} reaches it" in line, line
    assert "hpo launch" not in line  # a launch there would start a second copy


def test_a_study_never_launched_is_reported_with_where_it_was_looked_for(tmp_path: Path) -> None:
    (tmp_path / "my_objective.py").write_text(sleeping_objective(steps=1, step_s=0.0))
    write_study(
        tmp_path / "study.yaml", score_study(tmp_path, "never", {"function": "my_objective:objective"})
    )

    status = _hpo("status", "study.yaml", cwd=tmp_path, state=tmp_path / "state")

    [line] = status.stderr.strip().splitlines()
    assert status.returncode == 2, status.stderr
    assert f"no study 'never' in journal:{tmp_path}/work/optuna.journal" in line, line
    assert "this file has no recorded launch" in line and "run `hpo launch` first" in line, line


def test_studies_lists_every_launched_study_and_delete_removes_one(
    tmp_path: Path, fresh_database: str
) -> None:
    state = tmp_path / "state"
    (tmp_path / "my_objective.py").write_text(sleeping_objective(steps=2, step_s=0.05))
    files = {}
    for name, storage in (("on-journal", None), ("on-postgres", fresh_database)):
        document = score_study(
            tmp_path / name, name, {"function": "my_objective:objective", "steps": 2}, n_trials=2
        )
        document["objective"]["cwd"] = str(tmp_path)
        files[name] = write_study(tmp_path / f"{name}.yaml", document)
        extra = ("--storage", storage) if storage else ()
        assert _hpo("launch", f"{name}.yaml", *extra, cwd=tmp_path, state=state).returncode == 0

    listed = _hpo("studies", cwd=tmp_path, state=state)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert set(rows) == {"on-journal", "on-postgres"}, listed.stdout
    assert (
        "2 COMPLETE" in rows["on-journal"]
        and f"journal:{tmp_path}/on-journal/work/optuna.journal" in rows["on-journal"]
    )
    assert fresh_database in rows["on-postgres"] and "CPU-h" in rows["on-postgres"], rows
    only = _hpo("studies", "--storage", fresh_database, cwd=tmp_path, state=state)
    assert [line.split()[0] for line in only.stdout.splitlines()[1:]] == ["on-postgres"], only.stdout

    # Not on a terminal, without --yes: nothing deleted.
    unconfirmed = _hpo("delete", "on-journal.yaml", cwd=tmp_path, state=state)
    assert unconfirmed.returncode == 2 and "pass --yes" in unconfirmed.stderr, unconfirmed.stderr
    for name in files:  # the PostgreSQL one through its recorded launch: no --storage repeated
        deleted = _hpo("delete", f"{name}.yaml", "--yes", cwd=tmp_path, state=state)
        assert deleted.returncode == 0 and deleted.stdout.startswith(
            f"deleted study '{name}' and its 2 trials"
        ), deleted.stdout + deleted.stderr
    assert _hpo("studies", "--storage", fresh_database, cwd=tmp_path, state=state).stdout.startswith(
        "no study in"
    )
    assert _hpo("studies", cwd=tmp_path, state=state).stdout.startswith("no study in")


def test_delete_refuses_a_study_whose_launcher_runs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (tmp_path / "my_objective.py").write_text(sleeping_objective(steps=20, step_s=0.5))
    document = score_study(tmp_path, "busy", {"function": "my_objective:objective", "steps": 20}, n_trials=1)
    write_study(tmp_path / "study.yaml", document)
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    launcher = subprocess.Popen(
        [HPO, "launch", "study.yaml"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        wait_for_trials(
            document, None, launcher, lambda trials: any(t.state.name == "RUNNING" for t in trials)
        )  # type: ignore[arg-type]
        refused = _hpo("delete", "study.yaml", "--yes", cwd=tmp_path, state=state)
        assert refused.returncode == 1 and "is being launched by pid" in refused.stderr, refused.stderr
        assert "`hpo cancel` it first" in refused.stderr
    finally:
        launcher.terminate()
        launcher.communicate(timeout=60)
    assert len(load_trials(document)) == 1  # still there


def test_delete_refuses_a_study_whose_jobs_wait_in_a_queue(tmp_path: Path, local_cluster: str) -> None:
    """A worker or a detached launcher still queued with no launcher holding the study (its
    launcher killed): deleting the study under it would lose what it writes. Every executor's queue
    is asked, as `hpo cancel` asks them; here a held Slurm job with the study's worker name."""
    state = tmp_path / "state"
    (tmp_path / "my_objective.py").write_text(sleeping_objective(steps=1, step_s=0.0))
    document = score_study(tmp_path, "queued", {"function": "my_objective:objective"}, n_trials=1)
    write_study(tmp_path / "study.yaml", document)
    assert _hpo("launch", "study.yaml", cwd=tmp_path, state=state).returncode == 0
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--hold", "--job-name", "hpo-queued:worker", "--wrap", "sleep 60"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        refused = _hpo("delete", "study.yaml", "--yes", cwd=tmp_path, state=state)
    finally:
        subprocess.run(["scancel", job_id], check=False, timeout=60)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"has 1 jobs in Slurm's queue ({job_id}): `hpo cancel` it first" in refused.stderr, refused.stderr
    assert len(load_trials(document)) == 1  # still there


def test_a_launch_naming_another_workdir_starts_its_own_study_on_the_default_journal(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (tmp_path / "my_objective.py").write_text(sleeping_objective(steps=1, step_s=0.0))
    document = score_study(tmp_path, "two-workdirs", {"function": "my_objective:objective"}, n_trials=1)
    document["study"].pop("workdir")
    write_study(tmp_path / "study.yaml", document)

    first = _hpo("launch", "study.yaml", "--set", "study.workdir=w1", cwd=tmp_path, state=state)
    second = _hpo("launch", "study.yaml", "--set", "study.workdir=w2", cwd=tmp_path, state=state)

    assert first.returncode == 0 and second.returncode == 0, second.stdout + second.stderr
    assert f"in journal:{tmp_path}/w2/optuna.journal: 0 of 1 trials stored" in second.stdout, second.stdout
    assert (tmp_path / "w1" / "optuna.journal").exists() and (tmp_path / "w2" / "optuna.journal").exists()
