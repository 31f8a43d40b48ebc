"""Storage URLs as users write them reach the real PostgreSQL of the local cluster."""

from __future__ import annotations

from pathlib import Path

from hpo import search
from hpo.config import load_study
from hpo.storage import check_reachable, resolve_storage
from tests.hpo.helpers import study_document, write_study


def test_a_psycopg2_url_from_optunas_documentation_reaches_the_database(
    tmp_path: Path, fresh_database: str
) -> None:
    # Optuna's documentation writes postgresql+psycopg2://; the service installs psycopg 3.
    url = fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1)
    spec = load_study(write_study(tmp_path / "s.yaml", study_document("psycopg2-url", tmp_path / "w")))
    ref = resolve_storage(spec, url, spec.source)
    assert str(ref) == fresh_database
    study = search.load(spec, check_reachable(ref, spec.source), create=True)
    study.enqueue_trial({"lr": 0.1, "weight_decay": 1e-4, "batch_size": 32})
    study.tell(study.ask(search.distributions(spec)), 0.5)
    again = search.load(
        spec, check_reachable(resolve_storage(spec, fresh_database, spec.source), "s"), create=False
    )
    assert [(t.params["lr"], t.value) for t in again.get_trials()] == [(0.1, 0.5)]
