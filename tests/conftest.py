"""Shared fixtures. Tests train on the real Fashion-MNIST that `make setup` installs."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainer.config import DEFAULT_FASHION_MNIST_ROOT, TrainConfig
from trainer.sources import FASHION_MNIST_FILES, find_fashion_mnist_file

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def fashion_mnist_root() -> str:
    root = Path(DEFAULT_FASHION_MNIST_ROOT)
    missing = [
        s for pair in FASHION_MNIST_FILES.values() for s in pair if not find_fashion_mnist_file(root, s)
    ]
    assert not missing, f"Fashion-MNIST is not installed under {root}: run `make setup` (missing {missing})"
    return str(root)


def tiny_config(**overrides: object) -> TrainConfig:
    """A narrow ResNet on a slice of the real Fashion-MNIST: seconds per epoch on one core."""
    values: dict[str, object] = {
        "model": "resnet8",
        "width": 8,
        "dataset": "fashion-mnist",
        "batch_size": 32,
        "lr": 0.2,
        "epochs": 2,
        "max_steps_per_epoch": 30,
        "val_fraction": 0.1,
        "num_workers": 0,
        "log_every": 0,
    }
    values.update(overrides)
    return TrainConfig.from_mapping(values)


def run_trainer_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`python -m trainer ARGS` in a fresh process, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# Fair locks between the pytest workers (`pytest -n 4`, the test command): a test that breaks a part
# of Slurm does it on the fault cluster, whose lock it holds alone; tests that start a local Ray
# instance hold the "ray" lock alone: one at a time. The shared local cluster and PostgreSQL need no
# lock: no test stops any part of them (the guards below keep tests that did not ask for them off).
LOCKS = Path(tempfile.gettempdir()) / "hpo-test-locks"


@contextlib.contextmanager
def shared_lock(name: str, mode: int) -> Iterator[None]:
    """flock `name` in `mode`, entered through a turnstile so that a writer waiting for readers to
    leave is not overtaken by new readers."""
    LOCKS.mkdir(exist_ok=True)
    with open(LOCKS / f"{name}.turnstile", "a") as turnstile, open(LOCKS / f"{name}.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, mode)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# The rule that keeps the lock hole closed: while the suite runs, the cluster's commands on PATH are
# guards that refuse to run (exit 97, one line) unless the process that runs them, or the test that
# started it, holds the cluster through the `local_cluster` fixture, which sets the variable below.
# A test that reaches Slurm without asking for the cluster then fails where it calls the command,
# instead of running beside a fault test that has stopped slurmctld. PostgreSQL is reached only
# through the URL that fixture (or a test's own server) hands out.
HELD = "HPO_TEST_CLUSTER_HELD"
GUARDED = ("sbatch", "srun", "salloc", "scontrol", "squeue", "sacct", "sacctmgr", "scancel", "sinfo", "psql")
GUARDS = LOCKS / "cluster-guards"


def guard_script(real: str) -> str:
    return f"""#!/bin/sh
# Written by tests/conftest.py: the real command, for a test that holds the local cluster.
if [ "${{{HELD}:-}}" != 1 ]; then
    echo "$(basename "$0") run by a test that does not hold the local cluster: ask for the local_cluster fixture" >&2
    exit 97
fi
exec {real} "$@"
"""


def write_guards(folder: Path, path: str) -> None:
    """A guard in ``folder`` for each cluster command found on ``path`` (the search path without
    the guards), which it runs by its absolute name: a test's own wrapper of a command, earlier on
    PATH, may run the guard in turn."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in GUARDED:
        real = shutil.which(name, path=path)
        if real is None:
            continue
        guard, script = folder / name, guard_script(real)
        if not guard.exists() or guard.read_text() != script:
            partial = guard.with_suffix(f".{os.getpid()}")
            partial.write_text(script)
            partial.chmod(0o755)
            partial.replace(guard)  # atomic: the other worker may be running it


def pytest_configure(config: pytest.Config) -> None:
    # Ray starts its workers (where Tune trials and Train workers run) at niceness 15, below its own
    # daemons: right on a node of its own, but here four test workers share 2 cores, and a Ray
    # test's trials got a twentieth of a core beside the others' trials at niceness 0 (two minutes to
    # start a Train worker group, a test past its timeout). Inherited by the Ray of a Slurm job too.
    os.environ.setdefault("RAY_worker_niceness", "0")
    _join_cpu_group(config)
    if not shutil.which("sbatch"):  # no Slurm here: nothing a test could reach without the fixture
        return
    if not os.environ["PATH"].startswith(f"{GUARDS}:"):
        write_guards(GUARDS, os.environ["PATH"])
        os.environ["PATH"] = f"{GUARDS}:{os.environ['PATH']}"


@contextlib.contextmanager
def holding_the_cluster() -> Iterator[None]:
    """Let this process and its children run the cluster's commands (the guards above)."""
    before = os.environ.get(HELD)
    os.environ[HELD] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[HELD]
        else:
            os.environ[HELD] = before


@pytest.fixture(autouse=True)
def _one_ray_test_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    with contextlib.ExitStack() as held:
        if one_at_a_time(request.node) == "ray":
            held.enter_context(shared_lock("ray", fcntl.LOCK_EX))
        yield


# `make test-fast` runs the tests marked `fast` (a whole module by `pytestmark = pytest.mark.fast`,
# or one test by its decorator): no cluster, no database, no training, in under a minute with the
# cluster stopped. A mark travels with its module when the file is renamed or moved. A fast test that
# asks for the cluster or the database (itself or through another fixture) stops the collection.
CLUSTER_FIXTURES = frozenset(
    {"local_cluster", "fresh_database", "empty_database", "fresh_mysql_database", "fault_cluster"}
)


def fast_tests_on_the_cluster(items: list[pytest.Item]) -> list[str]:
    """The tests marked `fast` that request a cluster fixture, directly or through their fixtures."""
    return [
        item.nodeid
        for item in items
        if item.get_closest_marker("fast") is not None
        and CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ()))
    ]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    on_the_cluster = fast_tests_on_the_cluster(items)
    if on_the_cluster:
        raise pytest.UsageError(
            f"tests marked fast request the cluster or the database ({', '.join(sorted(CLUSTER_FIXTURES))}): "
            + ", ".join(on_the_cluster)
        )

    # The order the workers take tests in (pytest-xdist's loadgroup hands them out in it, each worker
    # holding at most two): the tests that run one at a time first, as two groups that two workers
    # run while the others work through the rest (they are the longest units of the suite); then the
    # tests of hpo in the order of their files' names, not their folders', so that slow files sit
    # among quick ones; then the tests that need no cluster: the top-level tests and the trainer's,
    # whose many short tests fill the end of the run.
    def place(item: pytest.Item) -> tuple[int, str]:
        parts = item.path.relative_to(REPO / "tests").parts
        if one_at_a_time(item):
            return (0, item.path.name)
        return (1 if parts[0] == "hpo" else 2 if len(parts) == 1 else 3, item.path.name)

    items.sort(key=place)  # stable: a file's tests keep their order


def pytest_itemcollected(item: pytest.Item) -> None:
    # The tests that must run one at a time run one after the other on one worker (`--dist
    # loadgroup`), instead of workers waiting for their locks while another holds them: those that
    # start a local Ray instance on one, those of the fault cluster on another. (A Ray test on the
    # fault cluster is that cluster's: its Ray runs in a Slurm job on ports chosen free, with a temp
    # dir of its own, beside a local instance as beside another study's.) Two groups that waited on
    # each other's locks would run no faster than one.
    # Marked as each is collected: pytest-xdist reads the groups in its own
    # pytest_collection_modifyitems, which runs before this file's.
    group = one_at_a_time(item)
    if group:
        item.add_marker(pytest.mark.xdist_group(group))


def one_at_a_time(item: pytest.Item) -> str | None:
    """The group of a test that must run one at a time: "fault-cluster", or "ray" (a local Ray
    instance: this host's default ports and temp dir); None for the others."""
    if "fault_cluster" in getattr(item, "fixturenames", ()):
        return "fault-cluster"
    if item.get_closest_marker("ray_ports") is not None:
        return "ray"
    return None


# Where the suite's time goes, printed at its end (the per-test list is `--durations`): the run's
# wall time and the 20 files whose tests took longest, set-up and tear-down included, lock waits too.
# Under pytest-xdist the workers' reports reach this hook in the controller with their durations.
SLOWEST_FILES = 20
_SESSION_STARTED = time.monotonic()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                path = report.nodeid.split("::", 1)[0]
                per_file[path] = per_file.get(path, 0.0) + report.duration
    if not per_file:
        return
    wall = time.monotonic() - _SESSION_STARTED
    terminalreporter.write_sep(
        "=",
        f"time per file ({wall:.0f} s wall since collection began, {sum(per_file.values()):.0f} s of tests)",
    )
    for path, seconds in sorted(per_file.items(), key=lambda item: -item[1])[:SLOWEST_FILES]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    write_timeline(terminalreporter, TIMELINE)


# Each test's worker, start and end (seconds since the first test began), for finding what the run's
# end waited on: test-artifacts/timeline.tsv, one line per test, in order of start. The suite is
# bound by the 2 cores, so what a test costs is its CPU: with HPO_TEST_CPU=1 (root, cgroup v1's
# cpuacct) each worker runs in a cpuacct group of its own, and a cpu_s column gives the CPU that the
# worker and every process it started (launchers, local trials, local Ray) spent during the test.
# Slurm jobs run under slurmd, not the worker: their CPU is not in it.
TIMELINE = REPO / "test-artifacts" / "timeline.tsv"
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_worker_cpu_group: Path | None = None
_CPU_AT_START = pytest.StashKey[float]()


def _join_cpu_group(config: pytest.Config) -> None:
    global _worker_cpu_group
    if os.environ.get("HPO_TEST_CPU") != "1" or not (CPUACCT / "cpuacct.usage").exists():
        return
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    group = CPUACCT / f"hpo-test-{worker}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    _worker_cpu_group = group


def _cpu_used_s() -> float:
    assert _worker_cpu_group is not None
    return int((_worker_cpu_group / "cpuacct.usage").read_text()) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if _worker_cpu_group is not None:
        item.stash[_CPU_AT_START] = _cpu_used_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    # Written into the teardown report (the last of a test's three), which reaches the controller.
    if call.when == "teardown" and _CPU_AT_START in item.stash:
        item.user_properties.append(("cpu_s", _cpu_used_s() - item.stash[_CPU_AT_START]))
    yield


def write_timeline(terminalreporter: pytest.TerminalReporter, path: Path) -> None:
    spans: dict[str, list[Any]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport) and hasattr(report, "start"):
                node = getattr(report, "node", None)
                worker = node.gateway.id if node is not None and hasattr(node, "gateway") else "main"
                span = spans.setdefault(report.nodeid, [worker, report.start, report.stop, ""])
                span[1], span[2] = min(span[1], report.start), max(span[2], report.stop)
                span[3] = next((f"{v:.1f}" for k, v in report.user_properties if k == "cpu_s"), span[3])
    if not spans:
        return
    first = min(start for _, start, _, _ in spans.values())
    path.parent.mkdir(exist_ok=True)
    with path.open("w") as out:
        out.write("worker\tstart_s\tend_s\tcpu_s\ttest\n")
        for nodeid, (worker, start, stop, cpu) in sorted(spans.items(), key=lambda item: item[1][1]):
            out.write(f"{worker}\t{start - first:.1f}\t{stop - first:.1f}\t{cpu}\t{nodeid}\n")
