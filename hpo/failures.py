"""What a trial's fail reason says: whether a retry could help, and whether two failures are the
same failure.

A retry is for what changes from one run to the next: a node lost, a file system that hung, a
neighbour's memory. A usage error, a program or file that is not there, a pattern that never matched
the output, or code that does not import fails again the same way, with the same parameters or any
others: such a failure is *permanent*; it is not retried, and two trials that fail with it are
enough to say the study's set-up is wrong (``hpo.budget.failing``). Pure functions of the reason
text the service itself writes (``hpo.trial.command_objective``, ``hpo.trial.task``, the launcher's
``job N STATE without telling a result: <error line>``), so that the trial side and the launcher
side classify alike.
"""

from __future__ import annotations

import dataclasses
import re

REASON_DIVERGED = "diverged at step"
"""The first words of a diverged trial's reason (``hpo.record.tell_diverged``)."""

USAGE = "usage"
NOT_FOUND = "not found"
NO_METRIC = "no metric"
PROGRAM = "program"
OTHER = "other"
CLUSTER = "cluster"
"""A job the cluster ended (node lost, preemption, time limit, scancel) or a signal: never the
study's set-up."""
KILLED = "killed"
"""The program was SIGKILLed by no one the service knows of: the kernel's OOM killer under a memory
limit (a neighbour's memory, or a limit too small for any configuration), or a user's kill. Retried
(the neighbour may be gone), and counted by fail fast like a crash: a study whose every trial is
killed stops instead of spending its budget, and its retries, on them."""
OUT_OF_MEMORY = "out of memory"
"""A trial told INFEASIBLE because it ran out of GPU or host memory (``hpo.record.tell_infeasible``):
the parameters' doing (a batch too large) or the set-up's (a limit too small for any of them)."""
DIVERGED = "diverged"
"""The run's numbers turned NaN or infinite (the service's "diverged at step N", or the program's
own "loss is nan"): the parameters' doing, so never retried with them and never the set-up's."""


@dataclasses.dataclass(frozen=True)
class Failure:
    kind: str
    """One of USAGE, NOT_FOUND, NO_METRIC, PROGRAM (all permanent), OTHER, KILLED, OUT_OF_MEMORY,
    CLUSTER or DIVERGED."""
    signature: str
    """The reason with its numbers (job ids, trial numbers, parameter values) blanked: equal for
    two trials that failed the same way."""

    @property
    def permanent(self) -> bool:
        """No rerun with the same parameters changes it: not retried."""
        return self.kind not in (OTHER, CLUSTER, KILLED, OUT_OF_MEMORY)

    @property
    def may_be_set_up(self) -> bool:
        """It may come from the study's set-up rather than its parameters (fail fast counts it)."""
        return self.kind not in (CLUSTER, DIVERGED)

    @property
    def may_depend_on_parameters(self) -> bool:
        """The same failure may come from some parameters only (a script that exits without its
        metric line, or crashes, for some of them): fail fast then asks that the failed trials
        spread over the space (``hpo.budget.failing``). A usage error, a missing file or code that
        does not import fails whatever the parameters."""
        return self.kind in (NO_METRIC, OTHER, KILLED, OUT_OF_MEMORY)


_COMMAND_EXIT = re.compile(r"^the command exited with status (?P<status>-?\d+)(?::\s*(?P<line>.*))?$")
# A usage error of the user's command, by its exit status and last line. argparse and click exit 2:
# "prog: error: unrecognized arguments: ...", "usage: prog [-h] ...", "Error: No such option: ...";
# getopt-style tools exit 1 or 64 naming the option.
_PARSER_ERROR = re.compile(r"(^usage: |^[\w./-]+: error: |^error: no such option)", re.IGNORECASE)
_OPTION_WORDS = re.compile(
    r"(unrecognized (arguments|option)|unknown option|invalid option|no such option)", re.IGNORECASE
)
_NOT_FOUND_LINE = re.compile(
    r"(can't open file|no such file or directory|command not found|not found$|permission denied|"
    r"FileNotFoundError|PermissionError|IsADirectoryError|NotADirectoryError)",
    re.IGNORECASE,
)
# Python errors that no rerun changes: the code or its environment is wrong.
_PROGRAM_LINE = re.compile(
    r"\b(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|NameError|TypeError|AttributeError)\b"
    # The user's function (objective.function) that gives no value.
    r"| returned None and reported nothing$|, not a number \(the final metric\)$"
)
# Launcher-side reasons whose cause is the cluster, not the program: never one failure repeated.
_CLUSTER_STATES = re.compile(
    r"^job \S+ (NODE_FAIL|PREEMPTED|BOOT_FAIL|CANCELLED|TIMEOUT|DEADLINE|REQUEUED|UNKNOWN|OUT_OF_MEMORY)\b"
)
# A program's own words for a run whose numbers blew up: "loss is nan", "Loss is inf",
# "returned nan values", "diverged", "non-finite loss".
_DIVERGED_LINE = re.compile(
    r"(\bis (nan|inf|infinite|not finite)\b|\b(nan|inf) (loss|values?|gradients?|encountered|detected)\b"
    r"|\bdiverg|\bnon-?finite\b)",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"\d+(\.\d+)?([eE][-+]?\d+)?")


def classify(reason: str) -> Failure:
    """The kind and signature of a trial's fail reason (see the module docstring)."""
    reason = reason.strip()
    signature = _NUMBER.sub("#", reason)
    if reason.startswith(REASON_DIVERGED):
        return Failure(DIVERGED, "diverged")
    if reason.startswith("no metric reported"):
        return Failure(NO_METRIC, "no metric reported")  # its last line varies with the run
    if reason.startswith("cannot run "):
        return Failure(NOT_FOUND, signature)
    if _CLUSTER_STATES.match(reason):
        return Failure(CLUSTER, signature)
    if "killed by SIGKILL" in reason:
        return Failure(KILLED, "killed by SIGKILL")  # its last output line varies with the run
    if "killed by SIG" in reason:  # the scheduler's SIGTERM of a preemption or a cancel
        return Failure(CLUSTER, signature)
    exited = _COMMAND_EXIT.match(reason)
    if exited:  # the user's command, told by the trial process
        line, status = exited.group("line") or "", int(exited.group("status"))
        if status in (126, 127):  # the shell's "cannot execute" and "command not found"
            return Failure(NOT_FOUND, signature)
        if (status == 2 and _PARSER_ERROR.search(line)) or (
            status in (1, 2, 64) and _OPTION_WORDS.search(line)
        ):
            return Failure(USAGE, signature)
    else:
        # The launcher's "job N STATE without telling a result: <its log's error line>" (the trial
        # process itself died), or a function's exception: no usage error of a command there.
        line = reason.partition(" without telling a result: ")[2] or reason
        if line.startswith("slurmstepd"):  # Slurm's own words about the step: the cluster's
            return Failure(OTHER, signature)
    if _NOT_FOUND_LINE.search(line):
        return Failure(NOT_FOUND, signature)
    if _PROGRAM_LINE.search(line):
        return Failure(PROGRAM, signature)
    if _DIVERGED_LINE.search(line):
        return Failure(DIVERGED, signature)
    return Failure(OTHER, signature)


def hint(kind: str, study_file: str, trial: int) -> str:
    """What to change for a failure of this kind (the study file's keys named)."""
    logs = f"hpo logs {study_file} {trial} --err"
    return {
        USAGE: f"the command's options are not the script's: check objective.command in {study_file} "
        "against the script's --help",
        NOT_FOUND: f"a program or file is missing where the trial ran: check objective.command and "
        f"objective.cwd in {study_file}, and the paths they name ({logs})",
        NO_METRIC: f"objective.metric_pattern read no number from the command's output: check it "
        f"against the trial's output (hpo logs {study_file} {trial}), or try it with hpo launch "
        f"{study_file} --check",
        PROGRAM: "the objective fails the same way whatever its parameters: run it once by hand in "
        f"the job's environment (modules, venv) and read its log ({logs})",
    }.get(kind, f"see the trial's log: {logs}")
