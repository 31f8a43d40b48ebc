"""Reading a metric from a line of the user's output: ``objective.metric_pattern`` (or
``final_pattern``), with its number read whole.

A value group narrower than the numbers a run prints is a trap that hides results: with
``(?P<value>[0-9.]+)`` the line ``val_loss 1.50e-05`` reads as 1.5, and ``val_acc nan`` does not
match at all, so a run that diverged ends with its last good value and can become the best. Here
the number at the value group's start is read to its end (exponent included), and a line the
pattern misses only because its value is nan or inf still reports it (a divergence). Each such
rescue says so once in the trial's log, naming the pattern.
"""

from __future__ import annotations

import dataclasses
import math
import re

WHOLE_NUMBER = r"[-+]?(?:(?i:nan|inf(?:inity)?)|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
"""A number as a program prints it: sign, decimals, exponent, nan and inf (Python's float() reads
every one of them)."""

_WHOLE = re.compile(WHOLE_NUMBER)
_NON_FINITE = re.compile(r"(?i:nan|inf)")

SUGGESTED_VALUE_GROUP = r"(?P<value>[-+.\w]+)"
"""A value group that reads what a program prints, as the shipped examples write it."""


@dataclasses.dataclass(frozen=True)
class Reading:
    match: re.Match[str]
    """The pattern's match (its other groups: step, metrics)."""
    value: str
    """The value group's text, read whole."""
    note: str | None = None
    """What was read beyond the value group, for a warning; None when it read the number whole."""


class MetricPattern:
    def __init__(self, pattern: str, key: str) -> None:
        self.key = key
        self.pattern = re.compile(pattern)
        self.widened = _compiled(widen_value_group(pattern))

    def read(self, line: str) -> Reading | None:
        found = self.pattern.search(line)
        if found is not None:
            text = found.group("value") or ""
            if found.start("value") < 0:  # an optional value group left out
                return Reading(found, text)
            whole = _WHOLE.match(line, found.start("value"))
            if whole is not None and whole.end() > found.end("value") and text:
                return Reading(
                    found,
                    whole.group(),
                    f"{self.key}'s value group read {text!r} of {whole.group()!r}: the whole number counts",
                )
            return Reading(found, text)
        # Most lines match nothing: only one that prints nan or inf is searched again.
        if (
            self.widened is None
            or not _NON_FINITE.search(line)
            or (found := self.widened.search(line)) is None
        ):
            return None
        value = found.group("value")
        if math.isfinite(float(value)):
            return None  # a number the pattern leaves out on purpose, as far as anyone can tell
        return Reading(
            found,
            value,
            f"{self.key}'s value group does not match {value!r}; it counts (the run diverged)",
        )

    def count(self, line: str) -> int:
        return len(self.pattern.findall(line))


def not_a_number(key: str, text: str) -> str:
    """What a matched line whose value group read ``text``, not a number, is told: the text, and
    how to make the group read the number alone (``1.5e-05,``, ``tensor(0.0123)``, a lone ``-``)."""
    number = _WHOLE.search(text)
    if number is None:
        fix = "it holds no number: make the pattern match only the lines that print one"
    else:
        outside = " and ".join(repr(part) for part in (text[: number.start()], text[number.end() :]) if part)
        fix = f"the number in it is {number.group()!r}: leave {outside} outside the value group"
    return f"{key} matched, but its value group read {text!r}, which is not a number; {fix}"


def widen_value_group(pattern: str) -> str | None:
    """``pattern`` with its ``(?P<value>...)`` group matching :data:`WHOLE_NUMBER` instead; None
    without such a group (or one whose end cannot be found: the pattern is then used as given)."""
    opening = "(?P<value>"
    start = pattern.find(opening)
    if start < 0:
        return None
    depth, i, in_class = 1, start + len(opening), False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":  # a ] first in a class is literal
                i += 1
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return f"{pattern[:start]}{opening}{WHOLE_NUMBER}){pattern[i + 1 :]}"
        i += 1
    return None


def _compiled(pattern: str | None) -> re.Pattern[str] | None:
    """None where the widened pattern does not compile (a numbered backreference past groups the
    value group held): the user's pattern alone is then used."""
    try:
        return re.compile(pattern) if pattern is not None else None
    except re.error:
        return None
