"""The two ways a researcher writes an Optuna study on Slurm by hand with submitit, for the dispatch
benchmark to set beside ``hpo launch`` (same objective: sleep ``seconds``, same study storage):

- ``submitit-array``: one job array of N tasks, K at a time (``%K``); each task opens the study,
  asks a trial, runs it and tells it; the driver waits for every task's result;
- ``submitit-async``: an ask-and-tell driver keeping K jobs in flight, one ``executor.submit`` per
  trial, noticing ends with submitit's ``job.done()`` (result file first, sacct at submitit's
  pace) every second, and telling the result itself.

Neither retries, resumes, checks limits or counts budgets: they are the floor of what dispatch
can cost, not a service.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
import submitit

from hpo.executors.jobs import process_started_at

DISTRIBUTIONS: dict[str, optuna.distributions.BaseDistribution] = {
    "lr": optuna.distributions.FloatDistribution(0.01, 1.0, log=True)
}


def _now_iso() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat()


def _value(params: dict[str, Any]) -> float:
    return math.tanh(float(params["lr"]))


def array_task(storage_url: str, study_name: str, seconds: float) -> float:
    """One array task: a whole trial, ask to tell, inside the job."""
    study = optuna.load_study(study_name=study_name, storage=storage_url)
    trial = study.ask(DISTRIBUTIONS)
    trial.set_user_attr("started_at", _now_iso())
    time.sleep(seconds)
    trial.set_user_attr("finished_at", _now_iso())
    value = _value(trial.params)
    study.tell(trial, value)
    return value


def sleep_task(seconds: float) -> tuple[str, str, float | None]:
    """An async driver's job: the objective alone; the driver asks and tells. Returns when it ran,
    and when its process started (for the benchmark's breakdown)."""
    started = _now_iso()
    time.sleep(seconds)
    return started, _now_iso(), process_started_at()


REPO = Path(__file__).resolve().parents[1]


def _executor(folder: Path, parallelism: int) -> submitit.SlurmExecutor:
    executor = submitit.SlurmExecutor(folder=folder / "%j")
    executor.update_parameters(
        time=30, cpus_per_task=1, ntasks_per_node=1, array_parallelism=parallelism,
        setup=[f"export PYTHONPATH={REPO}"],  # the jobs import these functions from bench
    )  # fmt: skip
    return executor


def run_array(storage_url: str, study_name: str, n: int, k: int, seconds: float, folder: Path) -> None:
    optuna.create_study(study_name=study_name, storage=storage_url, direction="maximize",
                        sampler=optuna.samplers.RandomSampler(seed=0))  # fmt: skip
    jobs = _executor(folder, k).map_array(array_task, [storage_url] * n, [study_name] * n, [seconds] * n)
    for job in jobs:
        job.result()


def run_async(
    storage_url: str, study_name: str, n: int, k: int, seconds: float, folder: Path, poll_s: float = 1.0
) -> None:
    study = optuna.create_study(
        study_name=study_name, storage=storage_url, direction="maximize",
        sampler=optuna.samplers.RandomSampler(seed=0),
    )  # fmt: skip
    executor = _executor(folder, k)
    in_flight: list[tuple[optuna.Trial, Any]] = []
    asked = 0
    while asked < n or in_flight:
        while asked < n and len(in_flight) < k:
            trial = study.ask(DISTRIBUTIONS)
            in_flight.append((trial, executor.submit(sleep_task, seconds)))
            trial.set_user_attr("submitted_at", _now_iso())
            asked += 1
        for trial, job in [entry for entry in in_flight if entry[1].done()]:
            started, finished, process_started = job.result()
            trial.set_user_attr("started_at", started)
            trial.set_user_attr("finished_at", finished)
            if process_started is not None:
                process = datetime.fromtimestamp(process_started, timezone.utc).isoformat()
                trial.set_user_attr("job_startup", {"process": process, "called": started})
            study.tell(trial, _value(trial.params))
            in_flight.remove((trial, job))
        time.sleep(poll_s)
