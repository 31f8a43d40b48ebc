"""A relaunch whose study file changed what the stored study's values mean is refused before
anything is written: another metric, other fixed trainer settings, a search space changed without
``--allow-space-change``, and a change Optuna cannot model the stored trials with even with it.

The study is real (the embedded journal and the local cluster's PostgreSQL, the launcher's own
set-up code); its one trial is told directly so that no training is needed to have stored trials.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.hpo.helpers import fault_line, run_hpo, study_document, write_study


@pytest.fixture(params=["journal", "postgresql"])
def stored_study(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[dict[str, Any], Path, list[str]]:
    """A study file, its study created by the launcher's set-up, one trial COMPLETE in it; on the
    embedded journal and on the local cluster's PostgreSQL. Returns the ``--storage`` options."""
    from hpo import config, search
    from hpo.dispatch.common import open_study
    from hpo.storage import resolve_storage

    url = request.getfixturevalue("fresh_database") if request.param == "postgresql" else None
    options = ["--storage", url] if url else []
    document = study_document("drift-study", tmp_path / "work", study={"n_trials": 1, "enqueue": []})
    study_file = write_study(tmp_path / "study.yaml", document)
    spec = config.load_study(str(study_file))
    study, _, _ = open_study(spec, resolve_storage(spec, url, "--storage"))
    trial = study.ask(search.distributions(spec))
    study.tell(trial, 0.5)
    return document, study_file, options


def stored(document: dict[str, Any], options: list[str]) -> Any:
    """What a refused relaunch must leave as it was: the trials and the study's attributes (and,
    for the journal, its every byte)."""
    import optuna

    storage = options[1] if options else None
    study = optuna.load_study(study_name=document["study"]["name"], storage=storage or journal(document))
    trials = [(t.number, t.state.name, t.params, t.user_attrs) for t in study.get_trials()]
    size = None if storage else (Path(document["study"]["workdir"]) / "optuna.journal").stat().st_size
    return trials, study.user_attrs, size


def journal(document: dict[str, Any]) -> Any:
    import optuna

    path = str(Path(document["study"]["workdir"]) / "optuna.journal")
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))


def relaunch_with(
    document: dict[str, Any], study_file: Path, options: list[str], change: Any, *more: str
) -> Any:
    changed = copy.deepcopy(document)
    change(changed)
    write_study(study_file, changed)
    return run_hpo("launch", str(study_file), *options, *more, timeout=120)


def one_line_refusal(proc: Any) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    return line


Stored = tuple[dict[str, Any], Path, list[str]]


def test_a_changed_metric_is_refused_by_launch_and_by_the_views(stored_study: Stored) -> None:
    document, study_file, options = stored_study
    before = stored(document, options)
    line = one_line_refusal(
        relaunch_with(document, study_file, options, lambda d: d["study"].update(metric="train_accuracy"))
    )
    assert (
        f"{study_file}: study.metric: the stored study 'drift-study' measured val_accuracy, the file says train_accuracy"
        in line
    )
    assert stored(document, options) == before  # nothing written
    line = one_line_refusal(run_hpo("status", str(study_file), *options))
    assert "study.metric" in line and "val_accuracy" in line
    fault_line(
        f"relaunch with another metric (val_accuracy -> train_accuracy), {'PostgreSQL' if options else 'journal'}",
        "refused: exit 2 naming both metrics; nothing written; `hpo status` refuses too",
        0,
        None,
    )


def test_a_changed_fixed_setting_is_refused(stored_study: Stored) -> None:
    document, study_file, options = stored_study
    before = stored(document, options)
    line = one_line_refusal(
        relaunch_with(document, study_file, options, lambda d: d["trainer"].update(epochs=5))
    )
    assert "trainer.epochs: 3 -> 5 since the stored study 'drift-study'" in line, line
    assert stored(document, options) == before
    # A setting that changes only how fast is not a change of meaning.
    again = relaunch_with(document, study_file, options, lambda d: d["trainer"].update(num_workers=1))
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_changed_search_space_needs_the_option(stored_study: Stored) -> None:
    document, study_file, options = stored_study
    before = stored(document, options)

    def narrower(changed: dict[str, Any]) -> None:
        changed["search_space"]["lr"]["high"] = 0.5

    line = one_line_refusal(relaunch_with(document, study_file, options, narrower))
    assert (
        "search_space.lr: type='float', low=0.001, high=1.0, log=True -> type='float', low=0.001, high=0.5, log=True"
        in line
    ), line
    assert "pass --allow-space-change" in line
    assert stored(document, options) == before
    accepted = relaunch_with(document, study_file, options, narrower, "--allow-space-change")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    # Stored as the study's new space: the same file relaunched needs no option.
    again = run_hpo("launch", str(study_file), *options, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_space_change_optuna_cannot_model_is_refused_even_with_the_option(stored_study: Stored) -> None:
    document, study_file, options = stored_study
    before = stored(document, options)

    def integer_batch(changed: dict[str, Any]) -> None:
        changed["search_space"]["batch_size"] = {"type": "int", "low": 32, "high": 64}

    line = one_line_refusal(
        relaunch_with(document, study_file, options, integer_batch, "--allow-space-change")
    )
    assert (
        "search_space.batch_size: the stored study 'drift-study' drew it from choices [32, 64], the file from int [32, 64]"
        in line
    ), line
    assert stored(document, options) == before

    def more_choices(changed: dict[str, Any]) -> None:
        changed["search_space"]["batch_size"]["choices"] = [32, 64, 128]

    line = one_line_refusal(
        relaunch_with(document, study_file, options, more_choices, "--allow-space-change")
    )
    assert "search_space.batch_size" in line and "dynamic value space" in line, line
    # No ghost: the refused relaunches left no trial behind, RUNNING or otherwise.
    assert stored(document, options) == before
    fault_line(
        f"relaunch with a search space Optuna cannot model the stored trials with, {'PostgreSQL' if options else 'journal'}",
        "refused even with --allow-space-change, naming the parameter and both definitions; no trial created",
        0,
        None,
    )


def test_a_study_stored_before_a_trainer_setting_existed_relaunches(stored_study: Stored) -> None:
    """A definition stored by an older version lacks the settings added since (cycle_momentum,
    val_image_size, ...): its trials ran with their defaults, so the same file relaunches, and a
    file that sets one of them otherwise is a change like any other."""
    import optuna

    from hpo import study_record

    document, study_file, options = stored_study
    storage = options[1] if options else journal(document)

    study = optuna.load_study(study_name=document["study"]["name"], storage=storage)
    definition = study_record.stored_definition(study)
    assert definition is not None
    for key in ("cycle_momentum", "base_momentum", "val_image_size"):
        del definition["fixed"][key]
    study_record.store_definition(study, definition)
    again = run_hpo("launch", str(study_file), *options, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    line = one_line_refusal(
        relaunch_with(document, study_file, options, lambda d: d["trainer"].update(cycle_momentum=True))
    )
    # The relaunch stored the definition anew, with every setting.
    assert "trainer.cycle_momentum: False -> True since the stored study 'drift-study'" in line, line
