"""The duration of each item of a source, for batches by duration: from a manifest column or from
each file's header, the headers read once in parallel and cached on disk (NOTE [ Duration cache ]).

NOTE [ Duration cache ]
=======================
One file per corpus folder (the deepest folder holding all of a source's files) in the cache folder:
an Arrow IPC file of four columns, each file's absolute path, size, modification time (ns) and
duration, read and matched against a source's paths in bulk, with no Python object per entry. An
entry counts only while the file's size and modification time are unchanged, so a second run over
the same files opens none of them (it only looks up their size and modification time), and a changed
file is read again. The file is replaced atomically (a temporary file and ``os.replace``); a cache
file that cannot be read, or holds other columns, is ignored and rewritten. Processes reading the
same files at once (DDP ranks) read the file again before writing it: one that finds every header it
read there (another rank wrote them meanwhile) leaves the file as it is, and one that Windows does
not let replace it (another process holds it open) leaves the other's copy. Sources that share a
folder share its cache file, so a train and a test split read each header once. Failed headers are
not cached: they are tried again on the next run.
"""
from __future__ import annotations

import hashlib
import logging
import math
import numbers
import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np
import soundfile as sf

from ..buffer import WAIT_SLICE
from ..decoders._sndfile import read_to_end, sndfile_path
from ..errors import DecodeError, SourceError
from ..sources.table import ABSENT, seconds_array, seconds_of

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

#: The cache file's columns and their types, as pyarrow names them.
_CACHE_COLUMNS = {"path": "large_binary", "size": "int64", "mtime_ns": "int64", "seconds": "double"}
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
        with sf.SoundFile(sndfile_path(path)) as f:
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
    elif known is not None and table.offsets is not None and not np.isnan(known).all():
        raise _missing_from_index(source, known)
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


def _missing_from_index(source: Any, known: np.ndarray) -> SourceError:
    """The error for an index that records the durations of some members and not of others: it names the
    first member without one, and its shard."""
    table = source.table
    missing = np.flatnonzero(np.isnan(known))
    i = int(missing[0])
    member, shard = table.members[i], table.shards[table.shard_of[i]]
    return SourceError(f"batches by duration need each item's duration, and {len(missing)} of {len(known)} "
                       f"members of {source.description} have none in it, the first member {member!r} of shard "
                       f"{shard!r} (null: its header could not be read as audio when the index was made): "
                       f"mend or drop that member and index the shards again (`audiobuffer index`), or give "
                       f"duration_column (a field of every member that holds its duration)")


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
    cache_file = None if folder is None else folder / f"{digest}.arrow"
    cached = _Entries.load(cache_file)
    row = cached.rows_of(keys)  # each key's entry in the cache, -1: none
    durations = np.full(len(paths), np.nan)
    stamps = np.zeros((len(paths), 2), dtype=np.int64)  # size and modification time of each header read
    fresh = np.zeros(len(paths), dtype=bool)  # read from its header now: a new entry
    failures: list[Failure] = []

    def read(start: int) -> list[tuple[int, Exception]]:
        """Fill in the durations of the chunk from ``start``; return its errors."""
        errors: list[tuple[int, Exception]] = []
        for i in range(start, min(start + _CHUNK, len(paths))):
            try:
                stat = os.stat(keys[i])
                r = row[i]
                if r >= 0 and cached.sizes[r] == stat.st_size and cached.mtimes[r] == stat.st_mtime_ns:
                    durations[i] = cached.seconds[r]
                else:
                    durations[i] = header_seconds(paths[i])
                    stamps[i] = (stat.st_size, stat.st_mtime_ns)
                    fresh[i] = True
            except Exception as exc:  # noqa: BLE001 - reported per on_error below
                errors.append((i, exc))
        return errors

    first_error: tuple[int, str, Exception] | None = None
    starts = range(0, len(paths), _CHUNK)
    # The pool's threads (audiobuffer-durations_N) are joined before this function returns, whatever
    # happens: shutdown(wait=True) in the finally, after cancelling the chunks not yet started.
    pool = ThreadPoolExecutor(max_workers=max(1, min(num_threads, len(starts))),
                              thread_name_prefix="audiobuffer-durations")
    try:
        for future in [pool.submit(read, start) for start in starts]:
            for i, exc in _result(future):
                message = _describe(paths[i], exc)
                if on_error == "raise":
                    first_error = (i, message, exc)
                    break
                failures.append((i, paths[i], message))
            if first_error is not None:
                break
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if cache_file is not None and fresh.any():
        new = np.flatnonzero(fresh)
        fresh_paths = _encoded([keys[i] for i in new.tolist()])
        once = _firsts(fresh_paths)  # a file listed twice: one entry
        new = new[once]
        entries = _Entries(fresh_paths.take(once), stamps[new, 0], stamps[new, 1], durations[new])
        now = _Entries.load(cache_file, warn=False)  # another rank may have written it meanwhile: then leave it
        if not now.holds(entries):
            now.merged(cached).merged(entries).save(cache_file, root)
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


def _encoded(paths: list[str]) -> Any:
    import pyarrow as pa

    return pa.array([p.encode("utf-8", "surrogateescape") for p in paths], type=pa.large_binary())


def _firsts(paths: Any) -> np.ndarray:
    """Where each distinct path of ``paths`` (a pyarrow array) first comes, in order."""
    import pyarrow.compute as pc

    _, first = np.unique(np.asarray(pc.dictionary_encode(paths).indices), return_index=True)
    return np.sort(first)


class _Entries:
    """Entries of the duration cache, in columns (NOTE [ Duration cache ]): each file's absolute path
    (a pyarrow array of its UTF-8 bytes, undecodable names as POSIX keeps them), size, modification
    time (ns) and duration in seconds (numpy arrays)."""

    def __init__(self, paths: Any, sizes: np.ndarray, mtimes: np.ndarray, seconds: np.ndarray) -> None:
        self.paths = paths if not isinstance(paths, list) else _encoded(paths)
        self.sizes, self.mtimes, self.seconds = sizes, mtimes, seconds

    def __len__(self) -> int:
        return len(self.sizes)

    @classmethod
    def load(cls, file: Path | None, *, warn: bool = True) -> _Entries:
        """The entries of a cache file; none when it is missing or cannot be read (a warning unless ``warn``
        is false: the second read of one run). Entries whose values are impossible are left out."""
        empty = cls([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))
        if file is None:
            return empty
        import pyarrow as pa
        import pyarrow.ipc

        try:
            with pa.OSFile(str(file), "rb") as f:  # read whole and closed: Windows replaces no open file
                table = pa.ipc.open_file(f).read_all()
            # Every offset and length checked: pyarrow trusts what a file says, and a damaged one (a path
            # said to end before it starts, or past the data) would crash the bulk matching below.
            table.validate(full=True)
        except FileNotFoundError:
            return empty
        except (OSError, ValueError, pa.ArrowException) as exc:  # ValueError: a column name not UTF-8
            if warn:
                logger.warning("ignoring the duration cache %s, which cannot be read (%s); it will be rewritten",
                               file, exc)
            return empty
        if {field.name: str(field.type) for field in table.schema} != _CACHE_COLUMNS:
            if warn:
                logger.warning("ignoring the duration cache %s, whose columns are not %s; it will be rewritten",
                               file, ", ".join(_CACHE_COLUMNS))
            return empty
        table = table.combine_chunks()
        paths = table.column("path").combine_chunks()
        sizes, mtimes, seconds = (table.column(name).to_numpy() for name in ("size", "mtime_ns", "seconds"))
        good = np.asarray(paths.is_valid(), dtype=bool) & (sizes >= 0) & np.isfinite(seconds) & (seconds >= 0)
        keep = np.flatnonzero(good)
        return cls(paths.take(pa.array(keep)), sizes[keep], mtimes[keep], seconds[keep])

    def rows_of(self, keys: Any) -> np.ndarray:
        """Each of ``keys``' row here, or -1 (``keys``: paths, or a pyarrow array of them as ``paths`` has)."""
        import pyarrow.compute as pc

        keys = _encoded(keys) if isinstance(keys, list) else keys
        if not len(self) or not len(keys):
            return np.full(len(keys), -1, dtype=np.int64)
        found = pc.index_in(keys, value_set=self.paths)
        return np.asarray(pc.fill_null(found, -1), dtype=np.int64)

    def holds(self, other: _Entries) -> bool:
        """Whether every entry of ``other`` is here, the same."""
        rows = self.rows_of(other.paths)
        return bool((rows >= 0).all() and (self.sizes[rows] == other.sizes).all()
                    and (self.mtimes[rows] == other.mtimes).all() and (self.seconds[rows] == other.seconds).all())

    def merged(self, newer: _Entries) -> _Entries:
        """These entries and ``newer``'s, which replace those of the same paths."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if not len(self):
            return newer
        keep = pa.array(np.flatnonzero(~np.asarray(pc.is_in(self.paths, value_set=newer.paths), dtype=bool)))
        k = np.asarray(keep, dtype=np.int64)
        return _Entries(pa.concat_arrays([self.paths.take(keep), newer.paths]),
                        np.concatenate([self.sizes[k], newer.sizes]), np.concatenate([self.mtimes[k], newer.mtimes]),
                        np.concatenate([self.seconds[k], newer.seconds]))

    def save(self, file: Path, root: str) -> None:
        """Write the entries to ``file`` atomically; a failure is logged, never raised (the cache is optional)."""
        import pyarrow as pa
        import pyarrow.ipc

        table = pa.table({"path": self.paths, "size": self.sizes, "mtime_ns": self.mtimes, "seconds": self.seconds},
                         metadata={"root": root.encode("utf-8", "surrogateescape")})
        temp = None
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            handle, temp = tempfile.mkstemp(dir=file.parent, prefix=file.name + ".", suffix=".tmp")
            with os.fdopen(handle, "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
                writer.write_table(table)
            try:
                os.replace(temp, file)
            except PermissionError as exc:  # Windows: another process (a rank reading it) holds the file open
                logger.info("the duration cache %s is open in another process, which keeps its copy (%s)", file, exc)
                return  # the temporary file goes in the finally
            temp = None
            try:
                file.with_suffix(".json").unlink(missing_ok=True)  # this folder's cache as earlier versions wrote it
            except OSError:
                pass
        except (OSError, pa.ArrowException) as exc:
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
