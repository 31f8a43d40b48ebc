"""The search_space section: each parameter's distribution."""

from __future__ import annotations

import math
from typing import Any

from hpo.config.values import PARAM_TYPES, ParamType
from trainer.fields import KeyProblem, config_dataclass, field


@config_dataclass()
class ParamSpec:
    type: ParamType = field(help=f"One of {', '.join(PARAM_TYPES)}.")
    low: int | float | None = field(None, "Lower bound (float and int).")
    high: int | float | None = field(None, "Upper bound, included (float and int).")
    log: bool = field(False, "Sample on a log scale (float and int).")
    step: int | float | None = field(None, "Discretisation step (float and int).")
    choices: list[Any] | None = field(None, "The values of a categorical parameter.")
    power_of_two: bool = field(False, "int only: the powers of two from low to high, as choices.")
    scale_with_batch_size: int | None = field(
        None,
        "lr only: the sampled value is the LR for a global batch of this size; the trial uses it "
        "scaled linearly with its own global batch size (batch_size x GPUs).",
        ge=1,
    )

    def __post_init__(self) -> None:
        if self.type == "categorical":
            for key in ("low", "high", "step"):
                if getattr(self, key) is not None:
                    raise KeyProblem(key, "does not apply to a categorical parameter (use choices)")
            if self.log or self.power_of_two:
                raise KeyProblem(
                    "log" if self.log else "power_of_two", "does not apply to a categorical parameter"
                )
            if not self.choices:
                raise KeyProblem("choices", "must be a non-empty list")
            if len(set(map(repr, self.choices))) != len(self.choices):
                raise KeyProblem("choices", f"has duplicates: {self.choices!r}")
            for value in self.choices:
                if not isinstance(value, str | int | float | bool) and value is not None:
                    raise KeyProblem("choices", f"values must be numbers, strings or booleans, got {value!r}")
            # [32, 64, "128"]: a quoted number among numbers reaches the run as a string, and the
            # choices cannot be ordered by value. null may stand beside one kind ("none" of it).
            kinds = {_kind(value) for value in self.choices if value is not None}
            if len(kinds) > 1:
                raise KeyProblem(
                    "choices",
                    f"mixes {' and '.join(sorted(kinds))}: {self.choices!r}; give them all one type",
                )
            return
        if self.choices is not None:
            raise KeyProblem("choices", f"applies to categorical parameters, not {self.type}")
        if self.low is None or self.high is None:
            raise KeyProblem(
                "low" if self.low is None else "high", f"is required for a {self.type} parameter"
            )
        if self.type == "int":
            for key in ("low", "high", "step"):
                value = getattr(self, key)
                if value is not None and value != int(value):
                    raise KeyProblem(key, f"must be an integer for an int parameter, got {value!r}")
        if not self.low < self.high:
            raise KeyProblem("high", f"must be greater than low ({self.low!r}), got {self.high!r}")
        if self.log and self.low <= 0:
            raise KeyProblem("low", f"must be > 0 on a log scale, got {self.low!r}")
        if self.step is not None:
            if not self.step > 0:
                raise KeyProblem("step", f"must be > 0, got {self.step!r}")
            if self.log:
                raise KeyProblem("step", "cannot be combined with log: true (Optuna does not support it)")
            if self.step > self.high - self.low:  # only low could ever be drawn
                raise KeyProblem(
                    "step",
                    f"{self.step!r} is wider than the range [{self.low!r}, {self.high!r}]: only low could be drawn",
                )
        if self.power_of_two:
            if self.type != "int":
                raise KeyProblem("power_of_two", "applies to int parameters only")
            for key in ("low", "high"):
                value = int(getattr(self, key))
                if value < 1 or value & (value - 1):
                    raise KeyProblem(key, f"must be a power of two, got {value}")
            if self.log or self.step is not None:
                raise KeyProblem("power_of_two", "cannot be combined with log or step")

    def rejects(self, value: Any) -> str | None:
        """Why ``value`` is not in this distribution (an enqueued trial must be), or None."""
        choices = (
            self.choices
            if self.type == "categorical"
            else self.powers_of_two()
            if self.power_of_two
            else None
        )
        if choices is not None:
            return None if value in choices else f"{value!r} is not one of the choices {choices!r}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {value!r}"
        if self.type == "int" and value != int(value):
            return f"must be an integer, got {value!r}"
        if not (self.low or 0) <= value <= (self.high or 0):
            return f"{value!r} is outside [{self.low!r}, {self.high!r}]"
        return None

    def values_to_check(self) -> list[Any]:
        """Representative values, each of which must be a valid trainer setting."""
        if self.type == "categorical":
            return list(self.choices or [])
        if self.power_of_two:
            return self.powers_of_two()
        if self.type == "int":
            return [int(self.low or 0), int(self.high or 0)]
        return [float(self.low or 0), float(self.high or 0)]

    def powers_of_two(self) -> list[int]:
        low, high = int(self.low or 1), int(self.high or 1)
        return [2**k for k in range(int(math.log2(low)), int(math.log2(high)) + 1)]


def _kind(value: Any) -> str:
    """What a categorical choice is, as the study file's reader would say it."""
    if isinstance(value, bool):
        return "booleans"
    return "strings" if isinstance(value, str) else "numbers"
