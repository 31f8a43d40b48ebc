"""``hpo dashboard``: optuna-dashboard on the study's own storage.

optuna-dashboard is given the opened storage object rather than a URL, so the embedded journal
file and a PostgreSQL server work alike and the password stays in ``PGPASSWORD``. It has no
authentication: it listens on 127.0.0.1 unless told otherwise, and a laptop reaches it through
the ssh tunnel that `hpo tunnel` prints.
"""

from __future__ import annotations

import ipaddress
import sys
from typing import TYPE_CHECKING

from hpo.errors import LaunchError, StudyFileError, optional_extra

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudySpec
    from hpo.storage import StorageRef

DEFAULT_PORT = 8080
DEFAULT_HOST = "127.0.0.1"
"""Where ``hpo dashboard`` listens unless told otherwise (``hpo tunnel`` forwards that port):
this machine's own loopback, the dashboard having no authentication."""


def serve(spec: StudySpec, ref: StorageRef, study: optuna.Study, host: str, port: int) -> int:
    """Serve the dashboard until interrupted (Ctrl-C)."""
    # Imported here: the command line reads this module's defaults to build its parser.
    from hpo.observe.tunnel import login_host
    from hpo.storage import open_storage

    if not 0 < port < 65536:
        raise StudyFileError(f"--port: must be 1 to 65535, got {port}")
    with optional_extra("hpo dashboard", "pip install 'slurm-hpo[dashboard]'"):
        import optuna_dashboard
    storage = open_storage(ref, create=False, tolerance_s=0)  # a page fails fast in an outage
    if not _is_loopback(host):
        print(
            f"warning: optuna-dashboard has no authentication; listening on {host} exposes the study "
            "to everyone who reaches this machine",
            file=sys.stderr,
        )
    page = f"dashboard/studies/{study._study_id}"
    print(f"optuna-dashboard for study {spec.study.name!r}: http://{host}:{port}/{page}", flush=True)
    print(f"from a laptop: ssh -N -L {port}:127.0.0.1:{port} {login_host()}, then open "
          f"http://localhost:{port}/{page}", flush=True)  # fmt: skip
    try:
        optuna_dashboard.run_server(storage, host=host, port=port)
    except OSError as err:  # port taken, host not on this machine
        raise LaunchError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
