"""`hpo cancel` beside a relaunch: the relaunch is refused while the cancel runs, the cancel names
every trial it ended, and a launch after it is accepted. Local processes, a journal study, the
user's own torch-free objective: the service's logic is the subject."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend

from tests.hpo.helpers import (
    held_score_study,
    load_trials,
    run_hpo,
    start_hpo,
    trials_or_none,
)


def _study_attrs(document: dict[str, Any]) -> dict[str, Any]:
    path = Path(document["study"]["workdir"]) / "optuna.journal"
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    return optuna.load_study(study_name=document["study"]["name"], storage=storage).user_attrs


def _until(condition: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_relaunch_while_hpo_cancel_runs_is_refused_and_the_cancel_names_every_trial_it_ended(
    tmp_path: Path, local_cluster: str
) -> None:
    """(The cluster: `hpo cancel` looks in Slurm's queue too, for a detached launcher of the study.)"""
    # The trials wait after their step 1 (the `hold` file) until the cancel ends them.
    document, study_file, hold = held_score_study(
        tmp_path, "cancel-beside", steps=2, step_s=0.5, hold_after=1, n_trials=4, max_concurrent=2
    )
    first = start_hpo("launch", str(study_file))
    journal = tmp_path / "work" / "optuna.journal"  # not created by this reader

    def both_running() -> bool:
        trials = (trials_or_none(document) if journal.exists() else None) or []
        return sum(1 for t in trials if t.state.name == "RUNNING" and t.intermediate_values) == 2

    _until(both_running, "two trials running")
    # The launcher freezes (a stalled node): `hpo cancel` waits for it to confirm. The cancel is
    # then frozen too, past its request, and the launcher killed: the study's launcher lock is free
    # while the cancel is under way, the moment a relaunch once took the study and ran its trials.
    os.kill(first.pid, signal.SIGSTOP)
    cancel = start_hpo("cancel", str(study_file))
    _until(lambda: "hpo_cancel_requested_at" in _study_attrs(document), "the cancel request stored")
    os.kill(cancel.pid, signal.SIGSTOP)
    first.kill()
    first.wait()
    assert first.stdout is not None
    first.stdout.close()  # its trials hold the pipe's other end: reading it would wait for them
    stored = load_trials(document)
    running = sorted(t.number for t in stored if t.state.name == "RUNNING")

    refused = run_hpo("launch", str(study_file), timeout=120)

    assert refused.returncode == 3, refused.stdout + refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert re.search(r"is being cancelled \(`hpo cancel` since \d\d:\d\d:\d\d\)", line), line
    after = load_trials(document)  # the refused launch asked for no trial and failed none
    assert [(t.number, t.state.name) for t in after] == [(t.number, t.state.name) for t in stored]

    os.kill(cancel.pid, signal.SIGCONT)
    output = cancel.communicate(timeout=300)[0]
    assert cancel.returncode == 0, output
    assert re.search(r"^launcher \(pid \d+ on .*\): gone$", output, re.M), output  # killed, not confirming
    for number in running:  # each trial it ended, by number, as cancelled (not the KeyboardInterrupt it got)
        assert re.search(rf"^trial {number}: cancelled local job \d+$", output, re.M), output
    trials = load_trials(document)
    assert all(t.state.is_finished() for t in trials), [(t.number, t.state.name) for t in trials]
    reasons = {t.number: t.user_attrs.get("fail_reason") for t in trials if t.number in running}
    assert set(reasons.values()) == {"cancelled by hpo cancel"}, reasons

    hold.unlink()
    again = run_hpo("launch", str(study_file), timeout=300)  # the cancel has returned: accepted
    assert again.returncode == 0, again.stdout + again.stderr
