"""A metric line's number is read whole whatever the value group: an exponent it stops short of,
a sign, and nan or inf where the group matches digits only (a run that diverged)."""

from __future__ import annotations

import math
import re

import pytest

from hpo.trial.metric_lines import (
    SUGGESTED_VALUE_GROUP,
    WHOLE_NUMBER,
    MetricPattern,
    not_a_number,
    widen_value_group,
)

pytestmark = pytest.mark.fast

NARROW = r"val_loss (?P<value>[0-9.]+)"


@pytest.mark.parametrize(
    ("line", "value", "noted"),
    [
        ("epoch 3 val_loss 0.0100", "0.0100", False),
        ("epoch 3 val_loss 1.50e-05", "1.50e-05", True),  # not 1.5
        ("epoch 3 val_loss 2E+3, lr 0.1", "2E+3", True),
        ("epoch 3 val_loss 0.91, lr 0.1", "0.91", False),  # the comma is not the number's
        ("epoch 3 val_loss nan", "nan", True),  # missed by the group: the divergence counts
        ("epoch 3 val_loss inf", "inf", True),
        ("epoch 3 val_loss -inf", "-inf", True),
        ("epoch 3 val_loss NaN", "NaN", True),
    ],
)
def test_a_narrow_value_group_reads_the_whole_number(line: str, value: str, noted: bool) -> None:
    reading = MetricPattern(NARROW, "objective.metric_pattern").read(line)
    assert reading is not None and reading.value == value
    assert (reading.note is not None) == noted
    if noted:
        assert reading.note is not None and reading.note.startswith("objective.metric_pattern's value group")


def test_a_finite_number_the_pattern_leaves_out_stays_out() -> None:
    # A pattern for positive values only: -0.5 is not read behind its back.
    assert MetricPattern(NARROW, "objective.metric_pattern").read("epoch 3 val_loss -0.5") is None
    assert MetricPattern(NARROW, "objective.metric_pattern").read("epoch 3 train_loss 0.5") is None


def test_the_other_groups_still_come_from_the_users_pattern() -> None:
    pattern = MetricPattern(r"^epoch (?P<step>\d+)/\d+ .*val_acc (?P<value>[0-9.]+) top5 (?P<top5>\S+)", "k")
    reading = pattern.read("epoch 2/3 loss 0.3 val_acc nan top5 0.9")
    assert reading is not None and reading.value == "nan"
    assert reading.match.group("step") == "2" and reading.match.group("top5") == "0.9"


@pytest.mark.parametrize(
    "pattern",
    [
        r"acc (?P<value>[0-9.]+)",
        r"acc (?P<value>(\d+)\.(\d+))%",  # nested groups
        r"acc (?P<value>[)(\]0-9.]+) end",  # brackets and an escaped ] inside a class
        r"acc (?P<value>[]0-9.]+) end",  # a ] first in a class is literal
        r"acc\) (?P<value>\d+\.\d+)",  # an escaped parenthesis before the group
    ],
)
def test_the_value_group_is_found_whatever_it_holds(pattern: str) -> None:
    widened = widen_value_group(pattern)
    assert widened is not None and f"(?P<value>{WHOLE_NUMBER})" in widened
    re.compile(widened)
    tail = pattern[pattern.index("(?P<value>") :]
    assert widened.endswith(tail[len(tail) - len(tail.split(")")[-1]) :])  # what follows is kept


def test_a_pattern_without_a_value_group_is_left_as_it_is() -> None:
    assert widen_value_group(r"val (\d+)") is None


def test_the_suggested_group_reads_what_a_program_prints() -> None:
    pattern = MetricPattern(f"val {SUGGESTED_VALUE_GROUP}", "k")
    for printed in ["0.5", "1.5e-05", "-2.0", "nan", "inf", "-inf"]:
        reading = pattern.read(f"val {printed}")
        assert reading is not None and reading.note is None, printed
        assert float(reading.value) == float(printed) or math.isnan(float(printed))


def test_a_pattern_whose_widened_form_cannot_compile_is_used_as_given() -> None:
    # (\d) inside the value group is group 2; widened, the \2 after it would name no group.
    pattern = MetricPattern(r"acc (?P<value>(\d)\.\d+) again \2", "k")
    assert pattern.widened is None
    reading = pattern.read("acc 5.25 again 5")
    assert reading is not None and reading.value == "5.25"


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("1.5e-05,", "the number in it is '1.5e-05': leave ',' outside the value group"),
        ("tensor(0.0123)", "the number in it is '0.0123': leave 'tensor(' and ')' outside the value group"),
        ("loss=-2", "the number in it is '-2': leave 'loss=' outside the value group"),
        ("-", "it holds no number: make the pattern match only the lines that print one"),
        ("n/a", "it holds no number: make the pattern match only the lines that print one"),
    ],
)
def test_a_value_group_that_is_not_a_number_is_named_with_its_fix(text: str, fix: str) -> None:
    [reading] = [MetricPattern(r"val (?P<value>\S+)", "k").read(f"val {text}")]
    assert reading is not None and reading.value == text  # read as printed: not a number
    assert (
        not_a_number("k", text)
        == f"k matched, but its value group read {text!r}, which is not a number; {fix}"
    )
