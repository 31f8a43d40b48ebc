"""The launcher's patience with an away Slurm controller, as pure logic: which sbatch failures are
tried again, how long it waits, and that a cancel or a lost study ends the waiting. (The real
outage, slurmctld stopped under a study, is tests/hpo/faults/test_control_plane.py.)"""

from __future__ import annotations

import pytest

from hpo.slurm.jobs import controller_away, submit_when_controller_answers

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`

AWAY = RuntimeError(
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
)
REFUSED = RuntimeError(
    "sbatch: error: Batch job submission failed: Invalid account or account/partition combination"
)


class Sbatch:
    """Fails with each of ``errors`` in turn, then returns a job id."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "4242"


def test_only_a_controller_that_is_away_is_waited_for() -> None:
    assert controller_away(AWAY)
    assert controller_away(RuntimeError("sbatch: error: Socket timed out on send/recv operation"))
    assert not controller_away(REFUSED)


def test_an_away_controller_is_tried_again_with_backoff_and_said_each_time() -> None:
    sbatch, pauses, lines = Sbatch(AWAY, AWAY), [], []

    assert submit_when_controller_answers(sbatch, lines.append, pauses.append) == "4242"

    assert sbatch.calls == 3 and pauses == [5.0, 10.0]
    assert all("Slurm controller unreachable" in line and "sbatch again in" in line for line in lines)


def test_a_refusal_is_raised_at_once() -> None:
    sbatch, pauses = Sbatch(REFUSED), []
    with pytest.raises(RuntimeError, match="Invalid account"):
        submit_when_controller_answers(sbatch, print, pauses.append)
    assert sbatch.calls == 1 and pauses == []


def test_a_cancel_while_waiting_ends_the_waiting_before_the_next_try() -> None:
    class Cancelled(Exception):
        pass

    def cancelled() -> None:
        raise Cancelled

    sbatch = Sbatch(AWAY, AWAY)
    with pytest.raises(Cancelled):
        submit_when_controller_answers(sbatch, print, lambda s: None, still_wanted=cancelled)
    assert sbatch.calls == 1


def test_the_wait_is_bounded() -> None:
    sbatch, pauses = Sbatch(*[AWAY] * 100), []
    with pytest.raises(RuntimeError, match="Unable to contact"):
        submit_when_controller_answers(sbatch, print, pauses.append, tolerance_s=0.0)
    assert sbatch.calls == 1 and pauses == []
