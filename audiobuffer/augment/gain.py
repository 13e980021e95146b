"""Gain (:class:`Gain`): each item scaled by a random number of decibels."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._draws import check_range
from .base import Augmentation

__all__ = ["Gain"]


class Gain(Augmentation):
    """Scale each item by ``10 ** (g / 20)``, ``g`` drawn uniformly from ``db`` decibels.

    Example:
        >>> gain = Gain(db=(-6.0, 6.0), p=0.5)
        >>> decoder = AudioDecoder(sample_rate=16000, augment=[gain])  # doctest: +SKIP

    Args:
        db: a ``(low, high)`` range of decibels, or one number (always that gain); within
            [-100, 100].
        p: the probability of changing an item's gain.
    """

    def __init__(self, db: Any = (-6.0, 6.0), *, p: float = 1.0) -> None:
        super().__init__(p=p)
        self.db = check_range("Gain(db=...)", db, low=-100.0, high=100.0, unit="decibels")

    def __repr__(self) -> str:
        return f"Gain(db={self.db}, p={self.p:g})"

    def transform(
        self, audio: np.ndarray, sample_rate: int, rng: np.random.Generator
    ) -> np.ndarray:
        gain = 10.0 ** (rng.uniform(*self.db) / 20.0)
        return audio * np.float32(gain)
