"""Errors the service raises on purpose; the CLI turns each into one line and an exit status."""

from __future__ import annotations


class StudyFileError(ValueError):
    """The study file, an override or a command-line option is invalid (exit status 2).

    The message is one line: ``FILE: key.path: problem``. Nothing has been submitted.
    """


class LaunchError(RuntimeError):
    """The study could not run to the end for a reason outside the study file (exit status 1)."""
