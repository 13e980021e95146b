"""Reverberation (:class:`Reverb`): each item convolved with a room impulse response."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

try:  # scipy's FFT keeps float32 in float32 and caches its plans: 2-3x numpy's on these lengths
    from scipy import fft as _fft
except ImportError:  # numpy's (the same transform, slower)
    from numpy import fft as _fft

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


def _grid_length(n: int) -> int:
    """The smallest ``m * 2**k >= n`` with ``m`` in 8, 9, 10, 12, 15 (5-smooth, fast FFT lengths):
    five lengths an octave, so that items of near lengths share an impulse response's spectrum
    (at most a quarter longer than ``n``, a tenth on average)."""
    if n <= 16:
        return _fast_length(n)
    k = (n - 1).bit_length() - 4  # 8 * 2**k < n <= 16 * 2**k
    return next(m << k for m in (9, 10, 12, 15, 16) if m << k >= n)


#: Bytes of impulse-response spectra a :class:`Reverb` keeps (least recently used out first).
SPECTRA_BYTES = 32 * 2**20


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
        self._init_cache()

    def _init_cache(self) -> None:
        # NOTE [ Impulse-response spectra ]
        # ==================================
        # The spectrum of response `which` at sample rate `sr` zero-padded to FFT length `size`,
        # by (which, sr, size, dtype): each is computed the same way whether found here or not, so
        # the cache changes no output. Bounded by SPECTRA_BYTES (least recently used out first);
        # any thread reads and fills it under the lock (a miss computes outside it); a pickled
        # Reverb leaves it behind.
        self._lock = threading.Lock()
        self._spectra: OrderedDict[tuple[int, int, int, str], np.ndarray] = OrderedDict()
        self._spectra_bytes = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_lock", "_spectra", "_spectra_bytes"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_cache()

    def _spectrum(
        self, which: int, sample_rate: int, size: int, response: np.ndarray, dtype: np.dtype
    ) -> np.ndarray:
        """``rfft(response, size)`` in ``dtype`` (NOTE [ Impulse-response spectra ])."""
        key = (which, sample_rate, size, np.dtype(dtype).str)
        with self._lock:
            found = self._spectra.get(key)
            if found is not None:
                self._spectra.move_to_end(key)
                return found
        spectrum = _fft.rfft(response.astype(dtype, copy=False), size)
        spectrum.setflags(write=False)  # shared by the threads that convolve with it
        with self._lock:
            if key not in self._spectra and spectrum.nbytes <= SPECTRA_BYTES:
                self._spectra[key] = spectrum
                self._spectra_bytes += spectrum.nbytes
                while self._spectra_bytes > SPECTRA_BYTES:
                    self._spectra_bytes -= self._spectra.popitem(last=False)[1].nbytes
        return spectrum

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
        # the first `frames` of the full convolution, by FFT on a length of the grid
        size = _grid_length(frames + len(response) - 1)
        spectrum = _fft.rfft(audio, size, axis=1)
        spectrum *= self._spectrum(which, sample_rate, size, response, audio.dtype)[None, :]
        out = _fft.irfft(spectrum, size, axis=1)[:, :frames]
        if self.normalize:  # float32 sums (pairwise, so within about 1e-6 of float64's)
            energy = float(np.sum(np.square(out)))
            if energy > 0.0:
                out *= np.float32(np.sqrt(float(np.sum(np.square(audio))) / energy))
        return np.ascontiguousarray(out, dtype=np.float32)
