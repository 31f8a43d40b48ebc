"""Launch-time problems: one line and nothing submitted. Bad input (the user's to fix) exits 2; a
machine or service that is not ready exits 3, with a hint."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from tests.hpo.helpers import HPO, REPO, study_document, write_study


def launch(
    study_file: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HPO, "launch", str(study_file), *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unreachable_storage_server_is_reported_before_anything_is_submitted(tmp_path: Path) -> None:
    document = study_document("unreachable", tmp_path / "work")
    study_file = write_study(tmp_path / "study.yaml", document)
    # Nothing listens on port 1: the connection is refused at once.
    proc = launch(study_file, "--storage", "postgresql://hpo@127.0.0.1:1/hpo")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert "(hint: start the database server" in line
    assert line.startswith(
        f"hpo launch: error: {study_file}: study.storage: cannot open postgresql://hpo@127.0.0.1:1/hpo: "
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "work" / "jobs").exists()


def test_slurm_executor_without_sbatch_names_the_local_executor(tmp_path: Path) -> None:
    document = study_document("no-slurm", tmp_path / "work", resources={"executor": "slurm"})
    study_file = write_study(tmp_path / "study.yaml", document)
    # Only the virtual environment on PATH: no sbatch, as on a workstation without Slurm.
    proc = launch(study_file, env={"PATH": str(Path(sys.executable).parent)})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert f"{study_file}: resources.executor: slurm, but there is no sbatch on this machine" in line
    assert "(hint: run on a Slurm login node, or use executor: local" in line
    assert not (tmp_path / "work").exists()


def test_a_job_larger_than_the_partition_is_rejected_with_the_numbers(
    tmp_path: Path, local_cluster: str
) -> None:
    for backend in ("optuna", "ray"):
        document = study_document(
            f"too-big-{backend}", tmp_path / backend, study={"backend": backend},
            resources={"executor": "slurm", "nodes": 2, "gpus_per_node": 1},
        )  # fmt: skip
        study_file = write_study(tmp_path / f"{backend}.yaml", document)
        proc = launch(study_file, "--storage", local_cluster)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        [line] = proc.stderr.splitlines()
        assert f"{study_file}: resources: a job needs 2 nodes with 1 GPUs" in line
        assert "has 2 nodes, 0 of them big enough (at most 0 GPUs and 2 CPUs per node) (hint: " in line
        assert not (tmp_path / backend / "jobs").exists()


def test_ray_ddp_trials_that_cannot_run_are_refused_in_one_line(tmp_path: Path) -> None:
    # (resources, study, problem, exit status): the machine's 2 cores are a fact, not a typo.
    cases = [
        (
            {"tasks_per_node": 2, "gpus_per_node": 3},
            {},
            "2 Ray Train workers cannot share gpus_per_node=3",
            2,
        ),
        ({"tasks_per_node": 64, "cpus_per_task": 64}, {}, "64 workers x cpus_per_task=64 need 4096 CPUs", 3),
        (
            {"tasks_per_node": 2},
            {"pruner": {"name": "pbt", "options": {}}},
            "PBT hands checkpoints between",
            2,
        ),
    ]
    for index, (resources, study, problem, status) in enumerate(cases):
        document = study_document(
            f"ray-ddp-bad-{index}", tmp_path / f"work{index}", study={"backend": "ray", **study},
            resources=resources,
        )  # fmt: skip
        study_file = write_study(tmp_path / f"study{index}.yaml", document)
        proc = launch(study_file)
        assert proc.returncode == status, proc.stdout + proc.stderr
        [line] = proc.stderr.splitlines()
        assert line.startswith(f"hpo launch: error: {study_file}: resources.tasks_per_node: {problem}"), line
        assert not (tmp_path / f"work{index}").exists()


def test_a_sampler_whose_package_is_missing_is_refused_before_anything_starts(tmp_path: Path) -> None:
    # The test environment has no cmaes package (the `samplers` extra): Optuna imports it when the
    # CmaEsSampler first samples, after its random start-up trials, mid-study (as GPSampler does
    # SciPy).
    assert importlib.util.find_spec("cmaes") is None
    document = study_document("cmaes-sampler", tmp_path / "work")
    document["study"]["sampler"] = {"name": "cmaes", "seed": 0}
    study_file = write_study(tmp_path / "study.yaml", document)
    proc = launch(study_file)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert f"{study_file}: study.sampler.name: cmaes needs cmaes, which is not installed" in line
    assert "(hint: pip install 'slurm-hpo[samplers]'" in line
    assert "Traceback" not in proc.stderr and not (tmp_path / "work").exists()


def test_a_terminator_without_scipy_is_refused_before_anything_starts(tmp_path: Path) -> None:
    # SciPy hidden from this one process (an import of it finds nothing), as on a machine without
    # the `samplers` extra: the Terminator's first evaluation would fail after the first trials.
    document = study_document("terminator-no-scipy", tmp_path / "work")
    document["study"]["stop"] = {"terminator": True}
    study_file = write_study(tmp_path / "study.yaml", document)
    hidden = (
        "import sys; sys.modules['scipy'] = None; from hpo.cli import main; "
        f"sys.exit(main(['launch', {str(study_file)!r}]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", hidden], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert (
        f"{study_file}: study.stop.terminator: Optuna's Terminator needs scipy, which is not installed"
        in line
    )
    assert "Traceback" not in proc.stderr and not (tmp_path / "work").exists()


def test_a_trial_longer_than_its_qos_allows_is_refused_before_submission(
    tmp_path: Path, local_cluster: str
) -> None:
    """The local cluster's QoS short5 has MaxWall 00:05:00 (deploy/local-cluster/up.sh), as Jean
    Zay's QoS have theirs: a 10-minute trial would pend forever. Read from sacctmgr, not guessed."""
    cases = [
        (
            "10m",
            "short5",
            "resources.time: 10m (10 min) is longer than QoS short5's MaxWall 00:05:00 (5 min)",
        ),
        ("4m", "nosuch", "resources.slurm.qos: no QoS 'nosuch' on this cluster; it has dev3, normal, short5"),
    ]
    for index, (time_limit, qos, problem) in enumerate(cases):
        document = study_document(
            f"qos-{index}",
            tmp_path / f"work{index}",
            resources={"executor": "slurm", "time": time_limit, "slurm": {"qos": qos}},
        )
        study_file = write_study(tmp_path / f"study{index}.yaml", document)
        proc = launch(study_file, "--storage", local_cluster)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        [line] = proc.stderr.splitlines()
        assert line.startswith(f"hpo launch: error: {study_file}: {problem}"), line
        assert not (tmp_path / f"work{index}").exists()
    # Within the MaxWall, the same study is not refused (no trial run: --dry-run stops before
    # sacctmgr, so the check itself is called here).
    from hpo.config import load_study
    from hpo.slurm.preflight import check_qos_wall

    document = study_document(
        "qos-ok", tmp_path / "ok", resources={"executor": "slurm", "time": "5m", "slurm": {"qos": "short5"}}
    )
    check_qos_wall(load_study(write_study(tmp_path / "ok.yaml", document), []))
