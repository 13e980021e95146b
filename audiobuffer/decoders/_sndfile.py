"""Reading a libsndfile stream whose header gives no frame count (FLAC without a total-samples field).

python-soundfile's ``read`` seeks after every read, and libsndfile cannot seek in a stream of unknown
length (it reports 2**63 - 1 frames), so the last read of such a file fails ("Internal psf_fseek()
failed") although libsndfile decodes it whole. Here libsndfile's own reader is called block by block
and the stream's error state checked once at the end: a file that really breaks off is still an error.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import soundfile as sf

__all__ = ["BLOCK_FRAMES", "read_to_end", "sndfile_path"]

#: Frames decoded per call.
BLOCK_FRAMES = 65536


def sndfile_path(path: str) -> str | bytes:
    """``path`` as libsndfile opens it: as it is, but on POSIX a file name that is not UTF-8 (which Python
    keeps with surrogate escapes, and soundfile would encode strictly) as its bytes (``os.fsencode``).
    Windows opens the string by its wide-character name."""
    if sys.platform == "win32" or path.isascii():  # isascii: a flag of the string, no pass over it
        return path
    try:
        path.encode(sys.getfilesystemencoding())
    except UnicodeEncodeError:
        return os.fsencode(path)
    return path


def read_to_end(f: sf.SoundFile, *, count_only: bool = False) -> tuple[np.ndarray | None, int, str | None]:
    """Decode ``f`` from its position to the end: ``(float32 (frames, channels) or None, frames, error)``.

    ``error`` is libsndfile's message when decoding stopped on an error (the frames before it are
    returned), else ``None``. ``count_only`` decodes into one reused block and returns no array.
    """
    snd: Any = getattr(sf, "_snd", None)
    ffi: Any = getattr(sf, "_ffi", None)
    if snd is None or ffi is None:  # a python-soundfile without them: read as it reads, to its failing end
        return _read_public(f, count_only)
    blocks: list[np.ndarray] = []
    frames = 0
    block = np.empty((BLOCK_FRAMES, f.channels), dtype=np.float32)
    while True:
        pointer = ffi.cast("float *", block.ctypes.data)  # ``block`` outlives every use of ``pointer``
        read = int(snd.sf_readf_float(f._file, pointer, BLOCK_FRAMES))
        frames += read
        if not count_only and read:
            blocks.append(block[:read].copy() if read < BLOCK_FRAMES else block)
            block = np.empty_like(block) if read == BLOCK_FRAMES else block
        if read < BLOCK_FRAMES:
            break
    code = snd.sf_error(f._file)
    error = ffi.string(snd.sf_error_number(code)).decode("utf-8", "replace") if code else None
    if count_only:
        return None, frames, error
    data = np.concatenate(blocks) if blocks else np.zeros((0, f.channels), dtype=np.float32)
    return data, frames, error


def _read_public(f: sf.SoundFile, count_only: bool) -> tuple[np.ndarray | None, int, str | None]:
    blocks: list[np.ndarray] = []
    frames = 0
    try:
        while True:
            block = f.read(BLOCK_FRAMES, dtype="float32", always_2d=True)
            frames += len(block)
            if len(block) and not count_only:
                blocks.append(block)
            if len(block) < BLOCK_FRAMES:
                break
    except Exception as exc:
        return (None if count_only else _joined(blocks, f.channels)), frames, str(exc)
    return (None if count_only else _joined(blocks, f.channels)), frames, None


def _joined(blocks: list[np.ndarray], channels: int) -> np.ndarray:
    return np.concatenate(blocks) if blocks else np.zeros((0, channels), dtype=np.float32)
