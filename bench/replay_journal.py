"""The runs a replay has finished, kept as they finish, so that a replay stopped part way (a
session's end, a crash, a killed process) goes on where it stopped with ``--resume``.

A slow candidate's named run (a GP fit at every ask) takes hours of a small machine: with the
journal, it is run in pieces and none of them is lost. A run is reused only where it would be
replayed the same: the same task, strategy and seed, against the same target (random search's
median best, which fixes the lookup, the seeds of the baseline and its trials) and the same
horizon. Two places hold finished runs: the run's committed JSON (``replay-RUN.json``) and the
journal beside it (``replay-RUN.journal.jsonl``, one run per line, appended as each one ends),
which is removed once the whole run is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class RunJournal:
    def __init__(self, output: Path, resume: bool, default_horizon: float) -> None:
        self.default_horizon = default_horizon  # that of runs written before the horizon was kept
        self.path = output.with_name(output.stem + ".journal.jsonl")
        self.reused = 0
        self.kept: dict[tuple[str, str, int], tuple[float, float, dict[str, Any]]] = {}
        if resume:
            self._read_output(output)
            self._read_journal()
        elif self.path.exists():
            self.path.unlink()  # a fresh run: what an earlier one left would never be read

    def _read_output(self, output: Path) -> None:
        if not output.exists():
            return
        for task, figures in json.loads(output.read_text())["tasks"].items():
            for run in figures.get("runs", []):
                horizon = figures["strategies"][run["strategy"]].get("horizon") or self.default_horizon
                self.kept[(task, run["strategy"], run["seed"])] = (figures["target"], horizon, run)

    def _read_journal(self) -> None:
        if not self.path.exists():
            return
        for line in self.path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # the line being written when the process was killed
                continue
            run = entry["run"]
            self.kept[(entry["task"], run["strategy"], run["seed"])] = (
                entry["target"],
                entry["horizon"],
                run,
            )

    def finished(
        self, task: str, name: str, seed: int, target: float, horizon: float
    ) -> dict[str, Any] | None:
        """The run already finished, where it was replayed as it would be now."""
        kept = self.kept.get((task, name, seed))
        if kept is None or kept[:2] != (target, horizon):
            return None
        self.reused += 1
        return kept[2]

    def record(self, task: str, target: float, horizon: float, run: dict[str, Any]) -> None:
        line = json.dumps({"task": task, "target": target, "horizon": horizon, "run": run})
        with self.path.open("a") as journal:
            journal.write(line + "\n")

    def close(self) -> None:
        """The whole run is written: its JSON holds every run the journal held."""
        self.path.unlink(missing_ok=True)
