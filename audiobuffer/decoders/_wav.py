"""A native reader for uncompressed WAV: RIFF and RF64, PCM 8/16/24/32-bit and IEEE float 32/64.

Why it exists: reading a tiny WAV through python-soundfile is mostly Python in its wrappers, run with
the GIL held (about 110 us for an FSDD file), so producer threads cannot overlap it. This reader does
one ``open``, one ``fstat``, one read of the header (the whole file when it is small), one seek and
read of the crop window otherwise, and converts with numpy. It is a fast path, never a second opinion:
where it is not sure to give libsndfile's answer it returns ``None`` and the caller reads the file
with libsndfile, so errors and the handling of odd files stay libsndfile's.

What it reads (everything else is ``None``):
    * ``RIFF``/``WAVE`` (little-endian) and ``RF64``/``WAVE`` with a ``ds64`` chunk;
    * format tags ``WAVE_FORMAT_PCM`` (1 to 32 bits, stored in 1 to 4 bytes: libsndfile's
      ``PCM_U8``, ``PCM_16``, ``PCM_24``, ``PCM_32``), ``WAVE_FORMAT_IEEE_FLOAT`` (32 or 64 bits)
      and ``WAVE_FORMAT_EXTENSIBLE`` with a PCM or IEEE float sub-format (plain or ambisonic);
    * a block align equal to channels x bytes per sample, 1 to 1024 channels;
    * any chunks before or after ``data`` that libsndfile's parser steps over exactly: unknown chunks
      with printable names, ``fact``, ``PEAK`` of the right size, ``bext``, ``cue``, and ``LIST``
      chunks whose sub-chunks tile the chunk exactly; odd-sized chunks are padded (RIFF only, as in
      libsndfile).

What it leaves to libsndfile: RIFX (big-endian), A-law, mu-law, ADPCM, GSM and other codecs, a second
``fmt`` or ``data`` chunk, ``smpl``/``acid``/``cart`` chunks, malformed chunk lists, inconsistent
block aligns, and anything it could not read.

What it gives: libsndfile's own numbers. The frame count follows libsndfile: the smaller of the
``data`` size and the bytes the file really holds, over the block align (a truncated file is read as
far as its data goes; a ``data`` size of 0 in a file whose RIFF size is 8 means "to the end of the
file"). Integer samples become float32 exactly as ``sf_readf_float`` makes them: unsigned 8-bit
``(x - 128) / 128``, 16-bit ``x / 2**15``, 24-bit ``x / 2**23``, 32-bit ``float32(x) / 2**31``
(rounded to float32 first, then scaled: a power of two, so exact); float samples as stored, 64-bit
ones rounded to float32. Bit for bit the same as python-soundfile's ``dtype="float32"`` reads.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["WavInfo", "is_wav_path", "read_wav", "read_wav_info"]

Buffer = bytes | bytearray | memoryview
#: ``(frames, samplerate) -> (start, length)``: picks the frames to read once the header is known.
Window = Callable[[int, int], tuple[int, int]]

# Files up to this size are read whole in the first read; larger ones read _HEAD bytes of header first.
_WHOLE_FILE = 1 << 16
_HEAD = 4096
_MAX_CHANNELS = 1024  # libsndfile's SF_MAX_CHANNELS

_PCM, _FLOAT, _EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
_GUID_TAIL = b"\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"  # KSDATAFORMAT_SUBTYPE_* after the tag
_AMBISONIC_TAIL = b"\x21\x07\xd3\x11\x86\x44\xc8\xc1\xca\x00\x00\x00"  # ambisonic B-format sub-types
_U8_SCALE = ((np.arange(256) - 128) / 128).astype(np.float32)  # exact: every value is k / 128
_SCALE = {2: np.float32(2.0 ** -15), 3: np.float32(2.0 ** -31), 4: np.float32(2.0 ** -31)}
_SUBTYPES = {(1, False): "PCM_U8", (2, False): "PCM_16", (3, False): "PCM_24", (4, False): "PCM_32",
             (4, True): "FLOAT", (8, True): "DOUBLE"}
# Chunks whose parsing in libsndfile can fail, misalign or replace what we read: they go to libsndfile.
_RIFF_DECLINE = frozenset({b"RIFF", b"RIFX", b"INFO", b"smpl", b"acid", b"cart"})
_RF64_DECLINE = frozenset({b"RIFF", b"RIFX", b"RF64", b"INFO", b"cart", b"ds64"})
_LIST_TYPES = (b"INFO", b"adtl")
_u32 = struct.Struct("<I").unpack_from
_header = struct.Struct("<4sI").unpack_from
_fmt = struct.Struct("<HHIIHH").unpack_from
_ds64 = struct.Struct("<QQQI").unpack_from


class WavInfo(NamedTuple):
    """What the header of a WAV file says, as libsndfile would report it.

    Attributes:
        frames: frames of audio (libsndfile's count: truncated files count what is really there).
        channels: interleaved channels per frame.
        samplerate: frames per second.
        subtype: libsndfile's name for the sample format: ``"PCM_U8"``, ``"PCM_16"``, ``"PCM_24"``,
            ``"PCM_32"``, ``"FLOAT"`` or ``"DOUBLE"``.
        container: ``"WAV"``, ``"WAVEX"`` (extensible format header) or ``"RF64"``.
        data_offset: the byte offset of the first frame.
        block_align: bytes per frame.
    """

    frames: int
    channels: int
    samplerate: int
    subtype: str
    container: str
    data_offset: int
    block_align: int


class _Reader:
    """Bytes of a file or buffer by offset, served from the first read where it covers them."""

    __slots__ = ("head", "size", "file")

    def __init__(self, head: Buffer, size: int, file=None) -> None:
        self.head = head
        self.size = size
        self.file = file

    def get(self, offset: int, n: int) -> Buffer:
        end = offset + n
        if end <= len(self.head) or self.file is None:
            return self.head[offset:end]
        if offset >= self.size:
            return b""
        self.file.seek(offset)
        return self.file.read(min(n, self.size - offset))


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
        view = memoryview(source).cast("B")
        return _parse(_Reader(view, len(view)))
    try:
        with open(source, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            return _parse(_Reader(f.read(min(size, _HEAD)), size, f))
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
        view = memoryview(source).cast("B")
        reader = _Reader(view, len(view))
        return _read(reader, start, frames, window)
    try:
        with open(source, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            return _read(_Reader(f.read(size if size <= _WHOLE_FILE else _HEAD), size, f),
                         start, frames, window)
    except OSError:  # libsndfile reports it in its own words
        return None


# -- reading -------------------------------------------------------------------------------------

def _read(reader: _Reader, start: int, frames: int | None,
          window: Window | None) -> tuple[np.ndarray, int] | None:
    info = _parse(reader)
    if info is None:
        return None
    if window is not None:
        start, length = window(info.frames, info.samplerate)
    else:
        start = min(start, info.frames)
        length = info.frames - start if frames is None else min(frames, info.frames - start)
    bytewidth = info.block_align // info.channels
    offset = info.data_offset + start * info.block_align
    nbytes = length * info.block_align
    head = reader.head
    if offset + nbytes <= len(head):
        raw = np.frombuffer(head, np.uint8, nbytes, offset)
        fresh = False
    else:
        raw = np.empty(nbytes, np.uint8)
        if not _read_into(reader.file, offset, raw):
            return None
        fresh = True
    is_float = info.subtype in ("FLOAT", "DOUBLE")
    return _convert(raw, bytewidth, is_float, info.channels, fresh), info.samplerate


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


def _convert(raw: np.ndarray, bytewidth: int, is_float: bool, channels: int,
             fresh: bool) -> np.ndarray:
    """Little-endian samples in ``raw`` (uint8) as a (frames, channels) float32 array.

    ``fresh``: ``raw`` was allocated for this read, so the result may share its memory.
    """
    if is_float:
        if bytewidth == 4:
            out = raw.view("<f4").astype(np.float32, copy=not fresh)
        else:
            with np.errstate(over="ignore"):  # out of float32's range: inf, as the C cast gives
                out = raw.view("<f8").astype(np.float32)
    elif bytewidth == 1:
        out = _U8_SCALE[raw]
    elif bytewidth == 3:
        wide = np.zeros((len(raw) // 3, 4), np.uint8)
        wide[:, 1:] = raw.reshape(-1, 3)  # the 24 bits in the top of an int32, as libsndfile does
        out = np.multiply(wide.view("<i4").reshape(-1), _SCALE[3], dtype=np.float32)
    else:
        out = np.multiply(raw.view("<i2" if bytewidth == 2 else "<i4"), _SCALE[bytewidth],
                          dtype=np.float32)
    return out.reshape(-1, channels)


# -- parsing -------------------------------------------------------------------------------------

def _parse(reader: _Reader) -> WavInfo | None:
    """Walk the chunks as libsndfile's wav.c / rf64.c do; ``None`` at the first thing not handled."""
    try:
        return _walk(reader)
    except (struct.error, IndexError, KeyError, ValueError):  # bytes no branch below expects
        return None


def _walk(reader: _Reader) -> WavInfo | None:
    first = reader.get(0, 12)
    if len(first) < 12 or bytes(first[8:12]) != b"WAVE":
        return None
    magic = bytes(first[:4])
    if magic == b"RIFF":
        rf64 = False
    elif magic == b"RF64":
        rf64 = True
    else:
        return None
    size = reader.size
    riff_size = 0 if rf64 else _u32(first, 4)[0]  # RF64 takes it from the ds64 chunk
    if not rf64 and size < riff_size + 8:
        riff_size = size - 8
    fmt = None
    data: tuple[int, int] | None = None  # (offset, length in bytes)
    ds64_length: int | None = None
    pos = 12
    if pos >= size - 4:
        return None
    while True:
        hdr = reader.get(pos, 8)
        if len(hdr) < 8:
            return None
        marker, chunk_size = _header(hdr)
        body = pos + 8
        consumed = chunk_size
        if marker == b"\0\0\0\0":
            break
        if marker == b"data":
            if fmt is None or data is not None:
                return None
            if rf64:
                if ds64_length is None:
                    return None
                length = ds64_length
            else:
                length = chunk_size
            if chunk_size == 0 and riff_size == 8 and size > 44:
                length = size - body  # "a WAV file which wasn't closed properly"
            data = (body, length)
            if rf64:
                consumed = length
            else:
                consumed = min(length, size - body) + (chunk_size & 1)
            chunk_size = 0  # libsndfile skips its "chunk larger than the file" test for data
            peek = bytes(reader.get(body, 4))
            if peek in (b"wvpk", b"OggS"):
                return None
        elif marker == b"fmt ":
            if fmt is not None:
                return None
            fmt = _parse_fmt(reader.get(body, chunk_size), chunk_size)
            if fmt is None:
                return None
        elif marker == b"ds64" and rf64 and pos == 12:
            fields = reader.get(body, 28)
            if chunk_size < 28 or len(fields) < 28:
                return None
            riff_size, ds64_length, _, table = _ds64(fields)
            if chunk_size != 28 + table:
                return None
        elif marker == b"PEAK":
            if fmt is None or (rf64 and ds64_length is None) or chunk_size != 8 + 8 * fmt[0]:
                return None
        elif marker == b"LIST":
            if not _list_is_clean(reader, body, chunk_size):
                return None
        elif marker in (_RF64_DECLINE if rf64 else _RIFF_DECLINE):
            return None
        elif not rf64 and marker == b"fact":
            if chunk_size < 4:
                return None
        elif not rf64 and marker == b"cue ":
            count = reader.get(body, 4)
            if chunk_size < 4 or len(count) < 4:
                return None
            count = _u32(count)[0]
            if count <= 2500 and 4 + 24 * count > chunk_size:
                return None
        elif marker in (b"bext", b"JUNK", b"PAD "):
            pass
        elif not all(32 <= c <= 126 for c in marker):
            # libsndfile stops parsing here, or resynchronises byte by byte (not followed here)
            if chunk_size < 0xFFFF0000 and body & 3:
                return None
            break
        elif chunk_size >= 0xFFFF0000:
            break
        end = body + consumed
        if chunk_size >= size or end >= size - 4:
            break
        pos = end if rf64 else end + (chunk_size & 1)
    if data is None or fmt is None:  # data is only set after fmt
        return None
    channels, samplerate, bytewidth, is_float, container = fmt
    if rf64:
        container = "RF64"
    offset, length = data
    block = channels * bytewidth
    frames = max(0, min(length, size - offset)) // block
    return WavInfo(frames, channels, samplerate, _SUBTYPES[bytewidth, is_float], container, offset, block)


def _parse_fmt(b: Buffer, size: int) -> tuple | None:
    """(channels, samplerate, bytewidth, is_float, container) from a ``fmt `` chunk, or None."""
    if size < 16 or len(b) < size:
        return None
    tag, channels, samplerate, _, block_align, bits = _fmt(b)
    container = "WAV"
    if tag == _EXTENSIBLE:
        if size < 40:
            return None
        guid = bytes(b[24:40])
        if guid[4:] != _GUID_TAIL and guid[4:] != _AMBISONIC_TAIL or guid[:4] not in (
                b"\x01\0\0\0", b"\x03\0\0\0"):
            return None
        tag = guid[0]
        container = "WAVEX"
    if tag == _PCM:
        if not 0 < bits <= 32:
            return None
        is_float = False
    elif tag == _FLOAT:
        if bits not in (32, 64):
            return None
        is_float = True
    else:
        return None
    bytewidth = (bits + 7) // 8
    if (not 0 < channels <= _MAX_CHANNELS or block_align != channels * bytewidth
            or not 0 < samplerate < 2 ** 31):
        return None
    return channels, samplerate, bytewidth, is_float, container


def _list_is_clean(reader: _Reader, body: int, size: int) -> bool:
    """Whether libsndfile reads exactly this LIST chunk: INFO/adtl sub-chunks that tile it exactly."""
    if size < 4 or size & 1 or body + size > reader.size:
        return False
    content = reader.get(body, size)
    if len(content) < size or bytes(content[:4]) not in _LIST_TYPES:
        return False
    at = 4
    while at < size:
        if size - at < 8:
            return False
        sub, sub_size = _header(content, at)
        if sub in (b"data", b"exif", b"INFO", b"adtl", b"\0\0\0\0") or (sub == b"labl" and sub_size < 4):
            return False
        at += 8 + sub_size + (sub_size & 1)
    return at == size
