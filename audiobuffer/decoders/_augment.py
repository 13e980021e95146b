"""How a decoder runs its augmentations: :func:`check_augmentations`, :func:`apply` and
:func:`stretch` (the built-in augmentations are in :mod:`audiobuffer.augment`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import short_repr
from ..sources.item import ReadClock

__all__ = ["Clock", "apply", "check_augmentations", "stretch"]

# NOTE [ Augmentations ]
# ======================
# An augmentation is a callable ``aug(audio, sample_rate, key) -> audio``: ``audio`` a C-contiguous
# float32 array ``(channels, frames)`` of real audio (a decoder's crop, before its padding), ``key``
# the ``(seed, epoch, index, position)`` its draws come from (NOTE [ Augmentation draws ] in
# ``augment/_draws.py``). It returns a float32 ``(channels, frames')`` array, a new one or ``audio``
# itself untouched; it never writes into ``audio``. It runs in a producer thread, so its heavy work
# is numpy or soxr, which release the GIL, and it holds no state that a call changes (a cache behind
# a lock at most). Its time is counted in ``AudioDecoder.augment_clock`` (``augment_s`` in stats).
#
# An augmentation that changes the number of frames says so before decoding with ``stretch(seed,
# epoch, indices, position) -> factors``: each item's output duration over its input duration, for
# an array of items, the same numbers its call will use. The planner of batches by duration
# multiplies each item's duration by the product of its decoder's factors
# (``AudioDecoder.stretch``), so that ``max_batch_seconds`` holds on the durations the batches will
# have. Without ``stretch`` an augmentation keeps the length.


def check_augmentations(augment: Any) -> tuple[Any, ...]:
    """``augment`` (``None`` or a sequence of augmentations) as a tuple; a ``TypeError`` names
    a wrong entry."""
    if augment is None:
        return ()
    if isinstance(augment, (str, bytes)) or not isinstance(augment, Sequence):
        raise TypeError(
            f"augment must be a list of augmentations (audiobuffer.augment) or None, got "
            f"{short_repr(augment)}"
        )
    for position, aug in enumerate(augment):
        if not callable(aug):
            raise TypeError(
                f"augment[{position}] must be an augmentation: a callable (audio, sample_rate, "
                f"key) -> audio such as audiobuffer.augment.Gain(), got {short_repr(aug)}"
            )
        hook = getattr(aug, "stretch", None)
        if hook is not None and not callable(hook):
            raise TypeError(
                f"augment[{position}].stretch must be a method (seed, epoch, indices, position) -> "
                f"factors, got {short_repr(hook)}"
            )
    return tuple(augment)


def apply(
    augment: Sequence[Any],
    audio: np.ndarray,
    sample_rate: int,
    *,
    seed: int,
    epoch: int,
    index: int,
) -> np.ndarray:
    """``audio`` (float32 ``(channels, frames)``) through each of ``augment`` in turn.

    Raises:
        TypeError: an augmentation returned something other than a float32 array of as many
        channels.
    """
    for position, aug in enumerate(augment):
        out = aug(audio, sample_rate, (seed, epoch, index, position))
        if not isinstance(out, np.ndarray) or out.ndim != 2 or out.shape[0] != audio.shape[0]:
            raise TypeError(
                f"augment[{position}] ({aug!r}) must return a (channels, frames) array of "
                f"{audio.shape[0]} channels, got {short_repr(out)}"
            )
        audio = np.ascontiguousarray(out, dtype=np.float32)
    return audio


def stretch(
    augment: Sequence[Any], seed: int, epoch: int, indices: np.ndarray
) -> np.ndarray | None:
    """Each item's output duration over its input duration through ``augment`` (float64), or
    ``None`` where no augmentation changes durations (NOTE [ Augmentations ])."""
    factors: np.ndarray | None = None
    for position, aug in enumerate(augment):
        hook = getattr(aug, "stretch", None)
        if hook is None:
            continue
        found = np.asarray(hook(seed, epoch, indices, position), dtype=np.float64)
        factors = found if factors is None else factors * found
    return factors


class Clock(ReadClock):
    """Seconds spent augmenting, summed over threads (thread-safe; a pickled copy starts at 0)."""

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
