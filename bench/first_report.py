"""A trainer trial's start to its first report, before and after a change, side by side in one run.

Every trial of a study starts a fresh process: Python, ``import torch``, the trainer's modules,
then the data, the model and the first epoch, whose metrics go to the trainer's reporter (the
``Reporter`` seam of ``trainer/reporting.py``, which a study's trial adapts to Optuna). Until that
first report a trial has told the study nothing: the seconds before it are every trial's overhead.

Each run is a child process of this one, started the way a trial's job runs the trainer (the same
interpreter, ``OMP_NUM_THREADS=1``, ``import torch`` and then ``trainer.train(config, reporter)``,
as ``hpo.trial.objective.TrainerObjective`` does), with a reporter that stamps the first report.
Two sides, the same tiny configuration:

- before: the code at ``--before`` (default 4a79ac2, the commit before torchvision was imported
  lazily), checked out with ``git worktree add`` into a temporary folder (removed afterwards);
- after: this working tree.

Each side's package is found through ``PYTHONPATH`` alone (the child runs in an empty folder and
checks where ``trainer`` came from). One discarded warm-up run per side compiles the fresh
checkout's bytecode; then the sides alternate, before/after, ``--repeats`` times. Each run yields:

- start -> first report: the parent's ``time.time()`` just before starting the child, to the
  child's ``time.time()`` inside the first ``report`` (one host, one clock), split into the
  interpreter's start, ``import torch``, the imports of the trainer's modules, and the rest (data,
  model, the first epoch's 20 steps and its validation);
- CPU seconds (user+sys): the child's own up to the first report (``getrusage`` in the child), and
  the whole process's (``os.wait4``);
- which of torchvision, sympy and torch._dynamo were loaded when the first report came.

Then one more run of each side under ``python -X importtime`` says where the import seconds go:
self time summed by package, for the imports before ``train`` is called and for those ``train``
makes itself before the first report (importtime slows imports down; its figures are shares, not
the timed runs' seconds).

    python -m bench.first_report                 # 5 repeats a side: about 2 minutes on 2 cores
    python -m bench.first_report --before REF --repeats N
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JSON = REPO / "bench" / "results" / "first_report.json"
DEFAULT_BEFORE = "4a79ac2"
SIDES = ("before", "after")

# The same tiny trial on both sides: a narrow CIFAR ResNet on the real Fashion-MNIST idx files.
CONFIG: dict[str, Any] = {
    "model": "resnet8",
    "width": 8,
    "dataset": "fashion-mnist",
    "data_root": "/usr/share/datasets/fashion-mnist",
    "batch_size": 64,
    "max_steps_per_epoch": 20,
    "epochs": 1,
    "num_workers": 0,
    "val_fraction": 0.1,
    "device": "cpu",
}
CHILD_ENV = {"OMP_NUM_THREADS": "1"}
# Modules whose presence at the first report is recorded: what the lazy import is meant to avoid.
WATCHED = ("torchvision", "sympy", "torch._dynamo")
# -X importtime's self time is summed under these (the first that prefixes a module), else "other".
IMPORT_GROUPS = ("torchvision", "torch._dynamo", "torch._inductor", "torch", "sympy", "numpy", "trainer")
MARKER = "FIRST-REPORT "
TRAIN_MARK = "first-report: train() called"
REPORT_MARK = "first-report: first report"

# The child: timed imports, then a run whose reporter stamps its first report on stdout.
DRIVER = f"""\
import time
t_exec = time.time()
import json, os, resource, sys
import torch
t_torch = time.time()
import trainer, trainer.loop
t_trainer = time.time()
from trainer import Decision, TrainConfig

root, config = os.path.realpath(sys.argv[1]), json.loads(sys.argv[2])
source = os.path.realpath(trainer.__file__)
if not source.startswith(root + os.sep):
    sys.exit(f"trainer imported from {{source}}, not from {{root}}")


class FirstReport:
    def __init__(self):
        self.reported = False

    def report(self, metrics):
        if not self.reported:
            self.reported = True
            t_report = time.time()
            usage = resource.getrusage(resource.RUSAGE_SELF)
            print({REPORT_MARK!r}, file=sys.stderr, flush=True)
            record = {{
                "t_exec": t_exec, "t_torch": t_torch, "t_trainer": t_trainer, "t_report": t_report,
                "cpu_to_report_s": usage.ru_utime + usage.ru_stime,
                "loaded": {{name: name in sys.modules for name in {WATCHED!r}}},
                "modules": len(sys.modules), "trainer_file": source,
                "epoch": metrics.epoch, "step": metrics.step, "val_accuracy": metrics.val_accuracy,
            }}
            print({MARKER!r} + json.dumps(record), flush=True)
        return Decision.CONTINUE


print({TRAIN_MARK!r}, file=sys.stderr, flush=True)
trainer.train(TrainConfig.from_mapping(config), FirstReport())
"""


def run_once(root: Path, workdir: Path, importtime: bool = False) -> dict[str, Any]:
    """One trial process of the code under ``root``: its timestamps, CPU seconds and import log."""
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(root)}
    flags = ["-X", "importtime"] if importtime else []
    command = [sys.executable, *flags, "-c", DRIVER, str(root), json.dumps(CONFIG)]
    with tempfile.TemporaryFile(mode="w+") as stderr:
        started = time.time()
        child = subprocess.Popen(
            command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        record: dict[str, Any] | None = None
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(MARKER) and record is None:
                arrived = time.time()
                record = json.loads(line.removeprefix(MARKER))
                record["t_arrived"] = arrived
        # os.wait4 rather than Popen.wait: the child's own rusage, whatever else this process ran.
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        log = stderr.read()
    if child.returncode != 0 or record is None:
        raise RuntimeError(f"the trial under {root} exited with {child.returncode}:\n{log[-3000:]}")
    record["t_start"] = started
    record["cpu_total_s"] = usage.ru_utime + usage.ru_stime
    record["wall_total_s"] = time.time() - started
    for key, (since, until) in SPANS.items():
        record[key] = record[until] - record[since]
    if importtime:
        record["importtime"] = import_groups(log)
    return record


# The spans of a run, from its timestamps; "first_report_s" is the sum of the four before it.
SPANS = {
    "interpreter_s": ("t_start", "t_exec"),
    "import_torch_s": ("t_exec", "t_torch"),
    "import_trainer_s": ("t_torch", "t_trainer"),
    "train_to_report_s": ("t_trainer", "t_report"),
    "first_report_s": ("t_start", "t_report"),
}


def import_groups(log: str) -> dict[str, dict[str, float]]:
    """Seconds of ``-X importtime`` self time by package, for the imports before ``train()``
    and for those it made up to the first report."""
    phases: dict[str, dict[str, float]] = {"before_train": {}, "in_train": {}}
    phase: str | None = "before_train"
    for line in log.splitlines():
        if line.strip() == TRAIN_MARK:
            phase = "in_train"
            continue
        if line.strip() == REPORT_MARK:
            phase = None
        if phase is None or not line.startswith("import time:") or "|" not in line:
            continue
        self_us, _, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        if not self_us.isdigit():  # the header line
            continue
        group = next((g for g in IMPORT_GROUPS if name == g or name.startswith(g + ".")), "other")
        phases[phase][group] = phases[phase].get(group, 0.0) + int(self_us) / 1e6
    return phases


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def quartiles(values: list[float]) -> dict[str, float]:
    if len(values) == 1:
        return {"median": values[0], "q1": values[0], "q3": values[0]}
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": median, "q1": q1, "q3": q3}


def measure(before_ref: str, repeats: int) -> dict[str, Any]:
    before_commit = git("rev-parse", "--verify", f"{before_ref}^{{commit}}")
    head = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--", "trainer")
    tmp = Path(tempfile.mkdtemp(prefix="hpo-bench-first-report-"))
    worktree, workdir = tmp / "before", tmp / "cwd"
    workdir.mkdir()
    git("worktree", "add", "--detach", "--quiet", str(worktree), before_commit)
    try:
        roots = {"before": worktree, "after": REPO}
        for side in SIDES:  # bytecode compiled, files cached: not measured
            run_once(roots[side], workdir)
        runs: list[dict[str, Any]] = []
        for repeat in range(repeats):
            for side in SIDES:
                record = run_once(roots[side], workdir)
                runs.append({"side": side, "repeat": repeat, **record})
                print(
                    f"  {repeat + 1}/{repeats} {side:<6} start -> first report {record['first_report_s']:6.2f} s"
                    f"  CPU {record['cpu_to_report_s']:6.2f} s to it, {record['cpu_total_s']:6.2f} s in all",
                    flush=True,
                )
        importtime = {side: run_once(roots[side], workdir, importtime=True)["importtime"] for side in SIDES}
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "benchmark": "first_report",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "config": CONFIG,
        "child_env": CHILD_ENV,
        "repeats": repeats,
        "sides": {
            "before": {"ref": before_ref, "commit": before_commit},
            "after": {
                "ref": "working tree",
                "commit": head,
                "trainer_changes_uncommitted": dirty.splitlines(),
            },
        },
        "runs": runs,
        "summary": summarize(runs),
        "importtime_s": importtime,
    }


METRICS = (*SPANS, "cpu_to_report_s", "cpu_total_s")


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for side in SIDES:
        mine = [run for run in runs if run["side"] == side]
        summary[side] = {metric: quartiles([run[metric] for run in mine]) for metric in METRICS}
        summary[side]["loaded"] = {
            name: sum(run["loaded"][name] for run in mine) / len(mine) for name in WATCHED
        }
        summary[side]["modules"] = statistics.median(run["modules"] for run in mine)
    summary["ratio_after_before"] = {}
    for metric in METRICS:
        before = [run[metric] for run in runs if run["side"] == "before"]
        after = [run[metric] for run in runs if run["side"] == "after"]
        paired = [a / b for a, b in zip(after, before, strict=True) if b > 0]
        summary["ratio_after_before"][metric] = {
            "of_medians": statistics.median(after) / statistics.median(before),
            "paired_median": statistics.median(paired) if paired else None,
        }
    return summary


LABELS = {
    "first_report_s": "start -> first report (wall)",
    "interpreter_s": "  interpreter start",
    "import_torch_s": "  import torch",
    "import_trainer_s": "  import trainer.loop (its modules)",
    "train_to_report_s": "  train() up to its first report",
    "cpu_to_report_s": "CPU to first report (user+sys)",
    "cpu_total_s": "CPU of the whole process",
}


def print_table(result: dict[str, Any]) -> None:
    summary, sides = result["summary"], result["sides"]
    config = result["config"]
    print(
        f"\nStart of a trainer trial's process to its first report: {config['model']} width {config['width']} on "
        f"{config['dataset']}, batch {config['batch_size']}, {config['max_steps_per_epoch']} steps, "
        f"{config['epochs']} epoch, {config['num_workers']} workers, OMP_NUM_THREADS=1"
    )
    after_note = "uncommitted trainer/ changes" if sides["after"]["trainer_changes_uncommitted"] else "clean"
    print(
        f"before: {sides['before']['ref']} ({sides['before']['commit'][:9]}); after: the working tree "
        f"(HEAD {sides['after']['commit'][:9]}, trainer/ {after_note})"
    )
    print(
        f"{result['repeats']} runs a side, alternated before/after after a discarded warm-up run of each; "
        "seconds, median [first quartile, third quartile]"
    )
    print(f"{'':<36}{'before':>22}{'after':>22}{'after/before':>14}")

    def cell(side: str, metric: str) -> str:
        q = summary[side][metric]
        return f"{q['median']:.2f} [{q['q1']:.2f}, {q['q3']:.2f}]"

    for metric in ("first_report_s", "interpreter_s", "import_torch_s", "import_trainer_s", "train_to_report_s",
                   "cpu_to_report_s", "cpu_total_s"):  # fmt: skip
        ratio = summary["ratio_after_before"][metric]["of_medians"]
        print(f"{LABELS[metric]:<36}{cell('before', metric):>22}{cell('after', metric):>22}{ratio:>14.2f}")
    paired = summary["ratio_after_before"]["first_report_s"]["paired_median"]
    paired_cpu = summary["ratio_after_before"]["cpu_to_report_s"]["paired_median"]
    print(
        f"after/before run by run (median of the pairs): wall {paired:.2f}, CPU to first report {paired_cpu:.2f}"
    )
    for side in SIDES:
        loaded = ", ".join(
            f"{name} {'yes' if share == 1 else 'no' if share == 0 else f'{share:.0%}'}"
            for name, share in summary[side]["loaded"].items()
        )
        print(f"loaded at the first report, {side}: {loaded}; {summary[side]['modules']:.0f} modules")

    groups = result["importtime_s"]
    print(
        "\nWhere the import seconds go: one run of each under python -X importtime, self time by package, s"
    )
    print(f"{'':<18}{'before train()':>30}{'inside train(), to 1st report':>32}")
    print(f"{'package':<18}{'before':>15}{'after':>15}{'before':>16}{'after':>16}")
    for group in (*IMPORT_GROUPS, "other", "total"):

        def seconds(side: str, phase: str, group: str = group) -> float:
            found: dict[str, float] = groups[side][phase]
            return sum(found.values()) if group == "total" else found.get(group, 0.0)

        print(
            f"{group:<18}{seconds('before', 'before_train'):>15.2f}{seconds('after', 'before_train'):>15.2f}"
            f"{seconds('before', 'in_train'):>16.2f}{seconds('after', 'in_train'):>16.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--before", default=DEFAULT_BEFORE, help=f"the commit to compare against (default {DEFAULT_BEFORE})"
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs of each side, alternated (default 5)")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"write the results here (default {DEFAULT_JSON})"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    result = measure(args.before, args.repeats)
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwritten: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
