"""The learning-curve table that the replay benchmark runs strategies against, recorded by the
service itself.

``record`` runs ``bench/curves/study.yaml`` with ``hpo launch`` on the local Slurm cluster: random
configurations of the quickstart's search space, every one trained to the end without pruning.
Then it repeats the first configurations under other training seeds (each seed its own study in
the same journal, the configurations enqueued), to measure the noise a strategy cannot see
through. Each launch resumes what an earlier sitting left: the journal is committed. ``export``
writes the table, ``bench/curves/table.json``, from the journal.

    python bench/curves.py record                 # the study, the repeats, then export
    python bench/curves.py export                 # the table from the journal as it stands
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpo import record, storage  # noqa: E402
from hpo.config import load_study  # noqa: E402

HPO = str(Path(sys.executable).parent / "hpo")
STUDY_FILE = REPO / "bench/curves/study.yaml"
TABLE = REPO / "bench/curves/table.json"
REPEAT_SEEDS = (1, 2)
REPEATED = 16
"""How many of the study's configurations are trained again under each other seed."""


def repeat_name(seed: int) -> str:
    return f"curves-seed{seed}"


def load_document() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(STUDY_FILE.read_text())
    return document


def _open(name: str) -> Any:
    import optuna

    spec = load_study(STUDY_FILE)
    ref = storage.resolve_storage(spec, spec.study.storage, str(STUDY_FILE))
    return optuna.load_study(study_name=name, storage=storage.open_storage(ref, create=False))


def _launch(study_file: Path) -> None:
    command = [HPO, "launch", str(study_file)]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=REPO, check=True)


def record_table() -> None:
    started = time.monotonic()
    subprocess.run(["bash", str(REPO / "deploy/local-cluster/up.sh")], check=True, stdout=subprocess.DEVNULL)
    _launch(STUDY_FILE)
    main = sorted(_completed(_open("curves")), key=lambda t: t.number)[:REPEATED]
    for seed in REPEAT_SEEDS:
        document = load_document()
        document["study"].update(
            name=repeat_name(seed),
            n_trials=len(main),
            sampler={"name": "random", "seed": seed},
            enqueue=[dict(t.params) for t in main],
        )
        document["trainer"]["seed"] = seed
        path = REPO / "runs/curves" / f"repeat-seed{seed}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        _launch(path)
    export()
    print(f"recorded in {(time.monotonic() - started) / 3600:.2f} h (this sitting)")


def _completed(study: Any) -> list[Any]:
    return [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]


def _row(trial: Any, metric: str) -> dict[str, Any]:
    curve = record.curve(trial)
    seconds = trial.user_attrs[record.ATTR_EPOCH_SECONDS]
    asked = datetime.fromisoformat(trial.user_attrs[record.ATTR_ASKED_AT])
    finished = datetime.fromisoformat(trial.user_attrs[record.ATTR_FINISHED_AT])
    epoch_total = sum(train + val for train, val in seconds)
    return {
        "number": trial.number,
        "params": dict(trial.params),
        metric: [curve[epoch] for epoch in sorted(curve)],
        "test_accuracy": trial.user_attrs.get(record.ATTR_TEST_ACCURACY),
        "train_s": [train for train, _ in seconds],
        "val_s": [val for _, val in seconds],
        # From the launcher's ask to the trial's end, what the epochs do not account for: the job's
        # submission and start, the imports, the data, the final test pass, the checkpoints.
        "overhead_s": round((finished - asked).total_seconds() - epoch_total, 3),
    }


def export() -> dict[str, Any]:
    spec = load_study(STUDY_FILE)
    metric = spec.study.metric
    main = _open("curves")
    rows = [_row(t, metric) for t in sorted(_completed(main), key=lambda t: t.number)]
    by_params = {json.dumps(r["params"], sort_keys=True): r["number"] for r in rows}
    repeats = []
    for seed in REPEAT_SEEDS:
        try:
            study = _open(repeat_name(seed))
        except KeyError:  # not recorded yet
            continue
        for trial in sorted(_completed(study), key=lambda t: t.number):
            row = _row(trial, metric)
            row["seed"] = seed
            row["of"] = by_params[json.dumps(row["params"], sort_keys=True)]
            repeats.append(row)
    asked = [datetime.fromisoformat(t.user_attrs[record.ATTR_ASKED_AT]) for t in _completed(main)]
    finished = [datetime.fromisoformat(t.user_attrs[record.ATTR_FINISHED_AT]) for t in _completed(main)]
    trial_hours = sum(sum(r["train_s"]) + sum(r["val_s"]) + r["overhead_s"] for r in rows + repeats) / 3600
    table = {
        "description": "Learning curves of random configurations, each trained to the end without "
        "pruning, recorded by `python bench/curves.py record` (bench/curves/study.yaml)",
        "metric": metric,
        "direction": "maximize",
        "epochs": int(spec.trainer["epochs"]),
        "max_concurrent": spec.study.max_concurrent,
        "space": {name: _param(p) for name, p in spec.search_space.items()},
        "trainer": {k: v for k, v in load_document()["trainer"].items()},
        "machine": f"{platform.machine()}, {_cores()} cores, {platform.platform()}",
        "recorded_from": min(asked).isoformat(timespec="seconds") if asked else None,
        "recorded_until": max(finished).isoformat(timespec="seconds") if finished else None,
        "trial_hours": round(trial_hours, 2),
        "configs": rows,
        "repeats": repeats,
    }
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE.relative_to(REPO)}: {len(rows)} configurations, {len(repeats)} repeats")
    return table


def _param(param: Any) -> dict[str, Any]:
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
    parser.add_argument("what", choices=["record", "export"])
    args = parser.parse_args(argv)
    os.chdir(REPO)  # the study file's paths are relative to the repository
    if args.what == "record":
        record_table()
    else:
        export()
    return 0


if __name__ == "__main__":
    sys.exit(main())
