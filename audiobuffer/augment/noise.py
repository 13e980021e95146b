"""Additive noise (:class:`AddNoise`): a random stretch of a random recording of a noise corpus,
mixed in at a random signal-to-noise ratio."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._clips import Clips
from ._draws import check_range
from .base import Augmentation

__all__ = ["AddNoise", "loop_to"]


def loop_to(clip: np.ndarray, frames: int, start: int) -> np.ndarray:
    """``frames`` frames of ``clip`` from ``start``, wrapping round to its start as often as
    needed."""
    if frames <= len(clip) - start:
        return clip[start : start + frames]
    return np.resize(np.roll(clip, -start), frames)  # np.resize repeats the array to fill


class AddNoise(Augmentation):
    """Mix each item with noise at an SNR drawn uniformly from ``snr_db``.

    The noise is a random item of ``source`` (any source audiobuffer reads: a folder, a file list, a
    manifest, an ``index.json`` of shards, local or remote), decoded to mono at the item's rate,
    from a random start, looped where it is shorter than the item. It is scaled so that the item's
    power over the noise's power, both over the item's frames, is the drawn SNR, and added to every
    channel. A silent item, or a silent stretch of noise, is left as it is (no SNR is defined).

    The source is listed on first use in the process that decodes (a pickled ``AddNoise`` carries
    only its description), and the last few noise clips decoded are kept in memory.

    Example:
        >>> noise = AddNoise("noise/", snr_db=(10.0, 20.0), p=0.5)  # doctest: +SKIP
        >>> decoder = AudioDecoder(sample_rate=16000, augment=[noise])  # doctest: +SKIP

    Args:
        source: the noise recordings.
        snr_db: a ``(low, high)`` range of signal-to-noise ratios in decibels, or one number.
        p: the probability of adding noise to an item.
        storage_options: fsspec options for a remote ``source``.
    """

    def __init__(
        self,
        source: Any,
        snr_db: Any = (10.0, 20.0),
        *,
        p: float = 1.0,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(p=p)
        self.snr_db = check_range(
            "AddNoise(snr_db=...)", snr_db, low=-100.0, high=200.0, unit="decibels"
        )
        self.clips = Clips("AddNoise(source=...)", source, storage_options=storage_options)

    def __repr__(self) -> str:
        return f"AddNoise({self.clips!r}, snr_db={self.snr_db}, p={self.p:g})"

    def transform(
        self, audio: np.ndarray, sample_rate: int, rng: np.random.Generator
    ) -> np.ndarray:
        snr = rng.uniform(*self.snr_db)
        which = int(rng.integers(len(self.clips)))
        u = rng.random()  # the start, drawn whatever the clip's length
        frames = audio.shape[1]
        clip = self.clips.clip(which, sample_rate)
        if frames == 0 or len(clip) == 0:
            return audio
        noise = loop_to(clip, frames, int(u * len(clip)))
        # float32 means (pairwise sums: within about 1e-6 of float64's, far inside 0.01 dB)
        signal_power = float(np.mean(np.square(audio)))
        noise_power = float(np.mean(np.square(noise)))
        if signal_power == 0.0 or noise_power == 0.0:
            return audio
        scale = np.sqrt(signal_power / (noise_power * 10.0 ** (snr / 10.0)))
        return audio + (noise * np.float32(scale))[None, :]
