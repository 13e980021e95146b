"""What the built-in augmentations share (:class:`Augmentation`); the protocol every augmentation
follows is NOTE [ Augmentations ] in ``decoders/_augment.py``."""

from __future__ import annotations

import numpy as np

from ._draws import Key, check_probability, generator

__all__ = ["Augmentation"]


class Augmentation:
    """What the built-in augmentations share: the probability ``p`` of applying one to an item.

    Subclasses implement :meth:`transform`; :meth:`__call__` draws whether to apply it (the first
    draw of the item's generator) and calls it with the same generator.
    """

    def __init__(self, *, p: float = 1.0) -> None:
        self.p = check_probability(f"{type(self).__name__}(p=...)", p)

    def __call__(self, audio: np.ndarray, sample_rate: int, key: Key) -> np.ndarray:
        rng = generator(key)
        if not rng.random() < self.p:
            return audio
        return self.transform(audio, sample_rate, rng)

    def transform(
        self, audio: np.ndarray, sample_rate: int, rng: np.random.Generator
    ) -> np.ndarray:
        """``audio`` augmented, drawing from ``rng``."""
        raise NotImplementedError
