"""Every GPU path of the service, checked in one command on a GPU node in under ten minutes.

    python -m bench gpu            # or: make gpu-check
    python -m bench.gpu --rehearse-on-cpu   # the same checks, tiny, on CPU (what the tests run)

No network is needed. Each check prints one line, ``ok`` with its figures or what failed:

- devices: the GPUs torch sees, bf16 support, NVML readable (the trials' GPU utilization);
- resnet50-bf16, resnet50-fp16: the trainer on synthetic ImageNet-size data (ResNet-50, 224 px,
  channels_last; fp16 with its GradScaler), images/s against a bare loop over the same model and
  data, and against the published 2,470 images/s per A100 (NVIDIA's Deep Learning Examples, AMP)
  and about 2,600 (timm, channels_last);
- study: a short real study through ``hpo launch`` (local executor, a CIFAR-size ResNet on
  Fashion-MNIST, or synthetic 32 px images where the dataset is not installed) whose trials record
  their data-wait share from CUDA events, NVML utilization and CUDA peak memory;
- profile: that study's profiled trial, whose trace must hold CUDA kernels;
- ddp: a two-process DDP trial over NCCL, where two GPUs are visible (said, where one is);
- packing: trials per GPU-hour of the same CIFAR-size trial packed k = 1, 2 and 4 on one GPU
  (``resources.trials_per_gpu``), each k with the same trials.

Writes ``bench/results/gpu.json`` (or ``--json``). Without a GPU it says so in one line, writes
nothing and exits 0; it exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from bench.throughput import PRESETS, bare_loop_throughput, trainer_throughput
from trainer import TrainConfig

REPO = Path(__file__).resolve().parents[1]

PUBLISHED = {"NVIDIA DLE, A100, AMP": 2470.0, "timm, channels_last": 2600.0}
"""Published ResNet-50 training images/s on one A100 (the figures the check is set against)."""
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
PACKING = (1, 2, 4)


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    line: str
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Plan:
    """How big each check is: the GPU run, or the CPU rehearsal that only proves the code paths."""

    rehearsal: bool
    scratch: Path
    deadline: float
    steps: int
    """Measured optimizer steps per epoch of the ResNet-50 runs."""
    study_trials: int
    packed_trials: int

    @property
    def device(self) -> str:
        return "cpu" if self.rehearsal else "cuda"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/gpu.json", help="where figures go")
    parser.add_argument("--budget-s", type=float, default=540.0, help="wall time for every check together")
    parser.add_argument(
        "--rehearse-on-cpu", action="store_true", help="run every check tiny on CPU (tests the script)"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.rehearse_on_cpu:
        print(f"gpu: no CUDA GPU visible (torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}): "
              f"nothing measured, {args.json} not written")  # fmt: skip
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hpo-gpu-check-") as scratch:
        plan = Plan(
            rehearsal=args.rehearse_on_cpu,
            scratch=Path(scratch),
            deadline=started + args.budget_s,
            steps=3 if args.rehearse_on_cpu else 60,
            study_trials=1 if args.rehearse_on_cpu else 6,
            packed_trials=2 if args.rehearse_on_cpu else 4,
        )
        checks: list[Check] = []
        for name, run in CHECKS:
            if time.monotonic() > plan.deadline:
                checks.append(Check(name, False, f"not run: the {args.budget_s:.0f} s budget is spent"))
            else:
                checks.append(_guarded(name, run, plan, checks))
            print(f"{name}: {'ok' if checks[-1].ok else 'FAILED'}: {checks[-1].line}", flush=True)
    elapsed = time.monotonic() - started
    failed = [c.name for c in checks if not c.ok]
    print(f"gpu check: {len(checks) - len(failed)} of {len(checks)} ok in {elapsed:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "rehearsal_on_cpu": plan.rehearsal,
                "machine": _machine(),
                "seconds": round(elapsed, 1),
                "checks": [dataclasses.asdict(c) for c in checks],
            },
            indent=2,
        )
        + "\n"
    )
    return 1 if failed else 0


def _guarded(name: str, run: Callable[[Plan, list[Check]], Check], plan: Plan, done: list[Check]) -> Check:
    try:
        return run(plan, done)
    except Exception as err:  # one check's failure is its line; the others still run
        traceback.print_exc()
        return Check(
            name,
            False,
            f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}",
        )


def _machine() -> dict[str, Any]:
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"gpus": gpus, "torch": torch.__version__, "cuda": torch.version.cuda, "cpus": os.cpu_count()}


# --- the checks ------------------------------------------------------------------------------------
def check_devices(plan: Plan, done: list[Check]) -> Check:
    if plan.rehearsal:
        return Check("devices", True, "rehearsal on CPU: no GPU to list")
    count = torch.cuda.device_count()
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    bf16 = torch.cuda.is_bf16_supported()
    try:
        utilization: float | None = float(torch.cuda.utilization(0))
    except Exception as err:  # no pynvml: the trials' gpu_utilization stays empty
        return Check("devices", False, f"{count} GPUs ({', '.join(names)}), but NVML is not readable: {err} "
                     "(pip install nvidia-ml-py)")  # fmt: skip
    line = f"{count} GPUs ({', '.join(names)}), bf16 {'yes' if bf16 else 'no'}, NVML reads {utilization:.0f}%"
    return Check("devices", True, line, {"count": count, "names": names, "bf16": bf16})


def _resnet50(plan: Plan, amp: str) -> Check:
    name = f"resnet50-{amp}"
    preset = dict(PRESETS["gpu"])
    if plan.rehearsal:  # the same code path, a model and data a CPU trains in seconds
        preset.update(model="resnet20", image_size=32, synthetic_num_classes=10, batch_size=16,
                      num_workers=0, device="cpu")  # fmt: skip
        amp = "off"
    config = TrainConfig.from_mapping(
        {
            **preset,
            "amp": amp,
            "channels_last": True,
            "epochs": 2,
            "max_steps_per_epoch": plan.steps,
            "synthetic_train_samples": plan.steps * int(preset["batch_size"]),
            "val_fraction": 0.02,
            "log_every": 0,
            "checkpoint_dir": str(plan.scratch / name),
        }
    )
    trainer = trainer_throughput(config, warmup_epochs=1)
    bare = bare_loop_throughput(config, warmup_epochs=1)
    figures: dict[str, Any] = {"trainer_images_per_s": round(trainer, 1), "bare_images_per_s": round(bare, 1),
                               "trainer_over_bare": round(trainer / bare, 3)}  # fmt: skip
    against = ", ".join(
        f"{trainer / value:.2f}x {source}'s {value:,.0f}" for source, value in PUBLISHED.items()
    )
    figures["against_published"] = {source: round(trainer / value, 3) for source, value in PUBLISHED.items()}
    loader = f"{config.num_workers} loader workers, {'pinned' if config.pin_memory else 'pageable'} memory"
    line = (f"trainer {trainer:,.0f} images/s, bare loop {bare:,.0f} ({trainer / bare:.3f}x); {against} "
            f"(channels_last, {loader})")  # fmt: skip
    if not plan.rehearsal and amp == "fp16":
        line += " (GradScaler on)"
    return Check(name, True, line, figures)


def check_bf16(plan: Plan, done: list[Check]) -> Check:
    if not plan.rehearsal and not torch.cuda.is_bf16_supported():
        return Check("resnet50-bf16", True, "skipped: this GPU has no bf16 (fp16 is checked next)")
    return _resnet50(plan, "bf16")


def check_fp16(plan: Plan, done: list[Check]) -> Check:
    return _resnet50(plan, "fp16")


def _cifar_study(plan: Plan, name: str, **study: Any) -> dict[str, Any]:
    """A short study of a CIFAR-size ResNet: Fashion-MNIST where Debian's package put it, else
    synthetic 32 px images (no network on a GPU node)."""
    trainer: dict[str, Any] = {"model": "resnet20", "width": 16, "epochs": 2, "batch_size": 256,
                               "num_workers": 2, "log_every": 0, "seed": 0, "device": plan.device}  # fmt: skip
    if FASHION_MNIST.is_dir():
        trainer.update(dataset="fashion-mnist", data_root=str(FASHION_MNIST), train_fraction=0.25)
    else:
        trainer.update(dataset="synthetic", image_size=32, synthetic_train_samples=15_000)
    if plan.rehearsal:
        # Width 8, not 4: resnet20 at width 4 in channels_last crashes torch 2.14.1 on the CPU now and
        # then (a segmentation fault or "double free" in the first epoch, 2 runs of 3 here).
        # 2% of the validation images: the full set would take most of the rehearsal's time.
        trainer.update(
            width=8, epochs=2, batch_size=64, num_workers=0, max_steps_per_epoch=3, val_fraction=0.02
        )
    document: dict[str, Any] = {
        "study": {
            "name": name,
            "workdir": str(plan.scratch / name),
            "sampler": {"name": "random", "seed": 0},
            "pruner": {"name": "none"},
            "n_trials": plan.study_trials,
            "max_concurrent": 1,
            **study,
        },
        "search_space": {"lr": {"type": "float", "low": 0.05, "high": 0.5, "log": True}},
        "trainer": trainer,
        "resources": {
            "executor": "local",
            "cpus_per_task": 2 if not plan.rehearsal else 1,
            "gpus_per_node": 0 if plan.rehearsal else 1,
            "time": "15m",
        },
    }
    return document


def _launch(plan: Plan, document: dict[str, Any], *extra: str) -> tuple[list[Any], float]:
    """``hpo launch`` of the document (its own journal file); the trials and the launch's seconds."""
    import optuna

    from hpo.storage import StorageRef, open_storage

    name = document["study"]["name"]
    study_file = plan.scratch / f"{name}.yaml"
    study_file.write_text(yaml.safe_dump(document, sort_keys=False))
    journal = plan.scratch / f"{name}.journal"
    left = max(30.0, plan.deadline - time.monotonic())
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hpo", "launch", str(study_file), "--storage", f"journal://{journal}", *extra],
        capture_output=True, text=True, timeout=left, cwd=REPO,
    )  # fmt: skip
    seconds = time.monotonic() - began
    if proc.returncode != 0:
        raise RuntimeError(
            f"hpo launch exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"
        )
    storage = open_storage(StorageRef("journal", str(journal)), create=False, log=lambda line: None)
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    return trials, seconds


def check_study(plan: Plan, done: list[Check]) -> Check:
    trials, seconds = _launch(plan, _cifar_study(plan, "gpu-check-study", profile_trials=1))
    states = [t.state.name for t in trials]
    if states.count("COMPLETE") != len(trials):
        return Check("study", False, f"trials ended {states}")
    wanted = ["data_wait_share", "peak_memory_mib"] + ([] if plan.rehearsal else ["gpu_utilization"])
    missing = {t.number: [k for k in wanted if k not in t.user_attrs] for t in trials}
    missing = {n: keys for n, keys in missing.items() if keys}
    if missing:
        return Check("study", False, f"{len(trials)} trials COMPLETE, but measurements missing: {missing}")
    waits = [float(t.user_attrs["data_wait_share"]) for t in trials]
    peaks = [float(t.user_attrs["peak_memory_mib"]) for t in trials]
    util = [float(t.user_attrs["gpu_utilization"]) for t in trials if "gpu_utilization" in t.user_attrs]
    best = max(float(t.values[0]) for t in trials)
    figures = {"trials": len(trials), "seconds": round(seconds, 1), "best_val_accuracy": best,
               "data_wait_share": waits, "peak_memory_mib": peaks, "gpu_utilization": util,
               "profile_dir": trials[0].user_attrs.get("profile_trace")}  # fmt: skip
    dataset = "Fashion-MNIST" if FASHION_MNIST.is_dir() else "synthetic 32 px (no Fashion-MNIST here)"
    line = (f"{len(trials)} trials on {dataset} COMPLETE in {seconds:.0f} s, best val_accuracy {best:.4f}; data wait "
            f"{min(waits):.1%}-{max(waits):.1%}, peak {max(peaks):,.0f} MiB"
            + (f", GPU utilization {min(util):.0f}-{max(util):.0f}%" if util else ""))  # fmt: skip
    return Check("study", True, line, figures)


def check_profile(plan: Plan, done: list[Check]) -> Check:
    study = next((c for c in done if c.name == "study" and c.ok), None)
    if study is None or not study.figures.get("profile_dir"):
        return Check("profile", False, "no profiled trial: the study check failed")
    traces = sorted(Path(study.figures["profile_dir"]).rglob("*.json*"))
    if not traces:
        return Check("profile", False, f"no trace file under {study.figures['profile_dir']}")
    raw = traces[-1].read_bytes()
    events = json.loads(gzip.decompress(raw) if traces[-1].suffix == ".gz" else raw).get("traceEvents", [])
    kernels = sum(1 for e in events if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy"))
    if plan.rehearsal:
        return Check(
            "profile",
            True,
            f"trace of {len(events)} events (no CUDA kernels on CPU)",
            {"events": len(events)},
        )
    if not kernels:
        return Check(
            "profile", False, f"trace of {len(events)} events, none a CUDA kernel: {traces[-1].name}"
        )
    return Check("profile", True, f"{kernels} CUDA kernel events in {traces[-1].name}", {"kernels": kernels})


def check_ddp(plan: Plan, done: list[Check]) -> Check:
    visible = torch.cuda.device_count()
    if not plan.rehearsal and visible < 2:
        return Check("ddp", True, f"skipped: {visible} GPU visible; DDP over NCCL needs 2", {"gpus": visible})
    document = _cifar_study(plan, "gpu-check-ddp", n_trials=1)
    document["resources"].update(tasks_per_node=2, gpus_per_node=0 if plan.rehearsal else 2)
    trials, seconds = _launch(plan, document)
    [trial] = trials
    if trial.state.name != "COMPLETE":
        return Check(
            "ddp",
            False,
            f"the 2-process trial ended {trial.state.name}: {trial.user_attrs.get('fail_reason')}",
        )
    backend = "gloo (rehearsal)" if plan.rehearsal else "NCCL"
    return Check("ddp", True, f"2-process trial over {backend} COMPLETE in {seconds:.0f} s, "
                 f"val_accuracy {trial.values[0]:.4f}", {"seconds": round(seconds, 1)})  # fmt: skip


def check_packing(plan: Plan, done: list[Check]) -> Check:
    """The same trials at k = 1, 2, 4 per GPU; trials per GPU-hour from each launch's wall time."""
    per_hour: dict[int, float] = {}
    packs = [k for k in PACKING if k <= (os.cpu_count() or 1)]  # each trial gets a CPU of its own
    for k in packs:
        document = _cifar_study(plan, f"gpu-check-pack{k}", n_trials=plan.packed_trials, max_concurrent=k)
        document["study"]["sampler"] = {"name": "random", "seed": 1}  # the same trials at every k
        document["resources"]["trials_per_gpu"] = k
        document["resources"]["cpus_per_task"] = 1
        trials, seconds = _launch(plan, document)
        states = {t.state.name for t in trials}
        if states != {"COMPLETE"}:
            return Check("packing", False, f"k={k}: trials ended {sorted(states)}")
        per_hour[k] = len(trials) / (seconds / 3600)  # one GPU held for the launch's wall time
    ratios = {k: per_hour[k] / per_hour[1] for k in packs}
    line = ", ".join(f"k={k} {per_hour[k]:,.0f} trials/GPU-hour ({ratios[k]:.2f}x)" for k in packs)
    return Check("packing", True, line, {"trials_per_gpu_hour": per_hour, "against_k1": ratios})


CHECKS: list[tuple[str, Callable[[Plan, list[Check]], Check]]] = [
    ("devices", check_devices),
    ("resnet50-bf16", check_bf16),
    ("resnet50-fp16", check_fp16),
    ("study", check_study),
    ("profile", check_profile),
    ("ddp", check_ddp),
    ("packing", check_packing),
]


if __name__ == "__main__":
    sys.exit(main())
