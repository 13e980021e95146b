"""Argument checks with one message shape, used by every constructor and by the YAML config.

One small function per kind of value, as python-soundfile's ``_check_mode``/``_check_format``: a wrong
type raises ``TypeError``, a wrong value ``ValueError``, and the message names the option, the value
(cut short) and what is allowed: ``num_producers must be an integer >= 1 or 'auto', got 'eight'``.
Choices come from the ``Literal`` type that annotates the option (``typing.get_args``), so the type,
the check and the message cannot disagree.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any, Literal, get_args

__all__ = ["MAX_SECONDS", "MAX_SEED", "batch_key", "check_budgets", "check_choice", "check_decoder",
           "check_int", "check_seconds", "choices", "short_repr"]

#: The longest wait or duration accepted, in seconds (a day): ``threading`` waits overflow past
#: ``threading.TIMEOUT_MAX``, and no sensible timeout or crop is longer.
MAX_SECONDS = 86400.0
#: The largest seed: numpy's ``default_rng`` and ``SeedSequence`` take non-negative integers, and
#: ``seed + epoch`` must stay one.
MAX_SEED = 2**63 - 1

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 4
_repr.maxlevel = 2


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to a short prefix, without ever building the whole of a huge one."""
    return _repr.repr(value)


def choices(literal: Any) -> tuple[Any, ...]:
    """The values a ``Literal[...]`` type allows (``Optional[Literal[...]]`` included)."""
    found: list[Any] = []
    for arg in get_args(literal):
        if arg is type(None):
            found.append(None)
        elif get_args(arg) and getattr(arg, "__origin__", None) is Literal:
            found.extend(get_args(arg))
        else:
            found.append(arg)
    return tuple(found)


def check_choice(name: str, value: Any, literal: Any) -> Any:
    """``value`` if it is one of ``literal``'s values, else ``ValueError`` listing them."""
    allowed = choices(literal)
    if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
        listed = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {listed}, got {short_repr(value)}")
    return value


def check_decoder(decoder: Any) -> None:
    """Refuse a decoder that is not callable, or that is a class (``AudioDecoder`` for ``AudioDecoder()``)."""
    if isinstance(decoder, type):
        raise TypeError(f"decoder must be a callable (WorkItem -> sample), got the class {decoder.__qualname__}: "
                        f"pass an instance, {decoder.__qualname__}(...)")
    if not callable(decoder):
        raise TypeError(f"decoder must be callable (WorkItem -> sample), got {decoder!r}")


def batch_key(decoder: Any, key: Any) -> str:
    """The sample key a loader that batches samples itself pads into each batch (``pad_collate``'s
    ``key``): ``key``, else the decoder's ``sample_key`` (``"image"`` for ``ImageDecoder``), else
    ``"audio"``."""
    if key is None:
        key = getattr(decoder, "sample_key", None)
        key = key if isinstance(key, str) else "audio"
    if not isinstance(key, str):
        raise TypeError(f"key must be a string or None, got {key!r}")
    return key


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None, *,
              also: str = "") -> int:
    """``value`` if it is an ``int`` (not a ``bool``) in [``minimum``, ``maximum``].

    Args:
        also: what else the option takes, for the message (``"or 'auto'"``, ``"or None"``).
    """
    bounds = _bounds(minimum, maximum)
    wanted = f"{name} must be an integer{bounds}{' ' + also if also else ''}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{wanted}, got {short_repr(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{wanted}, got {short_repr(value)}")
    return value


def check_seconds(name: str, value: Any, *, maximum: float | None = None) -> float | None:
    """``value`` if it is ``None`` or a number of seconds > 0 (and at most ``maximum``, if given).

    Without ``maximum``, ``float("inf")`` and large values are accepted: they mean "no limit", and the
    waits built on them never pass more than ``threading.TIMEOUT_MAX`` to the system.

    Raises:
        TypeError: not a number.
        ValueError: zero, negative, NaN, or over ``maximum``.
    """
    if value is None:
        return None
    limit = "" if maximum is None else f" and <= {maximum:g}"
    wanted = f"{name} must be None or a number of seconds > 0{limit}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{wanted}, got {short_repr(value)}")
    if math.isnan(value) or not value > 0 or (maximum is not None and value > maximum):
        hint = " (float('inf'): no limit)" if maximum is None else ""
        raise ValueError(f"{wanted}{hint}, got {short_repr(value)}")
    return float(value)


def check_budgets(name: str, value: Any, *, maximum: float | None = None) -> int | None:
    """``value`` if it is a batch budget: a number of seconds > 0 (at most ``maximum``), one per
    bucket (a non-empty list of such numbers), or a non-empty mapping from each bucket's upper edge
    (seconds > 0, increasing) to its budget. Returns the number of buckets it fixes (``None``: one
    budget for every bucket).

    Raises:
        TypeError: not a number, list or mapping, or one of them holds something else.
        ValueError: a budget or edge that is zero, negative, NaN or too large; an empty list or
            mapping; edges out of order.
    """
    if isinstance(value, Mapping):
        if not value:
            raise ValueError(f"{name} must map each bucket's upper edge (seconds) to its budget, "
                             f"got {{}}")
        edges = list(value)
        for edge in edges:
            _one_seconds(f"{name}'s bucket edge", edge, maximum)
            _one_seconds(f"{name}[{edge!r}]", value[edge], maximum)
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"{name}'s bucket edges must increase, got {short_repr(edges)}: list "
                             f"the "
                             f"buckets from the shortest to the longest")
        return len(edges)
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name} must give one budget per bucket, got an empty list")
        for i, seconds in enumerate(value):
            _one_seconds(f"{name}[{i}]", seconds, maximum)
        return len(value)
    check_seconds(name, value, maximum=maximum)
    return None


def _one_seconds(name: str, value: Any, maximum: float | None) -> None:
    limit = "" if maximum is None else f" and <= {maximum:g}"
    wanted = f"{name} must be a number of seconds > 0{limit}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{wanted}, got {short_repr(value)}")
    if math.isnan(value) or not value > 0 or (maximum is not None and value > maximum):
        raise ValueError(f"{wanted}, got {short_repr(value)}")


def _bounds(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""
