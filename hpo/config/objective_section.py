"""The objective section: the user's own code, a command or a Python function, in place of the trainer."""

from __future__ import annotations

import re

from hpo.config.user_code import RUNTIME_PLACEHOLDERS, TemplateError, placeholders
from hpo.config.values import FUNCTION, NAME, RANK_VARIABLES, check_single_line
from trainer.fields import KeyProblem, config_dataclass, field


@config_dataclass()
class ObjectiveSection:
    """The user's own training code as the objective, instead of the built-in trainer."""

    command: list[str] | None = field(
        None,
        "The program and its arguments, one list element each (no shell): {name} takes the trial's "
        "value of a search-space parameter or of objective.fixed; also {trial}, {checkpoint_dir} (the "
        "same across requeues and retries of a trial), {trial_dir} and {python} (the job's "
        "interpreter). {{ and }} are literal braces.",
    )
    function: str | None = field(
        None,
        "package.module:name, called in the trial's job as name(params, trial) with the trial's "
        "parameters and its hpo.trial handle; its return value is the final metric.",
    )
    metric_pattern: str | None = field(
        None,
        "command only: a regular expression searched in each line the command prints; its group "
        "(?P<value>...) is the metric, (?P<step>...) the step (default: the count of matches). Each "
        "match is a report the pruner sees. Not needed by a script that reports through hpo.trial.",
    )
    final_pattern: str | None = field(
        None,
        "command only: a regular expression with (?P<value>...) for the final metric "
        "(default: the last report).",
    )
    fixed: dict[str, str | int | float | bool] = field(
        factory=dict,
        help="Fixed values of placeholders (not searched), e.g. {epochs: 10}; hpo.trial.params() has them "
        "too, under the trial's parameters.",
    )
    steps: int = field(1, "The step of a full run's last report (its epochs): the pruners' maximum.", ge=1)
    stop_grace_s: float = field(
        10.0, "Seconds a pruned command has between SIGTERM and SIGKILL to its process group.", gt=0
    )
    cwd: str | None = field(
        None, "Folder the command runs in, relative to the study file's (default: the study file's folder)."
    )
    env: dict[str, str] = field(factory=dict, help="Environment variables of the command or function.")

    def __post_init__(self) -> None:
        if (self.command is None) == (self.function is None):
            raise KeyProblem(
                "command",
                "give one of command (a program and its arguments) or function (package.module:name)",
            )
        if self.command is not None:
            if not self.command:
                raise KeyProblem("command", "is empty: give the program and its arguments")
            for index, element in enumerate(self.command):
                key = f"command[{index}]"
                if "\0" in element:
                    raise KeyProblem(key, "contains a NUL character")
                try:
                    names = placeholders(element)
                except TemplateError as err:
                    raise KeyProblem(key, f"{err}: {element!r}") from None
                if index == 0 and names and element != "{python}":
                    # A parameter value (read back from a shared database) must never pick the program.
                    raise KeyProblem(
                        key, f"the program may be {{python}} or a fixed name or path, got {element!r}"
                    )
        else:
            for key in ("metric_pattern", "final_pattern"):
                if getattr(self, key) is not None:
                    raise KeyProblem(key, "applies to a command objective, not a function")
            if not FUNCTION.fullmatch(str(self.function)):
                raise KeyProblem("function", f"must be package.module:name, got {self.function!r}")
        for key in ("metric_pattern", "final_pattern"):
            pattern = getattr(self, key)
            if pattern is None:
                continue
            try:
                groups = re.compile(pattern).groupindex
            except re.error as err:
                raise KeyProblem(key, f"is not a regular expression ({err}): {pattern!r}") from None
            if "value" not in groups:
                raise KeyProblem(key, f"needs a group (?P<value>...) for the metric: {pattern!r}")
        for name, value in self.fixed.items():
            if not NAME.fullmatch(name):
                raise KeyProblem(f"fixed.{name}", "must be a name (letters, digits and _)")
            if name in RUNTIME_PLACEHOLDERS:
                raise KeyProblem(f"fixed.{name}", "is set by the service for each trial")
            check_single_line(f"fixed.{name}", str(value))
        for name, value in self.env.items():
            if not NAME.fullmatch(name):
                raise KeyProblem(f"env.{name}", "must be an environment variable name")
            if name.startswith("HPO_") or name in RANK_VARIABLES:
                raise KeyProblem(f"env.{name}", "is set by the service for each trial and rank")
            check_single_line(f"env.{name}", value)
        if self.cwd is not None:
            check_single_line("cwd", self.cwd)

    def placeholder_names(self) -> list[str]:
        return [name for element in self.command or [] for name in placeholders(element)]
