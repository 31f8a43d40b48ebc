"""A journal or workdir the launcher cannot write: one line naming the path and the fix, exit 3,
nothing created or submitted. The tests run as root, whom file modes do not stop, so each makes a
path that root cannot write either: a read-only mount (a tmpfs, or a bind mount of the journal
file alone, its folder writable), which is what a user without write permission meets too."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.storages.journal import JournalFileBackend

from hpo.journal import JournalWriteError
from hpo.storage import StorageRef, open_storage
from tests.hpo.helpers import fault_line, run_hpo, score_study, write_study

FUNCTION_MODULE = """
def objective(params, trial):
    trial.report(1, params["x"])
    return params["x"]
"""


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """An empty folder on a read-only tmpfs."""
    mount = tmp_path / f"read-only-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@contextlib.contextmanager
def read_only_file(path: Path) -> Iterator[None]:
    """The file alone made read-only (a read-only bind mount of it), its folder still writable."""
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _study(tmp_path: Path, workdir: Path, storage: str | None = None) -> Path:
    (tmp_path / "my_objective.py").write_text(FUNCTION_MODULE)
    document = score_study(
        tmp_path,
        "unwritable",
        {"steps": 1, "function": "my_objective:objective"},
        n_trials=1,
        **({"storage": storage} if storage else {}),
    )
    document["study"]["workdir"] = str(workdir)
    return write_study(tmp_path / "study.yaml", document)


def _refused(study_file: Path, *args: str) -> str:
    """The one line of a launch that exits 3."""
    proc = run_hpo("launch", str(study_file), *args, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("hpo launch: error: "), line
    return line


def test_a_read_only_journal_file_is_one_line_and_exit_3_and_nothing_is_asked(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    study_file = _study(tmp_path, workdir)
    assert run_hpo("launch", str(study_file), timeout=300).returncode == 0
    journal = workdir / "optuna.journal"
    before = journal.read_bytes()
    with read_only_file(journal):  # its folder stays writable (Optuna's lock goes there)
        line = _refused(study_file, "--set", "study.n_trials=2")

    assert f"cannot write the study's journal {journal}: read-only file system" in line, line
    assert f"{study_file}: study.storage: " in line, line
    # The default journal, in the workdir: another workdir moves it too.
    assert "(hint: make it writable, or name another with --storage or study.workdir)" in line, line
    assert journal.read_bytes() == before  # nothing asked or told
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    assert len(optuna.load_study(study_name="unwritable", storage=storage).trials) == 1
    fault_line("the journal file read-only, its folder writable", f"exit 3, nothing asked: {line}", 0, None)


def test_a_journal_in_a_read_only_folder_is_one_line_and_exit_3(
    tmp_path: Path, read_only_folder: Path
) -> None:
    journal = read_only_folder / "study.journal"
    study_file = _study(tmp_path, tmp_path / "work", storage=f"journal:{journal}")

    line = _refused(study_file)

    assert f"study.storage: cannot write the study's journal {journal}: " in line, line
    assert f"{read_only_folder}: read-only file system" in line, line
    assert "make it writable, or name another with --storage or study.storage" in line, line
    assert not (tmp_path / "work").exists()  # nothing created, nothing submitted
    fault_line("the journal's folder read-only", f"exit 3, nothing created: {line}", 0, None)


def test_a_read_only_workdir_is_one_line_and_exit_3(tmp_path: Path, read_only_folder: Path) -> None:
    study_file = _study(tmp_path, read_only_folder)

    line = _refused(study_file)

    expected = f"study.workdir: cannot write the study's workdir {read_only_folder}: read-only file system"
    assert expected in line, line
    assert "make it writable, or name another with study.workdir" in line, line
    # Below a read-only folder: the workdir cannot be created there.
    study_file = _study(tmp_path, read_only_folder / "runs" / "unwritable")
    line = _refused(study_file)
    assert f"cannot write the study's workdir {read_only_folder}/runs/unwritable: " in line, line
    assert f"{read_only_folder}: read-only file system" in line, line
    fault_line("the workdir read-only", f"exit 3, nothing created: {line}", 0, None)


def test_a_journal_made_read_only_under_a_running_study_is_the_same_line(
    tmp_path: Path, read_only_folder: Path
) -> None:
    """Past the launcher's check (a trial process, a view, a journal made read-only mid-study):
    the storage's own open and append say the same, not "free space"."""
    with pytest.raises(
        JournalWriteError, match=r"cannot write the study's journal .*: read-only file system"
    ):
        open_storage(StorageRef("journal", str(read_only_folder / "study.journal")), create=True)

    journal = tmp_path / "study.journal"
    storage = open_storage(StorageRef("journal", str(journal)), create=True)
    optuna.create_study(study_name="made-read-only", storage=storage)
    with read_only_file(journal), pytest.raises(JournalWriteError) as refused:
        optuna.create_study(study_name="another", storage=storage)
    assert str(refused.value) == (
        f"cannot write the study's journal {journal}: read-only file system "
        "(hint: make it writable, or name another with --storage or study.storage)"
    )


def test_a_read_only_sqlite_file_or_folder_is_one_line_and_exit_3(
    tmp_path: Path, read_only_folder: Path
) -> None:
    """SQLite gets the journal's check: before it, a read-only file was taken for an outage and
    waited on for the policy's 10 minutes, and a read-only folder was "start the database server"."""
    database = read_only_folder / "optuna.db"
    study_file = _study(tmp_path, tmp_path / "work", storage=f"sqlite:///{database}")
    line = _refused(study_file)
    assert f"study.storage: cannot write the study's database file {database}: " in line, line
    assert f"{read_only_folder}: read-only file system" in line, line
    assert not (tmp_path / "work").exists()  # nothing created, nothing submitted

    database = tmp_path / "optuna.db"
    study_file = _study(tmp_path, tmp_path / "work", storage=f"sqlite:///{database}")
    assert run_hpo("launch", str(study_file), timeout=300).returncode == 0
    before = database.read_bytes()
    with read_only_file(database):
        line = _refused(study_file, "--set", "study.n_trials=2")
    assert f"cannot write the study's database file {database}: read-only file system" in line, line
    assert database.read_bytes() == before  # nothing asked or told
    fault_line("a SQLite file read-only, or its folder", f"exit 3, nothing asked: {line}", 0, None)


def test_a_sqlite_file_refusing_writes_is_not_waited_on_as_an_outage(tmp_path: Path) -> None:
    """Past the launcher's check (a trial process; a file made read-only mid-study): SQLite's
    "readonly database" is final at once, where "database is locked" (another writer) is waited out."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    from hpo.outages import is_transient

    database = tmp_path / "optuna.db"
    writer = create_engine(f"sqlite:///{database}")
    with writer.begin() as connection:
        connection.execute(text("CREATE TABLE t (x INTEGER)"))
    read_only = create_engine(f"sqlite:///file:{database}?mode=ro&uri=true")
    with read_only.connect() as connection, pytest.raises(OperationalError) as refused:
        connection.execute(text("INSERT INTO t VALUES (1)"))
    assert "readonly database" in str(refused.value) and not is_transient(refused.value)

    impatient = create_engine(f"sqlite:///{database}", connect_args={"timeout": 0})
    with writer.connect() as holder, impatient.connect() as other:
        holder.execute(text("BEGIN IMMEDIATE"))
        with pytest.raises(OperationalError) as locked:
            other.execute(text("INSERT INTO t VALUES (2)"))
        holder.rollback()
    assert "database is locked" in str(locked.value) and is_transient(locked.value)
