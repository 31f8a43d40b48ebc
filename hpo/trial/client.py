"""The trial API for the user's own script: ``from hpo import trial``.

A script that the service runs as a trial (``objective.command``) gets its parameters, a checkpoint
folder that stays the same across requeues and retries of the trial, and ``report(step, value)``,
which says whether to stop. Run by hand, outside the service, the same script still runs: its
parameters are its own defaults, the checkpoint folder is its own, and reports change nothing.

Under DDP every rank calls ``report``: rank 0's report reaches the study, and its answer is shared
with the other ranks (a broadcast over the script's own ``torch.distributed`` group), so every rank
stops at the same step. Only the standard library is imported here: a script pays nothing for it.

The service side (``hpo.trial.command_objective``) hands the trial over in environment variables and, on
rank 0, a socket inherited by the script (``HPO_TRIAL_FD``): one JSON line per report, one word
back.
"""

from __future__ import annotations

import json
import operator
import os
import socket
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ENV_KEY = "HPO_TRIAL_KEY"
"""Set for every trial: its number, or a Ray Tune trial's own id."""
ENV_NUMBER = "HPO_TRIAL_NUMBER"
"""The trial's number in the study (not known inside a Ray Tune trial)."""
ENV_PARAMS = "HPO_TRIAL_PARAMS"
ENV_CHECKPOINT_DIR = "HPO_CHECKPOINT_DIR"
ENV_FD = "HPO_TRIAL_FD"

STOP, CONTINUE = "stop", "continue"


class Trial:
    """One trial as its code sees it. ``ask`` sends rank 0's report to the study (None: run alone)."""

    def __init__(
        self,
        key: str | None,
        number: int | None,
        params: Mapping[str, Any],
        checkpoint_dir: str | None,
        ask: Callable[[int, float, dict[str, float]], bool] | None,
    ) -> None:
        self.key = key
        self.number = number
        self._params = dict(params)
        self._checkpoint_dir = checkpoint_dir
        self._ask = ask

    @property
    def in_study(self) -> bool:
        """Whether the service runs this code as a trial (False when run by hand)."""
        return self.key is not None

    def params(self, defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The trial's parameters over ``defaults`` (run by hand: ``defaults`` alone)."""
        return {**(defaults or {}), **self._params}

    def checkpoint_dir(self, default: str | os.PathLike[str] = "checkpoint") -> Path:
        """The trial's checkpoint folder (created): the same across requeues and retries, so a
        script that saves there every epoch resumes where it stopped. Run by hand: ``default``."""
        folder = Path(self._checkpoint_dir or default)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def report(self, step: int, value: float, **metrics: float) -> bool:
        """Report the metric at ``step`` (an epoch); True means stop now (the trial is pruned).
        Other metrics of the step (``loss=0.31``) are kept with the trial; the study reads ``value``.

        Under ``torch.distributed`` call it on every rank: rank 0 reports, and the decision is
        the same on every rank when it returns."""
        # Checked run by hand too: a script that passes a wrong value fails the same way in a study.
        step, number = _as_step(step), _as_number("value", value)
        others = {name: _as_number(name, other) for name, other in metrics.items()}
        stop = False
        if _rank() == 0 and self._ask is not None:
            stop = self._ask(step, number, others)
        return share_decision(stop)


def _as_number(name: str, value: Any) -> float:
    """A reported number (a float, an int, a 0-d NumPy or torch value); NaN and infinity pass: the
    study ends the trial as diverged on them."""
    try:
        if isinstance(value, str | bytes | bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"hpo.trial.report: {name} must be a number, got {value!r}") from None


def _as_step(step: Any) -> int:
    """A step: an integer (a NumPy or torch integer, or a float such as 3.0, too)."""
    try:
        if isinstance(step, bool):
            raise TypeError
        return operator.index(step)
    except TypeError:
        if isinstance(step, float) and step.is_integer():
            return int(step)
        raise TypeError(f"hpo.trial.report: step must be an integer, got {step!r}") from None


def share_decision(stop: bool) -> bool:
    """Rank 0's ``stop`` on every rank, when the script runs under ``torch.distributed``."""
    dist = _torch_distributed()
    if dist is None or dist.get_world_size() <= 1:
        return stop
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if stop else 0], device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _torch_distributed() -> Any:
    """torch.distributed if the script has initialized it (never imported here otherwise)."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _rank() -> int:
    dist = _torch_distributed()
    if dist is not None:
        return int(dist.get_rank())
    # The service sets RANK for every rank of a multi-process trial (hpo.trial.command_objective).
    return int(os.environ.get("RANK", "0") or 0)


class _SocketChannel:
    """Rank 0's line to the trial's job: a report out, ``stop`` or ``continue`` back."""

    def __init__(self, fd: int) -> None:
        self._socket = socket.socket(fileno=fd)
        self._replies = self._socket.makefile("r", encoding="utf-8")

    def __call__(self, step: int, value: float, metrics: dict[str, float]) -> bool:
        message = {"step": step, "value": value, **({"metrics": metrics} if metrics else {})}
        self._socket.sendall((json.dumps(message) + "\n").encode())
        reply = self._replies.readline().strip()
        if not reply:
            raise ConnectionError("the trial's job closed its channel (it is stopping this trial)")
        return reply == STOP


def from_environment() -> Trial:
    """The trial the service started this process for, or a stand-alone one."""
    number = os.environ.get(ENV_NUMBER)
    # Adopted once, by this process: a process it starts (a launcher's workers) must not take the
    # same number for its own, possibly another file's, descriptor.
    fd = os.environ.pop(ENV_FD, None)
    if fd is not None and not _is_socket(fd):
        fd = None
    return Trial(
        key=os.environ.get(ENV_KEY),
        number=int(number) if number else None,
        params=json.loads(os.environ.get(ENV_PARAMS) or "{}"),
        checkpoint_dir=os.environ.get(ENV_CHECKPOINT_DIR) or None,
        ask=_SocketChannel(int(fd)) if fd else None,
    )


def _is_socket(fd: str) -> bool:
    try:
        return stat.S_ISSOCK(os.fstat(int(fd)).st_mode)
    except (OSError, ValueError):
        return False


_current: Trial | None = None


def current() -> Trial:
    """This process's trial (a function objective is handed its own; so is this module)."""
    global _current
    if _current is None:
        _current = from_environment()
    return _current


def set_current(trial: Trial | None) -> None:
    """Make ``trial`` the one the module-level functions use (a function objective's, in-process)."""
    global _current
    _current = trial


def params(defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return current().params(defaults)


def checkpoint_dir(default: str | os.PathLike[str] = "checkpoint") -> Path:
    return current().checkpoint_dir(default)


def report(step: int, value: float, **metrics: float) -> bool:
    return current().report(step, value, **metrics)


def number() -> int | None:
    return current().number


def in_study() -> bool:
    return current().in_study


params.__doc__ = Trial.params.__doc__
checkpoint_dir.__doc__ = Trial.checkpoint_dir.__doc__
report.__doc__ = Trial.report.__doc__
