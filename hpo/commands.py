"""The ``hpo`` commands as functions: what the command line runs, and what a detached launcher runs.

A :class:`Request` holds one command and its options. :func:`execute` runs it and turns whatever
ended it into an exit status and one line on stderr (``hpo.errors`` documents the statuses); the
command line (``hpo.cli``) only builds the request, and the launcher job of ``hpo launch --detach``
calls :func:`execute` on the same request, minus ``--detach``.

The project's modules are imported inside the command that needs them: ``hpo --help``, ``hpo
schema`` and an option's bad input answer without loading SQLAlchemy and Optuna's storages
(``hpo.storage`` alone takes about 0.4 s to import) or a backend's packages.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hpo.errors import LaunchError, NotReadyError, StudyFileError, exit_status, one_line

if TYPE_CHECKING:
    from hpo.config import StudySpec
    from hpo.storage import StorageRef

# Options that override a study-file key: (option, key), named in errors that the override caused.
_OVERRIDE_OPTIONS = (
    ("storage", "study.storage"),
    ("executor", "resources.executor"),
    ("backend", "study.backend"),
    ("n_trials", "study.n_trials"),
    ("max_concurrent", "study.max_concurrent"),
    ("enqueue_best_of", "study.warm_start.enqueue_best_of"),
)


@dataclasses.dataclass
class Request:
    """One ``hpo`` command with its options (the command line's, parsed)."""

    command: str
    study_file: Path | None
    storage: str | None = None
    overrides: list[str] = dataclasses.field(default_factory=list)
    argv: list[str] = dataclasses.field(default_factory=list)
    """The command line as typed, for the detached launcher's log."""
    # launch
    executor: str | None = None
    backend: str | None = None
    n_trials: int | None = None
    max_concurrent: int | None = None
    workers: int | None = None
    enqueue_best_of: str | None = None
    dry_run: bool = False
    check: bool = False
    check_timeout: float = 300.0
    detach: bool = False
    allow_space_change: bool = False
    # tunnel, dashboard, report, logs
    open: bool = False
    host: str = "127.0.0.1"
    port: int = 8080
    out: Path | None = None
    trial: int | None = None
    err: bool = False
    trace: bool = False
    follow: bool = False
    yes: bool = False


def schema_text() -> str:
    """The JSON Schema of a study file, as ``hpo schema`` prints it and docs/study.schema.json holds it."""
    import json

    from hpo.config.schema import json_schema

    return json.dumps(json_schema(), indent=2)


def execute_as_process(request: Request) -> int:
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
    return execute(request)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def execute(request: Request) -> int:
    """Run a command; returns its exit status, having printed one line for any error."""
    try:
        return run(request)
    except BrokenPipeError:
        # `hpo status ... | head`: the reader has what it wanted. Python would complain again when
        # it flushes stdout at exit, so stdout goes to /dev/null first. A launcher whose output
        # went away (`| tee` killed) was stopped mid-study: an interruption, not a success.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if request.command != "launch":
            return 0
        print(f"hpo {request.command}: its output was closed (broken pipe): stopped", file=sys.stderr)
        return exit_status(KeyboardInterrupt())
    except KeyboardInterrupt:
        print(f"hpo {request.command}: interrupted", file=sys.stderr)
        return exit_status(KeyboardInterrupt())
    except (StudyFileError, NotReadyError, LaunchError) as err:
        print(f"hpo {request.command}: error: {_escape_line_breaks(str(err))}", file=sys.stderr)
        return exit_status(err)
    except Exception as err:
        if os.environ.get("HPO_DEBUG"):
            raise
        # An unforeseen failure (a database outage...): one line, not a traceback.
        print(
            f"hpo {request.command}: error: {_escape_line_breaks(one_line(err, last=True))} "
            "(HPO_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return exit_status(err)


# Every character that ends a line for str.splitlines(): a message quoting the study file (a key
# written "a\rb") must stay one line, so each is written as its escape.
_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def _escape_line_breaks(message: str) -> str:
    return message.translate(_LINE_BREAKS)


def run(request: Request) -> int:
    """Run a command; errors are raised (see :func:`execute`)."""
    from hpo.config import load_study
    from hpo.storage import has_password, resolve_storage

    if request.command == "studies":
        return list_studies(request)
    assert request.study_file is not None  # every other command names one
    command_line_urls = [request.storage] if request.storage is not None else []
    command_line_urls += [o.partition("=")[2] for o in request.overrides if o.startswith("study.storage=")]
    if any(has_password(url) for url in command_line_urls):
        raise StudyFileError(
            "--storage: a password on the command line is visible to every user; put it in "
            "PGPASSWORD or ~/.pgpass"
        )
    overrides = list(request.overrides)
    labels = {}  # names the option behind an override in error messages
    for option, key in _OVERRIDE_OPTIONS:
        value = getattr(request, option)
        if value is not None:
            overrides.append(f"{key}={value}")
            labels[key] = "--" + option.replace("_", "-")
    spec = load_study(request.study_file, overrides, labels)
    if spec.study.warm_start.storage and has_password(spec.study.warm_start.storage):
        # The study's own password is moved to PGPASSWORD; a second one has nowhere to go, and the
        # study file (with this URL) is pickled into every job.
        raise StudyFileError(
            f"{spec.source}: study.warm_start.storage: a password in this URL would reach every job; "
            "put it in ~/.pgpass (mode 600)"
        )
    _use_last_launch(request, spec)
    storage = resolve_storage(spec, spec.study.storage, spec.source)
    # The study file is pickled into every job: it must carry the URL without its password.
    spec.study.storage = str(storage)
    if request.command == "launch":
        return launch(request, spec, storage)
    return observe(request, spec, storage)


def _use_last_launch(request: Request, spec: StudySpec) -> None:
    """A command that names no storage (options, overrides, the file's keys) takes the study file's
    last launch's (``hpo.launches``), and its workdir unless it names one: from another folder, or
    after a launch with ``--storage``, it finds the same study instead of an empty default. A last
    launch on the default journal is its workdir's: a command naming another workdir has its own."""
    from hpo import launches
    from hpo.storage import mask

    if spec.study.storage:
        return
    last = launches.recorded(Path(spec.source), spec.study.name)
    if last is None:
        return
    default_workdir = spec.workdir
    on_default_journal = last["storage"] == f"journal:{Path(last['workdir']) / 'optuna.journal'}"
    if spec.study.workdir and on_default_journal:
        return
    spec.study.workdir = spec.study.workdir or last["workdir"]
    spec.study.storage = last["storage"]
    if last["storage"] != f"journal:{default_workdir / 'optuna.journal'}":
        print(
            f"hpo {request.command}: {request.study_file}: the study of its last launch, in "
            f"{mask(last['storage'])} (workdir {last['workdir']}); --storage names another",
            file=sys.stderr,
        )


def launch(request: Request, spec: StudySpec, storage: StorageRef) -> int:
    from hpo.dispatch import preflight

    executor = spec.resources.executor
    preflight.check_launch(
        spec,
        executor=executor,
        workers=request.workers,
        detach=request.detach,
        dry_run=request.dry_run or request.check,
    )
    for warning in spec.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if request.dry_run:
        _print_dry_run(spec, storage, executor)
    if request.check:
        from hpo.trial.check import run_check

        run_check(spec, request.check_timeout)
    if request.dry_run or request.check:
        return 0
    import gc

    from hpo import launches
    from hpo.storage import check_reachable

    # Recorded once the storage opens: a launch on one that cannot be (a server down, a typo in
    # --storage) fails here (exit 3) and leaves the last launch that worked for later commands.
    # Optuna's storage has no close; collected, it frees its connection before the launcher's own.
    check_reachable(storage, spec.source)
    gc.collect()
    launches.record(Path(spec.source), spec.study.name, str(storage), spec.workdir)
    if request.detach:
        return _detach(request, spec, storage)
    from hpo.dispatch import launch as launcher

    options = launcher.LaunchOptions(
        executor=executor, workers=request.workers, allow_space_change=request.allow_space_change
    )
    summary = launcher.launch(spec, storage, options)
    if summary.failing:
        raise LaunchError(summary.failing)
    if summary.best_number is None and not summary.cancelled:
        raise LaunchError(f"no trial of study {spec.study.name!r} completed; see `hpo status {spec.source}`")
    return 0


def observe(request: Request, spec: StudySpec, storage: StorageRef) -> int:
    """The commands that read a stored study (and ``cancel``, which stops its jobs)."""
    from hpo import study_record
    from hpo.observe import views

    study = views.load_study(spec, storage)  # a missing study: a one-line error, not an empty page
    if request.command == "dashboard":
        from hpo.observe import dashboard

        return dashboard.serve(spec, storage, study, request.host, request.port)
    if request.command == "tunnel":
        from hpo.observe import tunnel

        if request.open:
            return tunnel.open_tunnel(spec, study)
        with_ray = spec.study.backend == "ray" or study_record.ray_job(study) is not None
        lines = tunnel.tunnel_commands(spec, study, with_ray=with_ray)
    elif request.command == "status":
        lines = views.status_lines(spec, study)
    elif request.command == "best":
        lines = views.best_lines(spec, study)
    elif request.command == "report":
        from hpo.observe import report

        assert request.out is not None  # required by the command line
        written = report.write_report(spec, study, request.out)
        lines = [f"report of study {spec.study.name!r}: {written[0]}", *(f"  {p}" for p in written[1:])]
    elif request.command == "logs":
        assert request.trial is not None  # required by the command line
        if request.trace:
            lines = views.trial_trace(spec, study, request.trial)
        elif request.follow:
            views.follow_log(spec, study, request.trial, request.err, _write_flushed)
            return 0
        else:
            sys.stdout.write(views.trial_log(spec, study, request.trial, request.err))
            return 0
    elif request.command == "cancel":
        lines = views.cancel(spec, storage, study)
    elif request.command == "delete":
        from hpo.observe import studies

        lines = studies.delete_study(spec, storage, confirmed=request.yes)
    else:
        raise StudyFileError(f"unknown command {request.command!r}")
    print("\n".join(lines))
    return 0


def list_studies(request: Request) -> int:
    from hpo.observe import studies
    from hpo.storage import has_password, resolve_url

    if request.storage is not None:
        if has_password(request.storage):
            raise StudyFileError(
                "--storage: a password on the command line is visible to every user; put it in PGPASSWORD or ~/.pgpass"
            )
        refs = [resolve_url(request.storage, "--storage")]
    else:
        refs = studies.launched_storages()
    print("\n".join(studies.list_studies(refs)))
    return 0


def _write_flushed(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _detach(request: Request, spec: StudySpec, storage: StorageRef) -> int:
    from hpo.dispatch.lease import Lease, StudyBusy
    from hpo.slurm import detach

    holder = Lease(storage, spec.study.name).held_by_another()
    if holder is not None:  # a second launcher job would only be refused when it starts
        raise StudyBusy(
            f"study {spec.study.name!r} is being launched by {holder}", "wait for it, or `hpo cancel` it"
        )

    again = dataclasses.replace(request, detach=False, argv=[a for a in request.argv if a != "--detach"])
    job_id = detach.submit(spec, functools.partial(execute_as_process, again), again.argv)
    print(
        f"launcher submitted as Slurm job {job_id} ({spec.launcher.time_min} min per run, requeued before its limit)"
    )
    print(f"its log: {detach.log_path(spec, job_id)}")
    print(f"follow the study: hpo status {spec.source}")
    return 0


def _print_dry_run(spec: StudySpec, storage: StorageRef, executor: str) -> None:
    import yaml

    from hpo import portfolio
    from hpo.slurm import executors
    from hpo.storage import mask

    document = {
        "study": {**dataclasses.asdict(spec.study), "storage": mask(str(storage))},
        "search_space": {
            name: {k: v for k, v in dataclasses.asdict(p).items() if v is not None and v is not False}
            for name, p in spec.search_space.items()
        },
        **(
            {"objective": dataclasses.asdict(spec.objective)} if spec.objective else {"trainer": spec.trainer}
        ),
        "resources": dataclasses.asdict(spec.resources),
    }
    print(f"# {spec.source}, resolved (workdir {spec.workdir})")
    print(yaml.safe_dump(document, sort_keys=False).rstrip())
    if learned := portfolio.starting_trials(spec):  # shown to 4 digits; enqueued exactly
        shown = [{k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in p.items()} for p in learned]
        print(
            f"# then the learned starting portfolio's {len(learned)} (hpo/portfolio.json), before the sampler:"
        )
        print(yaml.safe_dump(shown, sort_keys=False).rstrip())
    if executor == "slurm":
        k = spec.resources.trials_per_gpu
        what = f"job of up to {k} trials at once" if spec.resources.packed else "trial job"
        print(f"# sbatch script of each {what} (submitted by submitit; folder {executors.jobs_folder(spec)})")
        print(executors.render_sbatch(spec, executors.job_name(spec), direct=True).rstrip())
    else:
        if spec.resources.packed:
            print(f"# each job of up to {spec.resources.trials_per_gpu} trials runs as a local process that "
                  f"starts each trial in a process of its own: {sys.executable} -m submitit.core._submit "
                  "<job folder>, then -m hpo.trial.packing <member> per trial")  # fmt: skip
        else:
            print(
                f"# each trial runs as a local process: {sys.executable} -m submitit.core._submit <job folder>"
            )
    print("# dry run: nothing submitted")
