"""Audio decoding with libsndfile (python-soundfile), resampling with soxr, crop and pad: :class:`AudioDecoder`.

Every step (decode, mixdown, resample, crop, pad) runs in numpy, soxr or libsndfile, which release the
GIL for the heavy part, and the result becomes a tensor with ``torch.from_numpy``. No torch operator
runs in a producer thread, so decoding never wakes torch's intra-op thread pool, which on few cores
would take the cores the producers need (README, "Threads and cores").
"""

from __future__ import annotations

import contextlib
import io
import math
import numbers
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
import soundfile as sf
import soxr

from .._checks import MAX_SECONDS, check_choice, check_int, check_seconds
from ..errors import DecodeError
from ..sources.item import AUDIO_PATTERNS
from . import _augment, _wav
from ._common import ItemLike, as_item, as_tensor, check_flag, describe, sample_fields
from ._sndfile import read_to_end, sndfile_path

__all__ = ["MAX_CROP_SECONDS", "AudioDecoder", "CropMode", "Quality"]

#: Where a crop starts (``AudioDecoder(crop=...)``).
CropMode = Literal["random", "start", "center"]
#: soxr's resampling quality (``AudioDecoder(quality=...)``).
Quality = Literal["QQ", "LQ", "MQ", "HQ", "VHQ"]
#: A fallback reader: ``(path) -> (audio as (frames, channels) float32, sample_rate)``; the rate may be
#: a float (librosa gives one) and is checked and rounded to an int.
FallbackReader = Callable[[str], tuple[np.ndarray, float]]

# libsndfile reports 2**63 - 1 frames for streams whose header carries no length (FLAC without a
# total-samples field): such files are read block by block.
_UNKNOWN_FRAMES = 2**62
_BLOCK_FRAMES = 65536
# Formats whose header frame count is an estimate (MP3: from the bit rate and the encoder's delay
# and padding), so a read that ends a little early is normal there and not a truncated file.
_ESTIMATED_LENGTH_FORMATS = frozenset({"MP3"})
#: The longest ``crop_seconds`` accepted: one day. Longer values are typos (``1e9``), and padding
#: a file to them would need more memory than any machine has.
MAX_CROP_SECONDS = MAX_SECONDS
#: How far past the end of its file a segment may run: that much is padded by reflection to the
#: segment's duration, as Lhotse's ``load_audio()`` pads a cut (its default tolerance); further is a
#: DecodeError.
SEGMENT_PAD_SECONDS = 0.5
# What librosa warns for every file it hands on to audioread: nothing that the decode error does
# not say already.
_KNOWN_LIBROSA_WARNINGS = ("PySoundFile failed",)


class _FallbackFailed(Exception):
    """A fallback reader failed; the message says why (already described), the cause is the original."""


# NOTE [ Quiet fallback warnings ]
# ================================
# librosa.load warns "PySoundFile failed. Trying audioread instead." (UserWarning) and that its
# audioread loader is deprecated (FutureWarning) for every file it hands to audioread, which is
# every file that reaches our fallback: a folder of broken files would log two warnings per file.
# warnings.catch_warnings cannot silence them here: it swaps module-global state, so two producer
# threads entering and leaving it in overlapping order restore each other's state and can leave
# every later warning of the process swallowed. Instead, while any thread is inside the librosa
# reader (a count under a lock), one dispatcher is installed as warnings.showwarning: it keeps the
# warnings of a thread inside the reader for that thread (they go into the DecodeError when the
# reader fails) and passes every other warning to the showwarning installed before it. The
# warnings filters are left alone, so "-W error" still turns these warnings into errors.
class _WarningGate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._saved: Callable[..., Any] = warnings.showwarning
        self._local = threading.local()
        self._show_fn = self._show  # one bound method, so that "is" recognises it

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[str]]:
        """Keep the warnings this thread raises inside the block (as ``"Category: message"``)."""
        caught: list[str] = []
        with self._lock:
            if self._active == 0:
                self._saved = warnings.showwarning
                warnings.showwarning = self._show_fn
            self._active += 1
        outer = getattr(self._local, "caught", None)
        self._local.caught = caught
        try:
            yield caught
        finally:
            self._local.caught = outer
            with self._lock:
                self._active -= 1
                if self._active == 0 and warnings.showwarning is self._show_fn:
                    warnings.showwarning = self._saved

    def _show(self, message: Any, category: type[Warning], filename: str, lineno: int,
              file: Any = None, line: str | None = None) -> None:
        caught = getattr(self._local, "caught", None)
        if caught is None:
            self._saved(message, category, filename, lineno, file, line)
        else:
            caught.append(f"{category.__name__}: {message}")


_quiet = _WarningGate()


def _librosa_reader(path: str) -> tuple[np.ndarray, float]:
    try:
        import librosa
    except ImportError as exc:
        raise RuntimeError("librosa is not installed (pip install 'audiobuffer[librosa]')") from exc
    with _quiet.capture() as caught:  # NOTE [ Quiet fallback warnings ]
        try:
            audio, sr = librosa.load(path, sr=None, mono=False, dtype=np.float32)
        except Exception as exc:
            notes = [w for w in dict.fromkeys(caught)
                     if not w.startswith(("FutureWarning", "DeprecationWarning", "PendingDeprecationWarning"))
                     and not any(known in w for known in _KNOWN_LIBROSA_WARNINGS)]
            reason = describe(exc) + (f" (librosa warned: {'; '.join(notes)})" if notes else "")
            raise _FallbackFailed(f"librosa: {reason}") from exc
    audio = np.atleast_2d(audio).T  # librosa gives (channels, frames) or (frames,)
    return np.ascontiguousarray(audio), sr


def _check_rate(path: str, sr: Any, channels: int) -> int:
    """``sr`` as a positive int; a :class:`DecodeError` naming ``path`` for a rate or channel count
    no audio can have (a WAV header that says 0 Hz decodes to ``sr=0`` in librosa)."""
    # typeshed gives round() of a numbers.Real an _IntegralLike that cannot be compared
    if isinstance(sr, bool) or not isinstance(sr, numbers.Real) or not math.isfinite(sr) or round(sr) < 1:  # type: ignore[operator]
        raise DecodeError(f"cannot decode {path!r}: its sample rate is {sr!r}; a rate must be a positive "
                          "number of Hz (is the header damaged?)", path=path)
    if channels < 1:
        raise DecodeError(f"cannot decode {path!r}: it has {channels} channels", path=path)
    return int(round(sr))


def _window_of(data: np.ndarray, start: int, length: int) -> np.ndarray:
    """``data[start:start + length]``, copied unless it is all of ``data``: a crop must not keep the
    rest of a decoded file alive (the sample holds the crop; ``max_bytes`` counts only the crop)."""
    if start == 0 and length >= len(data):
        return data
    return data[start:start + length].copy()


class _Pick(NamedTuple):
    """What part of a file one decode keeps: the item's segment, and the random crop's generator;
    ``name`` names the item in errors, and ``padded`` receives a segment's full length in frames
    where the file ends before it (the reader then reads all the segment holds;
    :meth:`AudioDecoder._pad`)."""

    rng: np.random.Generator | None
    segment: tuple[float, float | None] | None
    path: str
    name: str
    padded: list[int]


def _name_of(item: Any) -> str:
    """An item as errors name it: its path, and its ``id`` field where it has one (a cut's)."""
    ident = item.fields.get("id") if isinstance(item.fields, Mapping) else None
    return f"{item.path!r}" + (f" (id {ident!r})" if isinstance(ident, str) and ident else "")


def _segment_frames(segment: tuple[float, float | None], frames: int, sr: int, path: str,
                    name: str) -> tuple[int, int, int]:
    """The (first frame, frames the file holds, frames to pad) of a segment (start and duration in
    seconds) of a ``frames``-long file: one past the end by up to ``SEGMENT_PAD_SECONDS`` is padded.

    Raises:
        DecodeError: the segment is empty, starts at or after the end of the file, or runs further
            past it.
    """
    start, duration = segment
    first = round(start * sr)
    length_s = "the rest" if duration is None else f"{duration:g} s"
    what = f"cannot decode {name}: segment {start:g} s + {length_s}"
    if duration is not None and round(duration * sr) <= 0:
        raise DecodeError(f"{what} of it is empty (no frame at {sr} Hz)", path=path)
    if first >= frames:
        raise DecodeError(f"cannot decode {name}: its segment starts at {start:g} s, at or after "
                          f"the end of the file ({frames / sr:g} s)", path=path)
    wanted = frames - first if duration is None else round(duration * sr)
    length = min(wanted, frames - first)
    if wanted - length > math.ceil(SEGMENT_PAD_SECONDS * sr):
        over = (wanted - length) / sr
        raise DecodeError(f"{what} of it runs {over:g} s past the end of the file "
                          f"({frames / sr:g} s), more than the {SEGMENT_PAD_SECONDS:g} s padded "
                          f"(as Lhotse pads a cut): correct its start or duration", path=path)
    return first, length, wanted - length


class AudioDecoder:
    """Decode an audio file into a float32 waveform tensor.

    Reads uncompressed WAV with a native reader that gives libsndfile's samples bit for bit, and
    everything else with libsndfile through python-soundfile; mixes down to mono (or keeps the channels),
    resamples with soxr, and crops and pads to a fixed length. A crop reads only the frames it needs
    from disk. Files libsndfile cannot open go to a fallback reader (librosa by default, when
    installed; its per-file warnings are kept out of the log); when both fail, a
    :class:`~audiobuffer.DecodeError` names the file and both causes. A decoded rate or channel
    count that is not positive (a damaged header) is a :class:`~audiobuffer.DecodeError` too.
    A work item whose ``read`` is set (a member of a tar shard, a remote object) is decoded from the
    bytes it returns, by the same readers (libsndfile through its virtual I/O), never from a
    temporary file; the fallback reader takes paths, so it is not tried for bytes.

    A crop of ``crop_seconds`` at output rate ``R`` holds ``round(crop_seconds * R)`` frames of real
    audio whenever the file is at least ``crop_seconds`` long (resampled or not), and the sample's
    array holds only those frames, never a view into the whole decoded file.

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
        crop_seconds: cut each file to this many seconds (at most :data:`MAX_CROP_SECONDS`, one day);
            ``None`` keeps the whole file.
        crop: where the crop starts: ``"random"`` (reproducible: seeded by the dataset's seed, the
            epoch and the item's index), ``"start"`` or ``"center"``.
        pad: pad files shorter than ``crop_seconds`` with zeros to the full length.
        quality: soxr's resampling quality, one of ``"QQ"``, ``"LQ"``, ``"MQ"``, ``"HQ"``, ``"VHQ"``.
        fallback: the reader for files libsndfile cannot open: ``"librosa"``, ``None`` (none), or a
            callable ``path -> (audio (frames, channels) float32, sample_rate)``.
        native_wav: read uncompressed WAV with the native reader first; ``False`` sends every file
            to libsndfile (the benchmarks compare the two).
        tensors: hand ``audio`` over as a torch tensor; ``False`` keeps the numpy array (no torch
            needed: the isolated loader's helper process sets it on its copy).
        augment: augmentations (:mod:`audiobuffer.augment`) run in turn on each item's real audio after
            the crop and before the padding, each drawing from (seed, epoch, item index, its position);
            with a crop, what they return is cut to the crop again (NOTE [ Augmentations ] in
            ``decoders/_augment.py``). ``num_frames`` counts the augmented frames.
    """

    #: The glob patterns a directory source matches when this decoder reads it
    #: (:class:`~audiobuffer.BufferedDataset` uses them unless given ``patterns=``).
    patterns = AUDIO_PATTERNS
    #: The sample key of what it decodes: the one a loader that batches samples itself stacks
    #: (:class:`~audiobuffer.IsolatedLoader` unless given ``key=``).
    sample_key = "audio"

    def __init__(self, sample_rate: int | None = None, *, mono: bool = True,
                 crop_seconds: float | None = None, crop: CropMode = "random", pad: bool = True,
                 quality: Quality = "HQ",
                 fallback: Literal["librosa"] | FallbackReader | None = "librosa",
                 native_wav: bool = True, tensors: bool = True,
                 augment: Sequence[Any] | None = None) -> None:
        if sample_rate is not None:
            check_int("sample_rate", sample_rate, 1, also="or None")
        check_seconds("crop_seconds", crop_seconds, maximum=MAX_CROP_SECONDS)
        check_choice("crop", crop, CropMode)
        check_choice("quality", quality, Quality)
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
        self.native_wav = check_flag("native_wav", native_wav)
        self.tensors = check_flag("tensors", tensors)
        self.augment = _augment.check_augmentations(augment)
        #: Seconds this decoder's augmentations have run, over all threads.
        self.augment_clock = _augment.Clock()

    def __repr__(self) -> str:
        more = f", augment={list(self.augment)!r}" if self.augment else ""
        return (f"AudioDecoder(sample_rate={self.sample_rate}, mono={self.mono}, "
                f"crop_seconds={self.crop_seconds}, crop={self.crop!r}, pad={self.pad}{more})")

    def stretch(self, seed: int, epoch: int, indices: np.ndarray) -> np.ndarray | None:
        """Each item's duration after the augmentations over its duration before, for the items
        ``indices`` of ``epoch`` under ``seed`` (before the crop), or ``None`` where no augmentation
        changes durations (NOTE [ Augmentations ] in ``decoders/_augment.py``)."""
        return _augment.stretch(self.augment, seed, epoch, indices)

    def __call__(self, item: ItemLike) -> dict[str, Any]:
        item = as_item(item)
        rng = item.rng() if self.crop == "random" and self.crop_seconds is not None else None
        raw = item.read() if item.read is not None else None  # a shard member's or an object's bytes
        name = item.path if item.segment is None else _name_of(item)  # only segments' errors use it
        pick = _Pick(rng, item.segment, item.path, name, [])
        try:
            data, native_sr = self._read_soundfile(item.path, pick, raw)
        except DecodeError:
            raise
        except Exception as exc:  # libsndfile's errors, and OSError for missing or unreadable files
            if raw is not None:  # the fallback reader takes paths: bytes end here, never in a temp file
                raise DecodeError(f"cannot decode {item.path!r}: {exc}", path=item.path) from exc
            data, native_sr = self._read_fallback(item.path, pick, exc)
        if pick.padded:
            data = self._pad(data, native_sr, pick)
        audio, num_frames, sr = self._finish(data, native_sr, item)
        sample = sample_fields(item)
        sample["audio"] = as_tensor(audio) if self.tensors else audio
        sample["sample_rate"] = sr
        sample["num_frames"] = num_frames
        return sample

    # -- reading -------------------------------------------------------------------------------

    def _target(self, out_sr: int) -> int:
        """Frames of a crop at ``out_sr``."""
        assert self.crop_seconds is not None
        return round(self.crop_seconds * out_sr)

    def _window(self, frames: int, sr: int, pick: _Pick) -> tuple[int, int]:
        """The (start, length) in native frames of the part of a ``frames``-long file to keep: the item's
        segment of the file (all of it without one), cropped."""
        offset = 0
        if pick.segment is not None:
            offset, frames, short = _segment_frames(pick.segment, frames, sr, pick.path, pick.name)
            if short:  # all the file holds of it: padded, then cropped (_pad)
                pick.padded.append(frames + short)
                return offset, frames
        start, length = self._crop_window(frames, sr, pick.rng)
        return offset + start, length

    def _pad(self, data: np.ndarray, sr: int, pick: _Pick) -> np.ndarray:
        """A segment that runs past the end of its file (``data``, all the file holds of it) padded
        to its length by reflection (``numpy.pad(mode="reflect")``, as Lhotse pads a cut), then
        cropped.

        Raises:
            DecodeError: the file held fewer frames than its header gave, and the pad would pass the
                limit.
        """
        short = pick.padded[0] - len(data)
        if short > math.ceil(SEGMENT_PAD_SECONDS * sr) or not len(data):
            raise DecodeError(f"cannot decode {pick.name}: the file ends {short / sr:g} s before "
                              f"the end of its segment", path=pick.path)
        data = np.pad(data, ((0, short), (0, 0)), mode="reflect")
        start, length = self._crop_window(len(data), sr, pick.rng)
        return _window_of(data, start, length)

    def _crop_window(self, frames: int, sr: int, rng: np.random.Generator | None) -> tuple[int, int]:
        """The (start, length) in native frames of the crop of ``frames`` frames."""
        if self.crop_seconds is None:
            return 0, frames
        out_sr = sr if self.sample_rate is None else self.sample_rate
        target = self._target(out_sr)
        if out_sr == sr:
            need = target
        else:
            # soxr turns n frames into round(n * out_sr / sr): read enough for the whole crop (the
            # exact ceiling in integers, plus one frame against rounding), then cut to ``target``.
            need = -(-target * sr // out_sr) + 1
        if frames <= need:
            return 0, frames
        slack = frames - need
        if self.crop == "start":
            return 0, need
        if self.crop == "center":
            return slack // 2, need
        assert rng is not None  # set whenever crop == "random"
        return int(rng.integers(0, slack + 1)), need

    def _read_soundfile(self, path: str, pick: _Pick, raw: bytes | None = None) -> tuple[np.ndarray, int]:
        # read_wav gives None for a WAV it does not read exactly: libsndfile reads that one
        if self.native_wav and _wav.is_wav_path(path):
            whole = self.crop_seconds is None and pick.segment is None
            window = None if whole else lambda frames, sr: self._window(frames, sr, pick)
            read = _wav.read_wav(path if raw is None else raw, window=window)  # no window: the whole file
            if read is not None:
                return read
        with sf.SoundFile(sndfile_path(path) if raw is None else io.BytesIO(raw)) as f:  # bytes: virtual I/O
            sr = _check_rate(path, f.samplerate, f.channels)
            frames = f.frames
            if frames >= _UNKNOWN_FRAMES:
                data = self._read_blocks(f, path)
                start, length = self._window(len(data), sr, pick)
                return _window_of(data, start, length), sr
            start, length = self._window(frames, sr, pick)
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
        data, frames, error = read_to_end(f)
        if error is not None:
            raise DecodeError(
                f"cannot decode {path!r}: its header gives no frame count and reading failed after "
                f"{frames} frames ({error}); the rest of the file would be lost", path=path)
        return data  # type: ignore[return-value]  # an array whenever count_only is off

    def _read_fallback(self, path: str, pick: _Pick, exc: Exception) -> tuple[np.ndarray, int]:
        if not os.path.exists(path):
            raise DecodeError(f"cannot decode {path!r}: no such file", path=path) from exc
        if self._fallback is None:
            raise DecodeError(f"cannot decode {path!r}: {exc}", path=path) from exc
        try:
            data, sr = self._fallback(path)
        except _FallbackFailed as fallback_exc:  # already described, with the reader's name
            raise DecodeError(f"cannot decode {path!r}: soundfile: {exc}; fallback reader: {fallback_exc}",
                              path=path) from fallback_exc.__cause__
        except Exception as fallback_exc:
            raise DecodeError(f"cannot decode {path!r}: soundfile: {exc}; fallback reader: "
                              f"{describe(fallback_exc)}", path=path) from fallback_exc
        data = np.asarray(data, dtype=np.float32)
        if data.ndim == 1:
            data = data[:, None]
        if data.ndim != 2:
            raise DecodeError(f"cannot decode {path!r}: the fallback reader gave an array of shape {data.shape}; "
                              "expected (frames, channels)", path=path)
        sr = _check_rate(path, sr, data.shape[1])
        start, length = self._window(len(data), sr, pick)
        return _window_of(data, start, length), sr

    # -- shaping -------------------------------------------------------------------------------

    def _finish(self, data: np.ndarray, sr: int, item: Any = None) -> tuple[np.ndarray, int, int]:
        """Mix down, resample, trim, augment (``item``'s draws) and pad ``data`` (frames, channels)
        float32; return (audio, valid frames, rate). Each step is skipped where it would change
        nothing: a tiny file spends more time here in Python than in numpy."""
        if self.mono and data.shape[1] > 1:
            data = data.mean(axis=1, keepdims=True, dtype=np.float32)
        out_sr = sr if self.sample_rate is None else self.sample_rate
        if out_sr != sr and len(data):
            data = soxr.resample(data, sr, out_sr, quality=self.quality)
        num_frames = len(data)
        if self.crop_seconds is not None:
            target = self._target(out_sr)
            if num_frames > target:
                data = data[:target]
                num_frames = target
        if self.augment and item is not None:
            data, num_frames = self._augment(data, out_sr, item)
        if self.crop_seconds is not None:
            target = self._target(out_sr)
            if self.pad and num_frames < target:
                data = np.pad(data, ((0, target - num_frames), (0, 0)))
        # mono: (frames, 1) as (frames,), a view where it is contiguous (every built-in reader's output
        # is; a fallback reader's may not be)
        audio = np.ascontiguousarray(data.reshape(-1) if self.mono else data.T)
        base = audio.base
        if base is not None and (not isinstance(base, np.ndarray) or base.nbytes > audio.nbytes):
            audio = audio.copy()  # a view into a longer array (a trimmed resample): keep only the crop
        return audio, num_frames, out_sr

    def _augment(self, data: np.ndarray, sr: int, item: Any) -> tuple[np.ndarray, int]:
        """``data`` (frames, channels) through the augmentations, cut to the crop; with its frames."""
        start = time.perf_counter()
        try:
            out = _augment.apply(self.augment, np.ascontiguousarray(data.T), sr, seed=item.seed,
                                 epoch=item.epoch, index=item.index).T
        finally:
            self.augment_clock.add(time.perf_counter() - start)
        if self.crop_seconds is not None:
            out = out[:self._target(sr)]
        return out, len(out)
