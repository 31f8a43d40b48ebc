"""The learning-curve tables that the replay benchmark runs strategies against, recorded by the
service itself, one per task: ``bench/curves/TASK/`` holds the task's study file, its journal
and its table.

``record`` runs the task's ``study.yaml`` with ``hpo launch`` on the local Slurm cluster: random
configurations of its search space, every one trained to the end without pruning. Then it
repeats the first configurations under other training seeds (each seed its own study in the same
journal, the configurations enqueued), to measure the noise a strategy cannot see through. Each
launch resumes what an earlier sitting left: the journal is committed. ``export`` writes the
task's ``table.json`` from the journal.

``record-short`` trains every configuration of the table again with a complete OneCycle schedule
of fewer epochs (each length its own study in the journal, same seed): the low fidelity that
respects the schedule, against which a prefix of the full run is measured (``bench/fidelity.py``).

A task of the built-in trainer records each epoch's seconds and the held-out test accuracy from
the trainer's own measurements; a task of the user's own command reports them as named groups
of its ``metric_pattern``: ``seconds`` (the epoch's), and ``test`` (held-out accuracy, if any).

    python -m bench.curves record --task fmnist-resnet20-9ep   # the study, the repeats, then export
    python -m bench.curves record-short --task digits-mlp-27ep --epochs 3 9
    python -m bench.curves export --task fmnist-resnet20-9ep   # the table from the journal as it stands
    python -m bench.curves list                                # the tasks and what each holds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from hpo import record, storage, tally
from hpo.config import load_study

REPO = Path(__file__).resolve().parents[1]

HPO = str(Path(sys.executable).parent / "hpo")
CURVES = REPO / "bench/curves"
FIRST_TASK = "fmnist-resnet20-9ep"
"""The task the replay was first built on (and its default)."""
REPEAT_SEEDS = (1, 2)
REPEATED = 16
"""How many of the study's configurations are trained again under each other seed."""


def tasks() -> list[str]:
    return sorted(p.parent.name for p in CURVES.glob("*/study.yaml"))


def study_file(task: str) -> Path:
    return CURVES / task / "study.yaml"


def table_path(task: str) -> Path:
    return CURVES / task / "table.json"


def repeat_name(main: str, seed: int) -> str:
    return f"{main}-seed{seed}"


def load_document(task: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(study_file(task).read_text())
    return document


def _open(task: str, name: str) -> Any:
    import optuna

    spec = load_study(study_file(task))
    ref = storage.resolve_storage(spec, spec.study.storage, str(study_file(task)))
    return optuna.load_study(study_name=name, storage=storage.open_storage(ref, create=False))


def _launch(study_file: Path) -> None:
    command = [HPO, "launch", str(study_file)]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=REPO, check=True)


def record_table(task: str) -> None:
    started = time.monotonic()
    subprocess.run(["bash", str(REPO / "deploy/local-cluster/up.sh")], check=True, stdout=subprocess.DEVNULL)
    _launch(study_file(task))
    main_name = load_document(task)["study"]["name"]
    main = sorted(_completed(_open(task, main_name)), key=lambda t: t.number)[:REPEATED]
    for seed in REPEAT_SEEDS:
        document = load_document(task)
        document["study"].update(
            name=repeat_name(main_name, seed),
            n_trials=len(main),
            sampler={"name": "random", "seed": seed},
            enqueue=[dict(t.params) for t in main],
        )
        _set_seed(document, seed)
        _launch_variant(task, document, f"repeat-seed{seed}.yaml")
    export(task)
    print(f"recorded in {(time.monotonic() - started) / 3600:.2f} h (this sitting)")


def record_short(task: str, lengths: list[int]) -> None:
    """Every configuration of the task's study trained again, each by a complete schedule of
    ``lengths`` epochs (the full run's seed): one study per length in the task's journal."""
    started = time.monotonic()
    subprocess.run(["bash", str(REPO / "deploy/local-cluster/up.sh")], check=True, stdout=subprocess.DEVNULL)
    main_name = load_document(task)["study"]["name"]
    configs = sorted(_completed(_open(task, main_name)), key=lambda t: t.number)
    for epochs in lengths:
        document = load_document(task)
        document["study"].update(
            name=short_name(main_name, epochs),
            n_trials=len(configs),
            sampler={"name": "random", "seed": 0},
            enqueue=[dict(t.params) for t in configs],
        )
        if "objective" in document:
            document["objective"].setdefault("fixed", {})["epochs"] = epochs
            document["objective"]["steps"] = epochs
        else:
            document["trainer"]["epochs"] = epochs
        _launch_variant(task, document, f"short-{epochs}ep.yaml")
    export(task)
    print(f"recorded in {(time.monotonic() - started) / 3600:.2f} h (this sitting)")


def short_name(main: str, epochs: int) -> str:
    return f"{main}-{epochs}ep"


def _launch_variant(task: str, document: dict[str, Any], filename: str) -> None:
    """Launch a variant of the task's study, written to its workdir: the objective's folder stays
    the one the task's file names."""
    path = REPO / document["study"]["workdir"] / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    if "objective" in document:
        cwd = study_file(task).parent / document["objective"].get("cwd", ".")
        document["objective"]["cwd"] = str(cwd.resolve())
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    _launch(path)


def _set_seed(document: dict[str, Any], seed: int) -> None:
    """The training seed of a repeat: the trainer's, or the command's fixed ``seed``."""
    if "objective" in document:
        document["objective"].setdefault("fixed", {})["seed"] = seed
    else:
        document["trainer"]["seed"] = seed


def _completed(study: Any) -> list[Any]:
    return [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]


def _row(trial: Any, metric: str) -> dict[str, Any]:
    curve = tally.curve(trial)
    asked = datetime.fromisoformat(trial.user_attrs[record.ATTR_ASKED_AT])
    finished = datetime.fromisoformat(trial.user_attrs[record.ATTR_FINISHED_AT])
    if record.ATTR_EPOCH_SECONDS in trial.user_attrs:  # the built-in trainer's own measurements
        seconds = trial.user_attrs[record.ATTR_EPOCH_SECONDS]
        train_s, val_s = [train for train, _ in seconds], [val for _, val in seconds]
        test = trial.user_attrs.get(record.ATTR_TEST_ACCURACY)
    else:  # a command's: named groups of its metric_pattern, per step
        reported = trial.user_attrs.get(record.ATTR_METRICS, {})
        train_s = [float(reported["seconds"][str(step)]) for step in sorted(curve)]
        val_s = [0.0] * len(train_s)  # the command's epoch seconds include its validation
        tests = reported.get("test", {})
        test = float(tests[str(max(curve))]) if str(max(curve)) in tests else None
    epoch_total = sum(train_s) + sum(val_s)
    return {
        "number": trial.number,
        "params": dict(trial.params),
        metric: [curve[epoch] for epoch in sorted(curve)],
        "test_accuracy": test,
        "train_s": train_s,
        "val_s": val_s,
        # From the launcher's ask to the trial's end, what the epochs do not account for: the job's
        # submission and start, the imports, the data, the final test pass, the checkpoints.
        "overhead_s": round((finished - asked).total_seconds() - epoch_total, 3),
    }


def export(task: str) -> dict[str, Any]:
    spec = load_study(study_file(task))
    metric = spec.study.metric
    main = _open(task, spec.study.name)
    rows = [_row(t, metric) for t in sorted(_completed(main), key=lambda t: t.number)]
    by_params = {json.dumps(r["params"], sort_keys=True): r["number"] for r in rows}
    repeats = []
    for seed in REPEAT_SEEDS:
        try:
            study = _open(task, repeat_name(spec.study.name, seed))
        except KeyError:  # not recorded yet
            continue
        for trial in sorted(_completed(study), key=lambda t: t.number):
            row = _row(trial, metric)
            row["seed"] = seed
            row["of"] = by_params[json.dumps(row["params"], sort_keys=True)]
            repeats.append(row)
    short: dict[str, list[dict[str, Any]]] = {}
    for name, epochs in _short_studies(task, spec.study.name):
        short[str(epochs)] = []
        for trial in sorted(_completed(_open(task, name)), key=lambda t: t.number):
            row = _row(trial, metric)
            row["of"] = by_params[json.dumps(row["params"], sort_keys=True)]
            short[str(epochs)].append(row)
    asked = [datetime.fromisoformat(t.user_attrs[record.ATTR_ASKED_AT]) for t in _completed(main)]
    finished = [datetime.fromisoformat(t.user_attrs[record.ATTR_FINISHED_AT]) for t in _completed(main)]
    rows_short = [r for runs in short.values() for r in runs]
    trial_hours = sum(sum(r["train_s"]) + sum(r["val_s"]) + r["overhead_s"] for r in rows + repeats) / 3600
    short_hours = sum(sum(r["train_s"]) + sum(r["val_s"]) + r["overhead_s"] for r in rows_short) / 3600
    document = load_document(task)
    table = {
        "task": task,
        "description": "Learning curves of random configurations, each trained to the end without "
        f"pruning, recorded by `python -m bench.curves record --task {task}` "
        f"({study_file(task).relative_to(REPO)})",
        "study_file": str(study_file(task).relative_to(REPO)),
        "metric": metric,
        "direction": spec.study.direction or "maximize",
        "epochs": spec.max_steps,
        "max_concurrent": spec.study.max_concurrent,
        "space": {name: _param(p) for name, p in spec.search_space.items()},
        **(
            {"objective": document["objective"]}
            if "objective" in document
            else {"trainer": document["trainer"]}
        ),
        "machine": f"{platform.machine()}, {_cores()} cores, {platform.platform()}",
        "recorded_from": min(asked).isoformat(timespec="seconds") if asked else None,
        "recorded_until": max(finished).isoformat(timespec="seconds") if finished else None,
        "trial_hours": round(trial_hours, 2),
        "configs": rows,
        "repeats": repeats,
        # Complete shorter schedules of the same configurations, by length in epochs.
        **({"short_trial_hours": round(short_hours, 2), "short": short} if short else {}),
    }
    table_path(task).write_text(json.dumps(table, indent=1) + "\n")
    print(f"{table_path(task).relative_to(REPO)}: {len(rows)} configurations, {len(repeats)} repeats")
    return table


def _short_studies(task: str, main: str) -> list[tuple[str, int]]:
    """The task's short-schedule studies in its journal: (name, epochs), shortest first."""
    import optuna

    spec = load_study(study_file(task))
    ref = storage.resolve_storage(spec, spec.study.storage, str(study_file(task)))
    names = optuna.get_all_study_names(storage.open_storage(ref, create=False))
    found = []
    for name in names:
        length = name.removeprefix(f"{main}-").removesuffix("ep")
        if name.startswith(f"{main}-") and name.endswith("ep") and length.isdigit():
            found.append((name, int(length)))
    return sorted(found, key=lambda found: found[1])


def _param(param: Any) -> dict[str, Any]:
    if param.type == "categorical":
        return {"type": "categorical", "choices": list(param.choices)}
    out = {"type": param.type, "low": param.low, "high": param.high, "log": param.log}
    if param.power_of_two:
        out["power_of_two"] = True
    return out


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["record", "record-short", "export", "list"])
    parser.add_argument("--task", choices=tasks(), default=FIRST_TASK)
    parser.add_argument("--epochs", type=int, nargs="+", default=[], help="record-short: the lengths")
    args = parser.parse_args(argv)
    os.chdir(REPO)  # the study files' paths are relative to the repository
    if args.what == "record":
        record_table(args.task)
    elif args.what == "record-short":
        if not args.epochs:
            parser.error("record-short needs --epochs, e.g. --epochs 3 9")
        record_short(args.task, args.epochs)
    elif args.what == "export":
        export(args.task)
    else:
        for task in tasks():
            held = json.loads(table_path(task).read_text()) if table_path(task).exists() else None
            what = (
                f"{len(held['configs'])} configurations, {len(held['repeats'])} repeats"
                + "".join(
                    f", {len(runs)} complete {n}-epoch runs" for n, runs in held.get("short", {}).items()
                )
                if held
                else "no table yet"
            )
            print(f"{task}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
