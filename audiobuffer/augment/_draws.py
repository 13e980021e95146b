"""Where every random draw of an augmentation comes from: a pure function of (seed, epoch, item
index, augmentation position), never of the thread or the order that decodes the item.

NOTE [ Augmentation draws ]
===========================
An augmentation at position ``k`` of ``AudioDecoder(augment=[...])`` draws for the item ``index`` of
epoch ``epoch`` under seed ``seed`` from ``generator(key)``, ``key = (seed, epoch, index, k)``: a
numpy ``Generator`` keyed by a hash of those four numbers and a tag, so that its stream differs
from the random crop's (``WorkItem.rng()``, seeded by the first three). Two items, two epochs, two
positions or two seeds draw independently; the same four numbers draw the same values on any
thread, in any process, after any resume. Ranks hold different items, so they draw differently.

A draw the planner needs before decoding (a speed factor changes an item's duration) comes from
:func:`uniform` instead: a hash of the same four numbers and a stream number, computed for a whole
array of items at once (``stretch`` of a duration batching plans millions of items in one call).
"""

from __future__ import annotations

import functools
import numbers
from typing import Any

import numpy as np

from .._checks import MAX_SEED, short_repr

__all__ = ["Key", "check_key", "check_probability", "check_range", "generator", "uniform",
           "uniform_one"]

#: What an augmentation draws from: (seed, epoch, item index, position in the decoder's list).
Key = tuple[int, int, int, int]

# Told apart from the random crop's stream (WorkItem.rng: [seed, epoch, index]).
_TAG = 0x61756731
# The streams of the two halves of a generator's key (uniform's own streams are small numbers).
_KEY_LOW, _KEY_HIGH = 2**32, 2**32 + 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def generator(key: Key) -> np.random.Generator:
    """The generator an augmentation draws an item's values from (NOTE [ Augmentation draws ]): a
    Philox generator keyed by two hashes of ``key`` (no ``SeedSequence``, which takes longer)."""
    seed, epoch, index, position = key
    keys = [_mix_int((_prefix(seed, epoch, position, stream) + int(_GOLDEN) + index) & _MASK)
            for stream in (_KEY_LOW, _KEY_HIGH)]
    return np.random.Generator(np.random.Philox(key=keys))


_MASK = 2**64 - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on an array of uint64 (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _mix_int(x: int) -> int:
    """:func:`_mix` of one Python int (the same numbers, without numpy's per-call cost)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=1024)  # the same few (seed, epoch, position, stream) for every item
def _prefix(seed: int, epoch: int, position: int, stream: int) -> int:
    h = _TAG
    for part in (seed, epoch, position, stream):
        h = _mix_int((h + int(_GOLDEN) + int(part)) & _MASK)
    return h


def uniform(seed: int, epoch: int, indices: Any, position: int, stream: int) -> np.ndarray:
    """One number in [0, 1) for each item of ``indices`` (float64), a pure function of (``seed``,
    ``epoch``, item index, ``position``, ``stream``): the draws the planner repeats before
    decoding."""
    items = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = _mix(np.uint64(_prefix(seed, epoch, position, stream)) + _GOLDEN + items)
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


def uniform_one(seed: int, epoch: int, index: int, position: int, stream: int) -> float:
    """``uniform(seed, epoch, [index], position, stream)[0]``, for one item, in Python ints."""
    h = _mix_int((_prefix(seed, epoch, position, stream) + int(_GOLDEN) + index) & _MASK)
    return (h >> 11) * 2.0**-53


def check_key(key: Any) -> Key:
    """``key`` as four non-negative ints (``TypeError``/``ValueError`` naming it otherwise)."""
    if (
        not isinstance(key, tuple)
        or len(key) != 4
        or not all(isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in key)
    ):
        raise TypeError(
            f"key must be a tuple (seed, epoch, index, position) of 4 integers, got "
            f"{short_repr(key)}"
        )
    if not all(0 <= k <= MAX_SEED for k in key):
        raise ValueError(f"key must hold integers in [0, 2**63 - 1], got {short_repr(key)}")
    return (int(key[0]), int(key[1]), int(key[2]), int(key[3]))


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_probability(name: str, value: Any) -> float:
    """``value`` as a probability in [0, 1]."""
    if not _number(value):
        raise TypeError(
            f"{name} must be a probability (a number in [0, 1]), got {short_repr(value)}"
        )
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {short_repr(value)}")
    return float(value)


def check_range(
    name: str, value: Any, *, low: float, high: float, unit: str
) -> tuple[float, float]:
    """``value``, a number or a ``(low, high)`` pair of finite numbers in [``low``, ``high``], as
    a pair with its first item at most its second (a single number ``x`` is ``(x, x)``)."""
    pair = (value, value) if _number(value) else value
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(_number(v) for v in pair):
        raise TypeError(
            f"{name} must be a number or a (low, high) pair of numbers of {unit}, got "
            f"{short_repr(value)}"
        )
    a, b = float(pair[0]), float(pair[1])
    if not (np.isfinite(a) and np.isfinite(b) and low <= a <= b <= high):
        raise ValueError(
            f"{name} must be finite {unit} with low <= high, within [{low:g}, {high:g}], "
            f"got {short_repr(value)}"
        )
    return a, b
