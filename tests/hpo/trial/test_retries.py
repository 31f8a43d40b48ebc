"""Retries and infeasible trials on a real Optuna journal storage (no cluster needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo import record, requeue, search, tally
from hpo.config import StudySpec, load_study
from hpo.storage import open_storage, resolve_storage
from hpo.trial import retries
from hpo.trial.objective import ObjectiveResult
from hpo.trial.task import run_attached
from tests.hpo.helpers import study_document, write_study

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`


def make_study(tmp_path: Path, **study: Any) -> tuple[StudySpec, optuna.Study]:
    document = study_document("retry-study", tmp_path / "work", study={"enqueue": [], **study})
    spec = load_study(write_study(tmp_path / "study.yaml", document))
    ref = resolve_storage(spec, None, "test")
    return spec, search.load(spec, open_storage(ref, create=True), create=True)


def fail(study: optuna.Study, spec: StudySpec, reason: str = "RuntimeError: boom") -> optuna.Trial:
    trial = study.ask(search.distributions(spec))
    trial.report(0.5, step=1)
    trial.set_user_attr(record.ATTR_FAIL_REASON, reason)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return trial


def test_a_failed_trial_is_retried_once_with_its_parameters_and_history(tmp_path: Path) -> None:
    spec, study = make_study(tmp_path, max_retries=2)
    first = fail(study, spec)
    assert requeue.queue_retries(study, spec.study.max_retries) == [0]
    assert requeue.queue_retries(study, spec.study.max_retries) == []  # once per failure
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].params == first.params
    assert waiting[0].intermediate_values == {1: 0.5}
    # The next ask runs the retry, before any new proposal.
    retry = study.ask(search.distributions(spec))
    assert retry.number == 1 and retry.params == first.params
    assert retry.user_attrs[record.ATTR_RETRY_OF] == 0
    # Optuna's own helper reads the history.
    frozen = study.get_trials()[1]
    assert optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(frozen) == [0]
    # The failed trial gives its place in the budget to its retry.
    assert [t.number for t in tally.counted_trials(study)] == [1]
    # A retry that fails is retried while retries are left: two in all here.
    study.tell(retry, state=optuna.trial.TrialState.FAIL)
    assert requeue.queue_retries(study, spec.study.max_retries) == [1]
    third = study.ask(search.distributions(spec))
    assert study.get_trials()[2].system_attrs["retry_history"] == [0, 1]
    study.tell(third, state=optuna.trial.TrialState.FAIL)
    assert requeue.queue_retries(study, spec.study.max_retries) == []
    assert [t.number for t in tally.counted_trials(study)] == [2]


def test_no_retry_when_max_retries_is_0_or_the_user_cancelled(tmp_path: Path) -> None:
    spec, study = make_study(tmp_path, max_retries=0)
    fail(study, spec)
    assert requeue.queue_retries(study, spec.study.max_retries) == []
    fail(study, spec, reason=record.REASON_CANCELLED)
    assert requeue.queue_retries(study, 3) == [0]  # the first only: a cancel is not a fault


def test_inherit_checkpoint_copies_the_failed_trials_checkpoint(tmp_path: Path) -> None:
    from hpo.paths import checkpoint_dir

    spec, study = make_study(tmp_path)
    fail(study, spec)
    source = checkpoint_dir(spec, 0)
    source.mkdir(parents=True)
    (source / "checkpoint.pt").write_bytes(b"weights")
    requeue.queue_retries(study, 1)
    retry = study.ask(search.distributions(spec))
    assert retries.inherit_checkpoint(spec, retry) == 0
    assert (checkpoint_dir(spec, 1) / "checkpoint.pt").read_bytes() == b"weights"
    assert retries.inherit_checkpoint(spec, retry) is None  # never over a checkpoint of its own


class _AllocatesTooMuch:
    """An objective that asks torch's allocator for more memory than any machine has."""

    def __call__(
        self, spec: StudySpec, key: int | str, params: dict[str, Any], reporter: Any
    ) -> ObjectiveResult:
        import torch

        torch.empty(1 << 60, dtype=torch.uint8)
        raise AssertionError("unreachable")


def test_out_of_memory_is_told_infeasible_and_not_retried(tmp_path: Path) -> None:
    spec, study = make_study(tmp_path)
    trial = study.ask(search.distributions(spec))
    result = run_attached(spec, study, trial, _AllocatesTooMuch())
    assert result["state"] == "INFEASIBLE"
    [frozen] = study.get_trials()
    assert frozen.state == optuna.trial.TrialState.COMPLETE and frozen.value == 0.0
    assert frozen.constraints == {record.CONSTRAINT_MEMORY: 1.0}
    assert frozen.user_attrs[record.ATTR_INFEASIBLE] is True
    assert "allocate" in frozen.user_attrs[record.ATTR_FAIL_REASON]
    assert requeue.queue_retries(study, 3) == []
    with pytest.raises(ValueError):
        study.best_trial  # noqa: B018  (no feasible trial: an infeasible one is never the best)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 GB"), True),
        (MemoryError(), True),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (ValueError("out of memory budget"), False),
    ],
)
def test_is_out_of_memory(error: BaseException, expected: bool) -> None:
    assert retries.is_out_of_memory(error) is expected
