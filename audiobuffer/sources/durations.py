"""The duration of each item of a source, for batches by duration: from a manifest column or from
each file's header, the headers read once in parallel and cached on disk (NOTE [ Duration cache ]).

NOTE [ Duration cache ]
=======================
One JSON file per corpus folder (the deepest folder holding all of a source's files) in the cache
folder, mapping each file's absolute path to its size, modification time (ns) and duration. An
entry counts only while the file's size and modification time are unchanged, so a second run over
the same files opens none of them (it only looks up their size and modification time), and a
changed file is read again. The file is replaced atomically (a temporary file and ``os.replace``); a
cache file that cannot be read or parsed is ignored and rewritten. Processes reading the same files
at once (DDP ranks) read the file again before writing it: one that finds every header it read there
(another rank wrote them meanwhile) leaves the file as it is, and one that Windows does not let
replace it (another process holds it open) leaves the other's copy. Sources that share a folder share
its cache file, so a train and a test split read each header once. Failed headers are not cached:
they are tried again on the next run.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import numbers
import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeGuard, Union

import numpy as np
import soundfile as sf

from ..buffer import WAIT_SLICE
from ..decoders._sndfile import read_to_end
from ..errors import DecodeError, SourceError
from .table import ABSENT, seconds_array, seconds_of

__all__ = [
    "CACHE_ENV",
    "Failure",
    "cache_root",
    "decoder_crop",
    "default_cache_dir",
    "header_seconds",
    "read_durations",
    "seconds_of",
]

logger = logging.getLogger(__name__)

#: The environment variable that moves the default cache folder.
CACHE_ENV = "AUDIOBUFFER_CACHE_DIR"
#: One failed header: ``(index, path, message)``.
Failure = tuple[int, str, str]
CacheDir = Union[str, "os.PathLike[str]", None, Literal[False]]

_CACHE_FORMAT = 1
# libsndfile reports 2**63 - 1 frames for streams whose header carries no length (FLAC without a
# total-samples field, as AudioDecoder notes): such files are counted by reading them once.
_UNKNOWN_FRAMES = 2**62
_BLOCK_FRAMES = 65536
# Paths per task of the thread pool: few tasks for a large corpus, all of them busy for a small one.
_CHUNK = 64
# Failures named one by one in the warning of on_error="warn"; the rest are counted.
_WARN_LISTED = 10
_POLICIES = ("raise", "warn", "skip")


def _result(future: Future[Any]) -> Any:
    """``future.result()``, waited for in slices: the trainer's thread waits here (NOTE [ Interruptible waits ])."""
    while True:
        try:
            return future.result(timeout=WAIT_SLICE)
        except TimeoutError:
            if future.done():  # the work itself raised it
                raise


def cache_root() -> Path:
    """audiobuffer's cache folder: ``$AUDIOBUFFER_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/audiobuffer``,
    else ``~/.cache/audiobuffer`` (the header cache and the demo's corpus live in it)."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "audiobuffer"


def default_cache_dir() -> Path:
    """The header cache: ``durations/`` in :func:`cache_root`."""
    return cache_root() / "durations"


def header_seconds(path: str) -> float:
    """The duration of the audio file at ``path`` in seconds, from its header (frames / sample rate).

    A file whose header gives no frame count (FLAC without a total-samples field) is read once to
    count its frames.

    Raises:
        DecodeError: the file cannot be opened, has no sample rate, or its frames cannot be counted.
    """
    try:
        with sf.SoundFile(path) as f:
            rate, frames = f.samplerate, f.frames
            if frames >= _UNKNOWN_FRAMES:
                frames = _count_frames(f, path)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"cannot read the header of {path!r}: {type(exc).__name__}: {exc}", path=path) from exc
    if rate <= 0:
        raise DecodeError(f"cannot read the header of {path!r}: sample rate {rate}", path=path)
    return frames / rate


def _count_frames(f: sf.SoundFile, path: str) -> int:
    """The frames of an open file whose header gives no count, counted by decoding it once."""
    _, frames, error = read_to_end(f, count_only=True)
    if error is not None:
        raise DecodeError(f"cannot read the duration of {path!r}: its header gives no frame count and decoding "
                          f"failed after {frames} frames ({error})", path=path)
    return frames


def read_durations(source: Any, *, duration_column: str | None = None, crop_seconds: float | None = None,
                   num_threads: int = 8, cache_dir: CacheDir = None,
                   on_error: Literal["raise", "warn", "skip"] = "raise") -> tuple[np.ndarray, list[Failure]]:
    """The duration in seconds of each item of ``source``, and the items whose header failed.

    Args:
        source: a :class:`~audiobuffer.sources.source.Source` (its ``paths``, and ``fields`` for a manifest).
        duration_column: a manifest column holding each item's duration in seconds; ``None`` reads
            each file's header instead.
        crop_seconds: caps each duration (a decoder that crops yields at most this much), or ``None``.
        num_threads: threads reading headers at once (file opens wait on the disk, not the CPU).
        cache_dir: the folder of the header cache; ``None``: :func:`default_cache_dir`; ``False``:
            no cache.
        on_error: a header that cannot be read: ``"raise"`` a :class:`~audiobuffer.DecodeError` naming
            the file; ``"warn"`` (logged) or ``"skip"``: the item's duration is ``NaN`` (batches leave it
            out) and it is listed in the failures.

    Returns:
        ``(durations, failures)``: a float64 array with one duration per item (``NaN`` for a failed
        header) and the failures as ``(index, path, message)``, by index.

    Raises:
        SourceError: ``duration_column`` is missing from a manifest row or holds a value that is not
            a duration (the message names the row and the value).
        DecodeError: a header failed with ``on_error="raise"``.
        TypeError, ValueError: an option of the wrong type or value (the message names it).
    """
    if duration_column is not None and not isinstance(duration_column, str):
        raise TypeError(f"duration_column must be a manifest column name or None, got {duration_column!r}")
    if crop_seconds is not None:
        if isinstance(crop_seconds, bool) or not isinstance(crop_seconds, numbers.Real):
            raise TypeError(f"crop_seconds must be a number of seconds > 0 or None, got {crop_seconds!r}")
        if not (math.isfinite(crop_seconds) and crop_seconds > 0):
            raise ValueError(f"crop_seconds must be a finite number of seconds > 0 or None, got {crop_seconds!r}")
    if isinstance(num_threads, bool) or not isinstance(num_threads, numbers.Integral):
        raise TypeError(f"num_threads must be an integer >= 1, got {num_threads!r}")
    if num_threads < 1:
        raise ValueError(f"num_threads must be an integer >= 1, got {num_threads!r}")
    if on_error not in _POLICIES:
        raise ValueError(f"on_error must be one of {_POLICIES}, got {on_error!r}")
    if not (cache_dir is None or cache_dir is False or isinstance(cache_dir, (str, os.PathLike))):
        raise TypeError(f"cache_dir must be a folder, None (the default folder) or False (no cache), got {cache_dir!r}")
    table = getattr(source, "table", None)
    known = table.durations if table is not None else None
    if duration_column is not None:
        durations, failures = _from_column(source, duration_column), []
    elif known is not None and not np.isnan(known).any():  # an index of packed shards
        durations, failures = np.array(known, dtype=np.float64), []
    elif known is not None or source.has_urls():
        raise SourceError(f"batches by duration need each item's duration, and {source.description} has none "
                          f"to read a header from locally: give duration_column (a manifest column), or pack the "
                          f"files with `audiobuffer pack`, whose index records each member's duration")
    else:
        folder = None if cache_dir is False else Path(default_cache_dir() if cache_dir is None else cache_dir)
        durations, failures = _from_headers(source.table.paths(), num_threads, folder, on_error)
    if crop_seconds is not None:
        durations = np.minimum(durations, float(crop_seconds))  # NaN stays NaN
    return durations, failures


def _from_column(source: Any, column: str) -> np.ndarray:
    """The column ``column`` of ``source``'s table read as seconds, in bulk."""
    table = source.table
    description = getattr(source, "description", "the source")
    if table.fields is None:
        raise ValueError(f"duration_column={column!r} needs a manifest source (CSV, TSV, JSONL or Parquet); "
                         f"{description} has no columns: leave duration_column out to read file headers")
    values = table.column(column)
    if values is None:
        others = [c for c in table.columns if c in table.fields]
        raise SourceError(f"{description} has no duration column {column!r}; its columns are "
                          f"{sorted(others)} (besides the path column)")
    durations, valid = seconds_array(values)
    bad = np.flatnonzero(~valid)
    if len(bad):
        n = int(bad[0])
        value = values[n]
        if value is ABSENT:
            raise SourceError(f"{description} row {n + 1} has no value in column {column!r}")
        raise SourceError(f"{description} row {n + 1}: column {column!r} holds {value!r}, not a duration "
                          f"(a finite number of seconds >= 0)")
    return durations


# -- headers and their cache --------------------------------------------------------------------

def _from_headers(paths: list[str], num_threads: int, folder: Path | None,
                  on_error: str) -> tuple[np.ndarray, list[Failure]]:
    keys = [os.path.abspath(p) for p in paths]
    root = _common_folder(keys)
    digest = hashlib.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    cache_file = None if folder is None else folder / f"{digest}.json"
    cached = {} if cache_file is None else _load(cache_file)
    durations = np.full(len(paths), np.nan)
    fresh: dict[str, list[Any]] = {}
    failures: list[Failure] = []

    def read(start: int) -> list[tuple[int, float, list[Any] | None, Exception | None]]:
        """The durations of the chunk from ``start``: (index, seconds, new cache entry, error)."""
        out: list[tuple[int, float, list[Any] | None, Exception | None]] = []
        for i in range(start, min(start + _CHUNK, len(paths))):
            try:
                stat = os.stat(keys[i])
                stamp = [stat.st_size, stat.st_mtime_ns]
                entry = cached.get(keys[i])
                if _valid(entry) and entry[:2] == stamp:
                    out.append((i, float(entry[2]), None, None))
                else:
                    seconds = header_seconds(paths[i])
                    out.append((i, seconds, [*stamp, seconds], None))
            except Exception as exc:  # noqa: BLE001 - reported per on_error below
                out.append((i, math.nan, None, exc))
        return out

    first_error: tuple[int, str, Exception] | None = None
    starts = range(0, len(paths), _CHUNK)
    # The pool's threads (audiobuffer-durations_N) are joined before this function returns, whatever
    # happens: shutdown(wait=True) in the finally, after cancelling the chunks not yet started.
    pool = ThreadPoolExecutor(max_workers=max(1, min(num_threads, len(starts))),
                              thread_name_prefix="audiobuffer-durations")
    try:
        for future in [pool.submit(read, start) for start in starts]:
            for i, seconds, entry, exc in _result(future):
                if exc is None:
                    durations[i] = seconds
                    if entry is not None:
                        fresh[keys[i]] = entry
                    continue
                message = _describe(paths[i], exc)
                if on_error == "raise":
                    first_error = (i, message, exc)
                    break
                failures.append((i, paths[i], message))
            if first_error is not None:
                break
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if cache_file is not None and fresh:
        now = _load(cache_file, warn=False)  # another rank may have written it meanwhile: then leave it
        if any(now.get(key) != entry for key, entry in fresh.items()):
            kept = {key: entry for key, entry in {**cached, **now}.items() if _valid(entry)}
            _save(cache_file, root, {**kept, **fresh})
    if first_error is not None:
        i, message, exc = first_error
        raise DecodeError(f"item {i}: {message}", path=paths[i], index=i) from exc
    if failures and on_error == "warn":
        listed = "; ".join(f"item {i}: {message}" for i, _, message in failures[:_WARN_LISTED])
        more = f"; and {len(failures) - _WARN_LISTED} more" if len(failures) > _WARN_LISTED else ""
        logger.warning("%d of %d headers could not be read, those items are left out: %s%s",
                       len(failures), len(paths), listed, more)
    return durations, failures


def _describe(path: str, exc: Exception) -> str:
    if isinstance(exc, DecodeError):
        return str(exc)  # names the file already
    if isinstance(exc, FileNotFoundError):
        return f"cannot read the header of {path!r}: no such file"
    return f"cannot read the header of {path!r}: {type(exc).__name__}: {exc}"


def _common_folder(keys: list[str]) -> str:
    """The deepest folder that holds all of ``keys`` (absolute paths); it names the cache file."""
    try:
        return os.path.commonpath([os.path.dirname(k) for k in keys]) if keys else ""
    except ValueError:  # Windows: paths on different drives
        return ""


def _valid(entry: Any) -> TypeGuard[list[Any]]:
    return (isinstance(entry, list) and len(entry) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) for v in entry[:2])
            and isinstance(entry[2], (int, float)) and not isinstance(entry[2], bool)
            and math.isfinite(entry[2]) and entry[2] >= 0)


def _load(file: Path, *, warn: bool = True) -> dict[str, list[Any]]:
    """The entries of a cache file; ``{}`` when it is missing or cannot be read or parsed (a warning
    unless ``warn`` is false: the second read of one run)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if warn:
            logger.warning("ignoring the duration cache %s, which cannot be read (%s); it will be rewritten", file,
                           exc)
        return {}
    if not isinstance(data, dict) or data.get("format") != _CACHE_FORMAT or not isinstance(data.get("entries"), dict):
        if warn:
            logger.warning("ignoring the duration cache %s, which is not a format-%d cache; it will be rewritten",
                           file, _CACHE_FORMAT)
        return {}
    return data["entries"]


def _save(file: Path, root: str, entries: dict[str, list[Any]]) -> None:
    """Write ``entries`` to ``file`` atomically; a failure is logged, never raised (the cache is optional)."""
    body = json.dumps({"format": _CACHE_FORMAT, "root": root, "entries": entries})
    temp = None
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=file.parent, prefix=file.name + ".", suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as f:
            f.write(body)
        try:
            os.replace(temp, file)
        except PermissionError as exc:  # Windows: another process (a rank reading it) holds the file open
            logger.info("the duration cache %s is open in another process, which keeps its copy (%s)", file, exc)
            return  # the temporary file goes in the finally
        temp = None
    except OSError as exc:
        logger.warning("cannot write the duration cache %s (%s); headers will be read again next time", file, exc)
    finally:
        if temp is not None:
            try:
                os.unlink(temp)
            except OSError:
                pass


def decoder_crop(decoder: Any) -> tuple[float | None, bool]:
    """``decoder``'s ``crop_seconds`` (``None`` without) and whether it pads every sample to that crop."""
    crop = getattr(decoder, "crop_seconds", None)
    crop = float(crop) if isinstance(crop, (int, float)) and not isinstance(crop, bool) else None
    return crop, crop is not None and getattr(decoder, "pad", False) is True
