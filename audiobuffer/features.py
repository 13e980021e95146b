"""Batched spectral features as torch modules: STFT magnitude and (log-)mel spectrograms, and
SpecAugment's masks.

Per-sample features in producer threads do not scale (``librosa.feature.melspectrogram`` holds the
GIL), so features belong here: one call on a whole batch, after it is loaded, on whatever device the
batch is on; lengths go in as frames of audio and come out as frames of features, so padding can be
masked downstream. The defaults match librosa's (``center=True`` with zero padding, a periodic Hann
window, the Slaney mel scale and normalisation), and the tests check the output against librosa.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from torch import nn

from ._checks import check_choice, check_int

__all__ = ["LogMel", "MelNorm", "MelSpectrogram", "SpecAugment", "Spectrogram", "mel_filterbank"]

#: How mel filters are normalised: ``"slaney"`` (each filter's area is constant, as librosa does) or ``None``.
MelNorm = Literal["slaney"] | None


# The Slaney mel scale (librosa's default): linear below 1 kHz, logarithmic above.
_F_SP = 200.0 / 3  # Hz per mel in the linear part
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def _hz_to_mel(freq: np.ndarray, htk: bool) -> np.ndarray:
    freq = np.asarray(freq, dtype=np.float64)
    if htk:
        return 2595.0 * np.log10(1.0 + freq / 700.0)
    mels = freq / _F_SP
    log_region = freq >= _MIN_LOG_HZ
    mels[log_region] = _MIN_LOG_MEL + np.log(freq[log_region] / _MIN_LOG_HZ) / _LOGSTEP
    return mels


def _mel_to_hz(mels: np.ndarray, htk: bool) -> np.ndarray:
    mels = np.asarray(mels, dtype=np.float64)
    if htk:
        return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    freqs = _F_SP * mels
    log_region = mels >= _MIN_LOG_MEL
    freqs[log_region] = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mels[log_region] - _MIN_LOG_MEL))
    return freqs


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int = 128, *, f_min: float = 0.0,
                   f_max: float | None = None, htk: bool = False,
                   norm: MelNorm = "slaney") -> np.ndarray:
    """Triangular mel filters, ``(n_mels, n_fft // 2 + 1)`` float64, as ``librosa.filters.mel`` makes them."""
    check_choice("norm", norm, MelNorm)
    f_max = sample_rate / 2.0 if f_max is None else f_max
    if not 0 <= f_min < f_max <= sample_rate / 2.0:
        raise ValueError(f"need 0 <= f_min < f_max <= sample_rate / 2, got f_min={f_min}, f_max={f_max}")
    fft_freqs = np.linspace(0.0, sample_rate / 2.0, 1 + n_fft // 2)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(np.array([f_min]), htk)[0],
                                   _hz_to_mel(np.array([f_max]), htk)[0], n_mels + 2), htk)
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    if norm == "slaney":
        weights *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights


class Spectrogram(nn.Module):
    """``|STFT|**power`` of a batch of waveforms, on the batch's device.

    Args:
        n_fft: FFT size.
        hop_length: hop between frames (default ``n_fft // 4``).
        win_length: window length (default ``n_fft``).
        power: 1.0 for magnitude, 2.0 for power.
        center: pad ``n_fft // 2`` zeros on both sides, as librosa does.

    Input ``(..., T)`` float; output ``(..., n_fft // 2 + 1, frames)``. ``forward`` also takes the
    ``lengths`` in samples and returns the lengths in frames.
    """

    window: torch.Tensor  # a buffer (``register_buffer``), moved with the module

    def __init__(self, n_fft: int = 2048, *, hop_length: int | None = None,
                 win_length: int | None = None, power: float = 1.0, center: bool = True) -> None:
        super().__init__()
        self.n_fft = n_fft
        self.hop_length = hop_length if hop_length is not None else n_fft // 4
        self.win_length = win_length if win_length is not None else n_fft
        self.power = power
        self.center = center
        self.register_buffer("window", torch.hann_window(self.win_length, periodic=True), persistent=False)

    def frames(self, lengths: torch.Tensor) -> torch.Tensor:
        """Frames of output for inputs of ``lengths`` samples."""
        if self.center:
            return 1 + torch.div(lengths, self.hop_length, rounding_mode="floor")
        return 1 + torch.div(lengths - self.n_fft, self.hop_length, rounding_mode="floor")

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The spectrogram of each waveform in the batch.

        Args:
            audio: float waveforms ``(..., T)``, e.g. ``(batch, T)`` or ``(batch, channels, T)``,
                on any device; padded examples are zero beyond their length.
            lengths: each example's length in samples, shape ``audio.shape[:-1]`` (``pad_collate``'s
                ``lengths``), or ``None``.

        Returns:
            ``(spec, frames)``: ``spec`` is ``(..., n_fft // 2 + 1, frames)`` in ``audio``'s dtype and
            device; ``frames`` is each example's length in frames (:meth:`frames` of ``lengths``), or
            ``None`` when ``lengths`` is ``None``. Frames past an example's length are computed from
            its padding; mask them with ``frames``.
        """
        shape = audio.shape
        flat = audio.reshape(-1, shape[-1])
        spec = torch.stft(flat, self.n_fft, hop_length=self.hop_length, win_length=self.win_length,
                          window=self.window.to(dtype=flat.dtype), center=self.center, pad_mode="constant",
                          return_complex=True).abs()
        if self.power != 1.0:
            spec = spec.pow(self.power)
        spec = spec.reshape(*shape[:-1], *spec.shape[-2:])
        return spec, None if lengths is None else self.frames(lengths)


class MelSpectrogram(nn.Module):
    """Mel spectrogram of a batch: :class:`Spectrogram` (power 2 by default) through mel filters.

    Input ``(..., T)``; output ``(..., n_mels, frames)`` and the lengths in frames.
    """

    filters: torch.Tensor  # a buffer (``register_buffer``), moved with the module

    def __init__(self, sample_rate: int, n_fft: int = 2048, *, hop_length: int | None = None,
                 win_length: int | None = None, n_mels: int = 128, f_min: float = 0.0,
                 f_max: float | None = None, power: float = 2.0, center: bool = True,
                 htk: bool = False, norm: MelNorm = "slaney") -> None:
        super().__init__()
        self.spectrogram = Spectrogram(n_fft, hop_length=hop_length, win_length=win_length, power=power,
                                       center=center)
        bank = mel_filterbank(sample_rate, n_fft, n_mels, f_min=f_min, f_max=f_max, htk=htk, norm=norm)
        self.register_buffer("filters", torch.from_numpy(bank.astype(np.float32)), persistent=False)

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The mel spectrogram of each waveform in the batch.

        Args:
            audio: float waveforms ``(..., T)`` on any device (padded with zeros).
            lengths: each example's length in samples, shape ``audio.shape[:-1]``, or ``None``.

        Returns:
            ``(mel, frames)``: ``mel`` is ``(..., n_mels, frames)``, the power (or magnitude, with
            ``power=1``) through the mel filters; ``frames`` is each example's length in frames, or
            ``None`` when ``lengths`` is ``None``.
        """
        spec, frames = self.spectrogram(audio, lengths)
        return torch.matmul(self.filters.to(spec.dtype), spec), frames


class LogMel(MelSpectrogram):
    """Log-mel spectrogram in decibels: ``10 * log10(max(mel, amin))``, optionally floored ``top_db`` below the peak.

    Matches ``librosa.power_to_db(librosa.feature.melspectrogram(...), ref=1.0)`` (with ``top_db``
    taken per example rather than over the whole input).

    Example:
        >>> logmel = LogMel(sample_rate=16000, n_fft=400, hop_length=160, n_mels=64)
        >>> features, frames = logmel(torch.randn(8, 16000), torch.full((8,), 16000))
        >>> features.shape, frames[0].item()
        (torch.Size([8, 64, 101]), 101)
    """

    def __init__(self, sample_rate: int, n_fft: int = 2048, *, amin: float = 1e-10,
                 top_db: float | None = None, **kwargs: object) -> None:
        super().__init__(sample_rate, n_fft, **kwargs)  # type: ignore[arg-type]
        self.amin = amin
        self.top_db = top_db

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The log-mel spectrogram of each waveform in the batch, in decibels.

        Args:
            audio: float waveforms ``(..., T)`` on any device (padded with zeros).
            lengths: each example's length in samples, shape ``audio.shape[:-1]``, or ``None``.

        Returns:
            ``(db, frames)``: ``db`` is ``(..., n_mels, frames)``, ``10 * log10(max(mel, amin))``,
            floored ``top_db`` below each example's peak when ``top_db`` is set; ``frames`` is each
            example's length in frames, or ``None`` when ``lengths`` is ``None``: pass them on to mask
            the frames computed from padding (they sit near the floor, not at a neutral value).
        """
        mel, frames = super().forward(audio, lengths)
        db = 10.0 * torch.log10(mel.clamp_min(self.amin))
        if self.top_db is not None:
            peak = db.amax(dim=(-2, -1), keepdim=True)
            db = torch.maximum(db, peak - self.top_db)
        return db, frames


def _bands(count: int, most: int, limits: torch.Tensor, size: int, generator: torch.Generator | None
           ) -> torch.Tensor:
    """A ``(rows, size)`` boolean mask of ``count`` bands per row, each of a width drawn in [0, ``most``]
    (at most the row's limit) starting within the row's first ``limits`` places. Drawn on the CPU."""
    rows = len(limits)
    limit = limits.to(torch.float64)[:, None]
    widths = torch.floor(torch.rand(rows, count, generator=generator, dtype=torch.float64) * (most + 1))
    widths = torch.minimum(widths, limit)
    starts = torch.floor(torch.rand(rows, count, generator=generator, dtype=torch.float64) * (limit - widths + 1))
    place = torch.arange(size, dtype=torch.float64)[None, None, :]
    inside = (place >= starts[..., None]) & (place < (starts + widths)[..., None])
    return inside.any(dim=1)


class SpecAugment(nn.Module):
    """SpecAugment's frequency and time masks on a batch of features, on the batch's device.

    Each example gets ``freq_masks`` bands of ``0`` to ``freq_width`` feature bins and ``time_masks``
    bands of ``0`` to ``time_width`` frames (widths and starts drawn uniformly), set to ``mask_value``.
    With ``frames`` (each example's length, as the feature modules return it), time bands lie within
    the example's own frames, never in its padding. The draws come from ``generator`` (a CPU
    ``torch.Generator``) or, without one, from a generator seeded by ``seed`` at construction (the
    same sequence of masks on every run); to resume exactly, pass a generator seeded from the step.

    Example:
        >>> specaug = SpecAugment(freq_masks=2, freq_width=8, time_masks=2, time_width=10, seed=0)
        >>> masked = specaug(torch.ones(4, 64, 100))
        >>> masked.shape
        torch.Size([4, 64, 100])

    Args:
        freq_masks: frequency bands per example.
        freq_width: the widest frequency band (bins).
        time_masks: time bands per example.
        time_width: the widest time band (frames).
        mask_value: what masked places are set to.
        seed: seeds the module's own generator (``None``: torch's global one).
    """

    def __init__(self, *, freq_masks: int = 2, freq_width: int = 27, time_masks: int = 2,
                 time_width: int = 40, mask_value: float = 0.0, seed: int | None = None) -> None:
        super().__init__()
        self.freq_masks = check_int("SpecAugment(freq_masks=...)", freq_masks, 0)
        self.freq_width = check_int("SpecAugment(freq_width=...)", freq_width, 0)
        self.time_masks = check_int("SpecAugment(time_masks=...)", time_masks, 0)
        self.time_width = check_int("SpecAugment(time_width=...)", time_width, 0)
        if isinstance(mask_value, bool) or not isinstance(mask_value, (int, float)):
            raise TypeError(f"SpecAugment(mask_value=...) must be a number, got {mask_value!r}")
        self.mask_value = float(mask_value)
        self.generator: torch.Generator | None = None
        if seed is not None:
            check_int("SpecAugment(seed=...)", seed, 0, 2**63 - 1, also="or None")
            self.generator = torch.Generator().manual_seed(seed)

    def forward(self, features: torch.Tensor, frames: torch.Tensor | None = None, *,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """``features`` ``(..., bins, time)`` with the masks set (a new tensor).

        Args:
            features: a batch of features on any device.
            frames: each example's length in frames, shape ``features.shape[:-2]``, or ``None``.
            generator: a CPU ``torch.Generator`` to draw from (else the module's own).

        Raises:
            ValueError: ``features`` has fewer than 2 dimensions, or ``frames`` another shape.
        """
        if features.dim() < 2:
            raise ValueError(f"SpecAugment takes features (..., bins, time), got shape {tuple(features.shape)}")
        gen = generator if generator is not None else self.generator
        *lead, bins, time = features.shape
        rows = math.prod(lead)
        if frames is None:
            limits = torch.full((rows,), time, dtype=torch.int64)
        else:
            if tuple(frames.shape) != tuple(lead):
                raise ValueError(f"SpecAugment(frames=...) must have the shape {tuple(lead)} of the features' "
                                 f"leading dimensions, got {tuple(frames.shape)}")
            limits = frames.detach().to("cpu", torch.int64).reshape(rows).clamp(0, time)
        mask = torch.zeros(rows, bins, time, dtype=torch.bool)
        if self.freq_masks and self.freq_width:
            full = torch.full((rows,), bins, dtype=torch.int64)
            mask |= _bands(self.freq_masks, self.freq_width, full, bins, gen)[:, :, None]
        if self.time_masks and self.time_width:
            mask |= _bands(self.time_masks, self.time_width, limits, time, gen)[:, None, :]
        mask = mask.reshape(features.shape).to(features.device, non_blocking=True)
        return features.masked_fill(mask, self.mask_value)
