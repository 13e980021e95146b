"""The validation vocabulary: one message shape, TypeError for types, ValueError for values."""

from __future__ import annotations

import math
from typing import Literal

import pytest

from audiobuffer._checks import (
    MAX_SECONDS,
    check_choice,
    check_int,
    check_seconds,
    choices,
    short_repr,
)

Mode = Literal["a", "b"]


def test_choices_come_from_the_literal():
    assert choices(Mode) == ("a", "b")
    assert choices(Literal["pad", "drop"] | None) == ("pad", "drop", None)
    assert check_choice("mode", "a", Mode) == "a"
    with pytest.raises(ValueError, match=r"^mode must be one of 'a', 'b', got 'c'$"):
        check_choice("mode", "c", Mode)
    with pytest.raises(ValueError, match="got True"):
        check_choice("flag", True, Literal[1, 2])  # True == 1, but it is not the choice 1


def test_check_int():
    assert check_int("n", 3, 1) == 3
    with pytest.raises(TypeError, match=r"^n must be an integer >= 1 or 'auto', got 'eight'$"):
        check_int("n", "eight", 1, also="or 'auto'")
    with pytest.raises(TypeError, match="got True"):
        check_int("n", True, 0)
    with pytest.raises(ValueError, match=r"^seed must be an integer in \[0, 5\], got -1$"):
        check_int("seed", -1, 0, 5)


@pytest.mark.parametrize("value", [0, -1.0, math.nan])
def test_check_seconds_refuses(value):
    with pytest.raises(ValueError, match=r"timeout must be None or a number of seconds > 0 \(float\('inf'\): no"):
        check_seconds("timeout", value)


def test_check_seconds_bounded():
    assert check_seconds("crop", MAX_SECONDS, maximum=MAX_SECONDS) == MAX_SECONDS
    with pytest.raises(ValueError, match="crop must be None or a number of seconds > 0 and <= 86400, got inf"):
        check_seconds("crop", math.inf, maximum=MAX_SECONDS)


def test_check_seconds_types_and_no_limit():
    assert check_seconds("t", 2) == 2.0
    assert check_seconds("t", None) is None
    assert check_seconds("t", math.inf) == math.inf  # no limit
    with pytest.raises(TypeError, match=r"^t must be .*, got '2'$"):
        check_seconds("t", "2")


def test_a_huge_value_makes_a_short_message():
    bomb: list = [0]
    for _ in range(30):
        bomb = [bomb] * 9  # 9**30 leaves, shared: repr() of it would never end
    text = short_repr(bomb)
    assert len(text) < 200
    with pytest.raises(TypeError, match="^batch_size must be ") as info:
        check_int("batch_size", bomb, 1)
    assert len(str(info.value)) < 250
