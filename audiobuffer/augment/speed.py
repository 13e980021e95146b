"""Speed perturbation (:class:`SpeedPerturb`): audio played ``f`` times as fast, so ``1/f`` as long
with its pitch moved by ``f``, as Kaldi's and Lhotse's speed perturbation."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import soxr

from .._checks import short_repr
from ._draws import Key, check_probability, uniform, uniform_one

__all__ = ["SpeedPerturb"]

#: The slowest and fastest factors accepted: a quarter and four times the speed.
FACTOR_RANGE = (0.25, 4.0)
# The streams of uniform() a SpeedPerturb draws from: whether to apply it, and which factor.
_APPLY, _CHOICE = 0, 1


class SpeedPerturb:
    """Resample each item so that it plays ``f`` times as fast: ``n`` frames become ``round(n / f)``
    and every frequency is multiplied by ``f``; ``f`` is drawn from ``factors`` with equal chances.

    The factor is a pure function of (seed, epoch, item index, position) that the planner of batches
    by duration computes before decoding (:meth:`stretch`), so ``max_batch_seconds`` holds on the
    perturbed durations (NOTE [ Augmentations ] in ``decoders/_augment.py``). Resampling is soxr's
    (GIL released).

    Example:
        >>> speed = SpeedPerturb((0.9, 1.0, 1.1))
        >>> decoder = AudioDecoder(sample_rate=16000, augment=[speed])  # doctest: +SKIP

    Args:
        factors: the speeds to draw from (each in [0.25, 4]; 1.0 leaves an item as it is).
        p: the probability of perturbing an item at all (else it keeps speed 1).
        quality: soxr's quality, ``"QQ"``, ``"LQ"``, ``"MQ"``, ``"HQ"`` or ``"VHQ"``.
    """

    def __init__(
        self, factors: Sequence[float] = (0.9, 1.0, 1.1), *, p: float = 1.0, quality: str = "HQ"
    ) -> None:
        if (
            isinstance(factors, (str, bytes))
            or not isinstance(factors, Sequence)
            or not factors
            or not all(isinstance(f, numbers.Real) and not isinstance(f, bool) for f in factors)
        ):
            raise TypeError(
                f"SpeedPerturb(factors=...) must be a non-empty list of numbers, got "
                f"{short_repr(factors)}"
            )
        low, high = FACTOR_RANGE
        if not all(low <= float(f) <= high for f in factors):
            raise ValueError(
                f"SpeedPerturb(factors=...) must hold speeds in [{low:g}, {high:g}], got "
                f"{short_repr(factors)}"
            )
        if quality not in ("QQ", "LQ", "MQ", "HQ", "VHQ"):
            raise ValueError(
                f"SpeedPerturb(quality=...) must be one of 'QQ', 'LQ', 'MQ', 'HQ', 'VHQ', got "
                f"{short_repr(quality)}"
            )
        self.factors = tuple(float(f) for f in factors)
        self.p = check_probability("SpeedPerturb(p=...)", p)
        self.quality = quality

    def __repr__(self) -> str:
        return f"SpeedPerturb(factors={self.factors}, p={self.p:g})"

    def factor(self, seed: int, epoch: int, indices: Any, position: int) -> np.ndarray:
        """The speed of each item of ``indices`` (1.0 where it is not perturbed)."""
        choice = uniform(seed, epoch, indices, position, _CHOICE) * len(self.factors)
        last = len(self.factors) - 1
        chosen = np.asarray(self.factors)[np.minimum(choice.astype(np.int64), last)]
        applied = uniform(seed, epoch, indices, position, _APPLY) < self.p
        return np.where(applied, chosen, 1.0)

    def factor_of(self, key: Key) -> float:
        """The speed of one item: ``factor(seed, epoch, [index], position)[0]``, without arrays."""
        seed, epoch, index, position = key
        if not uniform_one(seed, epoch, index, position, _APPLY) < self.p:
            return 1.0
        choice = int(uniform_one(seed, epoch, index, position, _CHOICE) * len(self.factors))
        return self.factors[min(choice, len(self.factors) - 1)]

    def stretch(self, seed: int, epoch: int, indices: Any, position: int) -> np.ndarray:
        """Each item's output duration over its input duration: ``1 / factor``."""
        return 1.0 / self.factor(seed, epoch, indices, position)

    def __call__(self, audio: np.ndarray, sample_rate: int, key: Key) -> np.ndarray:
        f = self.factor_of(key)
        if f == 1.0 or audio.shape[1] == 0:
            return audio
        out = soxr.resample(
            np.ascontiguousarray(audio.T), sample_rate, sample_rate / f, quality=self.quality
        )
        return np.ascontiguousarray(out.reshape(-1, audio.shape[0]).T)
