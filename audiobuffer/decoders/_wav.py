"""A native reader for uncompressed WAV: RIFF and RF64, PCM 8/16/24/32-bit and IEEE float 32/64.

A fast path beside libsndfile that gives its samples bit for bit, or ``None`` where it is not sure to
(NOTE [ Native WAV reads ]). The header walk, and the list of what is read here and what goes to
libsndfile, are in ``_wav_header.py`` (NOTE [ WAV header walk ]).

NOTE [ Native WAV reads ]
=========================
Why it exists: reading a tiny WAV through python-soundfile is mostly Python in its wrappers, run with
the GIL held, so producer threads cannot overlap it. This reader makes as few system calls as it can:
``open``, one read of the first 64 KiB (the whole file when it is small, confirmed by a read at its
end), ``close``; for a larger file also an ``fstat`` and one seek and read of the crop window. It
converts with numpy. It is a fast path, never a second opinion: where it is not sure to give
libsndfile's answer it returns ``None`` and the caller reads the file with libsndfile, so errors and
the handling of odd files stay libsndfile's.

What it gives: libsndfile's own numbers (frame counts included). Integer samples become float32
exactly as ``sf_readf_float`` makes them: unsigned 8-bit ``(x - 128) / 128``, 16-bit ``x / 2**15``,
24-bit ``x / 2**23``, 32-bit ``float32(x) / 2**31`` (rounded to float32 first, then scaled: a power
of two, so exact); float samples as stored, 64-bit ones rounded to float32. Bit for bit the same as
python-soundfile's ``dtype="float32"`` reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ._wav_header import Buffer, Reader, WavInfo, parse

__all__ = ["WavInfo", "is_wav_path", "read_wav", "read_wav_info"]

#: ``(frames, samplerate) -> (start, length)``: picks the frames to read once the header is known.
Window = Callable[[int, int], tuple[int, int]]

# The first read: the whole of a file up to this size, the header and the first frames of a larger one.
_HEAD = 1 << 16
_O_RDONLY = os.O_RDONLY | getattr(os, "O_BINARY", 0)  # O_BINARY: Windows only (no newline translation)
_U8_SCALE = ((np.arange(256) - 128) / 128).astype(np.float32)  # exact: every value is k / 128
_SCALE = {2: np.float32(2.0 ** -15), 3: np.float32(2.0 ** -31), 4: np.float32(2.0 ** -31)}


def is_wav_path(path: str) -> bool:
    """Whether ``path``'s name ends in ``.wav`` or ``.wave`` (any case)."""
    tail = path[-5:].lower()
    return tail.endswith(".wav") or tail == ".wave"


def read_wav_info(source: str | os.PathLike[str] | Buffer) -> WavInfo | None:
    """Parse a WAV header from a path or from the file's bytes.

    Args:
        source: a path, or the whole file as ``bytes``, ``bytearray`` or ``memoryview``.

    Returns:
        The :class:`WavInfo`, or ``None`` when the file is not a WAV this reader handles exactly as
        libsndfile does (read it with libsndfile), or a path that cannot be opened.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = _flat_bytes(source)
        return parse(Reader(view, len(view)))
    try:
        return _from_file(source, parse)
    except OSError:
        return None


def read_wav(source: str | os.PathLike[str] | Buffer, start: int = 0,
             frames: int | None = None, *, window: Window | None = None
             ) -> tuple[np.ndarray, int] | None:
    """Read frames of an uncompressed WAV as float32, exactly as libsndfile reads them.

    Args:
        source: a path, or the whole file as ``bytes``, ``bytearray`` or ``memoryview``.
        start: the first frame to read (past the end reads nothing).
        frames: how many frames to read; ``None`` reads to the end.
        window: instead of ``start`` and ``frames``, a callable ``(frames, samplerate) -> (start,
            length)`` called once with the file's frame count and rate, when the file is known to be
            read here; it decides the frames to read (a random crop, say).

    Returns:
        ``(audio, samplerate)`` with ``audio`` a C-contiguous ``(frames, channels)`` float32 array,
        or ``None`` when the file is not a WAV this reader handles exactly as libsndfile does (read
        it with libsndfile), or a path that cannot be opened or read.

    Raises:
        ValueError: ``start`` or ``frames`` is negative.
    """
    if start < 0 or (frames is not None and frames < 0):
        raise ValueError(f"start and frames must be >= 0, got start={start!r}, frames={frames!r}")
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = _flat_bytes(source)
        reader = Reader(view, len(view))
        return _read(reader, start, frames, window)
    try:
        return _from_file(source, lambda reader: _read(reader, start, frames, window))
    except OSError:  # libsndfile reports it in its own words
        return None


def _flat_bytes(source: Buffer) -> Buffer:
    """``source`` as flat bytes: ``bytes`` itself, else a view (a strided view is copied first)."""
    if source.__class__ is bytes:  # a shard member's or an object's bytes: already flat
        return source
    view = memoryview(source)
    return (view if view.c_contiguous else memoryview(view.tobytes())).cast("B")


def _from_file(path: str | os.PathLike[str], use: Callable[[Reader], Any]) -> Any:
    """``use(reader)`` on the file at ``path``: its first :data:`_HEAD` bytes, and the file itself when
    there is more."""
    fd = os.open(path, _O_RDONLY)
    try:
        head = os.read(fd, _HEAD)
        while len(head) < _HEAD:  # a short read is the end of a regular file, but not always elsewhere
            more = os.read(fd, _HEAD - len(head))
            if not more:
                return use(Reader(head, len(head)))  # the whole file
            head += more
        with open(fd, "rb", buffering=0, closefd=False) as f:
            return use(Reader(head, os.fstat(fd).st_size, f))
    finally:
        os.close(fd)


# -- reading -------------------------------------------------------------------------------------

def _read(reader: Reader, start: int, frames: int | None,
          window: Window | None) -> tuple[np.ndarray, int] | None:
    info = parse(reader)
    if info is None:
        return None
    total, channels, samplerate, subtype, _, data_offset, block_align = info
    if window is not None:
        start, length = window(total, samplerate)
        if start < 0 or length < 0:
            raise ValueError(f"the window gave start={start!r}, length={length!r}; both must be >= 0")
    else:
        length = total if frames is None else frames
    if start > total:  # a window past the end reads what there is, as libsndfile does
        start = total
    if length > total - start:
        length = total - start
    offset = data_offset + start * block_align
    count = length * channels
    head = reader.head
    if offset + length * block_align <= len(head):  # most files: the first read holds it all
        return _convert(head, offset, count, subtype, False).reshape(-1, channels), samplerate
    raw = np.empty(length * block_align, np.uint8)
    have = max(0, min(len(head) - offset, len(raw)))  # the part the first read already holds
    if have:
        raw[:have] = np.frombuffer(head, np.uint8, have, offset)
    if not _read_into(reader.file, offset + have, raw[have:]):
        return None
    return _convert(raw, 0, count, subtype, True).reshape(-1, channels), samplerate


def _read_into(f, offset: int, out: np.ndarray) -> bool:
    f.seek(offset)
    view = memoryview(out)  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ from Python 3.12 only
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            return False  # the file shrank since its size was taken
        done += n
    return True


def _convert(buf: Any, offset: int, count: int, subtype: str, fresh: bool) -> np.ndarray:
    """``count`` little-endian samples of ``subtype`` in ``buf`` from byte ``offset``, as float32.

    ``fresh``: ``buf`` was allocated for this read, so the result may share its memory.
    """
    if subtype == "PCM_16":  # most WAV files: one view and one multiply
        return np.multiply(np.frombuffer(buf, "<i2", count, offset), _SCALE[2], dtype=np.float32)
    if subtype == "FLOAT":
        return np.frombuffer(buf, "<f4", count, offset).astype(np.float32, copy=not fresh)
    if subtype == "DOUBLE":
        with np.errstate(over="ignore", invalid="ignore"):  # out of range: inf; a NaN stays NaN (C cast)
            return np.frombuffer(buf, "<f8", count, offset).astype(np.float32)
    if subtype == "PCM_U8":
        return _U8_SCALE[np.frombuffer(buf, np.uint8, count, offset)]
    if subtype == "PCM_24":
        wide = np.zeros((count, 4), np.uint8)
        wide[:, 1:] = np.frombuffer(buf, np.uint8, 3 * count, offset).reshape(-1, 3)  # the 24 bits in the top
        return np.multiply(wide.view("<i4").reshape(-1), _SCALE[3], dtype=np.float32)  # of an int32, as libsndfile
    return np.multiply(np.frombuffer(buf, "<i4", count, offset), _SCALE[4], dtype=np.float32)  # PCM_32
