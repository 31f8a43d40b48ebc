"""The training run: build, train epoch by epoch (report, checkpoint), return a result.

SGD with momentum and weight decay, label-smoothed cross-entropy, OneCycleLR stepped every
iteration, automatic mixed precision, channels_last, DistributedDataParallel across ranks.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer import checkpoint, distributed
from trainer.config import TrainConfig
from trainer.data import build_datasets, build_held_out_loader, build_loaders
from trainer.errors import ConfigError, StopRequested, TrialOutOfMemory
from trainer.measure import StepProfiler, TensorBoardLog, UtilizationSampler, peak_memory_bytes
from trainer.models import build_model
from trainer.reporting import Decision, EpochMetrics, Reporter, TimeBreakdown, TrainResult
from trainer.timing import PhaseTimer

log = logging.getLogger("trainer")

# The phases of a training step, in order (PhaseTimer marks).
STEP_PHASES = ("data", "forward", "backward", "optimizer")
# Values broadcast from rank 0 after the reporter ran.
_CONTINUE, _STOP, _REPORTER_FAILED = 0, 1, 2


def train(
    config: TrainConfig, reporter: Reporter | None = None, hparams: Mapping[str, Any] | None = None
) -> TrainResult:
    """Run one training; ``reporter`` (used on rank 0 only) sees each epoch and may stop the run.
    ``hparams``: what TensorBoard's HParams view shows of the run (with ``tensorboard_dir``; by
    default the usual tuned settings)."""
    env = distributed.detect()
    device = resolve_device(config, env)
    backend = "nccl" if device.type == "cuda" else "gloo"
    created = distributed.init_process_group(env, backend, config.dist_timeout_s, config.checkpoint_dir)
    try:
        return _Run(config, env, device, reporter, hparams).run()
    finally:
        # A group set up by the caller (Ray Train) is the caller's to destroy.
        if created:
            distributed.destroy_process_group()


def resolve_device(config: TrainConfig, env: distributed.DistEnv) -> torch.device:
    if config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device is 'cuda' but no CUDA device is visible")
    index = env.local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def resolve_amp(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for full precision."""
    if amp == "off" or (amp == "auto" and device.type == "cpu"):
        return None
    if amp == "auto":
        # Emulated bf16 (pre-Ampere GPUs) is slow: those get fp16.
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return torch.bfloat16 if amp == "bf16" else torch.float16


@contextmanager
def oom_as_trial_error(batch_size: int, device: str) -> Iterator[None]:
    """Turns a device out-of-memory error into :class:`TrialOutOfMemory` (an infeasible config)."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        raise TrialOutOfMemory(batch_size, device, str(err)) from err


# What TensorBoard's HParams view shows of a run started by hand.
DEFAULT_HPARAMS = (
    "model",
    "batch_size",
    "lr",
    "weight_decay",
    "momentum",
    "pct_start",
    "div_factor",
    "epochs",
)


def steps_per_epoch(config: TrainConfig, train_loader: Any, sampler: Any, world_size: int) -> int:
    steps = len(train_loader)
    if config.max_steps_per_epoch is not None:
        steps = min(steps, config.max_steps_per_epoch)
    if steps == 0:
        raise ConfigError(
            f"batch_size {config.batch_size} x {world_size} ranks exceeds the "
            f"{len(sampler.indices)} training samples selected (with drop_last)"
        )
    return steps


def build_parallel_model(
    raw_model: nn.Module, config: TrainConfig, env: distributed.DistEnv, device: torch.device
) -> nn.Module:
    """The model the training steps call: DDP across ranks, compiled if asked."""
    model = raw_model
    if env.is_distributed:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if config.compile:
        model = torch.compile(model)  # type: ignore[assignment]
    return model


def build_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(
        model.parameters(),
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        nesterov=config.nesterov,
    )


def build_schedule(
    config: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.OneCycleLR:
    """OneCycleLR over the whole run, stepped every iteration."""
    warmup_steps = config.pct_start * total_steps
    last_phase = total_steps + 1 - 2 * warmup_steps if config.three_phase else total_steps - warmup_steps
    if warmup_steps <= 1 or last_phase <= 0:
        # OneCycleLR divides by the length of each phase and fails on an empty one.
        raise ConfigError(
            f"OneCycle over {total_steps} steps with pct_start={config.pct_start} leaves an empty "
            "phase; train for more steps or move pct_start away from 0 and 1"
        )
    return torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=config.lr,
        total_steps=total_steps,
        pct_start=config.pct_start,
        div_factor=config.div_factor,
        final_div_factor=config.final_div_factor,
        anneal_strategy=config.anneal_strategy,
        three_phase=config.three_phase,
        # Off by default: OneCycleLR would overwrite SGD's momentum with its own cycle, and the
        # momentum being tuned would have no effect. On, it cycles between the two settings.
        cycle_momentum=config.cycle_momentum,
        base_momentum=config.base_momentum,
        max_momentum=config.momentum,
    )


def build_scaler(amp_dtype: torch.dtype | None, device: torch.device) -> torch.amp.GradScaler:
    # bf16 has fp32's exponent range: only fp16 needs loss scaling.
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    if scaler.is_enabled():
        # The scaler skips the optimizer step when it finds inf gradients (its first steps, while it
        # calibrates); the schedule still advances, which is what we want, so the warning is noise.
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
    return scaler


class _Tally:
    """An epoch's sums of (loss, correct, seen) per split, kept on the device: reading them every
    step would synchronize the GPU every step. One tensor, so one all-reduce sums them all."""

    SPLITS = ("train", "val", "test")

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(3 * len(self.SPLITS), dtype=torch.float64, device=device)

    def of(self, split: str) -> torch.Tensor:
        """The (loss, correct, seen) slots of ``split``, a view to add to."""
        first = 3 * self.SPLITS.index(split)
        return self.sums[first : first + 3]

    def reduced(self) -> dict[str, tuple[float, float, float]]:
        """Summed across ranks: split -> (loss, correct, seen)."""
        distributed.all_reduce_sum(self.sums)
        values = self.sums.tolist()
        return {
            split: (values[3 * i], values[3 * i + 1], values[3 * i + 2])
            for i, split in enumerate(self.SPLITS)
        }


class _Run:
    def __init__(
        self,
        config: TrainConfig,
        env: distributed.DistEnv,
        device: torch.device,
        reporter: Reporter | None,
        hparams: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.env = env
        self.device = device
        self.reporter = reporter
        self.amp_dtype = resolve_amp(config.amp, device)
        self.memory_format = torch.channels_last if config.channels_last else torch.preserve_format
        self.timer = PhaseTimer(device)
        self.wall_start = time.perf_counter()
        self.hparams = (
            dict(hparams) if hparams is not None else {k: getattr(config, k) for k in DEFAULT_HPARAMS}
        )

        if device.type == "cuda":
            torch.backends.cudnn.benchmark = config.cudnn_benchmark
            torch.cuda.reset_peak_memory_stats(device)
        torch.manual_seed(config.seed)

        bundle = build_datasets(config)
        self.normalize = bundle.normalize.to(device)
        pin = device.type == "cuda"
        self.train_loader, self.sampler, self.val_loader = build_loaders(
            config, bundle, env.rank, env.world_size, pin
        )
        self.test_loader = (
            build_held_out_loader(config, bundle, env.rank, env.world_size, pin)
            if config.test_held_out
            else None
        )
        self.steps_per_epoch = steps_per_epoch(config, self.train_loader, self.sampler, env.world_size)

        self.raw_model = build_model(config.model, bundle.num_classes, bundle.in_channels, config.width)
        self.raw_model.to(device)
        self.raw_model.to(memory_format=self.memory_format)
        self.model = build_parallel_model(self.raw_model, config, env, device)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
        # Validation loss is the plain cross-entropy, comparable across label_smoothing values.
        self.val_criterion = nn.CrossEntropyLoss(reduction="sum")
        self.optimizer = build_optimizer(config, self.raw_model)
        self.scheduler = build_schedule(config, self.optimizer, config.epochs * self.steps_per_epoch)
        self.scaler = build_scaler(self.amp_dtype, device)
        self.state = checkpoint.TrainingState(self.raw_model, self.optimizer, self.scheduler, self.scaler)
        # What a checkpoint must match to be continued: the settings, and what they resolved to here
        # (the schedule's length depends on the number of ranks, the scaler's state on the AMP dtype).
        self.fingerprint = {
            **config.training_fingerprint(),
            "world_size": env.world_size,
            "steps_per_epoch": self.steps_per_epoch,
            "amp_dtype": str(self.amp_dtype),
        }

    # --- the run ---------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        config, env = self.config, self.env
        history: list[EpochMetrics] = []
        start_epoch, stopped = 0, False
        if config.checkpoint_dir:
            start_epoch, history, stopped = self._resume()
        if env.is_main:
            log.info(
                "training %s on %s: %d epochs x %d steps, batch %d x %d ranks, amp=%s, channels_last=%s%s",
                config.model,
                config.dataset,
                config.epochs,
                self.steps_per_epoch,
                config.batch_size,
                env.world_size,
                self.amp_dtype or "off",
                config.channels_last,
                f", resumed after epoch {start_epoch}" if start_epoch else "",
            )
        resumed_epochs = len(history)
        # A run stopped by its reporter stays stopped when it is started again (a requeued pruned trial).
        end_epoch = start_epoch if stopped else config.epochs
        # Closed however the run ends (a failed set-up included): a sampler thread left polling
        # would outlive the run in a reused process (a Ray actor).
        with ExitStack() as cleanup:
            self.utilization: UtilizationSampler | None = None
            if env.is_main:
                self.utilization = UtilizationSampler(self.device)
                cleanup.callback(self.utilization.close)
            self.profiler = StepProfiler(config.profile_dir, self.device, env.rank)
            self.tensorboard: TensorBoardLog | None = None
            if config.tensorboard_dir and env.is_main and start_epoch < end_epoch:
                self.tensorboard = TensorBoardLog(config.tensorboard_dir, self.hparams)
                cleanup.callback(self.tensorboard.close)
            stopped = self._epochs(history, start_epoch, end_epoch, stopped)
        return self._result(history, start_epoch, stopped, history[resumed_epochs:])

    def _epochs(self, history: list[EpochMetrics], start_epoch: int, end_epoch: int, stopped: bool) -> bool:
        """Train epochs ``start_epoch`` to ``end_epoch`` (appended to ``history``); True if stopped."""
        config, env = self.config, self.env
        # A reporter that hands the epoch's checkpoint on (Ray Tune's PBT) needs it written first.
        save_first = bool(config.checkpoint_dir) and getattr(self.reporter, "checkpoint_before_report", False)
        for epoch in range(start_epoch, end_epoch):
            metrics = self._epoch(epoch)
            history.append(metrics)
            if self.tensorboard is not None:
                self.tensorboard.epoch(metrics)
            if save_first:
                self._save(epoch + 1, metrics.step, history, stopped=False)
            decision = self._report(metrics)
            stopped = decision == _STOP and epoch + 1 < config.epochs
            if config.checkpoint_dir and (stopped or not save_first):
                self._save(epoch + 1, metrics.step, history, stopped)
            if decision == _STOP:
                if env.is_main:
                    log.info("stopped by the reporter after epoch %d", epoch + 1)
                break
        return stopped

    def _save(self, epoch: int, step: int, history: list[EpochMetrics], stopped: bool) -> None:
        if not self.env.is_main:
            return
        assert self.config.checkpoint_dir is not None
        began = time.perf_counter()
        checkpoint.save(
            self.config.checkpoint_dir,
            self.state,
            epoch,
            step,
            self.fingerprint,
            [m.to_dict() for m in history],
            stopped=stopped,
        )
        self.timer.totals["checkpoint"] += time.perf_counter() - began

    def _resume(self) -> tuple[int, list[EpochMetrics], bool]:
        """Load the checkpoint if rank 0 sees one; every rank then starts at rank 0's epoch."""
        assert self.config.checkpoint_dir is not None
        path = checkpoint.checkpoint_path(self.config.checkpoint_dir)
        rank0_found = distributed.broadcast_from_main(int(self.env.is_main and path.exists()), self.device)
        if not rank0_found:
            return 0, [], False
        if not path.exists():
            raise ConfigError(
                f"rank {self.env.rank} cannot see {path}, which rank 0 resumes from; "
                "checkpoint_dir must be on a filesystem every node shares"
            )
        payload = checkpoint.load(path, self.device)
        changes = self.config.resume_changes
        checkpoint.check_fingerprint(path, payload["fingerprint"], self.fingerprint, may_differ=changes)
        checkpoint.restore(payload, self.state)
        checkpoint.adopt_changes(self.optimizer, payload["fingerprint"], self.fingerprint, changes)
        history = [EpochMetrics(**m) for m in payload["history"]]
        return int(payload["epoch"]), history, bool(payload.get("stopped", False))

    def _autocast(self) -> AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _to_device(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        non_blocking = self.config.non_blocking
        images = images.to(self.device, non_blocking=non_blocking, memory_format=self.memory_format)
        return self.normalize(images), labels.to(self.device, non_blocking=non_blocking)

    def _epoch(self, epoch: int) -> EpochMetrics:
        self.model.train()
        self.sampler.set_epoch(epoch)
        tally = _Tally(self.device)
        began = time.perf_counter()
        train_time, spent, gpu_utilization = self._training_phase(epoch, tally)
        began_val = time.perf_counter()
        self._validate(self.val_loader, tally.of("val"))
        # The held-out test set, once, in the last epoch: its figures ride with that epoch's report.
        tested = self.test_loader is not None and epoch + 1 == self.config.epochs
        if self.test_loader is not None and tested:
            self._validate(self.test_loader, tally.of("test"))
        self.timer.totals["validation"] += time.perf_counter() - began_val

        sums = tally.reduced()
        train_loss, train_correct, train_seen = sums["train"]
        val_loss, val_correct, val_seen = sums["val"]
        test_loss, test_correct, test_seen = sums["test"] if tested else (0.0, 0.0, 0.0)
        metrics = EpochMetrics(
            epoch=epoch + 1,
            step=(epoch + 1) * self.steps_per_epoch,
            train_loss=train_loss / train_seen,
            train_accuracy=train_correct / train_seen,
            val_loss=val_loss / val_seen,
            val_accuracy=val_correct / val_seen,
            lr=float(self.scheduler.get_last_lr()[0]),
            images_per_s=train_seen / train_time,
            train_time_s=train_time,
            epoch_time_s=time.perf_counter() - began,
            test_loss=test_loss / test_seen if test_seen else None,
            test_accuracy=test_correct / test_seen if test_seen else None,
            data_time_s=spent["data"],
            forward_time_s=spent["forward"],
            backward_time_s=spent["backward"],
            optimizer_time_s=spent["optimizer"],
            peak_memory_bytes=peak_memory_bytes(self.device),
            gpu_utilization=gpu_utilization,
        )
        if self.env.is_main:
            self._log_epoch(metrics, int(test_seen))
        return metrics

    def _training_phase(self, epoch: int, tally: _Tally) -> tuple[float, dict[str, float], float | None]:
        """The epoch's training steps: their seconds, the seconds of each step phase, and the GPU's
        mean utilization over them."""
        phases_before = self.timer.collect()
        if self.utilization is not None:
            self.utilization.take_mean()  # from here on: this epoch's training, not what came before
        began = time.perf_counter()
        self.timer.start()
        with self.profiler.epoch() as profiling:
            self._train_steps(epoch, tally.of("train"), began, profiling)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        train_time = time.perf_counter() - began
        phases = self.timer.collect()
        spent = {name: phases.get(name, 0.0) - phases_before.get(name, 0.0) for name in STEP_PHASES}
        gpu_utilization = self.utilization.take_mean() if self.utilization is not None else None
        return train_time, spent, gpu_utilization

    def _log_epoch(self, metrics: EpochMetrics, test_seen: int) -> None:
        log.info(
            "epoch %d/%d train_loss %.4f train_acc %.4f val_loss %.4f val_acc %.4f %.0f img/s %.1fs",
            metrics.epoch,
            self.config.epochs,
            metrics.train_loss,
            metrics.train_accuracy,
            metrics.val_loss,
            metrics.val_accuracy,
            metrics.images_per_s,
            metrics.epoch_time_s,
        )
        if metrics.test_accuracy is not None:
            log.info(
                "held-out test: loss %.4f acc %.4f on %d images",
                metrics.test_loss,
                metrics.test_accuracy,
                test_seen,
            )

    def _train_steps(self, epoch: int, sums: torch.Tensor, began: float, profiling: Any) -> None:
        """One epoch's training steps, adding (loss, correct, seen) to ``sums``."""
        config, env = self.config, self.env
        batches = iter(self.train_loader)
        for step in range(self.steps_per_epoch):
            images, labels = next(batches)
            with self._oom_as_trial_error():
                images, labels = self._to_device(images, labels)
                self.timer.mark("data")
                with self._autocast():
                    logits = self.model(images)
                    loss = self.criterion(logits, labels)
                self.timer.mark("forward")
                self.optimizer.zero_grad(set_to_none=True)
                self.scaler.scale(loss).backward()
                self.timer.mark("backward")
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.scheduler.step()
                self.timer.mark("optimizer")
            if StepProfiler.step(profiling):
                # Writing the trace takes seconds: its own phase, not the next step's data wait.
                self.timer.mark("profiler")
            sums[0] += loss.detach() * labels.size(0)
            sums[1] += (logits.argmax(1) == labels).sum()
            sums[2] += labels.size(0)
            if env.is_main and config.log_every and (step + 1) % config.log_every == 0:
                elapsed = time.perf_counter() - began
                log.info(
                    "epoch %d step %d/%d loss %.4f lr %.4g %.0f img/s",
                    epoch + 1,
                    step + 1,
                    self.steps_per_epoch,
                    loss.item(),
                    self.scheduler.get_last_lr()[0],
                    (step + 1) * config.batch_size * env.world_size / elapsed,
                )
        del batches  # non-persistent workers shut down here, before validation starts its own

    @torch.no_grad()
    def _validate(self, loader: Any, sums: torch.Tensor) -> None:
        """Adds the summed loss, the correct predictions and the images seen to ``sums[0:3]``."""
        # The unwrapped model: DDP's forward joins collectives, and a rank whose share of a small
        # validation set is empty would skip them and leave the others waiting.
        self.raw_model.eval()
        for images, labels in loader:
            with self._oom_as_trial_error(), self._autocast():
                images, labels = self._to_device(images, labels)
                logits = self.raw_model(images)
                sums[0] += self.val_criterion(logits.float(), labels)
            sums[1] += (logits.argmax(1) == labels).sum()
            sums[2] += labels.size(0)

    def _report(self, metrics: EpochMetrics) -> int:
        """Ask the reporter on rank 0; every rank gets its answer (no rank may be left waiting).

        A reporter with a true ``every_rank`` attribute is called on every rank it was given to,
        before the answer is shared (Ray Train's report is a barrier that every worker must reach);
        only rank 0's answer counts.
        """
        decision = _CONTINUE
        failure: BaseException | None = None
        every_rank = getattr(self.reporter, "every_rank", False)
        if self.reporter is not None and (self.env.is_main or every_rank):
            try:
                decision = _STOP if self.reporter.report(metrics) == Decision.STOP else _CONTINUE
            except BaseException as err:
                decision, failure = _REPORTER_FAILED, err
        decision = distributed.broadcast_from_main(decision, self.device)
        if failure is not None:
            raise failure
        if decision == _REPORTER_FAILED:
            raise StopRequested("the reporter on rank 0 failed; stopping this rank too")
        return decision

    def _oom_as_trial_error(self) -> AbstractContextManager[None]:
        return oom_as_trial_error(self.config.batch_size, str(self.device))

    def _result(
        self, history: list[EpochMetrics], start_epoch: int, stopped: bool, ran: list[EpochMetrics]
    ) -> TrainResult:
        """``ran``: the epochs this process trained (``history`` also holds those of a checkpoint)."""
        phases = self.timer.collect()
        peak = peak_memory_bytes(self.device)
        last = history[-1] if history else None
        return TrainResult(
            epochs_completed=last.epoch if last else 0,
            steps=last.step if last else 0,
            stopped_early=stopped,
            resumed_from_epoch=start_epoch,
            best_val_accuracy=max((m.val_accuracy for m in history), default=0.0),
            best_val_loss=min((m.val_loss for m in history), default=float("inf")),
            last_val_accuracy=last.val_accuracy if last else 0.0,
            last_val_loss=last.val_loss if last else float("inf"),
            train_images_per_s=sum(m.images_per_s for m in ran) / len(ran) if ran else 0.0,
            peak_memory_bytes=int(peak),
            world_size=self.env.world_size,
            device=str(self.device),
            time=TimeBreakdown(
                data=phases.get("data", 0.0),
                forward=phases.get("forward", 0.0),
                backward=phases.get("backward", 0.0),
                optimizer=phases.get("optimizer", 0.0),
                validation=phases.get("validation", 0.0),
                checkpoint=phases.get("checkpoint", 0.0),
                total=time.perf_counter() - self.wall_start,
            ),
            history=history,
        )
