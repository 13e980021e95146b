"""Augmentations a decoder runs on each item in its producer thread, every draw seeded by (seed,
epoch, item index, position): ``AudioDecoder(augment=[SpeedPerturb(), AddNoise("noise/")])``.

Each is a callable ``(audio, sample_rate, key) -> audio`` (NOTE [ Augmentations ] in
``decoders/_augment.py``); batch-level masks are :class:`audiobuffer.features.SpecAugment`.
"""

from __future__ import annotations

from .base import Augmentation
from .gain import Gain
from .noise import AddNoise
from .reverb import Reverb
from .speed import SpeedPerturb

__all__ = ["AddNoise", "Augmentation", "Gain", "Reverb", "SpeedPerturb"]
