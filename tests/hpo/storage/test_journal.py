"""The embedded journal against what a cluster's filesystem does to it: a record cut off by a crash
or a full disk, a journal damaged by a writer without the service's guards, and a full filesystem
(a real 16 KiB tmpfs) in the middle of a study. Trials are a small Python function run as local
processes (a second each), so the study and its relaunch are real and quick."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages.journal import JournalFileBackend

from hpo.journal import PARTIAL_SUFFIX
from tests.hpo.helpers import run_hpo, score_study, write_study

FUNCTION_MODULE = """
def objective(params, trial):
    for step in range(1, 5):
        if trial.report(step, params["x"] * step):
            return None
    return params["x"] * 4
"""


def _study(tmp_path: Path, journal: Path, n_trials: int) -> tuple[dict[str, Any], Path]:
    (tmp_path / "my_objective.py").write_text(FUNCTION_MODULE)
    document = score_study(
        tmp_path,
        "journal-study",
        {"steps": 4, "function": "my_objective:objective"},
        storage=f"journal:{journal}",
        n_trials=n_trials,
        max_concurrent=2,
    )
    return document, write_study(tmp_path / "study.yaml", document)


def _trials(journal: Path) -> list[optuna.trial.FrozenTrial]:
    """The study read back by Optuna's own journal reader (not the service's)."""
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    return optuna.load_study(study_name="journal-study", storage=storage).get_trials(deepcopy=False)


def _counted_complete(journal: Path) -> int:
    return sum(1 for t in _trials(journal) if t.state.name == "COMPLETE")


def test_a_record_cut_off_at_the_end_is_set_aside_and_the_relaunch_finishes(tmp_path: Path) -> None:
    journal = tmp_path / "study.journal"
    _, study_file = _study(tmp_path, journal, n_trials=4)
    assert run_hpo("launch", str(study_file), timeout=300).returncode == 0
    os.truncate(journal, journal.stat().st_size - 40)  # a write cut off by a crash or a full disk

    proc = run_hpo("launch", str(study_file), "--set", "study.n_trials=6", timeout=300)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "an incomplete last record" in proc.stderr and str(journal) + PARTIAL_SUFFIX in proc.stderr
    assert "Traceback" not in proc.stderr
    trials = _trials(journal)
    assert all(t.state.is_finished() for t in trials), [t.state for t in trials]
    # The cut record was the last trial's end: that trial is failed with the reason and retried.
    failed = [t for t in trials if t.state.name != "COMPLETE"]
    assert len(failed) <= 1 and all(
        "without telling a result" in t.user_attrs["fail_reason"]
        and any(r.user_attrs.get("retry_of") == t.number for r in trials)
        for t in failed
    ), [(t.number, t.state.name, t.user_attrs) for t in trials]
    assert sum(t.state.name == "COMPLETE" for t in trials) == 6
    assert (tmp_path / ("study.journal" + PARTIAL_SUFFIX)).stat().st_size > 0
    status = run_hpo("status", str(study_file))
    assert status.returncode == 0 and "journal-study" in status.stdout, status.stdout + status.stderr


def test_a_journal_an_unguarded_writer_damaged_is_mended_when_opened(tmp_path: Path) -> None:
    journal = tmp_path / "study.journal"
    _, study_file = _study(tmp_path, journal, n_trials=3)
    assert run_hpo("launch", str(study_file), timeout=300).returncode == 0
    before = _trials(journal)
    os.truncate(journal, journal.stat().st_size - 40)
    # Optuna's own writer appends after the partial record: the partial line and the next record
    # become one invalid line; a second append puts it in the middle, and no reader opens it.
    for _ in range(2):
        study = optuna.load_study(
            study_name="journal-study",
            storage=optuna.storages.JournalStorage(JournalFileBackend(str(journal))),
        )
        with pytest.raises(Exception):  # noqa: B017 (Optuna's own failure is whatever it is)
            study.ask()
    with pytest.raises(ValueError):
        _trials(journal)

    status = run_hpo("status", str(study_file))

    assert status.returncode == 0, status.stdout + status.stderr
    assert "damaged lines mended" in status.stdout + status.stderr
    after = _trials(journal)  # Optuna's reader opens it again
    assert [t.number for t in after[: len(before)]] == [t.number for t in before]
    assert [t.params for t in after[: len(before)]] == [t.params for t in before]
    assert run_hpo("launch", str(study_file), "--set", "study.n_trials=5", timeout=300).returncode == 0
    assert len(after := _trials(journal)) >= 5 and all(t.state.is_finished() for t in after)


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A real 16 KiB tmpfs: a full quota on $WORK, as the journal sees it."""
    mount = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k,mode=700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_stops_the_launcher_in_one_line_and_the_relaunch_finishes_the_study(
    tmp_path: Path, small_filesystem: Path
) -> None:
    journal = small_filesystem / "study.journal"
    _, study_file = _study(tmp_path, journal, n_trials=12)

    full = run_hpo("launch", str(study_file), timeout=300)

    assert full.returncode == 3, full.stdout + full.stderr
    [error] = [line for line in full.stderr.splitlines() if line.startswith("hpo launch: error:")]
    assert f"{journal}: cannot append to the study's journal: no space left on device" in error
    assert "KiB free there" in error and "run hpo launch again" in error
    assert "Traceback" not in full.stderr
    stopped_at = len(_trials(journal))  # the journal opens, full as it is
    assert 0 < stopped_at < 12
    assert run_hpo("status", str(study_file)).returncode == 0

    subprocess.run(["mount", "-o", "remount,size=1m", str(small_filesystem)], check=True)  # space freed
    relaunch = run_hpo("launch", str(study_file), timeout=300)

    assert relaunch.returncode == 0, relaunch.stdout + relaunch.stderr
    trials = _trials(journal)
    assert _counted_complete(journal) == 12, [
        (t.number, t.state.name, t.user_attrs.get("fail_reason")) for t in trials
    ]
    assert all(t.state.name in ("COMPLETE", "FAIL") for t in _trials(journal))
    status = run_hpo("status", str(study_file))
    assert status.returncode == 0 and "12 COMPLETE" in status.stdout, status.stdout + status.stderr
    assert shutil.disk_usage(small_filesystem).used < 1 << 20


def test_records_run_together_on_one_line_are_all_kept(tmp_path: Path) -> None:
    """The damage Optuna #5138 shows on a cluster's NFS: two records on one line, with a stray
    brace between them (``...}{{"op_code":...``). Both are whole, and both are kept."""
    from hpo.journal import repair

    journal = tmp_path / "study.journal"
    _, study_file = _study(tmp_path, journal, n_trials=2)
    assert run_hpo("launch", str(study_file), timeout=300).returncode == 0
    before = [(t.number, t.state.name, t.params) for t in _trials(journal)]
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[3:5] = [lines[3].rstrip(b"\n") + b"{" + lines[4]]
    journal.write_bytes(b"".join(lines))
    with pytest.raises(ValueError):
        _trials(journal)

    assert repair(str(journal)) == 1

    assert [(t.number, t.state.name, t.params) for t in _trials(journal)] == before


def test_a_journals_filesystem_type_is_read_from_its_mount_and_tmpfs_is_not_warned_of(
    small_filesystem: Path,
) -> None:
    from hpo.journal import SHARED_FILESYSTEMS, filesystem_type, shared_filesystem_warning

    assert filesystem_type(small_filesystem / "study.journal") == "tmpfs"  # the real mount's type
    assert shared_filesystem_warning(small_filesystem / "study.journal") is None
    assert filesystem_type(Path("/proc/self")) == "proc"
    assert {"nfs", "nfs4", "gpfs", "lustre"} <= set(SHARED_FILESYSTEMS)


def test_a_journal_or_sqlite_file_on_a_shared_filesystem_is_warned_of_in_its_own_terms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hpo.journal
    from hpo.storage import storage_file

    assert storage_file("journal:/shared/study.journal") == (Path("/shared/study.journal"), "journal")
    assert storage_file("sqlite:////shared/optuna.db") == (Path("/shared/optuna.db"), "database file")
    assert storage_file("sqlite:///:memory:") is None and storage_file("postgresql://hpo@db/hpo") is None
    # No NFS server here: the mount table's answer is what is replaced, not the rule that reads it.
    monkeypatch.setattr(hpo.journal, "filesystem_type", lambda path: "nfs4")
    journal = hpo.journal.shared_filesystem_warning(Path("/shared/study.journal"))
    database = hpo.journal.shared_filesystem_warning(Path("/shared/optuna.db"), "database file")
    assert journal is not None and "the journal /shared/study.journal is on nfs4" in journal
    assert database is not None and "the database file /shared/optuna.db is on nfs4" in database
    assert "corrupt the database" in database and "use PostgreSQL" in database


def test_a_trial_failed_on_a_full_disk_stops_the_launcher_rather_than_being_taken_as_told(
    small_filesystem: Path,
) -> None:
    """The launcher fails a trial whose process died (here: of the full disk) and takes Optuna's
    refusal to change a trial told meanwhile as "its state stands". The full disk is no such
    refusal: swallowed, the launcher would try the same write every round, forever."""
    from hpo import record
    from hpo.journal import JournalWriteError
    from hpo.storage import StorageRef, open_storage

    storage = open_storage(StorageRef("journal", str(small_filesystem / "study.journal")), create=True)
    study = optuna.create_study(study_name="full", storage=storage)
    trial = study.ask()
    with pytest.raises(JournalWriteError):  # other trials' writes fill the disk
        while True:
            study.ask()

    with pytest.raises(JournalWriteError), record.unless_told_meanwhile():
        record.fail(study, trial.number, "its job ended without telling a result")
    subprocess.run(["mount", "-o", "remount,size=1m", str(small_filesystem)], check=True)  # space freed
    study.tell(trial, 1.0)
    with record.unless_told_meanwhile():  # told meanwhile: Optuna refuses, the state stands
        record.fail(study, trial.number, "its job ended without telling a result")
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
