"""Reverberation (:class:`Reverb`): each item convolved with a room impulse response."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

try:  # scipy's FFT keeps float32 in float32 and caches its plans: 2-3x numpy's on these lengths
    from scipy import fft as _fft
except ImportError:  # numpy's (the same transform, slower)
    from numpy import fft as _fft  # type: ignore[no-redef]

from ._clips import Clips
from .base import Augmentation

__all__ = ["Reverb", "convolve"]


def _fast_length(n: int) -> int:
    """The smallest 5-smooth number (2**a 3**b 5**c) >= ``n``: a length numpy's FFT is fast at."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            length = p35
            while length < n:
                length *= 2
            best = min(best, length)
            p35 *= 3
        p5 *= 5
    return best


def convolve(audio: np.ndarray, response: np.ndarray) -> np.ndarray:
    """The full linear convolution of each channel of ``audio`` (``(channels, frames)``) with
    ``response`` (``(taps,)``) by FFT, in float32 for float32 ``audio``: ``frames + taps - 1``
    frames.

    The FFT is scipy's where scipy is installed, else numpy's: the two round differently in the
    last bits, so the same installation gives the same output, not any two.
    """
    full = audio.shape[1] + len(response) - 1
    size = _fast_length(full)
    spectrum = _fft.rfft(audio, size, axis=1)
    spectrum *= _fft.rfft(response.astype(audio.dtype, copy=False), size)[None, :]
    return _fft.irfft(spectrum, size, axis=1)[:, :full]


class Reverb(Augmentation):
    """Convolve each item with a room impulse response (RIR) drawn from ``source``.

    The RIR is a random item of ``source`` (any source audiobuffer reads), decoded to mono at the
    item's rate. The output is the FFT convolution of the item and the RIR, trimmed to the item's
    length (the reverberant tail past its end is cut, as Lhotse's ``reverb_rir`` does, so durations
    do not change) and, with ``normalize``, scaled to the item's energy (its sum of squares), so
    that a loud RIR does not clip and a quiet one does not fade the item. A silent RIR leaves the
    item as it is.

    Example:
        >>> reverb = Reverb("rirs/", p=0.3)  # doctest: +SKIP
        >>> decoder = AudioDecoder(sample_rate=16000, augment=[reverb])  # doctest: +SKIP

    Args:
        source: the impulse responses.
        p: the probability of reverberating an item.
        normalize: scale the output to the input's energy (``False``: the convolution as it is).
        storage_options: fsspec options for a remote ``source``.
    """

    def __init__(
        self,
        source: Any,
        *,
        p: float = 1.0,
        normalize: bool = True,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(p=p)
        if not isinstance(normalize, bool):
            raise TypeError(f"Reverb(normalize=...) must be True or False, got {normalize!r}")
        self.normalize = normalize
        self.clips = Clips("Reverb(source=...)", source, storage_options=storage_options)

    def __repr__(self) -> str:
        return f"Reverb({self.clips!r}, p={self.p:g}, normalize={self.normalize})"

    def transform(
        self, audio: np.ndarray, sample_rate: int, rng: np.random.Generator
    ) -> np.ndarray:
        which = int(rng.integers(len(self.clips)))
        response = self.clips.clip(which, sample_rate)
        frames = audio.shape[1]
        if frames == 0 or len(response) == 0 or not np.any(response):
            return audio
        out = convolve(audio, response)[:, :frames]
        if self.normalize:  # float32 sums (pairwise, so within about 1e-6 of float64's)
            energy = float(np.sum(np.square(out)))
            if energy > 0.0:
                out *= np.float32(np.sqrt(float(np.sum(np.square(audio))) / energy))
        return np.ascontiguousarray(out, dtype=np.float32)
