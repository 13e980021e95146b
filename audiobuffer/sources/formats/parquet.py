"""Hugging Face audio and image datasets in Parquet: :class:`ParquetStream`, a source that streams
row groups.

NOTE [ Parquet audio datasets ]
===============================
A Hugging Face audio dataset on disk or in a hub repository is a set of Parquet files whose ``audio``
column is a struct of the encoded file's ``bytes`` and its original ``path`` (what
``datasets.Audio(decode=False)`` stores; an image dataset's ``image`` column, what
``datasets.Image()`` stores, is read the same way); the other columns are the sample's fields.
Such a file is read the way tar shards are streamed (NOTE [ Streamed shards ] in ``stream.py``),
with a **row group** as the unit of work: the epoch plan shuffles the row groups and splits them by
rank and DataLoader worker, a producer reads one row group (one request per column chunk, never a
row at a time) and decodes its samples from the bytes in memory, with ``shuffle=True`` through a
seeded shuffle buffer, and resume is at
row-group boundaries. The number of rows comes from each file's footer, so ``len()`` is known before
anything else is read; with ``labels=`` naming a column, only that column is read to list the classes. A
column that ``datasets`` declares a ``ClassLabel`` (in the ``huggingface`` schema metadata) gives
its names in its order, so a sample's ``label`` is the dataset's own number; every file must declare
the same names.

A row whose audio holds a path and no bytes (what ``datasets`` writes for an ``Audio`` column cast
from paths) is read from the file its path names when it is decoded, through the Parquet file's
storage; with ``path_column="audio.path"`` every row is. The path is confined as a manifest's paths
are (``listing.py``): a remote file's rows stay in its bucket or host (a path starting with ``/``
starts at its root; another scheme, bucket or host fails); a local file's relative paths join its
folder and its absolute paths are read where they point (a local file is the user's own, as a local
manifest is), but never a URL, a device or a pipe. A row that cannot be read fails alone
(``on_error`` applies).

A sample's ``path`` is ``<file>/<row>/<original name>`` (``<file>/<row>`` without a name), so label
regular expressions read the original names. Remote files are read through fsspec with the storage
timeouts and retries of :mod:`~audiobuffer.sources.storage`, a column chunk per ranged request.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import DecodeError, SourceError, StorageError
from ..storage import Storage, inside_bucket, is_url
from ..tar import ShardSample

__all__ = ["AUDIO_COLUMN", "IMAGE_COLUMN", "RowFile", "RowSample", "audio_column", "class_names",
           "holds_audio", "is_parquet", "open_parquet", "read_row_group", "row_file", "row_name"]

#: The column :class:`ParquetStream` reads audio from unless told otherwise (``datasets``' default name).
AUDIO_COLUMN = "audio"
#: The column it reads images from where there is no :data:`AUDIO_COLUMN`.
IMAGE_COLUMN = "image"


def is_parquet(spec: Any) -> bool:
    """Whether a source spec names Parquet files (a path, URL, pattern or list ending ``.parquet``)."""
    if isinstance(spec, (str, os.PathLike)):
        return os.fspath(spec).lower().endswith(".parquet")
    if isinstance(spec, Sequence) and spec and all(isinstance(s, (str, os.PathLike)) for s in spec):
        return all(os.fspath(s).lower().endswith(".parquet") for s in spec)
    return False


def holds_audio(spec: Any, *, storage: Storage) -> bool:
    """Whether Parquet files ``spec`` hold encoded audio (a Hugging Face dataset), judged by the
    first file's schema (read through ``storage``); ``False`` for a Parquet manifest of paths (or
    for files that cannot be read: the manifest's reader then names what is wrong)."""
    try:
        urls = storage.expand_urls(spec)
        if not urls:
            return False
        schema = open_parquet(urls[0], storage=storage).schema_arrow
    except (SourceError, StorageError, ValueError):
        return False
    try:
        audio_column(schema, urls[0])
    except SourceError:
        if AUDIO_COLUMN in schema.names:  # meant as audio, stored otherwise
            raise SourceError(f"column {AUDIO_COLUMN!r} of Parquet file {urls[0]!r} holds "
                              f"{schema.field(AUDIO_COLUMN).type}, not encoded audio: a struct of bytes and path, "
                              f"as datasets.Audio(decode=False) stores it") from None
        if _encoded_columns(schema):  # several, none named: which one is the user's to say
            raise
        return False
    return True


def _pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency
        raise SourceError("reading Parquet needs pyarrow: pip install pyarrow") from exc
    return pq


class _RangeFile:
    """A read-only, seekable file over ranged reads of a remote object (what pyarrow reads a footer and
    column chunks through), each read retried and bounded by the storage timeout."""

    def __init__(self, url: str, size: int, storage: Storage) -> None:
        self.url, self.size, self._storage = url, size, storage
        self._pos = 0
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        n = self.size - self._pos if n is None or n < 0 else min(n, self.size - self._pos)
        if n <= 0:
            return b""
        data = self._storage.read_range(self.url, self._pos, n)
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: offset, 1: self._pos + offset, 2: self.size + offset}[whence]
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def open_parquet(url: str, *, storage: Storage) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` of a local path or a URL (read through ``storage``).

    Raises:
        StorageError: the file cannot be read.
        SourceError: it is not a Parquet file.
    """
    pq = _pyarrow()
    import pyarrow as pa

    if is_url(url):
        handle: Any = _RangeFile(url, storage.size(url), storage)
    else:
        handle = url
    try:
        return pq.ParquetFile(handle)
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise SourceError(f"Parquet file {url!r} does not exist") from exc
        raise SourceError(f"{url!r} is not a Parquet file pyarrow can read ({exc})") from exc


def audio_column(schema: Any, url: str, wanted: str | None = None) -> str:
    """The name of the column of encoded audio or images: a struct with a binary ``bytes`` field
    (what ``datasets.Audio`` and ``datasets.Image`` store).

    Without ``wanted``: the column named ``"audio"``, else the one named ``"image"``, else the only
    such column; several others are ambiguous (a segmentation mask beside its photo, say).

    Raises:
        SourceError: there is none, ``wanted`` is not one, or several are and none is named
            ``"audio"`` or ``"image"``; the message lists the columns.
    """
    names = list(schema.names)
    found = _encoded_columns(schema)
    if wanted is not None:
        if wanted not in found:
            raise SourceError(f"Parquet file {url!r} has no audio or image column {wanted!r} "
                              f"(a struct of bytes and path, as datasets.Audio and datasets.Image "
                              f"store); its columns are {names}")
        return wanted
    if not found:
        raise SourceError(f"Parquet file {url!r} has no audio or image column (a struct of bytes "
                          f"and path, as datasets.Audio and datasets.Image store); its columns are "
                          f"{names}")
    named = [n for n in (AUDIO_COLUMN, IMAGE_COLUMN) if n in found]
    if named:
        return named[0]
    if len(found) > 1:
        raise SourceError(f"Parquet file {url!r} has {len(found)} columns of encoded audio or "
                          f"images, {found}, and none is named {AUDIO_COLUMN!r} or "
                          f"{IMAGE_COLUMN!r}: name the one to decode "
                          f"(ParquetStream(audio_column=...))")
    return found[0]


def _encoded_columns(schema: Any) -> list[str]:
    """The columns of ``schema`` that hold encoded files: structs with a binary ``bytes`` field."""
    import pyarrow as pa

    def is_encoded(kind: Any) -> bool:
        if not pa.types.is_struct(kind) or kind.get_field_index("bytes") < 0:
            return False
        data = kind.field("bytes").type
        return bool(pa.types.is_binary(data) or pa.types.is_large_binary(data))

    return [field.name for field in schema if is_encoded(field.type)]


def class_names(schema: Any) -> dict[str, list[str]]:
    """The label names of each ``ClassLabel`` column that ``datasets`` recorded in the file's metadata."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return {}
    try:
        features = json.loads(raw).get("info", {}).get("features", {})
    except (ValueError, AttributeError):
        return {}
    out = {}
    for name, feature in features.items() if isinstance(features, dict) else ():
        if (isinstance(feature, dict) and feature.get("_type") == "ClassLabel"
                and isinstance(feature.get("names"), list)):
            out[name] = [str(n) for n in feature["names"]]
    return out


def row_name(file: str, row: int, original: str | None) -> str:
    """A sample's name inside its file: ``<row>/<original name>``, or ``<row>`` without one."""
    base = original.replace("\\", "/").rpartition("/")[2] if original else ""
    return f"{row}/{base}" if base else str(row)


def read_row_group(file: Any, url: str, group: int, first_row: int, column: str, *,
                   storage: Storage,
                   from_paths: bool = False) -> Generator[ShardSample, None, None]:
    """The samples of row group ``group`` of ``file`` (its first row is row ``first_row`` of the file).

    A row without audio bytes (every row, with ``from_paths``) is a :class:`RowSample` whose audio
    is read from the file its path names when it is decoded (:class:`RowFile`), through
    ``storage``; a row that names none fails then, alone.

    Raises:
        DecodeError: the row group cannot be read (a damaged file); the message names file and row group.
    """
    import pyarrow as pa

    try:
        table = file.read_row_group(group)
    except (pa.ArrowException, OSError) as exc:
        raise DecodeError(f"row group {group} of Parquet file {url!r} cannot be read ({exc})", path=url) from exc
    audio = table.column(column).combine_chunks()
    data = audio.field("bytes").to_pylist()
    paths = (audio.field("path").to_pylist() if audio.type.get_field_index("path") >= 0
             else [None] * table.num_rows)
    others = [n for n in table.column_names if n != column]
    columns = {n: table.column(n).to_pylist() for n in others}
    for i in range(table.num_rows):
        fields = {n: values[i] for n, values in columns.items()}
        row = first_row + i
        name = row_name(url, row, paths[i])
        payload = None if from_paths else data[i]
        if payload is None:  # read (or failed) when it is decoded, alone
            read = RowFile(url, row, paths[i], storage=storage)
            yield RowSample(shard=url, key=str(row), files={}, member=name, name=name, data=b"",
                            meta=None, fields=fields, read=read)
            continue
        yield ShardSample(shard=url, key=str(row), files={}, member=name, name=name, data=payload,
                          meta=None, fields=fields)


@dataclass(frozen=True)
class RowSample(ShardSample):
    """A row's sample whose audio is not in the row: ``read`` gets it (or raises a DecodeError)."""

    read: Callable[[], bytes] | None = None


def row_file(url: str, path: str) -> str:
    """The file a row of Parquet file ``url`` names by ``path`` (NOTE [ Parquet audio datasets ]).

    Raises:
        ValueError: ``path`` leaves a remote file's bucket or host, is a URL in a local file, or
            holds a NUL.
    """
    if "\0" in path:
        raise ValueError("the path holds a NUL character")
    if is_url(url):
        return inside_bucket(url, path)
    if is_url(path):
        raise ValueError("a URL in a local Parquet file: its rows' files are read from local paths")
    file = Path(path)
    return str(file if file.is_absolute() else Path(url).parent / file)


class RowFile:
    """The read of a row's audio from the file its path names (:func:`row_file`), through the
    Parquet file's storage; each failure a :class:`DecodeError` naming the row, the path and the
    file. Thread-safe."""

    def __init__(self, url: str, row: int, path: str | None, *, storage: Storage) -> None:
        self.url, self.row, self.path, self.storage = url, row, path, storage

    def __call__(self) -> bytes:
        where = f"row {self.row} of Parquet file {self.url!r}"
        if not self.path:
            raise DecodeError(f"{where} holds neither audio bytes nor a path to its file",
                              path=self.url)
        try:
            file = row_file(self.url, self.path)
        except ValueError as exc:
            raise DecodeError(f"{where} names {self.path!r}, which is not read: {exc}",
                              path=self.url) from exc
        try:
            if not is_url(file) and not stat.S_ISREG(os.stat(file).st_mode):
                raise DecodeError(f"{where} names {self.path!r}: {file!r} is not a regular file",
                                  path=self.url)
            return self.storage.read_bytes(file)
        except (StorageError, OSError) as exc:
            read_as = "" if file == self.path else f" as {file!r}"
            raise DecodeError(f"{where} names {self.path!r}, which cannot be read{read_as}: {exc}",
                              path=self.url) from exc
