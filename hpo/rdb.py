"""Optuna's database storage as the service opens it (``hpo.storage`` alone uses this module).

Kept apart from ``hpo.storage`` because it imports SQLAlchemy, which a journal study never needs:
only a database URL's open calls :func:`rdb_storage_class`.
"""

from __future__ import annotations

import os
from typing import Any

import optuna

CONNECT_TIMEOUT_S = 10
"""How long a connection waits on a database host that does not answer."""


def connect_args(url: str) -> dict[str, Any]:
    """The driver's connection arguments for a database URL (without its password, which
    ``hpo.storage`` moved out of it): a bounded wait on a dead host, and, for MySQL, the password
    from ``MYSQL_PWD``, which libpq-like clients read themselves but PyMySQL does not."""
    if url.startswith("postgresql"):
        return {"connect_timeout": CONNECT_TIMEOUT_S}
    if url.startswith("mysql"):
        password = os.environ.get("MYSQL_PWD")
        return {"connect_timeout": CONNECT_TIMEOUT_S, **({"password": password} if password else {})}
    return {}


def rdb_storage_class() -> type[optuna.storages.RDBStorage]:
    """Optuna's RDBStorage, its schema-version manager replaced by one set up on demand. RDBStorage
    looks the manager's class up in its module when it opens and when it is unpickled: every open
    in ``hpo.storage`` goes through this function, and so does an unpickled ``OutageTolerantStorage``."""
    from optuna.storages._rdb import storage as rdb_storage

    if getattr(rdb_storage._VersionManager, "on_demand", False):
        return optuna.storages.RDBStorage

    class _VersionManagerOnDemand(rdb_storage._VersionManager):
        """Optuna's schema-version manager, set up when first asked. Optuna's RDBStorage builds one on
        every open, and so imports alembic (with mako and pygments) and queries two version tables,
        even with ``skip_compatibility_check``: a fifth of a second of CPU, and two round trips, in
        every trial job and every ``hpo`` command on PostgreSQL. Only the opens that create the schema
        (or check it, or upgrade it) ask it anything, and then it is set up as Optuna's own."""

        on_demand = True

        def __init__(self, url: str, engine: Any, scoped_session: Any) -> None:  # Optuna's arguments
            self.url, self.engine, self.scoped_session = url, engine, scoped_session
            self._set_up = False

        def _ready(self) -> None:
            if not self._set_up:
                self._set_up = True
                self._init_version_info_model()
                self._init_alembic()

        def check_table_schema_compatibility(self) -> None:
            self._ready()
            super().check_table_schema_compatibility()

        def get_current_version(self) -> str:
            self._ready()
            return super().get_current_version()

        def get_head_version(self) -> str:
            self._ready()
            return super().get_head_version()

        def get_all_versions(self) -> list[str]:
            self._ready()
            return super().get_all_versions()

        def upgrade(self) -> None:
            self._ready()
            super().upgrade()

    rdb_storage._VersionManager = _VersionManagerOnDemand  # type: ignore[misc]
    return optuna.storages.RDBStorage
