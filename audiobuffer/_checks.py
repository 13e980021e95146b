"""Argument checks shared by the constructors: one helper per kind of value, one message shape."""

from __future__ import annotations

import math
from typing import Any, Optional

__all__ = ["check_int", "check_seconds"]


def check_int(name: str, value: Any, minimum: Optional[int]) -> None:
    """Raise unless ``value`` is an ``int`` (not a ``bool``) of at least ``minimum``.

    Raises:
        TypeError: not an integer.
        ValueError: below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer{f' >= {minimum}' if minimum is not None else ''}, "
                        f"got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_seconds(name: str, value: Any) -> None:
    """Raise unless ``value`` is ``None`` or a number of seconds > 0.

    ``float("inf")`` and large values are accepted: they mean "no limit", and the waits built on
    them never pass more than ``threading.TIMEOUT_MAX`` to the system.

    Raises:
        TypeError: not a number.
        ValueError: zero, negative or NaN.
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be None or a number of seconds > 0, got {value!r}")
    if math.isnan(value) or not value > 0:
        raise ValueError(f"{name} must be None or a number of seconds > 0 (float('inf'): no limit), "
                         f"got {value!r}")
