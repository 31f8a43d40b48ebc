"""``hpo tunnel``: the ssh commands that bring a study's dashboards to a laptop.

The Ray dashboard listens on 127.0.0.1 of the head node only, so the tunnel jumps through the
login node to the head and forwards to the head's own loopback. optuna-dashboard is run by the
user on the login node with ``hpo dashboard`` (on 127.0.0.1 too) and forwarded the same way.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import TYPE_CHECKING

from hpo.dispatch.ray.cluster import read_rendezvous, rendezvous_path
from hpo.errors import LaunchError
from hpo.study_record import STUDY_ATTR_RAY_JOB

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudySpec

RAY_LOCAL_PORT = 8265


def login_host() -> str:
    """The host a laptop reaches by ssh: HPO_LOGIN_HOST, else this machine's name."""
    return os.environ.get("HPO_LOGIN_HOST") or socket.gethostname()


def ray_head(spec: StudySpec, study: optuna.Study) -> dict[str, object]:
    """The head node and dashboard port of the study's running Ray job."""
    job_id = study.user_attrs.get(STUDY_ATTR_RAY_JOB)
    if not job_id:
        raise LaunchError(
            f"study {spec.study.name!r} has no Ray job; launch it with --backend ray --executor slurm"
        )
    if not _job_running(str(job_id)):
        raise LaunchError(f"the study's Ray job {job_id} is not running")
    data = read_rendezvous(rendezvous_path(spec, str(job_id)))
    if not data or data.get("done"):
        raise LaunchError(f"the Ray cluster of job {job_id} is not up (yet); try again in a minute")
    return data


def tunnel_commands(spec: StudySpec, study: optuna.Study, with_ray: bool, dashboard_port: int) -> list[str]:
    """The ssh commands: to the Ray dashboard ``with_ray``, and to ``hpo dashboard`` on
    ``dashboard_port`` (its default: this module does not import the dashboard's, which imports it)."""
    login = login_host()
    lines = []
    if with_ray:
        head = ray_head(spec, study)
        lines.append(
            f"ray dashboard (job {head['job_id']}, head {head['head']}): "
            f"ssh -N -L {RAY_LOCAL_PORT}:127.0.0.1:{head['dashboard_port']} -J {login} {head['head']}"
            f"   then open http://localhost:{RAY_LOCAL_PORT}"
        )
    lines.append(
        f"optuna-dashboard: on {login} run `hpo dashboard {spec.source} --port {dashboard_port}`, then: "
        f"ssh -N -L {dashboard_port}:127.0.0.1:{dashboard_port} {login}"
        f"   then open http://localhost:{dashboard_port}/dashboard/"
    )
    return lines


def open_tunnel(spec: StudySpec, study: optuna.Study) -> int:
    """Run the Ray dashboard's tunnel (from a laptop that can ssh to the login node)."""
    head = ray_head(spec, study)
    command = [
        "ssh",
        "-N",
        "-L",
        f"{RAY_LOCAL_PORT}:127.0.0.1:{head['dashboard_port']}",
        "-J",
        login_host(),
        str(head["head"]),
    ]
    return subprocess.call(command)


def _job_running(job_id: str) -> bool:
    if shutil.which("squeue") is None:
        return False
    proc = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60
    )
    return proc.stdout.strip() in ("RUNNING", "COMPLETING")
