"""What every ``hpo`` command shares: the :class:`Command` its module declares, the study-file
arguments, the study file loaded with the command line's overrides, and :func:`execute`, which turns
whatever ended a command into an exit status and one line on stderr (``hpo.errors`` documents the
statuses).

The project's modules are imported inside the functions that need them: ``hpo --help``, ``hpo
schema`` and an option's bad input answer without loading SQLAlchemy and Optuna's storages
(``hpo.storage`` alone takes about 0.4 s to import) or a backend's packages.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.errors import LaunchError, NotReadyError, StudyFileError, exit_status, one_line

if TYPE_CHECKING:
    import optuna

    from hpo.config import StudySpec
    from hpo.storage import StorageRef

Options = argparse.Namespace
"""A command's parsed options: its own arguments, ``command`` (its name), ``run`` (its function)
and ``argv`` (the command line as typed, for the detached launcher's log)."""


@dataclasses.dataclass(frozen=True)
class Command:
    """One ``hpo`` command, as its module declares it; ``hpo.commands.COMMANDS`` lists them."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Options], int]
    """Runs the command; errors are raised (:func:`execute` turns them into an exit status)."""


@dataclasses.dataclass(frozen=True)
class Forwarded:
    """A command whose own parser reads the rest of the line (``hpo train``: the trainer's flags)."""

    name: str
    help: str
    main: Callable[[list[str]], int]


PASSWORD_ON_COMMAND_LINE = (
    "--storage: a password on the command line is visible to every user; put it in PGPASSWORD or ~/.pgpass"
)
STORAGE_HELP = "no password here: use PGPASSWORD or ~/.pgpass"

# Options that override a study-file key: (option, key), named in errors that the override caused.
_OVERRIDE_OPTIONS = (
    ("storage", "study.storage"),
    ("executor", "resources.executor"),
    ("backend", "study.backend"),
    ("n_trials", "study.n_trials"),
    ("max_concurrent", "study.max_concurrent"),
    ("enqueue_best_of", "study.warm_start.enqueue_best_of"),
)


def add_study_arguments(parser: argparse.ArgumentParser) -> None:
    """The study file, ``--storage`` and ``--set``: every command on one study takes them."""
    parser.add_argument("study_file", type=Path, metavar="STUDY.yaml")
    parser.add_argument("--storage", help=f"override study.storage ({STORAGE_HELP})")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a study-file key",
    )


def add_view_arguments(parser: argparse.ArgumentParser) -> None:
    """A view's arguments: the study's (``add_study_arguments``), and ``--json`` for scripts."""
    add_study_arguments(parser)
    parser.add_argument(
        "--json", action="store_true", help="one JSON document instead (its keys: docs/watching-a-study.md)"
    )


def execute_as_process(options: Options) -> int:
    """:func:`execute` as the main work of a process (the command line, a detached launcher's job):
    SIGTERM stops it as cleanly as Ctrl-C, so that a launcher stopped by ``kill`` or by Slurm (its
    job's time limit, a requeue) says which trials keep running."""
    signal.signal(signal.SIGTERM, _interrupt)
    # A closed terminal or ssh session (SIGHUP) stops the launcher as cleanly: it says which trials
    # keep running. (nohup, screen and --detach keep it alive instead.)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _interrupt)
    # A script's background job inherits SIGINT ignored (and Python then keeps ignoring it);
    # `kill -INT` must still stop a launcher cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return execute(options)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def execute(options: Options) -> int:
    """Run a command; returns its exit status, having printed one line for any error."""
    try:
        return int(options.run(options))
    except BrokenPipeError:
        # `hpo status ... | head`: the reader has what it wanted. Python would complain again when
        # it flushes stdout at exit, so stdout goes to /dev/null first. A launcher whose output
        # went away (`| tee` killed) was stopped mid-study: an interruption, not a success.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if options.command != "launch":
            return 0
        print(f"hpo {options.command}: its output was closed (broken pipe): stopped", file=sys.stderr)
        return exit_status(KeyboardInterrupt())
    except KeyboardInterrupt:
        print(f"hpo {options.command}: interrupted", file=sys.stderr)
        return exit_status(KeyboardInterrupt())
    except (StudyFileError, NotReadyError, LaunchError) as err:
        print(f"hpo {options.command}: error: {_escape_line_breaks(str(err))}", file=sys.stderr)
        return exit_status(err)
    except Exception as err:
        if os.environ.get("HPO_DEBUG"):
            raise
        # An unforeseen failure (a database outage...): one line, not a traceback.
        print(
            f"hpo {options.command}: error: {_escape_line_breaks(one_line(err, last=True))} "
            "(HPO_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return exit_status(err)


# Every character that ends a line for str.splitlines(): a message quoting the study file (a key
# written "a\rb") must stay one line, so each is written as its escape.
_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def _escape_line_breaks(message: str) -> str:
    return message.translate(_LINE_BREAKS)


def load_spec(options: Options) -> tuple[StudySpec, StorageRef]:
    """The study file with the command line's overrides, and its storage: named by the command
    line or the file, else the file's last launch's (:func:`_use_last_launch`)."""
    from hpo.config import load_study
    from hpo.storage import has_password, resolve_storage

    command_line_urls = [options.storage] if options.storage is not None else []
    command_line_urls += [o.partition("=")[2] for o in options.overrides if o.startswith("study.storage=")]
    if any(has_password(url) for url in command_line_urls):
        raise StudyFileError(PASSWORD_ON_COMMAND_LINE)
    overrides = list(options.overrides)
    labels = {}  # names the option behind an override in error messages
    for option, key in _OVERRIDE_OPTIONS:
        value = getattr(options, option, None)
        if value is not None:
            overrides.append(f"{key}={value}")
            labels[key] = "--" + option.replace("_", "-")
    spec = load_study(options.study_file, overrides, labels)
    if spec.study.warm_start.storage and has_password(spec.study.warm_start.storage):
        # The study's own password is moved to PGPASSWORD; a second one has nowhere to go, and the
        # study file (with this URL) is pickled into every job.
        raise StudyFileError(
            f"{spec.source}: study.warm_start.storage: a password in this URL would reach every job; "
            "put it in ~/.pgpass (mode 600)"
        )
    _use_last_launch(options, spec)
    storage = resolve_storage(spec, spec.study.storage, spec.source)
    # The study file is pickled into every job: it must carry the URL without its password.
    spec.study.storage = str(storage)
    return spec, storage


def _use_last_launch(options: Options, spec: StudySpec) -> None:
    """A command that names no storage (options, overrides, the file's keys) takes the study file's
    last launch's (``hpo.launch_history``), and its workdir unless it names one: from another
    folder, or after a launch with ``--storage``, it finds the same study instead of an empty
    default. A last launch on the default journal is its workdir's: a command naming another
    workdir has its own."""
    from hpo import launch_history
    from hpo.storage import default_storage, mask

    if spec.study.storage:
        return
    last = launch_history.recorded(Path(spec.source), spec.study.name)
    if last is None:
        return
    default_workdir = spec.workdir
    on_default_journal = last["storage"] == str(default_storage(Path(last["workdir"])))
    if spec.study.workdir and on_default_journal:
        return
    spec.study.workdir = spec.study.workdir or last["workdir"]
    spec.study.storage = last["storage"]
    if last["storage"] != str(default_storage(default_workdir)):
        print(
            f"hpo {options.command}: {options.study_file}: the study of its last launch, in "
            f"{mask(last['storage'])} (workdir {last['workdir']}); --storage names another",
            file=sys.stderr,
        )


def open_study(options: Options) -> tuple[StudySpec, StorageRef, optuna.Study]:
    """The stored study of a command that reads it: a missing one is a one-line error, not an
    empty page."""
    from hpo.observe import views

    spec, storage = load_spec(options)
    return spec, storage, views.load_study(spec, storage)


def print_lines(lines: list[str]) -> int:
    print("\n".join(lines))
    return 0


def print_json(document: dict[str, Any]) -> int:
    """A machine-readable view on stdout: strict JSON (no nan), one document."""
    print(json.dumps(document, indent=2, allow_nan=False))
    return 0
