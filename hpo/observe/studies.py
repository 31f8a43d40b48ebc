"""`hpo studies` and `hpo delete`: the studies a storage holds, and removing one.

`hpo studies --storage URL` lists every study in that storage; without it, every study the user
launched (``hpo.launches``), in whichever storage each lives. Each line: trials by state, the best
value, the compute its trials recorded, and whether a launcher holds it now.

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

from hpo import launches, record
from hpo.dispatch.lease import Lease
from hpo.errors import LaunchError, StudyFileError
from hpo.slurm import accounting, executors
from hpo.storage import StorageRef, mask, open_storage

if TYPE_CHECKING:
    from hpo.config import StudySpec


def launched_storages() -> list[StorageRef]:
    """The storages of the user's recorded launches that still exist, each once."""
    refs: dict[str, StorageRef] = {}
    for entry in launches.entries():
        ref = StorageRef.parse(str(entry["storage"]))
        if ref.kind == "journal" and not Path(ref.target).exists():
            continue  # its folder was removed
        refs.setdefault(str(ref), ref)
    return list(refs.values())


def list_studies(refs: list[StorageRef]) -> list[str]:
    rows = [("study", "storage", "trials", "best", "compute", "launcher")]
    for ref in refs:
        storage = open_storage(ref, create=False, tolerance_s=0)
        for summary in sorted(optuna.get_all_study_summaries(storage), key=lambda s: s.study_name):
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            rows.append((summary.study_name, mask(str(ref)), *_summary(study, ref)))
    if len(rows) == 1:
        where = ", ".join(mask(str(r)) for r in refs) or "no storage: no study launched yet"
        return [f"no study in {where}"]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]


def _summary(study: optuna.Study, ref: StorageRef) -> tuple[str, str, str, str]:
    trials = record.own_trials(study)
    counts = Counter(t.state.name for t in trials)
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
        best = f"{chosen.values[0]:.4f} (trial {chosen.number})"
    gpu = sum(float(t.user_attrs.get(record.ATTR_GPU_HOURS) or 0) for t in trials)
    cpu = sum(float(t.user_attrs.get(record.ATTR_CPU_HOURS) or 0) for t in trials)
    compute = f"{accounting.format_hours(gpu)} GPU-h" if gpu else f"{accounting.format_hours(cpu)} CPU-h"
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
    queued = executors.queued_jobs(spec)
    if queued:
        raise LaunchError(
            f"study {spec.study.name!r} has {len(queued)} jobs in Slurm's queue ({', '.join(queued)}): "
            "`hpo cancel` it first"
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
    launches.forget(Path(spec.source), spec.study.name)
    return [f"deleted {what}", f"its folder is left: {spec.workdir} (job logs, checkpoints)"]
