"""What the service's tests share: small real study files, `hpo` run as a child process, the
stored trials read back with Optuna, sacct's view of the jobs, the fault table's lines, the checks
several fault tests make (the budget met once, its spending as sacct counts it), a job's processes
killed as a crash would, the processes a trial left behind. The fixtures that bring up the cluster
and a fresh database are in conftest.py."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
HPO = str(Path(sys.executable).parent / "hpo")

# A narrow ResNet on a slice of the real Fashion-MNIST: a few seconds per trial on one core.
TINY_TRAINER: dict[str, Any] = {
    "model": "resnet8",
    "width": 8,
    "dataset": "fashion-mnist",
    "epochs": 3,
    "max_steps_per_epoch": 20,
    "val_fraction": 0.1,
    "momentum": 0.9,
    "num_workers": 0,
    "log_every": 0,
}
FINISHED = {"COMPLETE", "PRUNED"}
GOOD = {"lr": 0.3, "weight_decay": 1e-4, "batch_size": 64}
BAD = {"lr": 0.001, "weight_decay": 1e-4, "batch_size": 64}


def study_document(name: str, workdir: Path, **sections: Any) -> dict[str, Any]:
    """A small real study: TPE, successive halving, 8 trials, 2 in flight.

    Two good configurations run first, then two bad ones: by the time a bad one reports its first
    epoch, good ones have reported theirs, so successive halving has something to prune.
    """
    document: dict[str, Any] = {
        "study": {
            "name": name,
            "workdir": str(workdir),
            "sampler": {"name": "tpe", "seed": 0, "options": {"n_startup_trials": 3}},
            "pruner": {"name": "successive_halving", "options": {"min_resource": 1, "reduction_factor": 2}},
            "n_trials": 8,
            "max_concurrent": 2,
            "enqueue": [GOOD, {**GOOD, "lr": 0.2}, BAD, {**BAD, "weight_decay": 2e-4}],
        },
        "search_space": {
            "lr": {"type": "float", "low": 0.001, "high": 1.0, "log": True},
            "weight_decay": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True},
            "batch_size": {"type": "categorical", "choices": [32, 64]},
        },
        "trainer": copy.deepcopy(TINY_TRAINER),
        "resources": {"executor": "local", "cpus_per_task": 1, "time": "10m"},
    }
    for section, values in sections.items():
        document[section].update(values)
    return document


def score_study(tmp_path: Path, name: str, objective: dict[str, Any], **study: Any) -> dict[str, Any]:
    """A study of the user's own small objective (a function or a command, standard library only,
    seconds per trial) that maximizes ``score`` over one parameter ``x``, as local processes."""
    document: dict[str, Any] = {
        "study": {
            "name": name,
            "workdir": str(tmp_path / "work"),
            "metric": "score",
            "direction": "maximize",
            "sampler": {"name": "random", "seed": 0},
            "pruner": {"name": "none"},
            **study,
        },
        "search_space": {"x": {"type": "float", "low": 0.5, "high": 2.0}},
        "objective": objective,
        "resources": {"executor": "local", "time": "5m"},
    }
    return document


# A stand-in for the trainer where the service is the subject (faults, relaunches, budgets): the same
# search space and metric as `study_document`'s trainer, epochs of `epoch_s` seconds, a checkpoint of
# its epoch that a requeued or retried trial resumes from, and no torch to import (a trial's job
# starts in about a second instead of six, and spends no CPU on training). The trainer's own path is
# tested end to end in tests/hpo/dispatch/test_launch.py, test_ray_backend.py and one fault test.
# While a file `hold` lies beside it, a trial waits after its epoch `hold_after`: a test can act on
# trials that are all mid-run, however their jobs' starts were spread.
STAND_IN_TRAINER = """
import math
import time
from pathlib import Path

HOLD = Path(__file__).parent / "hold"


def val_accuracy(params, epoch):
    # Best at lr 0.3 (GOOD), far lower at lr 0.001 (BAD), rising with the epochs.
    distance = abs(math.log10(params["lr"] / 0.3))
    return round((0.9 - 0.1 * distance) * (1 - 0.5 ** epoch), 6)


def objective(params, trial):
    params = trial.params()  # the searched ones and objective.fixed's
    epochs, epoch_s, hold_after = params["epochs"], params["epoch_s"], params["hold_after"]
    saved = trial.checkpoint_dir() / "epoch"
    start = int(saved.read_text()) if saved.exists() else 0
    if start:
        print(f"trial {trial.number}: resumed from epoch {start}", flush=True)
    for epoch in range(start + 1, epochs + 1):
        time.sleep(epoch_s)
        # Reported, then saved: a fault between the two redoes the epoch, whose report replaces its own.
        if trial.report(epoch, val_accuracy(params, epoch)):
            return None
        saved.write_text(str(epoch))
        while epoch == hold_after and HOLD.exists():
            time.sleep(0.2)
    return val_accuracy(params, epochs)
"""


def stand_in_study(
    folder: Path,
    name: str,
    epochs: int = 3,
    epoch_s: float = 1.0,
    hold_after: int = 0,
    workdir: Path | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """`study_document`'s study with the torch-free stand-in (written as ``stand_in.py`` in
    ``folder``, where the study file goes) in place of the trainer; its workdir is ``folder/work``
    unless given."""
    (folder / "stand_in.py").write_text(STAND_IN_TRAINER)
    document = study_document(name, workdir or folder / "work", **sections)
    del document["trainer"]
    document["study"].update(metric="val_accuracy", direction="maximize")
    document["objective"] = {
        "function": "stand_in:objective",
        "steps": epochs,
        "fixed": {"epochs": epochs, "epoch_s": epoch_s, "hold_after": hold_after},
    }
    return document


def sleeping_objective(steps: int, step_s: float, hold_after: int = 0) -> str:
    """A module (write it as ``my_objective.py`` beside the study file) whose ``objective`` reports
    ``x * step`` for ``steps`` steps, ``step_s`` seconds apart: a trial long enough to be hit by
    a fault, with no torch to import (its job starts in a second). While a file ``hold`` lies
    beside it, a trial waits after its step ``hold_after``."""
    return f"""
import time
from pathlib import Path

HOLD = Path(__file__).parent / "hold"

def objective(params, trial):
    for step in range(1, {steps} + 1):
        time.sleep({step_s})
        if trial.report(step, params["x"] * step):
            return None
        while step == {hold_after} and HOLD.exists():
            time.sleep(0.2)
    return params["x"] * {steps}
"""


def held_score_study(
    tmp_path: Path, name: str, steps: int, step_s: float, hold_after: int, **study: Any
) -> tuple[dict[str, Any], Path, Path]:
    """A study of :func:`sleeping_objective` (document, study file, hold file) whose trials wait
    after step ``hold_after`` while the ``hold`` file, created here, lies beside it."""
    (tmp_path / "my_objective.py").write_text(sleeping_objective(steps, step_s, hold_after=hold_after))
    hold = tmp_path / "hold"
    hold.touch()
    document = score_study(tmp_path, name, {"steps": steps, "function": "my_objective:objective"}, **study)
    return document, write_study(tmp_path / "study.yaml", document), hold


def start_hpo(*args: str, **env: str) -> subprocess.Popen[str]:
    """``hpo ARGS`` as a child process, its output (stdout and stderr) collected for the assertions.
    It starts as from a terminal, a hang-up stopping it: a suite itself run under ``nohup`` would
    otherwise pass on its ignored SIGHUP, which the launcher keeps ignoring by design."""
    return subprocess.Popen(
        ["env", "--default-signal=HUP", HPO, *args],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def fault_line(fault: str, outcome: str, lost: int, recovery_s: float | None) -> None:
    """The line a fault test prints for the fault table of docs/faults.md (``pytest -s`` shows them)."""
    shown = "-" if recovery_s is None else f"{recovery_s:.1f} s"
    line = f"FAULT | {fault} | {outcome} | trials lost: {lost} | recovery: {shown}"
    print(f"\n{line}")
    # Under pytest-xdist a worker's output is not shown: HPO_FAULT_LINES names a file that collects them.
    if os.environ.get("HPO_FAULT_LINES"):
        with open(os.environ["HPO_FAULT_LINES"], "a") as lines:
            lines.write(line + "\n")


def write_study(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run_hpo(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPO, *args],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def load_trials(document: dict[str, Any], storage: str | None = None) -> list[Any]:
    """The stored trials of a study, read back with Optuna itself."""
    import optuna

    if storage is None:
        from optuna.storages.journal import JournalFileBackend

        path = Path(document["study"]["workdir"]) / "optuna.journal"
        backend: Any = optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    else:
        backend = database_reader(storage)
    study = optuna.load_study(study_name=document["study"]["name"], storage=backend)
    return study.get_trials(deepcopy=False)


_DATABASE_READERS: dict[str, Any] = {}


def database_reader(storage: str) -> Any:
    """The test process's one Optuna storage on a database, kept for its polls: a new one per poll
    costs a PostgreSQL connection and about 40 ms more CPU (55 against 17 ms per poll, measured),
    and the suite polls thousands of times while its trials run."""
    import optuna

    reader = _DATABASE_READERS.get(storage)
    if reader is None:
        # No schema creation from the test's side: racing the launcher's would fail one of them.
        # pool_pre_ping: a connection that a server restart or an outage cut is replaced, not raised.
        reader = optuna.storages.RDBStorage(
            storage,
            skip_table_creation=True,
            skip_compatibility_check=True,
            engine_kwargs={"pool_pre_ping": True},
        )
        _DATABASE_READERS[storage] = reader
    return reader


def forget_database_reader(storage: str) -> None:
    """Close the reader of a database that is about to be dropped or whose server is stopped."""
    reader = _DATABASE_READERS.pop(storage, None)
    if reader is not None:
        reader.engine.dispose()


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    proc = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return dict(line.split("|", 1) for line in proc.stdout.splitlines() if line)


UNFINISHED_SACCT_STATES = frozenset({"", "RUNNING", "PENDING", "COMPLETING", "REQUEUED"})
"""A job's state in sacct before accounting has its end ("": not known yet)."""


def study_jobs_in_sacct(document: dict[str, Any], held: list[str], timeout: float = 120) -> dict[str, str]:
    """The state of every job sacct lists under the study's job name, read once it lists each job
    the trials hold ended: slurmdbd learns of a job a moment after slurmctld (seen under the
    suite's load: a job submitted and cancelled within a second not listed yet), and jobs run
    while it was away reach it a while after it is back. A job listed that no trial holds (one
    submitted twice) is returned at once, for the caller's comparison to fail on."""
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "--name", f"hpo-{document['study']['name']}",
             "-S", "now-2hours"],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        listed = dict(line.split("|", 1) for line in proc.stdout.splitlines() if line)
        settled = set(held) <= set(listed) and not UNFINISHED_SACCT_STATES.intersection(
            listed[job] for job in held
        )
        if settled or not set(listed) <= set(held) or time.monotonic() > deadline:
            return listed
        time.sleep(1)


def final_sacct_states(job_ids: list[str], timeout: float = 60) -> dict[str, str]:
    """The jobs' states once accounting has recorded their end: slurmdbd learns it a moment after
    the job leaves squeue (seen: RUNNING in sacct with squeue already empty)."""
    deadline = time.monotonic() + timeout
    while True:
        states = sacct_states(job_ids)
        if (
            not UNFINISHED_SACCT_STATES.intersection(states.get(j, "") for j in job_ids)
            or time.monotonic() > deadline
        ):
            return states
        time.sleep(1)


def max_overlap(trials: list[Any]) -> int:
    """The largest number of trials that were running at the same moment."""
    events = []
    for trial in trials:
        events += [(trial.datetime_start, 1), (trial.datetime_complete, -1)]
    running = peak = 0
    for _, delta in sorted(events, key=lambda event: (event[0], event[1])):
        running += delta
        peak = max(peak, running)
    return peak


def distinct_params(trials: list[Any]) -> bool:
    """No two trials got the same parameters (a relaunch or a second worker must not replay a
    seeded sampler's proposals). A retry repeats the parameters of the trial it retries, on purpose."""
    keys = [tuple(sorted(t.params.items())) for t in trials if "retry_of" not in t.user_attrs]
    return len(set(keys)) == len(keys)


def release_hold_at(launcher: subprocess.Popen[str], marker: str, hold: Path, timeout: float = 300) -> str:
    """Read the launcher's lines until one holds ``marker`` (a relaunch's "re-attached"), then remove
    the ``hold`` file its trials wait on; return what it had printed so far. A launcher that never
    prints it must not keep the trials waiting forever: the hold ends after ``timeout`` anyway."""
    assert launcher.stdout is not None
    release = threading.Timer(timeout, lambda: hold.unlink(missing_ok=True))
    release.start()
    lines = []
    try:
        for line in launcher.stdout:
            lines.append(line)
            if marker in line:
                break
    finally:
        hold.unlink(missing_ok=True)
        release.cancel()
    return "".join(lines)


def launch_in_background(study_file: Path, storage: str, *extra: str, **env: str) -> subprocess.Popen[str]:
    """``hpo launch`` as a child process, its output collected for the assertions."""
    return start_hpo("launch", str(study_file), "--storage", storage, *extra, **env)


def trials_or_none(document: dict[str, Any], storage: str | None = None) -> list[Any] | None:
    import optuna
    import sqlalchemy.exc

    try:
        return load_trials(document, storage)
    except (KeyError, FileNotFoundError, sqlalchemy.exc.DBAPIError, optuna.exceptions.StorageInternalError):
        # The launcher has not created the journal, the schema or the study yet (Optuna's RDBStorage creates
        # its alembic_version table on every start, so a reader may also race the launcher's DDL).
        return None


def wait_for_trials(
    document: dict[str, Any],
    storage: str,
    launcher: subprocess.Popen[str],
    ready: Callable[[list[Any]], bool],
    timeout: float = 300,
) -> list[Any]:
    """Poll the study until ``ready(trials)``; fail with the launcher's output if it ends first."""
    deadline = time.monotonic() + timeout
    while True:
        trials = trials_or_none(document, storage) or []
        if ready(trials):
            return trials
        if time.monotonic() >= deadline or launcher.poll() is not None:
            # A launcher still running at the deadline is stopped first: its output is the message,
            # and a test that waited in vain fails instead of waiting on the launcher forever.
            if launcher.poll() is None:
                launcher.kill()
            raise AssertionError(launcher.communicate(timeout=60)[0])
        time.sleep(0.5)


def stored_steps(storage: str, trial_id: int) -> list[int]:
    """The intermediate values' steps as rows in PostgreSQL: a step reported twice would show twice."""
    proc = subprocess.run(
        ["psql", "-X", "-w", "-A", "-t", storage, "-c",
         f"SELECT step FROM trial_intermediate_values WHERE trial_id = {int(trial_id)} ORDER BY step"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return [int(line) for line in proc.stdout.split()]


def check_budget_met_once(document: dict[str, Any], storage: str, n_trials: int) -> None:
    """The budget is met exactly (a failed trial that was retried gives its place to its retry, one
    never submitted gives it up), and sacct knows exactly one Slurm job per trial: nothing was
    submitted twice."""
    trials = load_trials(document, storage)
    retried = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    # A trial asked for and never submitted (a launcher stopped between the two) is closed FAIL,
    # not run and not counted.
    counted = [t for t in trials if t.number not in retried and not t.user_attrs.get("not_run")]
    assert len(counted) == n_trials, [(t.number, t.state.name, t.user_attrs) for t in trials]
    assert {t.state.name for t in counted} <= FINISHED
    assert distinct_params(trials)
    job_ids = [str(t.user_attrs["job_id"]) for t in trials if "job_id" in t.user_attrs]
    assert len(set(job_ids)) == len(job_ids)
    listed = sorted(study_jobs_in_sacct(document, job_ids))
    assert listed == sorted(job_ids), (listed, sorted(job_ids))


def check_budget_counted_from_sacct(document: dict[str, Any], study_file: Path, storage: str) -> None:
    """What the study says it spent (`hpo status`, its study.budget line) is what sacct says its
    jobs used, within one trial's cost. Jobs that ran while slurmdbd was away reach sacct when
    slurmctld sends their records, a moment after it is back: until then the study's line is its
    own estimate (marked so), and a job whose end has not arrived is RUNNING in sacct with an
    elapsed time that grows. Both are read once sacct has every trial's job ended."""
    own = sorted(
        {str(t.user_attrs["job_id"]) for t in load_trials(document, storage) if "job_id" in t.user_attrs}
    )
    states = final_sacct_states(own, timeout=120)
    assert all(states.get(job, "") not in UNFINISHED_SACCT_STATES for job in own), states
    # Read again while they differ: sacct's records of an outage's jobs can still be settling
    # (seen twice under load: the study's figure twice sacct's by name, both read from sacct).
    deadline = time.monotonic() + 60
    while True:
        status = run_hpo("status", str(study_file), "--storage", storage)
        found = re.search(r"^budget: ([0-9.e-]+) of [0-9.]+ CPU-hours spent", status.stdout, re.M)
        assert status.returncode == 0 and found, status.stdout + status.stderr
        assert re.search(r"^cost: .*\[measured\]$", status.stdout, re.M), (
            status.stdout
        )  # sacct, not the estimate
        jobs = sacct_cpu_hours(document["study"]["name"])
        if abs(float(found.group(1)) - sum(jobs.values())) <= max(jobs.values()):
            return
        if time.monotonic() > deadline:
            rows = subprocess.run(
                ["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,JobName,ElapsedRaw,AllocTRES,State,Start,End",
                 "-S", "now-2days", "-j", ",".join(own)],
                capture_output=True, text=True, timeout=60,
            ).stdout  # fmt: skip
            raise AssertionError((found.group(0), jobs, status.stdout, rows))
        time.sleep(2)


def kill_job_processes(job_id: str, stepd: bool = True) -> None:
    """SIGKILL the processes of a Slurm job (the batch script, srun, the tasks; its slurmstepd
    unless ``stepd`` is False), as the kernel's OOM killer or a crash would: nothing is told.
    (`scancel --signal=KILL` does not do this: Slurm 22.05 takes it as a cancel, TERM first and
    KILL after KillWait, and a trial ignores TERM and may finish meanwhile.) The job is the one of
    the cluster SLURM_CONF names: the fault cluster numbers its jobs from 1 too."""
    conf = b"SLURM_CONF=" + os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf").encode()
    victims = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = environ.read_bytes().split(b"\0")
            cmdline = (environ.parent / "cmdline").read_bytes()
        except OSError:
            continue
        # A slurmstepd inherits its slurmd's environment (SLURM_CONF for the fault cluster's), a
        # job's process the submitter's; no SLURM_CONF is the local cluster's default.
        of_cluster = next(
            (v for v in variables if v.startswith(b"SLURM_CONF=")), b"SLURM_CONF=/etc/slurm/slurm.conf"
        )
        if of_cluster != conf:
            continue
        stepd_of_job = f"slurmstepd: [{job_id}.".encode() in cmdline
        if stepd_of_job and not stepd:
            continue
        if stepd_of_job or (
            f"SLURM_JOB_ID={job_id}".encode() in variables and not cmdline.startswith(b"slurmstepd")
        ):
            victims.append(environ.parent.name)
    subprocess.run(["kill", "-9", *victims], check=False)


def sacct_cpu_hours(name: str) -> dict[str, float]:
    """Each job of the study, by name, with its CPU-hours as sacct has them."""
    out = subprocess.run(
        ["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,ElapsedRaw,AllocCPUS", "--name", f"hpo-{name}",
         "-S", "now-1hour"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    hours: dict[str, float] = {}
    for line in out.split():
        job_id, elapsed, cpus = line.split("|")
        hours[job_id] = hours.get(job_id, 0.0) + int(elapsed) * int(cpus) / 3600
    return hours


def processes_with(marker: str) -> list[str]:
    """Command lines of the running processes that contain ``marker`` (the process table)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and str(os.getpid()) != entry.name:
            found.append(cmdline)
    return found
