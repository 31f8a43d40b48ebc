"""A Ray-backend trial that is a DDP run: ``resources.tasks_per_node: N`` Ray Train workers.

Each such Tune trial is a thin function that runs Ray Train's ``TorchTrainer`` with N workers,
each with ``cpus_per_task`` CPUs and ``gpus_per_node / N`` GPUs. The workers hold the trial's
resources; the Tune trial itself holds no CPU or GPU, or it and its own workers could wait for
each other on a full node. This is how Ray Train V2 (the default since Ray 2.5x) trains inside
Tune: a function trainable calls ``TorchTrainer.fit()``, and ``TuneReportCallback`` in Train's
run config passes each report on to the Tune trial.

Ray Train sets torch.distributed up before it calls the worker function; every worker then runs
the study's objective (the trainer, with the same config as a single-process trial), which takes
the group as it is. Ray Train's report is a barrier that every worker must reach, so every rank
reports each epoch: rank 0 its metrics (the keys of a single-process trial), the others nothing.
Tune's scheduler thus sees one result per epoch.

A trial that Tune stops (its scheduler, a pause, the time budget) aborts its Train run at once:
the workers and their placement group go, and the trial's thread returns within Tune's 2 s, so
that Tune can start the next trial in the same actor. Killing the run instead would leave the
placement group taken (Ray Train V2 frees a dead controller's only through the State API, which
a Ray instance without the dashboard lacks), and the next trial would never get its workers.

Ray is imported inside the functions that use it: the launcher, ``hpo status`` and the pre-flight
checks import this module on machines and in processes where Ray is absent or not wanted.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import TYPE_CHECKING, Any

from hpo import executors
from hpo.errors import NotReadyError, StudyFileError, optional_extra
from hpo.paths import trial_dir
from hpo.trial.objective import Objective, StepReport
from trainer.reporting import Decision, EpochMetrics

if TYPE_CHECKING:
    from hpo.config import StudySpec

# What the Tune trial itself reserves. Tune refuses an empty request; memory is the one resource
# that neither the workers ask for nor the allocation is sized by (CPUs and GPUs are exact).
DRIVER_MEMORY_BYTES = 256 * 2**20


def check_settings(spec: StudySpec) -> None:
    """Reject, before anything starts, DDP trials that the Ray backend cannot run."""
    res, workers = spec.resources, spec.resources.tasks_per_node
    where = f"{spec.source}: resources.tasks_per_node"
    if res.gpus_per_node % workers:
        raise StudyFileError(
            f"{where}: {workers} Ray Train workers cannot share gpus_per_node={res.gpus_per_node} "
            "evenly; make gpus_per_node a multiple of tasks_per_node"
        )
    if spec.study.pruner.name == "pbt":
        raise StudyFileError(
            f"{where}: PBT hands checkpoints between single-process trials; got {workers} processes per trial"
        )
    cpus = os.cpu_count() or 1
    if executors.get(res.executor).on_this_machine and workers * res.cpus_per_task > cpus:
        # The local Ray instance has this machine's cores: the workers could never all start.
        # (Checked before Ray Train is imported: that takes seconds of torch.)
        raise NotReadyError(
            f"{where}: {workers} workers x cpus_per_task={res.cpus_per_task} need "
            f"{workers * res.cpus_per_task} CPUs; this machine has {cpus}"
        )
    with optional_extra(
        f"{where}: DDP trials (Ray Train with its Tune integration)", "pip install 'ray[default,tune,train]'"
    ):
        from ray.train.torch import TorchTrainer
        from ray.tune.integration.ray_train import TuneReportCallback  # noqa: F401
    if not TorchTrainer.__module__.startswith("ray.train.v2"):
        raise NotReadyError(f"{where}: DDP trials need Ray Train V2", "unset RAY_TRAIN_V2_ENABLED")


def tune_trainable(spec: StudySpec, objective: Objective) -> Any:
    """The Tune trainable of a DDP trial, with what the Tune trial itself reserves."""
    from ray import tune

    return tune.with_resources(
        tune.with_parameters(trainable, spec=spec, objective=objective),
        resources={"cpu": 0, "gpu": 0, "memory": DRIVER_MEMORY_BYTES},
    )


def trainable(config: dict[str, Any], spec: StudySpec, objective: Objective) -> None:
    """One Tune trial: ``tasks_per_node`` Ray Train workers, each running the objective."""
    import ray.train
    from ray import tune
    from ray.train._internal.session import get_session
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback
    from ray.util.queue import Queue

    res, workers = spec.resources, spec.resources.tasks_per_node
    trial_key = f"ray-{tune.get_context().get_trial_id()}"  # names the checkpoint folder, as for one process
    params = dict(config)
    # Where Train's controller leaves its handle, for aborting the run should Tune stop the trial.
    mailbox = Queue(maxsize=1, actor_options={"num_cpus": 0})
    # The handle first: it is in the mailbox before Tune sees a result it could stop on. (Typed
    # loosely: mypy reads ray.train.RunConfig as Train V1's, whose callbacks are Tune's.)
    callbacks: list[Any] = [_controller_handover(mailbox), TuneReportCallback()]
    trainer = TorchTrainer(
        _Worker(spec, objective, trial_key, params),
        scaling_config=ray.train.ScalingConfig(
            num_workers=workers,
            use_gpu=res.gpus_per_node > 0,
            resources_per_worker={"CPU": res.cpus_per_task, "GPU": res.gpus_per_node / workers},
        ),
        # Ray Train creates the group, so the trainer's collective timeout is given to it.
        torch_config=TorchConfig(timeout_s=spec.trainer_config(params).dist_timeout_s),
        run_config=ray.train.RunConfig(
            name="ray_train",
            storage_path=str(trial_dir(spec, trial_key)),
            callbacks=callbacks,
        ),
    )
    run = _Fit(trainer)
    run.start()
    session = get_session()
    assert session is not None  # a Tune function trainable runs in one
    # Set when Tune stops, pauses or re-uses the trial's actor (the function API has no other hook).
    stopped = session.stop_event
    while run.is_alive():
        if stopped.wait(0.2):
            threading.Thread(target=_abort, args=(mailbox, run), daemon=True).start()
            return
    mailbox.shutdown()
    if run.error is not None:
        raise run.error


class _Fit(threading.Thread):
    """``TorchTrainer.fit()`` in a thread of its own, so that the trial can return while it ends."""

    def __init__(self, trainer: Any) -> None:
        super().__init__(daemon=True)
        self.trainer = trainer
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.trainer.fit()
        except BaseException as err:  # raised in the trial's thread, unless Tune stopped the trial
            self.error = err


def _controller_handover(mailbox: Any) -> Any:
    """A Train callback (it runs in the controller) that puts the controller's handle in ``mailbox``
    at the first report."""
    import ray
    from ray.train import UserCallback

    class ControllerHandover(UserCallback):
        def __init__(self) -> None:
            self.handed = False

        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            if not self.handed:
                mailbox.put(ray.get_runtime_context().current_actor)
                self.handed = True

    return ControllerHandover()


def _abort(mailbox: Any, run: _Fit) -> None:
    """End a Train run that Tune stopped: Train's own abort stops the workers and frees their
    placement group (a stop before the first report waits for the controller's handle)."""
    from ray.util.queue import Empty

    try:
        while run.is_alive():
            try:
                controller = mailbox.get(timeout=1)
            except Empty:
                continue
            controller.abort.remote()
            run.join()  # fit() ends as the controller exits
            break
    finally:
        mailbox.shutdown()


@dataclasses.dataclass
class _Worker:
    """Ray Train's ``train_loop_per_worker``: an object, so that it carries its arguments."""

    spec: StudySpec
    objective: Objective
    trial_key: str
    params: dict[str, Any]

    def __call__(self) -> None:
        import ray.train

        # Ray's workers inherit the job step's variables of the node they run on. The trainer takes
        # the group Ray Train set up anyway; nothing must mistake a worker for a rank of that step.
        executors.here().leave_step()
        main = ray.train.get_context().get_world_rank() == 0
        self.objective(self.spec, self.trial_key, dict(self.params), _TrainReporter(main))


class _TrainReporter:
    """Every rank's reporter: rank 0's metrics go to Tune (TuneReportCallback takes rank 0's)."""

    every_rank = True  # the trainer calls it on every rank: Ray Train's report is a barrier

    def __init__(self, main: bool) -> None:
        self.main = main

    def report(self, metrics: EpochMetrics | StepReport) -> Decision:
        import ray.train

        if self.main:
            node = executors.here().node()
            ray.train.report({**metrics.to_dict(), "node": node})  # Tune overwrites "hostname"
        else:
            ray.train.report({})
        return Decision.CONTINUE  # Tune stops the trial itself when its scheduler says so
