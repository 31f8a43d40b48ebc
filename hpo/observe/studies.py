"""`hpo studies` and `hpo delete`: the studies a storage holds, and removing one.

`hpo studies --storage URL` lists every study in that storage; without it, every study the user
launched (``hpo.launch_history``), in whichever storage each lives. Each line: trials by state, the best
value, the compute its trials recorded, and whether a launcher holds it now. A storage that cannot
be read (its server down) costs one line on stderr, which and why, and the others are still listed:
the command fails (exit 3) only when it listed nothing and a storage failed.

`hpo delete STUDY.yaml` removes the study from its storage after checking that nothing of it runs:
no launcher holds it and Slurm's queue has none of its jobs (``hpo cancel`` stops them first). It
asks for the study's name to be typed unless ``--yes``; the study's folder (logs, checkpoints) is
left, and said where.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import optuna

from hpo import executors, launch_history, record, tally
from hpo.budget.usage import format_hours
from hpo.dispatch.lease import Lease
from hpo.errors import LaunchError, NotReadyError, StudyFileError
from hpo.outages import driver_line
from hpo.storage import StorageRef, mask, open_storage

if TYPE_CHECKING:
    from hpo.config import StudySpec


def launched_storages() -> list[StorageRef]:
    """The storages of the user's recorded launches that still exist, each once."""
    refs: dict[str, StorageRef] = {}
    for entry in launch_history.entries():
        ref = StorageRef.parse(str(entry["storage"]))
        if ref.missing:
            continue  # its folder was removed
        refs.setdefault(str(ref), ref)
    return list(refs.values())


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def list_studies(refs: list[StorageRef], warn: Callable[[str], None] = _to_stderr) -> list[str]:
    """The table of the studies in ``refs``; each storage that cannot be read is one ``warn`` line
    (which, why) and the rest are listed. Raises :class:`NotReadyError` when a storage failed and
    no study was listed."""
    rows: list[tuple[str, ...]] = [("study", "storage", "trials", "best", "compute", "launcher")]
    failed: list[str] = []
    for ref in refs:
        try:
            rows += _rows(ref)
        except Exception as err:  # the drivers raise many types; all mean "cannot read this storage"
            failed.append(f"cannot read {mask(str(ref))}: {_why(err)}")
    if failed and len(rows) == 1 and len(refs) == 1:
        raise NotReadyError(failed[0], _HINT)  # the one storage asked for: its error line alone
    for line in failed:
        warn(f"hpo studies: {line}")
    if failed and len(rows) == 1:
        raise NotReadyError(
            f"no study listed: {len(failed)} of {len(refs)} storages could not be read", _HINT
        )
    if len(rows) == 1:
        where = ", ".join(mask(str(r)) for r in refs) or "no storage: no study launched yet"
        return [f"no study in {where}"]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]


def _rows(ref: StorageRef) -> list[tuple[str, ...]]:
    storage = open_storage(ref, create=False, tolerance_s=0)
    rows: list[tuple[str, ...]] = []
    for summary in sorted(optuna.get_all_study_summaries(storage), key=lambda s: s.study_name):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        rows.append((summary.study_name, mask(str(ref)), *_summary(study, ref)))
    return rows


def _why(err: BaseException) -> str:
    """The first line of the cause, under Optuna's wrapper (which blames "invalid data in the
    commit, e.g. exceeding max length" for a server that does not answer), kept short."""
    line = driver_line(err)
    return line if len(line) <= _WHY_CHARS else line[: _WHY_CHARS - 3] + "..."


_WHY_CHARS = 200
_HINT = "start the database server, or name another with --storage URL"


def _summary(study: optuna.Study, ref: StorageRef) -> tuple[str, str, str, str]:
    trials = tally.own_trials(study)
    counts = Counter(record.shown_state(t) for t in trials)
    shown = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none"
    complete = [
        t
        for t in trials
        if t.state.name == "COMPLETE" and t.values and not t.user_attrs.get(record.ATTR_INFEASIBLE)
    ]
    best = "-"
    if complete:
        pick = max if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else min
        chosen = pick(complete, key=lambda t: t.values[0])
        best = f"{tally.format_value(chosen.values[0])} (trial {chosen.number})"
    gpu = sum(float(t.user_attrs.get(record.ATTR_GPU_HOURS) or 0) for t in trials)
    cpu = sum(float(t.user_attrs.get(record.ATTR_CPU_HOURS) or 0) for t in trials)
    compute = f"{format_hours(gpu)} GPU-h" if gpu else f"{format_hours(cpu)} CPU-h"
    holder = Lease(ref, study.study_name).held_by_another()
    return shown, best, compute, holder or "-"


def delete_study(
    spec: StudySpec, ref: StorageRef, *, confirmed: bool, ask: Callable[[str], str] = input
) -> list[str]:
    storage = open_storage(ref, create=False, tolerance_s=0)
    try:
        study = optuna.load_study(study_name=spec.study.name, storage=storage)
    except KeyError:
        raise StudyFileError(
            f"{spec.source}: study.name: no study {spec.study.name!r} in {mask(str(ref))}"
        ) from None
    holder = Lease(ref, spec.study.name).held_by_another()
    if holder is not None:
        raise LaunchError(f"study {spec.study.name!r} is being launched by {holder}: `hpo cancel` it first")
    if queued := executors.queued(spec):
        executor, jobs = queued[0]
        raise LaunchError(
            f"study {spec.study.name!r} has {len(jobs)} jobs in {executor.queue_name}'s queue "
            f"({', '.join(jobs)}): `hpo cancel` it first"
        )
    trials = len(study.get_trials(deepcopy=False))
    what = f"study {spec.study.name!r} and its {trials} trials from {mask(str(ref))}"
    if not confirmed:
        if not sys.stdin.isatty():
            raise StudyFileError(
                f"{spec.source}: hpo delete: not on a terminal to confirm: pass --yes to delete {what}"
            )
        answer = ask(f"delete {what}? type the study's name to confirm: ")
        if answer.strip() != spec.study.name:
            return ["not deleted"]
    optuna.delete_study(study_name=spec.study.name, storage=storage)
    launch_history.forget(Path(spec.source), spec.study.name)
    return [f"deleted {what}", f"its folder is left: {spec.workdir} (job logs, checkpoints)"]
