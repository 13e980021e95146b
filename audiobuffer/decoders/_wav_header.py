"""The header walk of the native WAV reader (``_wav.py``): the chunks, as libsndfile's parser reads them.

Where it is not sure to give libsndfile's answer, it returns ``None`` and the file goes to libsndfile
(NOTE [ WAV header walk ]).

NOTE [ WAV header walk ]
========================
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

The frame count follows libsndfile: the smaller of the ``data`` size and the bytes the file really
holds, over the block align (a truncated file is read as far as its data goes; a ``data`` size of 0
in a file whose RIFF size is 8 means "to the end of the file").
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

__all__ = ["Buffer", "Reader", "WavInfo", "parse"]

Buffer = bytes | bytearray | memoryview

_MAX_CHANNELS = 1024  # libsndfile's SF_MAX_CHANNELS
_PCM, _FLOAT, _EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
_GUID_TAIL = b"\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"  # KSDATAFORMAT_SUBTYPE_* after the tag
_AMBISONIC_TAIL = b"\x21\x07\xd3\x11\x86\x44\xc8\xc1\xca\x00\x00\x00"  # ambisonic B-format sub-types
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
# RIFF, size, "WAVEfmt ", 16, tag, channels, rate, bytes/s, block align, bits, "data", size: the
# 44-byte header most WAV files have
_plain_header = struct.Struct("<4sI8sIHHIIHH4sI").unpack_from
# (tag, bits) -> (bytes per sample, subtype) for the common layouts of a plain header
_PLAIN_KINDS = {(_PCM, 8): (1, "PCM_U8"), (_PCM, 16): (2, "PCM_16"), (_PCM, 24): (3, "PCM_24"),
                (_PCM, 32): (4, "PCM_32"), (_FLOAT, 32): (4, "FLOAT"), (_FLOAT, 64): (8, "DOUBLE")}
# The first bytes of a data chunk that is WavPack or Ogg inside a RIFF wrapper: libsndfile's own.
_WRAPPED = (b"wvpk", b"OggS")


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


class Reader:
    """Bytes of a file or buffer by offset, served from the first read where it covers them."""

    __slots__ = ("head", "size", "file")

    def __init__(self, head: Buffer, size: int, file: Any = None) -> None:
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


def parse(reader: Reader) -> WavInfo | None:
    """Walk the chunks as libsndfile's wav.c / rf64.c do; ``None`` at the first thing not handled."""
    try:
        return _plain(reader) or _walk(reader)
    except (struct.error, IndexError, KeyError, ValueError):  # bytes no branch below expects
        return None


def _plain(reader: Reader) -> WavInfo | None:
    """What :func:`_walk` gives for the plain 44-byte header (a 16-byte ``fmt `` chunk, then ``data``
    running to the end of the file), without the walk; ``None`` for every other file (walk it).

    The walk, step by step, for such a file of at least 44 bytes: it reads ``fmt `` and then ``data``,
    and stops there, because the data chunk (plus its pad byte) reaches within 4 bytes of the end.
    A data size of 0 (which may mean "to the end of the file") is left to the walk.
    Most WAV files have this header, so it is one ``unpack`` and a dict lookup, with no call
    it can avoid: it runs once per file, with the GIL held.
    """
    head, size = reader.head, reader.size
    if size < 44 or len(head) < 44:
        return None
    riff, _, wave_fmt, fmt_size, tag, channels, samplerate, _, block_align, bits, data_id, length = (
        _plain_header(head))
    if (riff != b"RIFF" or wave_fmt != b"WAVEfmt " or fmt_size != 16 or data_id != b"data"
            or length == 0 or 44 + min(length, size - 44) + (length & 1) < size - 4
            or bytes(head[44:48]) in _WRAPPED):
        return None
    kind = _PLAIN_KINDS.get((tag, bits))
    if kind is None:  # PCM of 1-7, 9-15, ... bits (held in whole bytes), or what the walk declines
        fmt = _parse_fmt(head[20:36], 16)
        if fmt is None:
            return None
        channels, samplerate, bytewidth, is_float, _ = fmt
        kind = bytewidth, _SUBTYPES[bytewidth, is_float]
    bytewidth, subtype = kind
    block = channels * bytewidth
    if block_align != block or not 0 < channels <= _MAX_CHANNELS or not 0 < samplerate < 2 ** 31:
        return None
    return WavInfo(min(length, size - 44) // block, channels, samplerate, subtype, "WAV", 44, block)


def _walk(reader: Reader) -> WavInfo | None:
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
            if peek in _WRAPPED:
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


def _list_is_clean(reader: Reader, body: int, size: int) -> bool:
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
