"""Read-side commands on a stored study: ``hpo status``, ``hpo best`` and ``hpo logs``."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from hpo import executors, paths, record, search, study_record, tally
from hpo.budget import stopping
from hpo.budget.cost import StudyCost, study_cost
from hpo.budget.usage import format_hours
from hpo.config.user_code import placeholders, render
from hpo.errors import LaunchError, NotReadyError, StudyFileError
from hpo.outages import DatabaseUnreachable, driver_line, is_transient
from hpo.record import ATTR_PBT_FINAL_PARAMS, ATTR_PBT_SCHEDULE, ATTR_RETRY_OF
from hpo.storage import StorageRef, mask, open_storage
from hpo.trial import client
from trainer.config import RUNTIME_ONLY_FIELDS, TrainConfig
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from hpo.config import StudySpec


def load_study(spec: StudySpec, ref: StorageRef) -> optuna.Study:
    """The stored study, for reading: never created, and any problem reaching it is one line."""

    try:
        # A view answers at once: a database that stops answering later, mid-view, raises
        # DatabaseUnreachable (exit 3, the server and the driver's reason) instead of waiting.
        storage = open_storage(ref, create=False, tolerance_s=0)
        study = search.load(spec, storage, create=False)
    except (KeyError, FileNotFoundError):
        raise StudyFileError(_not_found(spec, ref)) from None
    except DatabaseUnreachable:
        raise
    except optuna.exceptions.StorageInternalError as err:
        if is_transient(err):  # the server went away while the storage was being opened
            raise _unreachable(spec, ref, err) from None
        raise LaunchError(f"cannot read {mask(str(ref))}: {driver_line(err)}") from None
    except Exception as err:  # drivers raise many types for an unreachable server
        raise _unreachable(spec, ref, err) from None
    search.check_direction(study, spec)  # a file whose objectives changed would misread it
    search.check_metric(study, spec)
    return study


def _not_found(spec: StudySpec, ref: StorageRef) -> str:
    """Where the study was looked for, and where else it may be; a launch is suggested only when
    this file has never been launched (it would otherwise start a second copy)."""
    from pathlib import Path

    from hpo import launch_history

    where = f"{spec.source}: study.name: no study {spec.study.name!r} in {mask(str(ref))}"
    last = launch_history.recorded(Path(spec.source), spec.study.name)
    if last is None:
        return f"{where}; this file has no recorded launch ({launch_history.registry_path()}): run `hpo launch` first"
    if last["storage"] == str(ref):
        return f"{where}, where its last launch ({last['at']}) put it: the study was deleted, or the storage moved"
    return f"{where}; its last launch ({last['at']}) used {mask(last['storage'])}: --storage {mask(last['storage'])} reaches it"


def _unreachable(spec: StudySpec, ref: StorageRef, err: BaseException) -> NotReadyError:
    return NotReadyError(
        f"{spec.source}: study.storage: cannot open {mask(str(ref))}: {driver_line(err)}",
        "start the database server, or name another with --storage URL",
    )


def status_lines(spec: StudySpec, study: optuna.Study, cost: StudyCost | None = None) -> list[str]:
    """The status table; ``cost`` when the caller already has it (one sacct call, not two)."""
    trials = tally.own_trials(study)
    counts = Counter(record.shown_state(t) for t in trials)
    # The budget's count: retried failures and trials never submitted are shown, not counted.
    counted = len(tally.counted_trials(study))
    imported = tally.imported_count(study)
    lines = [
        f"study {spec.study.name}: {counted} of {spec.study.n_trials} trials; "
        + ", ".join(f"{counts[s]} {s}" for s in sorted(counts))
        + (f"; {imported} imported by a warm start (not listed, not counted)" if imported else ""),
    ]
    cost = cost or study_cost(spec, trials)
    unit = "GPU-h" if cost.unit == "GPU-hours" else "CPU-h"
    # What the trials measured of themselves (the built-in trainer): shown once any trial has it.
    measured = any(record.ATTR_DATA_WAIT_SHARE in t.user_attrs for t in trials)
    extra = ("data wait", "img/s/GPU", "peak MiB") if measured else ()
    # The other metrics the user's objective reported: each one's value at the trial's last step.
    others = sorted({name for t in trials for name in t.user_attrs.get(record.ATTR_METRICS, {})})
    header = (
        "#",
        "state",
        "epoch",
        spec.study.metric,
        *others,
        "job",
        "elapsed",
        unit,
        *extra,
        "params / reason",
    )
    rows: list[tuple[str, ...]] = [header]
    front = {t.number for t in tally.pareto_front(study, spec)}
    mates = {n: [m for m in pack if m != n] for pack in tally.packs(trials).values() for n in pack}
    rows += [_status_row(spec, t, cost, others, measured, t.number in front, mates) for t in trials]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    lines.append(cost_line(cost))
    mismatched = {t.number: last for t in trials if (last := tally.steps_mismatch(t, spec)) is not None}
    if mismatched and spec.objective is not None:
        lines.append(
            f"warning: {spec.source}: objective.steps is {spec.objective.steps}, but "
            + ", ".join(f"trial {n} reported up to step {last}" for n, last in mismatched.items())
            + ": the pruner takes objective.steps for a full run's last step"
        )
    lines.extend(input_lines(spec, trials))
    lines.extend(ending_lines(spec, study, cost))
    return lines


def _status_row(
    spec: StudySpec,
    t: optuna.trial.FrozenTrial,
    cost: StudyCost,
    others: list[str],
    measured: bool,
    on_front: bool,
    mates: dict[int, list[int]],
) -> tuple[str, ...]:
    """One trial's row of the status table (the columns of ``status_lines``' header); ``mates``:
    the trials each packed trial's job ran beside it."""
    value = tally.metric_value(t)
    elapsed = tally.elapsed_s(t)
    detail = tally.format_params(t.params)
    reason = t.user_attrs.get(record.ATTR_FAIL_REASON)
    state = record.shown_state(t)
    if reason and state in ("FAIL", "INFEASIBLE", "DIVERGED"):
        detail = f"{detail}  [{reason}]"
    notes = [
        f"Pareto front, {spec.study.also_minimize}={tally.format_value(t.values[1])}" if on_front else "",
        f"retry of {t.user_attrs[ATTR_RETRY_OF]}" if ATTR_RETRY_OF in t.user_attrs else "",
        f"requeued {t.user_attrs[record.ATTR_RESTARTS]}x" if record.ATTR_RESTARTS in t.user_attrs else "",
        _pack_note(t, mates.get(t.number, [])),
    ]
    if any(notes):
        detail = f"{detail}  ({', '.join(n for n in notes if n)})"
    return (
        str(t.number),
        state,
        str(max(tally.curve(t), default=0)),
        tally.format_value(value),
        *(_last_of(t, name) for name in others),
        str(t.user_attrs.get(record.ATTR_JOB_ID, "-")),
        "-" if elapsed is None else f"{float(elapsed):.0f}s",
        format_hours(cost.of(cost.per_trial[t.number])) if t.number in cost.per_trial else "-",
        *(_measurement_cells(t) if measured else ()),
        detail,
    )


def _last_of(trial: optuna.trial.FrozenTrial, name: str) -> str:
    return tally.format_value(tally.other_metric(trial, name))


def _pack_note(trial: optuna.trial.FrozenTrial, mates: list[int]) -> str:
    """What ``hpo status`` says of a trial that shared its job's GPU: the trials its per-trial
    job ran beside it (``mates``), or its place among a --workers job's workers."""
    if mates:
        return f"shared its job with {', '.join(map(str, mates))}"
    slot = trial.user_attrs.get(record.ATTR_PACK_SLOT)
    if record.dispatch_mode(trial) == record.DispatchMode.WORKERS and slot is not None:
        return f"worker {int(slot) + 1} of {trial.user_attrs.get(record.ATTR_PACK_SIZE)} sharing its job"
    return ""


INPUT_BOUND_SHARE = 0.3
"""A trial whose training steps waited for data this share of their time or more is input-bound:
its GPU (or CPU) idled while the DataLoader decoded, and a better loader setting buys speed for
free. A fed model waits a few percent (the copy of each batch)."""


def _measurement_cells(trial: optuna.trial.FrozenTrial) -> tuple[str, str, str]:
    attrs = trial.user_attrs
    share = attrs.get(record.ATTR_DATA_WAIT_SHARE)
    speed = attrs.get(record.ATTR_IMAGES_PER_S_PER_GPU)
    peak = attrs.get(record.ATTR_PEAK_MEMORY_MIB)
    return (
        "-" if share is None else f"{100 * share:.0f}%",
        "-" if speed is None else f"{speed:.0f}",
        "-" if peak is None else f"{peak:.0f}",
    )


def input_verdict(trials: list[optuna.trial.FrozenTrial]) -> dict[str, Any] | None:
    """Whether the study's trials wait for their data: the measured trials, those input-bound
    (numbers), and the median data-wait share of each group. None before any trial measured."""
    shares = {
        t.number: float(t.user_attrs[record.ATTR_DATA_WAIT_SHARE])
        for t in trials
        if t.user_attrs.get(record.ATTR_DATA_WAIT_SHARE) is not None
    }
    if not shares:
        return None
    bound = sorted(n for n, share in shares.items() if share >= INPUT_BOUND_SHARE)
    return {
        "measured": len(shares),
        "input_bound": bound,
        "median_share": statistics.median(shares.values()),
        "median_share_input_bound": statistics.median(shares[n] for n in bound) if bound else None,
        "threshold": INPUT_BOUND_SHARE,
    }


def input_lines(spec: StudySpec, trials: list[optuna.trial.FrozenTrial]) -> list[str]:
    """One line: are the trials input-bound, and which setting to change if so."""
    verdict = input_verdict(trials)
    if verdict is None:
        return []
    bound, measured = verdict["input_bound"], verdict["measured"]
    if not bound:
        return [
            f"input: data wait {100 * verdict['median_share']:.0f}% of step time (median of {measured} "
            "trials): not input-bound"
        ]
    workers = int(spec.trainer.get("num_workers", TrainConfig.num_workers))
    advice = (
        "set trainer.num_workers above 0"
        if workers == 0
        else f"raise trainer.num_workers (now {workers}) or prefetch_factor"
    )
    return [
        f"input-bound: data wait {100 * verdict['median_share_input_bound']:.0f}% of step time in "
        f"{len(bound)} of {measured} trials: {advice} "
        "(python -m trainer --tune-loader --config <the trainer section> measures the best setting)"
    ]


def ending_lines(spec: StudySpec, study: optuna.Study, cost: StudyCost) -> list[str]:
    """The compute budget spent and left, a stop rule's verdict, the Terminator's last look."""
    lines = []
    if spec.study.budget is not None:
        # The Ray backend spends its allocations' hours, idle slots included: the driver's figure.
        stored = study_record.spent_hours(study)
        spent = stored if spec.study.on_ray and stored is not None else cost.total
        left = max(0.0, spec.study.budget - spent)
        lines.append(
            f"budget: {format_hours(spent)} of {format_hours(spec.study.budget)} "
            f"{cost.unit} spent, {format_hours(left)} left"
        )
    stopped = study_record.stopped(study)
    if stopped and stopped.get("kind") == "failing":
        lines.append(f"last launch stopped: {stopped['reason']}")
    elif stopped:
        lines.append(
            f"stopped after trial {stopped['at_trial']}: {stopped['reason']}; saved {stopped['saved']}"
        )
    look = stopping.terminator_evaluation(study)
    if look and "error" in look:
        lines.append(
            f"terminator after trial {look['at_trial']}: could not fit its model ({look['error']}): go on"
        )
    elif look:
        decision = "stop" if look["stop"] else "go on"
        lines.append(
            f"terminator after trial {look['at_trial']} ({look['complete_trials']} complete): regret "
            f"bound {look['regret_bound']:.4g} vs noise {look['noise']:.4g}: {decision}"
        )
    return lines


def cost_line(cost: StudyCost) -> str:
    """The study's cost in one line: total, by state, and what pruning saved."""
    parts = ", ".join(f"{format_hours(h)} {state}" for state, h in sorted(cost.by_state.items()))
    # Measured: by the trials' executor (Slurm: sacct), where each trial had a job of its own.
    if cost.measured:
        source = "measured"
    elif any(usage.measured for usage in cost.per_trial.values()):
        source = "measured where trials had their own job, else elapsed time x resources"
    else:
        source = "elapsed time x resources"
    return (
        f"cost: {format_hours(cost.total)} {cost.unit} ({parts}); "
        f"pruning saved {format_hours(cost.saved_by_pruning)} {cost.unit} [{source}]"
    )


def best_lines(spec: StudySpec, study: optuna.Study) -> list[str]:
    best = tally.best_trial(study, spec)
    if best is None:
        raise LaunchError(f"study {spec.study.name!r} has no completed trial yet")
    # A PBT member ends with the settings PBT gave it, on weights that may come from others.
    final = best.user_attrs.get(ATTR_PBT_FINAL_PARAMS) or best.params
    command = rerun_command(spec, best)  # first: a trainer section changed since is bad input
    lines = []
    front = tally.pareto_front(study, spec)
    if front:
        lines.append(
            f"Pareto front ({spec.study.metric} {spec.study.direction}, {spec.study.also_minimize} minimize):"
        )
        lines += [
            f"  trial {t.number}: {spec.study.metric}={tally.format_value(t.values[0])} "
            f"{spec.study.also_minimize}={tally.format_value(t.values[1])}  "
            + tally.format_params(t.params)
            for t in front
        ]  # fmt: skip
        lines.append(f"of the front, the best {spec.study.metric}:")
    lines += [
        f"best trial {best.number}: {spec.study.metric}={tally.format_value(best.values[0])} "
        + (
            f"held-out test_accuracy={tally.format_value(best.user_attrs[record.ATTR_TEST_ACCURACY])} "
            if record.ATTR_TEST_ACCURACY in best.user_attrs
            else ""
        )
        + f"(job {best.user_attrs.get(record.ATTR_JOB_ID, '-')})",
        "params: " + tally.format_params(best.params),
    ]
    for change in best.user_attrs.get(ATTR_PBT_SCHEDULE, []):
        lines.append(
            f"  PBT, after epoch {change['after_epoch']}: weights of trial {change['weights_of_trial']}, "
            + tally.format_params(change["params"])
        )
    if final != best.params:
        lines.append("params at the end: " + tally.format_params(final))
        lines.append(
            "(the command trains with the final params from the start; it does not replay PBT's schedule)"
        )
    if spec.objective is None:
        lines.append(f"train it: {command}")
    else:
        lines += objective_lines(spec, best)
    return lines


def rerun_command(spec: StudySpec, best: optuna.trial.FrozenTrial) -> str:
    """What runs the trial again by hand: the trainer's full command, a command objective's line
    from its folder, or a function objective's call."""
    if spec.objective is not None:
        return rerun_line(spec, best) if spec.objective.command is not None else objective_command(spec, best)
    final = best.user_attrs.get(ATTR_PBT_FINAL_PARAMS) or best.params
    try:
        config = spec.trainer_config(final)
    except ConfigError as err:  # the study file's trainer section changed since the trial ran
        raise StudyFileError(f"{spec.source}: trainer: {err}") from None
    threads = int(best.user_attrs.get(record.ATTR_THREADS, spec.resources.cpus_per_task))
    return full_training_command(config, threads)


def objective_lines(spec: StudySpec, best: optuna.trial.FrozenTrial) -> list[str]:
    """How to run the best configuration of the user's own objective by hand."""
    if spec.objective is not None and spec.objective.function is not None:
        command = objective_command(spec, best)
        return [f"call it: {command}  (in {spec.objective_cwd}; trial: hpo.trial, run alone)"]
    fresh = spec.workdir / "rerun" / f"trial-{best.number}"
    return [
        f"run it (checkpoints in a fresh folder, {fresh}):",
        f"  {rerun_line(spec, best)}",
    ]


def rerun_line(spec: StudySpec, best: optuna.trial.FrozenTrial) -> str:
    """The command of a command objective's trial, from its folder: pasted anywhere, it runs."""
    return f"cd {shlex.quote(os.path.normpath(spec.objective_cwd))} && {objective_command(spec, best)}"


def objective_command(spec: StudySpec, best: optuna.trial.FrozenTrial) -> str:
    """The command line (or the function call) of a trial of the user's own objective."""
    objective = spec.objective
    assert objective is not None
    if objective.function is not None:
        return f"{objective.function}({best.params!r}, trial)"
    # A fresh checkpoint folder: the trial's own would resume its finished run.
    fresh = spec.workdir / "rerun" / f"trial-{best.number}"
    values = {
        **objective.fixed,
        **best.params,
        "trial": best.number,
        "checkpoint_dir": str(fresh / "checkpoint"),
        "trial_dir": str(fresh),
        "python": spec.resources.python or sys.executable,
    }
    argv = render(objective.command or [], values)
    # What the trial's process had that made its value: its threads, and, for a script that reads
    # its parameters through the trial API (a parameter its command does not pass), the parameters.
    environment = {
        "OMP_NUM_THREADS": str(best.user_attrs.get(record.ATTR_THREADS, spec.resources.cpus_per_task))
    }
    passed = {name for element in objective.command or [] for name in placeholders(element)}
    given = {**objective.fixed, **best.params}  # what the trial's hpo.trial.params() returned
    if any(name not in passed for name in given):
        environment[client.ENV_PARAMS] = json.dumps(given)
        environment[client.ENV_CHECKPOINT_DIR] = str(fresh / "checkpoint")
    environment.update(objective.env)
    return shlex.join(["env", *(f"{name}={value}" for name, value in environment.items()), *argv])


def full_training_command(config: TrainConfig, threads: int) -> str:
    """``python -m trainer`` with every setting that differs from the trainer's defaults, each float
    in its exact shortest form, with the trial's thread count: the trial's values to the last digit
    (on the machine it ran on)."""
    defaults = TrainConfig()
    words = [f"OMP_NUM_THREADS={threads}", "python", "-m", "trainer"]
    for field in dataclasses.fields(TrainConfig):
        value = getattr(config, field.name)
        if field.name in RUNTIME_ONLY_FIELDS and field.name != "num_workers":
            continue
        if value == getattr(defaults, field.name):
            continue
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + field.name.replace("_", "-"))
        else:
            words += [flag, repr(value) if isinstance(value, float) else str(value)]
    return " ".join(shlex.quote(word) for word in words)


def trial_trace(spec: StudySpec, study: optuna.Study, number: int) -> list[str]:
    """Where trial ``number``'s torch.profiler trace is, and how to open it."""
    trial = _trial(spec, study, number)
    folder = paths.profile_dir(spec, trial.number)
    traces = sorted(folder.glob("*.pt.trace.json*")) if folder.is_dir() else []
    if not traces:
        if trial.number >= spec.study.profile_trials:
            why = f"study.profile_trials is {spec.study.profile_trials}: trials 0 to K-1 are profiled"
        elif trial.state.name in ("RUNNING", "WAITING"):
            why = f"it has not reached its first steps yet ({trial.state.name})"
        else:
            why = f"its run wrote none ({trial.state.name}: see hpo logs --err)"
        raise LaunchError(f"trial {number} has no profiler trace in {folder}: {why}")
    return [
        *(str(path) for path in traces),
        f"open one in https://ui.perfetto.dev (the file stays local), or: tensorboard --logdir {folder} "
        "with the profiler plugin (pip install torch-tb-profiler)",
    ]


def _trial(spec: StudySpec, study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    trial = trials.get(number)
    if trial is None:
        raise StudyFileError(
            f"{spec.source}: trial {number}: no such trial in study {spec.study.name!r} (0 to {len(trials) - 1})"
        )
    return trial


def _log_path(spec: StudySpec, trial: optuna.trial.FrozenTrial, stderr: bool) -> Path:
    job_id = trial.user_attrs.get(record.ATTR_JOB_ID)
    if job_id is None:
        raise LaunchError(f"trial {trial.number} ({trial.state.name}) never started in a job: it has no log")
    if record.dispatch_mode(trial) == record.DispatchMode.RAY:
        raise LaunchError(
            f"trial {trial.number} ran in Ray job {job_id}: its log is under {spec.workdir / 'ray_results'}"
        )
    slot = trial.user_attrs.get(record.ATTR_PACK_SLOT)  # a packed job's trial has a log of its own
    executor = executors.get(record.executor_name(trial) or spec.resources.executor)
    return executor.log(spec, str(job_id), slot=None if slot is None else int(slot), stderr=stderr)


FOLLOW_POLL_S = 0.5


def follow_log(
    spec: StudySpec, study: optuna.Study, number: int, stderr: bool, write: Callable[[str], Any]
) -> None:
    """`hpo logs -f`: the output so far, then each new line as the job writes it, until the trial
    has ended and its output is quiet (or Ctrl-C). A trial whose job has not started yet is waited
    for."""
    trial = _trial(spec, study, number)
    while record.ATTR_JOB_ID not in trial.user_attrs and not trial.state.is_finished():
        time.sleep(FOLLOW_POLL_S)  # asked, not yet submitted
        trial = record.read_trial(study, record.trial_id(trial))
    path = _log_path(spec, trial, stderr)
    offset, quiet_since, waiting_said = 0, None, False
    while True:
        try:
            with open(path, "rb") as log:
                log.seek(offset)
                chunk = log.read()
        except FileNotFoundError:
            chunk = b""
            if not waiting_said and not trial.state.is_finished():
                write(f"[waiting for job {trial.user_attrs[record.ATTR_JOB_ID]} to start: {path}]\n")
                waiting_said = True
        if chunk:
            offset += len(chunk)
            write(chunk.decode(errors="replace"))
            quiet_since = None
        elif trial.state.is_finished():
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 2 * FOLLOW_POLL_S:  # what it wrote while exiting
                write(f"[trial {number} {trial.state.name}]\n")
                return
        time.sleep(FOLLOW_POLL_S)
        trial = record.read_trial(study, record.trial_id(trial))


def trial_log(spec: StudySpec, study: optuna.Study, number: int, stderr: bool) -> str:
    """The Slurm (or local) output of trial ``number``'s job, rank 0's."""
    trial = _trial(spec, study, number)
    job_id = trial.user_attrs.get(record.ATTR_JOB_ID)
    mode = record.dispatch_mode(trial)
    try:
        path = _log_path(spec, trial, stderr)
    except LaunchError as err:
        if mode == record.DispatchMode.RAY:
            return str(err)
        raise
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise LaunchError(f"trial {number}: cannot read {path}: {err.strerror}") from None
    if mode == record.DispatchMode.WORKERS:  # a worker's log holds every trial it ran
        return f"[worker job {job_id}: the log of every trial it ran]\n{text}"
    return text
