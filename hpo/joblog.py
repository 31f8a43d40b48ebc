"""A job's own log: what a trial, a ``--workers`` worker, a Ray allocation or a detached launcher
says of itself goes through the ``hpo`` and ``trainer`` loggers to the job's stdout (the file
``hpo logs`` shows). ``HPO_LOG_LEVEL`` (DEBUG, INFO, WARNING; INFO by default) chooses how much.

Outside a job nothing configures these loggers: a library user or a test picks their handlers.
"""

from __future__ import annotations

import logging
import os
import sys

LEVEL_ENV = "HPO_LOG_LEVEL"

# The trainer's lines keep the prefix `python -m trainer` prints them with.
_FORMATS = {"hpo": "%(message)s", "trainer": "[trainer] %(message)s"}


def to_stdout() -> None:
    """Send the service's and the trainer's log records to stdout at ``HPO_LOG_LEVEL``. Called
    where a job starts; a second call (a requeued job's next task, an actor reused by Ray) adds
    nothing."""
    level = os.environ.get(LEVEL_ENV, "INFO").upper()
    for name, form in _FORMATS.items():
        logger = logging.getLogger(name)
        if logger.handlers:
            continue
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter(form))
        logger.addHandler(handler)
        logger.setLevel(level if level in ("DEBUG", "INFO", "WARNING", "ERROR") else "INFO")
        logger.propagate = False
