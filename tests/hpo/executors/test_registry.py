"""The executor seam: executors are found through the ``hpo.executors`` entry points (the built-in
ones too), each implements the whole protocol, no module outside the registry and the config tells executors, dispatch modes or
backends apart by name (a comparison, a ``match``, a table keyed by names) or reads a scheduler's
environment, and trials written before the dispatch attribute existed read the same."""

from __future__ import annotations

import ast
import inspect
import os
import re
import signal
import time
from pathlib import Path

import optuna
import pytest

from hpo import executors, record
from hpo.config import load_study
from hpo.config.schema import BUILT_IN_EXECUTORS
from hpo.config.values import BACKENDS
from hpo.executors.base import Executor
from tests.hpo.helpers import study_document, write_study

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`

REPO = Path(__file__).resolve().parents[3]
# Where names may be compared: the registry (each executor knows its own) and the config (which
# checks the study file's choices).
OWNERS = ("hpo/executors/", "hpo/config/")
NAMES = {*executors.names(), *BACKENDS, *(mode.value for mode in record.DispatchMode), "worker"}


def test_the_built_in_executors_register_as_plugins_do() -> None:
    """Through the entry-point group, by this project's own distribution (pyproject.toml) like any
    other package's; none is imported until a study asks for it."""
    import importlib.metadata

    ours = {
        point.name: point.value
        for point in importlib.metadata.distribution("slurm-hpo").entry_points
        if point.group == executors.GROUP
    }
    assert ours == {"local": "hpo.executors.local:LocalExecutor", "slurm": "hpo.slurm.executor:SlurmExecutor"}
    assert set(ours) == set(BUILT_IN_EXECUTORS)  # the committed schema's sections are theirs
    registered = {point.name for point in importlib.metadata.entry_points(group=executors.GROUP)}
    assert set(executors.names()) == registered >= set(ours)


@pytest.mark.parametrize("name", executors.names())
def test_each_executor_implements_the_whole_protocol(name: str) -> None:
    cls = executors.executor_class(name)
    assert cls.name == name
    wanted = {n for n, _ in inspect.getmembers(Executor) if not n.startswith("_")} | set(
        Executor.__annotations__
    )
    missing = sorted(n for n in wanted if not hasattr(cls, n))
    assert not missing, f"{cls.__name__} lacks {missing}"
    for method, _ in inspect.getmembers(Executor, inspect.isfunction):
        if method.startswith("_"):
            continue
        ours, theirs = inspect.signature(getattr(Executor, method)), inspect.signature(getattr(cls, method))
        assert list(ours.parameters) == list(theirs.parameters), f"{cls.__name__}.{method}"


def _names_in(node: ast.AST) -> bool:
    return any(isinstance(c, ast.Constant) and c.value in NAMES for c in ast.walk(node))


SCHEDULER_VARIABLE = re.compile(r"^(SLURM|SLURMD|SLURMCTLD|SUBMITIT)_\w+$")


def _name_uses(source: str, name: str) -> list[str]:
    """What tells an executor, a mode or a backend apart by its name outside the registry:
    ``x == "slurm"``, ``x in ("ray", ...)``; ``match x: case "slurm":``; a dispatch table, a dict
    keyed by such names; and a read of a scheduler's environment (``SLURM_*``, ``SUBMITIT_*``),
    which only the executor that set it can interpret."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and _names_in(node):
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.match_case) and _names_in(node.pattern):
            found.append(f"{name}:{node.pattern.lineno}: case {ast.unparse(node.pattern)}")
        elif (
            isinstance(node, ast.Dict)
            and node.keys
            and all(k is not None and _names_in(k) for k in node.keys)
        ):
            found.append(f"{name}:{node.lineno}: a table keyed by names: {ast.unparse(node)[:60]}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and SCHEDULER_VARIABLE.match(node.value)
        ):
            found.append(f"{name}:{node.lineno}: reads {node.value}")
    return found


# The one table keyed by names outside the registry: how trials written before the ``dispatch``
# attribute stored their mode (they are read, never written, that way).
STORED_NAMES = {"record.py": "{'worker': DispatchMode.WORKERS, 'ray': DispatchMode.RAY}"}


def test_no_module_outside_the_registry_and_the_config_tells_executors_or_modes_apart() -> None:
    offenders = []
    for path in sorted((REPO / "hpo").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(OWNERS):
            continue
        for use in _name_uses(path.read_text(), path.name):
            if " reads " in use and relative.startswith("hpo/slurm/"):
                continue  # the Slurm executor's own code reads Slurm's variables
            if not use.endswith(f"a table keyed by names: {STORED_NAMES.get(path.name)}"):
                offenders.append(use)
    assert not offenders, "\n".join(offenders)


def test_the_check_sees_comparisons_cases_tables_and_environment_reads() -> None:
    probe = 'if kind == "slurm" or mode in ("ray", "x") or backend != "optuna":\n    pass\n'
    assert len(_name_uses(probe, "probe.py")) == 3  # each comparison of the condition
    probe = 'match kind:\n    case "local":\n        pass\n    case other:\n        pass\n'
    assert _name_uses(probe, "probe.py") == ["probe.py:2: case 'local'"]
    probe = 'RUN = {"slurm": submit_sbatch, "local": start_process}\n'
    assert _name_uses(probe, "probe.py") == [
        "probe.py:1: a table keyed by names: {'slurm': submit_sbatch, 'local': start_process}"
    ]
    probe = 'job = os.environ.get("SLURM_JOB_ID")\nrank = os.environ["SUBMITIT_LOCAL_GLOBAL_RANK"]\n'
    probe += 'node = os.environ.get("SLURMD_NODENAME")\n'
    assert _name_uses(probe, "probe.py") == [
        "probe.py:1: reads SLURM_JOB_ID",
        "probe.py:2: reads SUBMITIT_LOCAL_GLOBAL_RANK",
        "probe.py:3: reads SLURMD_NODENAME",
    ]
    probe = 'a = kind == executor.name\nb = mode in (DispatchMode.RAY, None)\nc = ["slurm"]\nd = {"per_trial": 1, "lr": 2}\n'
    assert _name_uses(probe, "probe.py") == []  # through the registry; a name as data, or one field of many


def _trial(attrs: dict[str, object]) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=1.0, user_attrs=attrs)


@pytest.mark.parametrize(
    ("attrs", "executor", "mode"),
    [
        # written before the dispatch attribute: the mode kept in ``executor``
        ({"executor": "slurm", "job_id": "7"}, "slurm", record.DispatchMode.PER_TRIAL),
        ({"executor": "local", "job_id": "7"}, "local", record.DispatchMode.PER_TRIAL),
        ({"executor": "worker", "job_kind": "slurm"}, "slurm", record.DispatchMode.WORKERS),
        ({"executor": "worker", "job_kind": "local"}, "local", record.DispatchMode.WORKERS),
        ({"executor": "ray", "job_id": "9"}, None, record.DispatchMode.RAY),
        # written now
        (record.placement("slurm", record.DispatchMode.WORKERS), "slurm", record.DispatchMode.WORKERS),
        (record.placement("local", record.DispatchMode.RAY), "local", record.DispatchMode.RAY),
        ({}, None, None),  # imported by a warm start, or asked and not yet placed
        ({"dispatch": "elsewhere", "executor": "slurm"}, "slurm", None),  # a later release's mode
    ],
)
def test_a_trial_reads_its_executor_and_mode_whenever_it_was_written(
    attrs: dict[str, object], executor: str | None, mode: record.DispatchMode | None
) -> None:
    trial = _trial(attrs)
    assert record.executor_name(trial) == executor
    assert record.dispatch_mode(trial) == mode


def test_a_process_outside_any_job_is_on_the_local_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    assert executors.here().name == "local"
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert executors.here().identity() == ("41", os.environ.get("SLURM_JOB_NODELIST", ""))


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _signal_state(pid: int) -> str:
    """Where a SIGINT to this process went: its state, its blocked, ignored and pending signals, and
    its children's: a controller that outlives the SIGINT says here whether it ignores it."""
    lines = []
    for task in [pid, *(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]:
        status = Path(f"/proc/{task}/status").read_text().splitlines()
        keep = ("Name", "State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
        lines.append(f"{task}: " + ", ".join(line for line in status if line.split(":")[0] in keep))
    return "\n".join(lines)


def test_the_local_executor_runs_watches_logs_and_cancels_a_job(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The protocol end to end on real local processes: submit, watch to its end, read its log;
    submit again, cancel it by its id, as a relaunch (no handle) would."""
    spec = load_study(write_study(tmp_path / "s.yaml", study_document("seam", tmp_path / "w")))
    # As in a launcher (hpo/commands/common.py): a suite started as a script's background job
    # inherits SIGINT ignored, and so would the job's controller, which the cancel then could not stop.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    local = executors.get("local")
    job = local.submitter(spec, job_name="t").submit(_sleep, 0.1)
    assert job.result() == 0.1
    assert local.ended(str(job.job_id), job) and local.end_state(job) == "exited"
    assert local.log(spec, str(job.job_id)).exists()
    long = local.submitter(spec, job_name="t").submit(_sleep, 60)
    deadline = time.monotonic() + 30
    while local.ended(str(long.job_id), None) and time.monotonic() < deadline:
        time.sleep(0.1)  # its controller process starting
    assert not local.ended(str(long.job_id), None)
    local.cancel(spec, str(long.job_id))
    deadline = time.monotonic() + 30
    while not local.ended(str(long.job_id), None) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert local.ended(str(long.job_id), None), _signal_state(int(long.job_id))
    assert local.cost([str(long.job_id)]) == {}


def test_the_mode_is_written_before_the_executor() -> None:
    """Attributes are written one at a time: a trial left with ``executor`` alone reads as written
    before ``dispatch`` existed, which for a worker's or a Ray trial would be the wrong mode."""
    assert list(record.placement("slurm", record.DispatchMode.WORKERS)) == [
        record.ATTR_DISPATCH,
        record.ATTR_EXECUTOR,
    ]
