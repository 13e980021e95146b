"""Audio decoding with libsndfile (python-soundfile), resampling with soxr, crop and pad.

Where tensors are made: every step here (decode, mixdown, resample, crop, pad) runs in numpy, soxr or
libsndfile, all of which release the GIL for the heavy part, and the result becomes a tensor with
``torch.from_numpy`` (zero-copy, no torch operator). No torch operator runs in a producer thread, so
decoding never wakes torch's intra-op thread pool, which on few cores would take the cores the
producers need (see the README, "Threads and cores").
"""

from __future__ import annotations

import io
import math
import os
from typing import Any, Callable, Literal, Optional, Tuple

import numpy as np
import soundfile as sf
import soxr

from ..errors import DecodeError
from . import _wav
from ._common import ItemLike, as_item, as_tensor, sample_fields

__all__ = ["AudioDecoder", "CropMode"]

CropMode = Literal["random", "start", "center"]
#: A fallback reader: ``(path) -> (audio as (frames, channels) float32, sample_rate)``.
FallbackReader = Callable[[str], Tuple[np.ndarray, int]]

# libsndfile reports 2**63 - 1 frames for streams whose header carries no length (FLAC without a
# total-samples field): such files are read block by block.
_UNKNOWN_FRAMES = 2**62
_BLOCK_FRAMES = 65536
# Formats whose header frame count is an estimate (MP3: from the bit rate and the encoder's delay
# and padding), so a read that ends a little early is normal there and not a truncated file.
_ESTIMATED_LENGTH_FORMATS = frozenset({"MP3"})
_CROP_MODES = ("random", "start", "center")
# Read ``.wav`` files with the native PCM reader first (``_wav.py``); False sends every file to libsndfile.
_NATIVE_WAV = True
_QUALITIES = ("QQ", "LQ", "MQ", "HQ", "VHQ")


def _librosa_reader(path: str) -> tuple[np.ndarray, int]:
    try:
        import librosa
    except ImportError as exc:
        raise RuntimeError("librosa is not installed (pip install 'audiobuffer[librosa]')") from exc
    audio, sr = librosa.load(path, sr=None, mono=False, dtype=np.float32)
    audio = np.atleast_2d(audio).T  # librosa gives (channels, frames) or (frames,)
    return np.ascontiguousarray(audio), int(sr)


class AudioDecoder:
    """Decode an audio file into a float32 waveform tensor.

    Reads uncompressed WAV with a native reader that gives libsndfile's samples bit for bit, and
    everything else with libsndfile through python-soundfile; mixes down to mono (or keeps the channels),
    resamples with soxr, and crops and pads to a fixed length. A crop reads only the frames it needs
    from disk. Files libsndfile cannot open go to a fallback reader (librosa by default, when
    installed); when both fail, a :class:`~audiobuffer.DecodeError` names the file and both causes.
    A work item whose ``read`` is set (a member of a tar shard, a remote object) is decoded from the
    bytes it returns, by the same readers (libsndfile through its virtual I/O), never from a
    temporary file; the fallback reader takes paths, so it is not tried for bytes.

    The sample dict holds ``audio`` (``(frames,)`` mono or ``(channels, frames)``, float32),
    ``sample_rate``, ``num_frames`` (frames of real audio, before padding), ``path``, ``index``, the
    ``label`` and ``label_name`` when the source has labels, and the manifest's other columns.

    Thread safety: an instance holds no mutable state and opens its own file handle per call, so one
    decoder serves all producer threads.

    Example:
        >>> decode = AudioDecoder(sample_rate=16000, crop_seconds=1.0, crop="start")
        >>> sample = decode("speech.flac")  # doctest: +SKIP
        >>> sample["audio"].shape  # doctest: +SKIP
        torch.Size([16000])

    Args:
        sample_rate: the output rate in Hz; ``None`` keeps each file's own rate.
        mono: mix the channels down to one (the mean); ``False`` keeps them.
        crop_seconds: cut each file to this many seconds; ``None`` keeps the whole file.
        crop: where the crop starts: ``"random"`` (reproducible: seeded by the dataset's seed, the
            epoch and the item's index), ``"start"`` or ``"center"``.
        pad: pad files shorter than ``crop_seconds`` with zeros to the full length.
        quality: soxr's resampling quality, one of ``"QQ"``, ``"LQ"``, ``"MQ"``, ``"HQ"``, ``"VHQ"``.
        fallback: the reader for files libsndfile cannot open: ``"librosa"``, ``None`` (none), or a
            callable ``path -> (audio (frames, channels) float32, sample_rate)``.
    """

    def __init__(self, sample_rate: Optional[int] = None, *, mono: bool = True,
                 crop_seconds: Optional[float] = None, crop: CropMode = "random", pad: bool = True,
                 quality: str = "HQ", fallback: Literal["librosa"] | FallbackReader | None = "librosa"
                 ) -> None:
        if sample_rate is not None:
            if isinstance(sample_rate, bool) or not isinstance(sample_rate, int):
                raise TypeError(f"sample_rate must be None or a positive integer, got {sample_rate!r}")
            if sample_rate <= 0:
                raise ValueError(f"sample_rate must be None or a positive integer, got {sample_rate!r}")
        if crop_seconds is not None:
            if isinstance(crop_seconds, bool) or not isinstance(crop_seconds, (int, float)):
                raise TypeError(f"crop_seconds must be None or a positive number, got {crop_seconds!r}")
            if not crop_seconds > 0 or not math.isfinite(crop_seconds):
                raise ValueError(f"crop_seconds must be None or a positive number, got {crop_seconds!r}")
        if crop not in _CROP_MODES:
            raise ValueError(f"crop must be one of {_CROP_MODES}, got {crop!r}")
        if quality not in _QUALITIES:
            raise ValueError(f"quality must be one of {_QUALITIES}, got {quality!r}")
        if fallback == "librosa":
            self._fallback: FallbackReader | None = _librosa_reader
        elif fallback is None or callable(fallback):
            self._fallback = fallback
        else:
            raise ValueError(f"fallback must be 'librosa', None or a callable, got {fallback!r}")
        self.sample_rate = sample_rate
        self.mono = bool(mono)
        self.crop_seconds = crop_seconds
        self.crop = crop
        self.pad = bool(pad)
        self.quality = quality

    def __repr__(self) -> str:
        return (f"AudioDecoder(sample_rate={self.sample_rate}, mono={self.mono}, "
                f"crop_seconds={self.crop_seconds}, crop={self.crop!r}, pad={self.pad})")

    def __call__(self, item: ItemLike) -> dict[str, Any]:
        item = as_item(item)
        rng = item.rng() if self.crop == "random" and self.crop_seconds is not None else None
        raw = item.read() if item.read is not None else None  # a shard member's or an object's bytes
        try:
            data, native_sr = self._read_soundfile(item.path, rng, raw)
        except DecodeError:
            raise
        except Exception as exc:  # libsndfile's errors, and OSError for missing or unreadable files
            if raw is not None:  # the fallback reader takes paths: bytes end here, never in a temp file
                raise DecodeError(f"cannot decode {item.path!r}: {exc}", path=item.path) from exc
            data, native_sr = self._read_fallback(item.path, rng, exc)
        audio, num_frames, sr = self._finish(data, native_sr)
        sample = sample_fields(item)
        sample["audio"] = as_tensor(audio)
        sample["sample_rate"] = sr
        sample["num_frames"] = num_frames
        return sample

    # -- reading -------------------------------------------------------------------------------

    def _window(self, frames: int, sr: int, rng: np.random.Generator | None) -> tuple[int, int]:
        """The (start, length) in native frames of the part of a ``frames``-long file to keep."""
        if self.crop_seconds is None:
            return 0, frames
        need = math.ceil(self.crop_seconds * sr)
        if frames <= need:
            return 0, frames
        slack = frames - need
        if self.crop == "start":
            return 0, need
        if self.crop == "center":
            return slack // 2, need
        assert rng is not None  # set whenever crop == "random"
        return int(rng.integers(0, slack + 1)), need

    def _read_soundfile(self, path: str, rng: np.random.Generator | None,
                        raw: bytes | None = None) -> tuple[np.ndarray, int]:
        if _NATIVE_WAV and _wav.is_wav_path(path):  # None: not a WAV it reads exactly, so libsndfile
            read = _wav.read_wav(path if raw is None else raw,
                                 window=lambda frames, sr: self._window(frames, sr, rng))
            if read is not None:
                return read
        with sf.SoundFile(path if raw is None else io.BytesIO(raw)) as f:  # bytes: libsndfile's virtual I/O
            sr = f.samplerate
            frames = f.frames
            if frames >= _UNKNOWN_FRAMES:
                data = self._read_blocks(f, path)
                start, length = self._window(len(data), sr, rng)
                return data[start:start + length], sr
            start, length = self._window(frames, sr, rng)
            if start:
                f.seek(start)
            data = f.read(length, dtype="float32", always_2d=True)
            estimated = f.format in _ESTIMATED_LENGTH_FORMATS
        if len(data) != length and not estimated:
            raise DecodeError(
                f"cannot decode {path!r}: the file ended after {start + len(data)} frames; its header "
                f"promises {frames}", path=path)
        return data, sr

    @staticmethod
    def _read_blocks(f: sf.SoundFile, path: str) -> np.ndarray:
        blocks = []
        try:
            while True:
                block = f.read(_BLOCK_FRAMES, dtype="float32", always_2d=True)
                if len(block):
                    blocks.append(block)
                if len(block) < _BLOCK_FRAMES:
                    break
        except Exception as exc:
            read = sum(len(b) for b in blocks)
            raise DecodeError(
                f"cannot decode {path!r}: its header gives no frame count and reading failed after "
                f"{read} frames ({exc}); the rest of the file would be lost", path=path) from exc
        if not blocks:
            return np.zeros((0, f.channels), dtype=np.float32)
        return np.concatenate(blocks)

    def _read_fallback(self, path: str, rng: np.random.Generator | None,
                       exc: Exception) -> tuple[np.ndarray, int]:
        if not os.path.exists(path):
            raise DecodeError(f"cannot decode {path!r}: no such file", path=path) from exc
        if self._fallback is None:
            raise DecodeError(f"cannot decode {path!r}: {exc}", path=path) from exc
        try:
            data, sr = self._fallback(path)
        except Exception as fallback_exc:
            raise DecodeError(
                f"cannot decode {path!r}: soundfile: {exc}; fallback reader: "
                f"{type(fallback_exc).__name__}: {fallback_exc}", path=path) from fallback_exc
        data = np.asarray(data, dtype=np.float32)
        if data.ndim == 1:
            data = data[:, None]
        start, length = self._window(len(data), sr, rng)
        return data[start:start + length], int(sr)

    # -- shaping -------------------------------------------------------------------------------

    def _finish(self, data: np.ndarray, sr: int) -> tuple[np.ndarray, int, int]:
        """Mix down, resample, trim and pad ``data`` (frames, channels); return (audio, valid frames, rate)."""
        if self.mono:
            data = data.mean(axis=1, keepdims=True, dtype=np.float32) if data.shape[1] > 1 else data
        out_sr = sr if self.sample_rate is None else self.sample_rate
        if out_sr != sr and len(data):
            data = soxr.resample(data, sr, out_sr, quality=self.quality)
        if self.crop_seconds is not None:
            target = round(self.crop_seconds * out_sr)
            data = data[:target]
            num_frames = len(data)
            if self.pad and num_frames < target:
                data = np.pad(data, ((0, target - num_frames), (0, 0)))
        else:
            num_frames = len(data)
        audio = data[:, 0] if self.mono else data.T
        return np.ascontiguousarray(audio, dtype=np.float32), num_frames, out_sr
