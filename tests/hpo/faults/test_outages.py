"""The database going away at any moment of a study, on the local Slurm cluster and PostgreSQL.

PostgreSQL is stopped for more than a minute at four moments of one study: while the launcher asks
for a trial, while it stores a submitted job's id, while it collects a trial whose job ended
without telling, and while it only waits. The first three moments are made exact by a trigger
that holds the launcher's statement (``pg_sleep``) until the server is stopped under it; the
study must finish its budget exactly, without a relaunch. Each moment prints a ``FAULT`` line.
The server is the test's own, so the suite's other tests are not stopped with it.
"""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from tests.hpo.helpers import (
    check_budget_counted_from_sacct,
    fault_line,
    final_sacct_states,
    forget_database_reader,
    kill_job_processes,
    launch_in_background,
    load_trials,
    run_hpo,
    score_study,
    sleeping_objective,
    stand_in_study,
    wait_for_trials,
    write_study,
)

pytestmark = pytest.mark.slow

OUTAGE_S = 62.0
"""Longer than a minute: past every reconnect a driver makes on its own, and past the service's
backoff cap (30 s), so a waiting process retries at its longest interval. One outage lasts this long;
the moments that only need the server gone while a statement is held take SHORT_OUTAGE_S."""

SHORT_OUTAGE_S = 20.0
"""Long enough that the held statement, the launcher's next call and a trial's report all fail and
back off at least twice (5 s, then 10 s)."""


class PrivateServer:
    """A PostgreSQL server of the test's own: a second cluster of the local installation on a free
    port, so that stopping it stops no other test's database. Local trust authentication (it
    listens on 127.0.0.1 only and lives for one test)."""

    def __init__(self) -> None:
        self.version = subprocess.run(
            ["pg_lsclusters", "-h"], capture_output=True, text=True, check=True
        ).stdout.split()[0]
        self.name = f"outage{uuid.uuid4().hex[:6]}"
        self.studies: list[str] = []  # whose trial jobs the fixture cancels after the test
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        subprocess.run(
            ["pg_createcluster", self.version, self.name, "-p", str(self.port), "--start-conf", "manual",
             "--", "--auth-host=trust", "--auth-local=peer"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        conf = Path(f"/etc/postgresql/{self.version}/{self.name}/conf.d/test.conf")
        conf.write_text("listen_addresses = '127.0.0.1'\nmax_connections = 100\n")
        self.control("start")
        subprocess.run(
            ["runuser", "-u", "postgres", "--", "psql", "-X", "-q", "-p", str(self.port), "-d", "postgres",
             "-c", "CREATE ROLE hpo LOGIN", "-c", "CREATE DATABASE hpo OWNER hpo"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self.url = f"postgresql://hpo@127.0.0.1:{self.port}/hpo"

    def control(self, action: str) -> None:
        command = ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action]
        if action == "stop":
            command += ["-m", "fast"]  # ends every session at once, mid-statement included
        subprocess.run(command, check=True, timeout=60, stdin=subprocess.DEVNULL, capture_output=True)

    def restart(self, down_s: float, during_outage: Callable[[], None] = lambda: None) -> None:
        """Stop the server, keep it down ``down_s`` seconds, start it again."""
        self.control("stop")
        stopped = time.monotonic()
        during_outage()
        time.sleep(max(0.0, down_s - (time.monotonic() - stopped)))
        self.control("start")

    def drop(self) -> None:
        forget_database_reader(self.url)
        subprocess.run(
            ["pg_dropcluster", "--stop", self.version, self.name], capture_output=True, timeout=120
        )


# A statement of the service held on the server: the n-th row a trigger sees (counted by a
# sequence, which a rolled-back transaction does not rewind) waits in pg_sleep, where the test
# finds it in pg_stat_activity and stops the server under it.
_STALL_FUNCTION = """
CREATE FUNCTION hpo_test_stall() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval(TG_ARGV[0]::regclass) = TG_ARGV[1]::bigint THEN
        PERFORM pg_sleep(120);
    END IF;
    RETURN NEW;
END $$
"""


class Stalls:
    """Stall points installed in a study's database."""

    def __init__(self, url: str) -> None:
        import optuna

        optuna.storages.RDBStorage(url).remove_session()  # the schema, so the triggers have tables
        self.engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        with self.engine.begin() as connection:
            connection.exec_driver_sql(_STALL_FUNCTION)

    def add(self, name: str, table: str, nth: int, when: str = "true") -> None:
        with self.engine.begin() as connection:
            connection.exec_driver_sql(f"CREATE SEQUENCE stall_{name}")
            connection.exec_driver_sql(
                f"CREATE TRIGGER stall_{name} BEFORE INSERT ON {table} FOR EACH ROW WHEN ({when}) "
                f"EXECUTE FUNCTION hpo_test_stall('stall_{name}', '{nth}')"
            )

    def wait_until_held(self, launcher: Any, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self.engine.connect() as connection:
                held = connection.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event = 'PgSleep' AND datname = current_database()"
                ).scalar()
            if held:
                return
            assert time.monotonic() < deadline and launcher.poll() is None, launcher.communicate()[0]
            time.sleep(0.2)


@pytest.fixture
def server(local_cluster: str) -> Iterator[PrivateServer]:
    private = PrivateServer()
    try:
        yield private
    finally:
        # A test that failed leaves trial jobs that would wait for this server for 10 minutes. Its
        # own only: the other test of this file may be running on the same partition meanwhile.
        for study in private.studies:
            subprocess.run(["scancel", "--partition", "isolated", "--name", f"hpo-{study}"], timeout=60)
        private.drop()


def test_a_database_outage_at_any_moment_of_a_study_loses_and_doubles_nothing(
    tmp_path: Path, server: PrivateServer
) -> None:
    database = server.url
    name = f"outage-{uuid.uuid4().hex[:6]}"  # its jobs are found in sacct by name
    server.studies.append(name)
    # Epochs long enough (4 s, the stand-in of helpers.py) that trials are seen running with one
    # epoch reported, and run on through an outage.
    document = stand_in_study(
        tmp_path,
        name,
        epochs=4,
        epoch_s=4.0,
        study={"n_trials": 4, "enqueue": [], "pruner": {"name": "none"}},
        # n3 alone: a node of the shared partition may be lost by a fault test running beside this one.
        resources={"executor": "slurm", "slurm": {"partition": "isolated"}},
    )
    study_file = write_study(tmp_path / "study.yaml", document)
    stalls = Stalls(database)
    stalls.add("ask", "trials", nth=1)  # the launcher's first study.ask
    stalls.add("job_id", "trial_user_attributes", nth=2, when="NEW.key = 'job_id'")  # its second job
    stalls.add("collect", "trial_user_attributes", nth=1, when="NEW.key = 'fail_reason'")
    launcher = launch_in_background(study_file, database)
    recoveries: dict[str, float] = {}

    # 1. During ask: the first trial is being created when the server goes away.
    stalls.wait_until_held(launcher)
    down = time.monotonic()
    server.restart(SHORT_OUTAGE_S)
    wait_for_trials(document, database, launcher, lambda trials: len(trials) >= 1)
    recoveries["ask"] = time.monotonic() - down

    # 2. During the bookkeeping of a submission: the second job is submitted, its id not stored.
    stalls.wait_until_held(launcher)
    down = time.monotonic()
    server.restart(SHORT_OUTAGE_S)
    wait_for_trials(
        document, database, launcher, lambda trials: sum("job_id" in t.user_attrs for t in trials) >= 2
    )
    recoveries["submit"] = time.monotonic() - down

    # 3. While the launcher only waits, its trials mid-epoch; a view in the outage says so at once.
    def running(trials: list[Any]) -> list[Any]:
        return [t for t in trials if t.state.name == "RUNNING" and t.intermediate_values]

    running_now = running(
        wait_for_trials(document, database, launcher, lambda trials: len(running(trials)) == 2)
    )
    reported = sum(len(t.intermediate_values) for t in running_now)
    views: list[subprocess.CompletedProcess[str]] = []

    def look() -> None:
        started = time.monotonic()
        views.append(run_hpo("status", str(study_file), "--storage", database))
        views.append(run_hpo("best", str(study_file), "--storage", database))
        recoveries["view"] = time.monotonic() - started

    down = time.monotonic()
    server.restart(OUTAGE_S, during_outage=look)
    wait_for_trials(
        document,
        database,
        launcher,
        lambda trials: sum(len(t.intermediate_values) for t in trials) > reported,
    )
    recoveries["idle"] = time.monotonic() - down
    for view in views:
        assert view.returncode == 3, view.stderr
        [line] = view.stderr.strip().splitlines()
        assert f"127.0.0.1:{server.port}" in line and "hint:" in line, line
        assert "invalid data in the commit" not in line, line

    # 4. While collecting a trial whose job ended without telling (its processes killed behind the
    # service's back, as the kernel's OOM killer or a crash would): the launcher is storing its fail
    # reason when the server goes away. SIGKILL to its processes, not scancel (which sends TERM,
    # and KILL only after KillWait): submitit ignores TERM, and a trial would finish meanwhile.
    def later(trials: list[Any]) -> list[Any]:
        # Early in its run: one epoch of four reported, so that the kill lands well before its end
        # (a trial seen with two or three epochs has finished before the signal on a quiet machine).
        return [t for t in running(trials) if t.number >= 2 and len(t.intermediate_values) == 1]

    [victim, *_] = later(wait_for_trials(document, database, launcher, lambda trials: bool(later(trials))))
    kill_job_processes(victim.user_attrs["job_id"], stepd=False)  # the job ends FAILED, its node up
    stalls.wait_until_held(launcher)
    down = time.monotonic()
    server.restart(SHORT_OUTAGE_S)
    wait_for_trials(
        document,
        database,
        launcher,
        lambda trials: any(t.user_attrs.get("retry_of") == victim.number for t in trials),
    )
    recoveries["collect"] = time.monotonic() - down

    output = launcher.communicate(timeout=900)[0]
    assert launcher.returncode == 0, output
    assert "storage unreachable during create_new_trial" in output, output
    assert "storage unreachable during set_trial_user_attr" in output, output

    trials = load_trials(document, database)
    seen = [
        (
            t.number,
            t.state.name,
            {k: t.user_attrs.get(k) for k in ("job_id", "retry_of", "not_run", "fail_reason")},
        )
        for t in trials
    ]
    # A trial asked for and never submitted (the launcher's wait for the server ended between the
    # two) is closed FAIL as not run: neither counted nor a job. The others: the 4 of the budget,
    # the victim among them, and the victim's retry.
    ran = [t for t in trials if not t.user_attrs.get("not_run")]
    counted = [t for t in ran if t.number != victim.number]
    assert len(ran) == 5 and len(counted) == 4, seen
    assert all(t.state.name == "COMPLETE" for t in counted), seen
    assert all(sorted(t.intermediate_values) == [1, 2, 3, 4] for t in counted)
    failed = trials[victim.number]
    reason = failed.user_attrs["fail_reason"]
    assert failed.state.name == "FAIL" and "without telling a result" in reason, reason
    # One Slurm job per stored trial: nothing submitted twice, nothing submitted unrecorded.
    job_ids = [str(t.user_attrs["job_id"]) for t in ran]
    assert len(set(job_ids)) == 5 and not any("job_id" in t.user_attrs for t in trials if t not in ran), seen
    jobs_of_study = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID", "--name", f"hpo-{name}", "-S", "now-1hour"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert sorted(jobs_of_study) == sorted(job_ids), (jobs_of_study, job_ids)
    states = final_sacct_states(job_ids)
    assert states.pop(str(victim.user_attrs["job_id"])) != "COMPLETED"
    assert set(states.values()) == {"COMPLETED"}, states

    fault_line(
        f"PostgreSQL stopped {SHORT_OUTAGE_S:.0f} s while the launcher asked for a trial (statement held on the server)",
        "the launcher waited with backoff and created the trial once the server was back; 4 of 4 trials COMPLETE",
        0,
        recoveries["ask"],
    )
    fault_line(
        f"PostgreSQL stopped {SHORT_OUTAGE_S:.0f} s while the launcher stored a submitted job's id",
        "the id was stored on reconnection; one Slurm job per trial (sacct)",
        0,
        recoveries["submit"],
    )
    fault_line(
        f"PostgreSQL stopped {OUTAGE_S:.0f} s while the launcher waited and 2 trials trained",
        f"launcher and trials waited and went on; `hpo status` and `best` in the outage exit 3 naming the server in {recoveries['view']:.1f} s",
        0,
        recoveries["idle"],
    )
    fault_line(
        f"PostgreSQL stopped {SHORT_OUTAGE_S:.0f} s while the launcher collected a trial whose job was killed",
        f"the trial was failed with the Slurm state ({reason.split(' without')[0]}) and retried once the server was back",
        0,
        recoveries["collect"],
    )


def test_only_an_unreachable_database_is_waited_for(local_cluster: str) -> None:
    """A server that is down is waited for; one that answers "no such database" is not."""
    from hpo.outages import DatabaseUnreachable, is_transient, with_retries

    def error_of(url: str) -> BaseException:
        engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 5})
        with pytest.raises(sqlalchemy.exc.DBAPIError) as caught:
            engine.connect()
        return caught.value

    server = local_cluster.rsplit("/", 1)[0]
    down = error_of(server.replace(":5432", ":1") + "/hpo")  # nothing listens on port 1
    missing = error_of(f"{server}/no_such_database_{uuid.uuid4().hex[:6]}")
    assert is_transient(down) and not is_transient(missing)

    def fail_with(error: BaseException) -> Callable[[], None]:
        def call() -> None:
            calls.append(error)
            raise error

        return call

    calls: list[BaseException] = []
    waits: list[str] = []
    with pytest.raises(sqlalchemy.exc.DBAPIError):
        with_retries(fail_with(missing), "connect", waits.append)
    assert len(calls) == 1 and not waits  # raised at once
    with pytest.raises(
        DatabaseUnreachable, match=r"during connect \(waited 1 s\): .*hint: start the database"
    ):
        with_retries(fail_with(down), "connect", waits.append, tolerance_s=1.0)
    assert len(calls) >= 3 and waits and "storage unreachable during connect" in waits[0]


def test_a_database_out_of_connections_is_waited_out(tmp_path: Path, server: PrivateServer) -> None:
    """Another client takes every connection the server allows (max_connections 100) for 20 s:
    trial processes starting meanwhile, and the launcher, wait ("too many clients") and go on."""
    import psycopg

    (tmp_path / "my_objective.py").write_text(sleeping_objective(6, 1.5))
    document = score_study(
        tmp_path, f"crowded-{uuid.uuid4().hex[:6]}", {"steps": 6, "function": "my_objective:objective"},
        n_trials=6, max_concurrent=2, budget=1.0,
    )  # fmt: skip
    server.studies.append(document["study"]["name"])
    document["resources"] = {"executor": "slurm", "slurm": {"partition": "isolated"}, "time": "10m"}
    study_file = write_study(tmp_path / "study.yaml", document)
    launcher = launch_in_background(study_file, server.url)
    wait_for_trials(
        document, server.url, launcher, lambda trials: sum(1 for t in trials if t.intermediate_values) >= 1
    )
    hog: list[Any] = []
    try:
        while True:  # every connection left, then one more is refused
            try:
                hog.append(psycopg.connect(server.url))
            except psycopg.OperationalError as err:
                assert "too many clients" in str(err) or "reserved" in str(err), err
                break
            assert len(hog) < 200
        full = time.monotonic()
        # Every connection held for 20 s, fixed: the fault itself. Longer than a trial (9 s), so trial
        # processes start, and the launcher submits and collects, while no connection is to be had.
        time.sleep(20)
    finally:
        for connection in hog:
            connection.close()
    freed = time.monotonic()
    output = launcher.communicate(timeout=600)[0]

    assert launcher.returncode == 0, output
    trials = load_trials(document, server.url)
    assert len(trials) == 6 and all(t.state.name == "COMPLETE" for t in trials), [
        (t.number, t.state.name, t.user_attrs.get("fail_reason")) for t in trials
    ]
    job_ids = [t.user_attrs["job_id"] for t in trials]
    assert len(set(job_ids)) == 6 and set(final_sacct_states(job_ids).values()) == {"COMPLETED"}
    check_budget_counted_from_sacct(document, study_file, server.url)
    fault_line(
        f"PostgreSQL out of connections for {freed - full:.0f} s (another client held all {len(hog)} left)",
        "trial processes and the launcher waited and went on; 6 of 6 COMPLETE, one job each",
        0,
        time.monotonic() - freed,
    )
