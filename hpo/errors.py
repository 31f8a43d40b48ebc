"""Errors the service raises on purpose, each with its exit status, and the one way an exception
becomes the one line a user reads.

Exit status: 0 success, 1 runtime failure, 2 bad input (the study file, an override, an option:
the user's to fix), 3 not ready (this machine or a service it needs: no ``sbatch``, a partition
too small, a database that does not answer, an optional extra not installed), 130 interrupted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

EXIT_RUNTIME = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_READY = 3
EXIT_INTERRUPTED = 130


class StudyFileError(ValueError):
    """The study file, an override or a command-line option is invalid (exit status 2).

    The message is one line: ``FILE: key.path: problem``. Nothing has been submitted.
    """


class NotReadyError(RuntimeError):
    """The machine or a service the study needs is not ready (exit status 3): the study file may
    be fine. The message says what is missing; ``hint`` says what to do about it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        message = super().__str__()
        return f"{message} (hint: {self.hint})" if self.hint else message


class LaunchError(RuntimeError):
    """The study could not run to the end for a reason outside the study file (exit status 1)."""


@contextlib.contextmanager
def optional_extra(needed_by: str, hint: str | None = None) -> Iterator[None]:
    """Imports of an optional extra (Ray, optuna-dashboard, the report's plotting): a missing one is
    "not ready" (exit 3), naming what needs it and how to install it (default: pip install it)."""
    try:
        yield
    except ImportError as err:
        missing = err.name or str(err)
        raise NotReadyError(
            f"{needed_by} needs {missing}, which is not installed", hint or f"pip install {missing}"
        ) from None


def exit_status(err: BaseException) -> int:
    """The documented exit status of an error that ended a command."""
    if isinstance(err, StudyFileError):
        return EXIT_BAD_INPUT
    if isinstance(err, NotReadyError):
        return EXIT_NOT_READY
    if isinstance(err, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_RUNTIME


def one_line(err: BaseException, *, last: bool = False, name: bool = True) -> str:
    """An exception as one line: its first non-empty line (a Python error's message), or its last
    (``last``: tools such as sbatch put the cause at the end), after its type name (``name``)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = (lines[-1] if last else lines[0]) if lines else ""
    if not name:
        return text or repr(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
