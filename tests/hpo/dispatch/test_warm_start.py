"""Warm starts: a study seeded with an earlier study's finished trials, and one that runs another
study's best configurations first. Real trials, local processes, journal files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages.journal import JournalFileBackend

from tests.hpo.helpers import load_trials, run_hpo, stand_in_study, study_document, write_study

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An earlier study of 4 trials (two good, two bad configurations), run to its end. Its trials
    and the followers' are the torch-free stand-in of helpers.py: the warm start is the subject."""
    tmp = tmp_path_factory.mktemp("source")
    document = stand_in_study(tmp, "source", study={"n_trials": 4, "pruner": {"name": "none"}})
    study_file = write_study(tmp / "source.yaml", document)
    proc = run_hpo("launch", str(study_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [t.state.name for t in load_trials(document)] == ["COMPLETE"] * 4
    return document


def journal(document: dict[str, Any]) -> str:
    return f"journal:{Path(document['study']['workdir']) / 'optuna.journal'}"


def follower(tmp_path: Path, name: str, **study: Any) -> tuple[dict[str, Any], Path]:
    document = stand_in_study(
        tmp_path,
        name,
        workdir=tmp_path / name,
        study={"n_trials": 1, "enqueue": [], "pruner": {"name": "none"}, **study},
    )
    return document, write_study(tmp_path / f"{name}.yaml", document)


def test_a_warm_start_imports_the_trials_apart_and_moves_the_first_proposal(
    tmp_path: Path, source: dict[str, Any]
) -> None:
    cold, cold_file = follower(tmp_path, "cold")
    warm, warm_file = follower(
        tmp_path, "warm", warm_start={"studies": ["source"], "storage": journal(source)}
    )
    for study_file in (cold_file, warm_file):
        proc = run_hpo("launch", str(study_file))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warm start: imported 4 completed trials of study 'source'" in proc.stdout, proc.stdout
    imported = [t for t in load_trials(warm) if "imported_from" in t.user_attrs]
    own = [t for t in load_trials(warm) if "imported_from" not in t.user_attrs]
    assert [t.user_attrs["imported_from"] for t in imported] == [f"source#{n}" for n in range(4)]
    assert [t.values for t in imported] == [t.values for t in load_trials(source)]
    # Same sampler, same seed: the cold start's first proposal is a random start-up draw; the warm
    # start's comes from TPE's model of the imported trials.
    [cold_trial] = load_trials(cold)
    [warm_trial] = own
    assert warm_trial.params != cold_trial.params, (warm_trial.params, cold_trial.params)
    status = run_hpo("status", str(warm_file))
    first = status.stdout.splitlines()[0]
    assert first.startswith("study warm: 1 of 1 trials; 1 COMPLETE; 4 imported by a warm start"), first
    # A relaunch with a larger budget runs one more trial and imports nothing again.
    proc = run_hpo("launch", str(warm_file), "--n-trials", "2")
    assert proc.returncode == 0 and "warm start" not in proc.stdout, proc.stdout
    trials = load_trials(warm)
    assert sum("imported_from" in t.user_attrs for t in trials) == 4 and len(trials) == 6


def test_enqueue_best_of_runs_the_other_studys_best_first(tmp_path: Path, source: dict[str, Any]) -> None:
    document, study_file = follower(tmp_path, "follow", n_trials=2, warm_start={"storage": journal(source)})
    proc = run_hpo("launch", str(study_file), "--enqueue-best-of", "source")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Three by default, two of them within the budget of 2 trials.
    assert "enqueued the 2 best configurations of study 'source' to run first" in proc.stdout
    best = sorted(load_trials(source), key=lambda t: t.values[0], reverse=True)
    trials = load_trials(document)
    assert [t.params for t in trials] == [best[0].params, best[1].params]
    assert not any("imported_from" in t.user_attrs for t in trials)


def test_an_lr_is_rescaled_to_this_studys_global_batch(tmp_path: Path, source: dict[str, Any]) -> None:
    # The source searched batch_size; here it is fixed at 128 and not searched: an imported lr is
    # rescaled by 128 / the batch size it trained with (the linear rule). The trainer's batch_size
    # is what fixes it, so this study runs the real trainer.
    space = copy.deepcopy(source["search_space"])
    del space["batch_size"]
    document = study_document("rescaled", tmp_path / "rescaled", study={
        "n_trials": 1, "enqueue": [], "pruner": {"name": "none"},
        "warm_start": {"studies": ["source"], "storage": journal(source)},
    })  # fmt: skip
    document["search_space"] = space
    document["trainer"]["batch_size"] = 128
    proc = run_hpo("launch", str(write_study(tmp_path / "rescaled.yaml", document)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "parameters batch_size are not in this space and were left out" in proc.stdout, proc.stdout
    theirs = {t.number: t.params for t in load_trials(source)}
    for trial in load_trials(document):
        if "imported_from" in trial.user_attrs:
            origin = theirs[int(trial.user_attrs["imported_from"].split("#")[1])]
            assert trial.params["lr"] == pytest.approx(origin["lr"] * 128 / origin["batch_size"])
            assert "batch_size" not in trial.params


@pytest.mark.parametrize(
    ("warm_start", "change", "problem"),
    [
        ({"studies": ["nosuch"]}, {}, "study.warm_start.studies: no study 'nosuch' in journal:"),
        ({"enqueue_best_of": "nosuch"}, {}, "study.warm_start.enqueue_best_of: no study 'nosuch'"),
        ({"studies": ["source"]}, {"lr": {"type": "float", "low": 0.5, "high": 1.0}},
         "study.warm_start.studies: study 'source' has no completed trial this search space can take"),
        ({"studies": ["source"]}, {"metric": "val_loss"}, "study.warm_start.studies: study 'source' measures val_accuracy, this one val_loss"),
    ],
)  # fmt: skip
def test_a_warm_start_that_cannot_be_is_one_line_exit_2(
    tmp_path: Path, source: dict[str, Any], warm_start: dict[str, Any], change: dict[str, Any], problem: str
) -> None:
    document, _ = follower(tmp_path, "bad", warm_start={**warm_start, "storage": journal(source)})
    if "metric" in change:
        document["study"]["metric"] = change["metric"]
    else:
        document["search_space"].update(change)
    study_file = write_study(tmp_path / "bad.yaml", document)
    proc = run_hpo("launch", str(study_file))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert str(study_file) in line and problem in line, line
    assert "Traceback" not in proc.stderr
    # Refused before the study was created: the storage (if the launcher opened it) has none.
    journal_file = tmp_path / "bad" / "optuna.journal"
    if journal_file.exists():
        storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal_file)))
        assert optuna.study.get_all_study_names(storage) == []


def test_imported_trials_do_not_end_the_median_pruners_start_up(tmp_path: Path) -> None:
    """Imported trials have no epochs: the median pruner's start-up (5 complete trials) counts
    this study's own trials, or pruning starts at its first trial (found by the replay)."""
    from hpo import record, search
    from hpo.config import load_study
    from hpo.storage import StorageRef, open_storage

    _, study_file = follower(tmp_path, "pruned", pruner={"name": "median", "options": {"n_warmup_steps": 0}})
    spec = load_study(study_file, [])
    storage = open_storage(StorageRef("journal", str(tmp_path / "pruned.journal")), create=True)
    study = search.load(spec, storage, create=True)
    space = search.distributions(spec)
    for number in range(4):
        study.add_trial(
            optuna.trial.create_trial(
                params={"lr": 0.1 + number / 100},
                distributions={"lr": space["lr"]},
                value=0.8,
                user_attrs={"imported_from": f"earlier#{number}"},
            )
        )
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 0.3}, distributions={"lr": space["lr"]}, value=0.9, intermediate_values={1: 0.9}
        )
    )
    reloaded = search.load(spec, storage, create=False)
    trial = reloaded.ask(space)
    trial.report(0.1, step=1)  # far below the one own trial's 0.9 at epoch 1
    assert not trial.should_prune()
    # The same study without the imports' marks: 5 complete trials, the start-up is over.
    plain = optuna.load_study(
        study_name="pruned", storage=storage, pruner=search.build_pruner(spec.study.pruner, "")
    )
    assert optuna.Trial(plain, record.trial_id(trial)).should_prune()
