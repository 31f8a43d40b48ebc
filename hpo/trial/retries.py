"""How a trial's job treats a failure: a retry starts from the failed trial's checkpoint, and an
out-of-memory error is told as infeasible (``hpo.record.tell_infeasible``), not failed.

Which failures are retried, and how a retry is recorded, is the trial record's (``hpo.record``).
"""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING

import optuna

from hpo import record, tally
from hpo.paths import checkpoint_dir, private_dir

if TYPE_CHECKING:
    from hpo.config import StudySpec


def inherit_checkpoint(spec: StudySpec, trial: optuna.Trial | optuna.trial.FrozenTrial) -> int | None:
    """Give a retry the checkpoint of the trial it retries, before its job starts; returns that
    trial's number if a checkpoint was copied."""
    failed = trial.user_attrs.get(record.ATTR_RETRY_OF)
    if failed is None:
        return None
    source, target = checkpoint_dir(spec, int(failed)), checkpoint_dir(spec, trial.number)
    if not source.is_dir() or target.exists():
        return None
    private_dir(target.parent)
    shutil.copytree(source, target)
    if spec.objective is not None and not spec.study.also_minimize and isinstance(trial, optuna.Trial):
        # The user's script resumes after the checkpoint's step and reports only what follows:
        # the retry takes the curve up to it (one resumed at its last step reports nothing).
        [earlier] = [t for t in trial.study.get_trials(deepcopy=False) if t.number == int(failed)]
        for step, value in sorted(tally.curve(earlier).items()):
            record.report_step(trial, step, value)
    return int(failed)


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or an allocator's "out of memory" (CUDA, MPS) / "can't allocate
    memory" / "not enough memory" (torch's CPU allocator)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    if isinstance(err, MemoryError):
        return True
    text = str(err).lower()
    markers = ("out of memory", "can't allocate memory", "not enough memory")
    return isinstance(err, RuntimeError) and any(marker in text for marker in markers)


KILLED = "killed by SIGKILL"


def killed_again(study: optuna.Study, trial: optuna.Trial, reason: str) -> bool:
    """A retry whose command was killed by SIGKILL as the trial it retries was: with the same
    parameters, twice, most likely the kernel's out-of-memory killer. Told infeasible like an
    out-of-memory error, so that it is not retried a third time and the sampler learns."""
    failed = trial.user_attrs.get(record.ATTR_RETRY_OF)
    if KILLED not in reason or failed is None:
        return False
    earlier = record.trial_by_number(study, int(failed))
    return KILLED in str(earlier.user_attrs.get(record.ATTR_FAIL_REASON, ""))
