"""Where the work items come from: files, manifests, indexes of shards, and labels.

A :class:`Source` is listed once (a folder with glob patterns, a CSV/TSV/JSONL manifest, an
``index.json`` of shards, or a list; local or through fsspec), labels resolved, and is immutable
afterwards; it turns an epoch plan's indices into :class:`WorkItem` objects as producers ask for them.
What data files name stays inside the data: a remote manifest's paths inside its bucket or host, an
index's shards inside its folder (``allow_outside`` lifts both). Tar shards without an index are
streamed instead (:class:`~audiobuffer.sources.stream.ShardStream`).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Union

import numpy as np

from ..errors import SourceError
from . import storage
from .index import Member, read_index
from .lhotse import is_lhotse, read_lhotse
from .storage import RetrySpec, as_retry, is_url, read_bytes

__all__ = [
    "AUDIO_PATTERNS",
    "IMAGE_PATTERNS",
    "LABEL_COLUMN",
    "LabelSpec",
    "Listing",
    "MANIFEST_SUFFIXES",
    "ReadClock",
    "Source",
    "SourceSpec",
    "WorkItem",
    "list_source",
    "names_shards",
]


MANIFEST_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
#: The column of an index's (or a shard sidecar's) label name, as ``labels=`` names it.
LABEL_COLUMN = "label"


@dataclass
class Listing:
    """What a source lists.

    Attributes:
        paths: the files (paths or URLs; an index member's ``<shard>/<name>``).
        description: the source, for messages.
        fields: each file's sample fields (a manifest's other columns), or ``None``.
        rows: what ``labels=`` may name a column of (the fields, plus an index's ``label``), or ``None``.
        columns: those columns.
        members: an index's members (read by range), or ``None``.
        segments: each item's part of its file as ``(start, duration)`` seconds (a Lhotse cut's), or ``None``.
    """

    paths: list[str]
    description: str
    fields: list[dict[str, Any]] | None = None
    rows: list[dict[str, Any]] | None = None
    columns: list[str] = field(default_factory=list)
    members: tuple[Member, ...] | None = None
    segments: list[tuple[float, float | None]] | None = None


def names_shards(source: Any) -> bool:
    """Whether ``source`` names tar shards: a path, URL or pattern ending in ``.tar``, or a list of them."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source).lower().endswith(".tar")
    return (isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)) and len(source) > 0
            and all(isinstance(p, (str, os.PathLike)) and os.fspath(p).lower().endswith(".tar") for p in source))


def list_source(source: Any, *, patterns: Sequence[str], path_column: str,
                storage_options: Mapping[str, Any] | None, retry: RetrySpec, allow_outside: bool = False) -> Listing:
    """List ``source``: a folder, a manifest, an ``index.json`` of shards (paths or URLs), or a list of files.

    What data names is confined unless ``allow_outside``: an index's shards to its folder, a remote
    manifest's files to its bucket or host (a local manifest is the user's own: any path).

    Raises:
        SourceError: the source does not exist, is malformed or cannot be listed.
        StorageError: a remote manifest or index cannot be read.
        TypeError: ``source`` is none of these.
    """
    if names_shards(source):
        raise SourceError(f"{source!r} names tar shards: without their index they are streamed, which "
                          f"BufferedDataset does; for random access give the shards' index.json")
    if is_lhotse(source, storage_options=storage_options, retry=retry):
        lhotse = read_lhotse(source, storage_options=storage_options, retry=retry, allow_outside=allow_outside)
        columns = list(dict.fromkeys(k for row in lhotse.fields for k in row))
        return Listing(lhotse.paths, lhotse.description, lhotse.fields, lhotse.fields, columns,
                       segments=lhotse.segments)
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        suffix = Path(text.split("?", 1)[0]).suffix.lower() if storage.is_url(text) else Path(text).suffix.lower()
        if suffix == ".json":
            return _list_index(text, storage_options, retry, allow_outside)
        if storage.is_url(text):
            if suffix in MANIFEST_SUFFIXES:
                data = storage.read_bytes(text, storage_options=storage_options, retry=retry)
                resolve = storage.sibling if allow_outside else storage.inside_bucket
                hint = "" if allow_outside else "; pass allow_outside=True to Source to read files elsewhere"
                return _manifest(text, io.StringIO(_text(data, text), newline=""), MANIFEST_SUFFIXES[suffix],
                                 path_column, lambda value: resolve(text, value), hint)
            return _list_remote_dir(text, patterns, storage_options, retry)
        root = Path(text)
        if root.is_dir():
            return Listing(_list_dir(root, patterns), f"{str(root)!r} (patterns {list(patterns)})")
        if suffix in MANIFEST_SUFFIXES:
            if not root.is_file():
                raise SourceError(f"manifest {str(root)!r} does not exist")
            try:
                # utf-8-sig: the byte order mark that spreadsheet programs write is not part of the first column.
                with open(root, newline="", encoding="utf-8-sig") as f:
                    return _manifest(str(root), f, MANIFEST_SUFFIXES[suffix], path_column,
                                     lambda value: _beside(root, Path(value)))
            except (OSError, UnicodeDecodeError) as exc:
                raise SourceError(f"cannot read manifest {str(root)!r}: {exc}") from exc
        if root.exists():
            raise SourceError(
                f"source {str(root)!r} is neither a directory nor a manifest (expected one of "
                f"{sorted(MANIFEST_SUFFIXES)}) nor an index of shards (.json); pass a list to use single files")
        raise SourceError(f"source {str(root)!r} does not exist")
    if isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)):
        bad = [p for p in source if not isinstance(p, (str, os.PathLike))]
        if bad:
            raise TypeError(f"a source list must hold file paths, got {bad[0]!r}")
        paths = [os.fspath(p) for p in source]
        for n, p in enumerate(paths):
            if "\0" in p:
                raise SourceError(f"source list entry {n}: the path {p[:80]!r} holds a NUL character")
        return Listing(paths, f"a list of {len(paths)} paths")
    raise TypeError(f"source must be a directory, a manifest file, an index of shards, a pattern of .tar "
                    f"shards or a list of paths, got {source!r}")


def _beside(manifest: Path, file: Path) -> str:
    return str(file if file.is_absolute() else manifest.parent / file)


def _list_dir(root: Path, patterns: Sequence[str]) -> list[str]:
    found: set[str] = set()
    for pattern in _patterns(patterns):
        found.update(str(p) for p in root.glob(pattern) if p.is_file())
    return sorted(found)


def _list_remote_dir(url: str, patterns: Sequence[str], storage_options: Mapping[str, Any] | None,
                     retry: RetrySpec) -> Listing:
    base = url.rstrip("/")
    found: set[str] = set()
    for pattern in _patterns(patterns):
        found.update(storage.glob_urls(f"{base}/{pattern}", storage_options=storage_options, retry=retry))
        if pattern.startswith("**/"):  # fsspec's ** may or may not match no folder at all: both, to be sure
            found.update(storage.glob_urls(f"{base}/{pattern[3:]}", storage_options=storage_options, retry=retry))
    return Listing(sorted(found), f"{url!r} (patterns {list(patterns)})")


def _patterns(patterns: Sequence[str]) -> list[str]:
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise TypeError(f"patterns must be non-empty glob strings, got {pattern!r}")
    return patterns


def _text(data: bytes, url: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(f"cannot read manifest {url!r}: {exc}") from exc


def _manifest(name: str, f: IO[str], kind: str, path_column: str, resolve: Any, hint: str = "") -> Listing:
    """The files of a manifest read from ``f``; ``resolve`` turns a path column value into a path or URL
    (a ``ValueError`` for one it refuses, reported with ``hint``)."""
    rows: list[dict[str, Any]] = []
    columns: list[str] = []
    try:
        if kind == "jsonl":
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SourceError(f"manifest {name!r} line {lineno}: invalid JSON ({exc})") from exc
                except RecursionError as exc:
                    raise SourceError(f"manifest {name!r} line {lineno}: JSON nested too deeply to be a row") from exc
                if not isinstance(row, dict):
                    raise SourceError(f"manifest {name!r} line {lineno}: expected a JSON object, got {row!r}")
                rows.append(row)
                columns.extend(k for k in row if k not in columns)
        else:
            reader = csv.DictReader(f, delimiter="\t" if kind == "tsv" else ",")
            columns = list(reader.fieldnames or [])
            rows = list(reader)
    except csv.Error as exc:
        raise SourceError(f"cannot read manifest {name!r}: {exc}") from exc
    if path_column not in columns:
        raise SourceError(f"manifest {name!r} has no path column {path_column!r}; its columns are {columns}")
    paths: list[str] = []
    fields: list[dict[str, Any]] = []
    for n, row in enumerate(rows):
        value = row.get(path_column)
        if not isinstance(value, str) or not value:
            raise SourceError(f"manifest {name!r} row {n + 1}: empty or missing {path_column!r}")
        if "\0" in value:  # the C libraries would open the path cut at the NUL
            raise SourceError(f"manifest {name!r} row {n + 1}: the path {value[:80]!r} holds a NUL character")
        try:
            paths.append(resolve(value))
        except ValueError as exc:  # a path leaving a remote manifest's bucket or host
            raise SourceError(f"manifest {name!r} row {n + 1}: {exc}{hint}") from exc
        fields.append({k: v for k, v in row.items() if k != path_column})
    return Listing(paths, f"manifest {name!r}", fields, fields, columns)


def _list_index(url: str, storage_options: Mapping[str, Any] | None, retry: RetrySpec,
                allow_outside: bool) -> Listing:
    if not storage.is_url(url) and not Path(url).is_file():
        raise SourceError(f"index {url!r} does not exist")
    index = read_index(url, storage_options=storage_options, retry=retry, allow_outside=allow_outside)
    members = index.members
    fields = [dict(m.fields) for m in members]
    columns = [LABEL_COLUMN, *dict.fromkeys(k for row in fields for k in row if k != LABEL_COLUMN)]
    rows = [{**row, LABEL_COLUMN: m.label} for m, row in zip(members, fields)]
    return Listing([m.path for m in members], f"index {url!r} ({len(index.shards)} shards)", fields, rows,
                   columns, members)


#: Glob patterns a directory source matches by default: the audio containers libsndfile reads.
AUDIO_PATTERNS: tuple[str, ...] = (
    "**/*.wav", "**/*.flac", "**/*.ogg", "**/*.opus", "**/*.mp3", "**/*.aiff", "**/*.aif", "**/*.sph",
)
#: Glob patterns an :class:`~audiobuffer.ImageDecoder` reads from a directory by default: the common
#: formats Pillow decodes, with the upper-case suffixes cameras write.
IMAGE_PATTERNS: tuple[str, ...] = (
    "**/*.png", "**/*.jpg", "**/*.jpeg", "**/*.bmp", "**/*.gif", "**/*.tif", "**/*.tiff", "**/*.webp",
    "**/*.PNG", "**/*.JPG", "**/*.JPEG",
)
#: Characters that make a ``labels`` string a regular expression rather than a manifest column name.
_REGEX_CHARS = frozenset(".^$*+?{}[]|()\\")

SourceSpec = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]
LabelSpec = Union[None, str, "re.Pattern[str]", Callable[[str], Hashable]]


@dataclass(frozen=True, init=False)
class WorkItem:
    """One unit of work for a decoder: a file, its label and metadata, and where it sits in the epoch.

    Attributes:
        index: the item's position in the source (stable across epochs and shards).
        path: the file to decode.
        label: the class index of the label (into ``Source.classes``), or ``None`` without labels.
        label_name: the label as found (folder name, regex match or manifest value), or ``None``.
        fields: the other columns of a manifest row (empty for directories and file lists; ``None``
            given to the constructor means empty).
        epoch: the epoch this item belongs to.
        seed: the dataset's seed.
        seq: the item's position in this shard's order for this epoch (0, 1, 2, ...).
        read: ``None`` (decoders open ``path``), or a callable returning the file's bytes (a member
            of a tar shard, an object in remote storage), called by the decoder in its thread.
        segment: ``None`` (the whole file), or the part of the file this item is, as ``(start,
            duration)`` in seconds (``duration`` ``None``: to the end): an utterance in a long
            recording. :class:`~audiobuffer.AudioDecoder` reads only that part, and crops within it.
    """

    index: int
    path: str
    label: int | None = None
    label_name: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    epoch: int = 0
    seed: int = 0
    seq: int = 0
    read: Callable[[], bytes] | None = field(default=None, compare=False, repr=False)
    segment: tuple[float, float | None] | None = None

    def __init__(self, index: int, path: str, label: int | None = None, label_name: str | None = None,
                 fields: Mapping[str, Any] | None = None, epoch: int = 0, seed: int = 0, seq: int = 0,
                 read: Callable[[], bytes] | None = None, segment: tuple[float, float | None] | None = None
                 ) -> None:
        # One item is made per sample, in the consumer's thread when it decodes inline. A frozen
        # dataclass's own __init__ sets each field through object.__setattr__; writing the instance
        # dict directly gives the same object for a fraction of the time (BENCHMARKS.md).
        attrs = self.__dict__
        attrs["index"] = index
        attrs["path"] = path
        attrs["label"] = label
        attrs["label_name"] = label_name
        attrs["fields"] = {} if fields is None else fields
        attrs["epoch"] = epoch
        attrs["seed"] = seed
        attrs["seq"] = seq
        attrs["read"] = read
        attrs["segment"] = segment

    def rng(self) -> np.random.Generator:
        """A random generator seeded by (seed, epoch, index).

        Random choices made with it (a random crop, say) are reproducible whatever thread decodes
        the item and in whatever order.
        """
        return np.random.default_rng([self.seed, self.epoch, self.index])


class ReadClock:
    """Seconds producers spent waiting for bytes (reads of members, objects and shard blocks). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds

    def timed(self, read: Callable[[], bytes]) -> Callable[[], bytes]:
        """``read``, its time counted here."""
        def timed_read() -> bytes:
            start = time.perf_counter()
            try:
                return read()
            finally:
                self.add(time.perf_counter() - start)
        return timed_read


def _natural_key(name: str) -> tuple[int, Any]:
    """Sort numbers numerically and before words, so class "10" comes after class "9"."""
    try:
        return (0, int(name))
    except ValueError:
        return (1, name)


class Source:
    """The files of a dataset with their labels and fields, local or remote.

    Args:
        source: a directory (matched with ``patterns``), a CSV/TSV/JSONL manifest with a path column,
            the ``index.json`` of packed shards (members read by byte range), or a list of file
            paths; each may be a URL (``s3://``, ``gs://``, ``https://``...) read through fsspec.
        patterns: glob patterns, relative to a directory source (``**`` recurses).
        labels: where labels come from: ``None`` (no labels); ``"parent"`` (the parent folder's name);
            the name of a manifest column (of an index: ``"label"``, the label it was packed with, or
            a packed manifest's column); a regular expression searched in the file name (its first
            group, or the whole match without groups; a member's original name); or a callable from
            path to label.
        path_column: the manifest column that holds the file paths; relative paths are resolved
            against the manifest's folder (or URL).
        storage_options: options for the fsspec filesystem of URLs (``{"endpoint_url": ..., "key":
            ..., "secret": ...}``), passed to every remote read.
        retry: how transient storage failures are retried (:class:`~audiobuffer.sources.storage.Retry`).
        start_column: a manifest column of where each row starts in its file, in seconds: each row is
            then a segment of its file (:attr:`WorkItem.segment`), ``duration_column`` seconds long (to
            the end of the file without one).
        duration_column: with ``start_column``, the column of each segment's duration in seconds.
        allow_outside: read what an index or a remote manifest names wherever it points. Without it
            (the default), an index's shards must lie inside the index's folder and a remote
            manifest's files inside its bucket or host (relative paths, ``..`` within the bucket, and
            ``/``-rooted keys are fine), so data from elsewhere cannot make the loader read other
            files (``../../secret``, ``/etc/passwd``, ``file:///...``) or other hosts. A local
            manifest is yours and names any path. ``BufferedDataset`` takes a ``Source`` made with it.

    A remote file's or index member's work item reads its bytes in the producer thread that decodes
    it (:attr:`WorkItem.read`): one request per file, one ranged request sized to the member.

    Raises:
        SourceError: the source does not exist, a manifest or index is malformed or names a file
            outside its folder or bucket, no file matched, or a file name does not match the label
            expression.
        StorageError: a remote manifest, index or listing cannot be read.
    """

    def __init__(self, source: SourceSpec, *, patterns: Sequence[str] = AUDIO_PATTERNS,
                 labels: LabelSpec = None, path_column: str = "path",
                 storage_options: Mapping[str, Any] | None = None, retry: RetrySpec = None,
                 allow_outside: bool = False, start_column: str | None = None,
                 duration_column: str | None = None) -> None:
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"storage_options must be a mapping of fsspec options or None, got {storage_options!r}")
        if not isinstance(allow_outside, bool):
            raise TypeError(f"allow_outside must be True or False, got {allow_outside!r}")
        listing = list_source(source, patterns=patterns, path_column=path_column,
                              storage_options=storage_options, retry=retry, allow_outside=allow_outside)
        self.description: str = listing.description
        self.paths: list[str] = listing.paths
        self.fields: list[dict[str, Any]] | None = listing.fields
        #: fsspec options for the URLs this source reads (``None``: none).
        self.storage_options = None if storage_options is None else dict(storage_options)
        self.retry = as_retry(retry)
        self._members = listing.members  # an index's members: read by range
        #: Each item's part of its file as ``(start, duration)`` seconds (a Lhotse cut's), or ``None``.
        self.segments = listing.segments
        if start_column is not None:
            self.segments = _segments(listing, start_column, duration_column)
        if not self.paths:
            raise SourceError(f"no files in {self.description}")
        self.label_names = _resolve_labels(labels, self.paths, listing.rows, listing.columns)
        names = {n for n in self.label_names if n is not None} if self.label_names else set()
        #: The sorted label names; a sample's ``label`` is an index into this list.
        self.classes: list[str] = sorted(names, key=_natural_key)
        #: The label name to class index map.
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(self.classes)}

    def __len__(self) -> int:
        return len(self.paths)

    def __repr__(self) -> str:
        labels = f", classes={len(self.classes)}" if self.label_names is not None else ""
        return f"Source({self.description}, items={len(self.paths)}{labels})"

    @property
    def known_durations(self) -> list[float | None] | None:
        """Each item's duration in seconds where the source knows it without reading the file (an
        index's members, measured by ``audiobuffer pack``; ``None`` where unknown; a segment's own
        duration), else ``None``."""
        if self.segments is not None and all(d is not None for _, d in self.segments):
            return [d for _, d in self.segments]
        return None if self._members is None else [m.duration for m in self._members]

    def _has_urls(self) -> bool:
        """Whether any path is a URL (looked at once; local paths then skip the test per item)."""
        has = self.__dict__.get("_urls")
        if has is None:
            has = self.__dict__["_urls"] = any(is_url(p) for p in self.paths)
        return has

    def fingerprint(self) -> str:
        """A digest of the file list (its order included): a saved state names the source it came from."""
        fingerprint = self.__dict__.get("_fingerprint")
        if fingerprint is None:
            digest = hashlib.sha256()
            for path in self.paths:
                digest.update(path.encode("utf-8", "surrogateescape") + b"\0")
            if self.segments is not None:  # the cuts of one recording share its path
                digest.update(repr(self.segments).encode())
            fingerprint = self.__dict__["_fingerprint"] = f"{len(self.paths)}:{digest.hexdigest()[:16]}"
        return fingerprint

    def subset(self, indices: Sequence[int]) -> Source:
        """A source of the files at ``indices``, keeping this source's classes (so label indices agree).

        Use it to split one source into train and test sets.
        """
        part = object.__new__(Source)
        part.description = f"{len(indices)} files of {self.description}"
        part.paths = [self.paths[i] for i in indices]
        part.fields = None if self.fields is None else [self.fields[i] for i in indices]
        part.storage_options, part.retry = self.storage_options, self.retry
        part._members = None if self._members is None else tuple(self._members[i] for i in indices)
        part.segments = None if self.segments is None else [self.segments[i] for i in indices]
        part.label_names = None if self.label_names is None else [self.label_names[i] for i in indices]
        part.classes = list(self.classes)
        part.class_to_idx = dict(self.class_to_idx)
        if not part.paths:
            raise SourceError(f"an empty subset of {self.description}")
        return part

    def item(self, index: int, *, epoch: int = 0, seed: int = 0, seq: int = 0,
             clock: ReadClock | None = None) -> WorkItem:
        """The work item for the source's ``index``-th file (with ``read`` set for an index member or a URL,
        its time counted by ``clock`` when given)."""
        name = self.label_names[index] if self.label_names else None
        path = self.paths[index]
        read: Callable[[], bytes] | None = None
        if self._members is not None:  # one ranged request, sized to the member
            read = self._members[index].reader(storage_options=self.storage_options, retry=self.retry)
        elif self._has_urls() and is_url(path):
            read = functools.partial(read_bytes, path, storage_options=self.storage_options, retry=self.retry)
        if read is not None and clock is not None:
            read = clock.timed(read)
        return WorkItem(index, path, None if name is None else self.class_to_idx[name], name,
                        None if self.fields is None else self.fields[index], epoch, seed, seq, read,
                        None if self.segments is None else self.segments[index])


def _segments(listing: Listing, start_column: str, duration_column: str | None) -> list[tuple[float, float | None]]:
    """Each row's segment of its file from a manifest's start (and duration) columns.

    Raises:
        SourceError: the source has no such column, or a row's value is not a number of seconds >= 0.
    """
    if listing.fields is None:
        raise SourceError(f"start_column={start_column!r} reads a manifest's column; {listing.description} has "
                          f"no columns")
    for column in (start_column, duration_column):
        if column is not None and column not in listing.columns:
            raise SourceError(f"{listing.description} has no column {column!r}; its columns are {listing.columns}")

    def seconds(row: int, column: str) -> float:
        value = listing.fields[row].get(column)  # type: ignore[index]  # checked above
        try:
            number = float(value)  # type: ignore[arg-type]  # CSV text or JSON numbers
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not math.isfinite(number) or number < 0:
            raise SourceError(f"{listing.description} row {row + 1}: {column} {value!r} is not a number of seconds "
                              f">= 0")
        return number

    return [(seconds(i, start_column), None if duration_column is None else seconds(i, duration_column))
            for i in range(len(listing.paths))]


def _resolve_labels(labels: LabelSpec, paths: list[str], fields: list[dict[str, Any]] | None,
                    columns: list[str]) -> list[str | None] | None:
    if labels is None:
        return None
    if callable(labels) and not isinstance(labels, re.Pattern):
        return [_label_str(labels(p)) for p in paths]
    if labels == "parent":
        return [Path(p).parent.name for p in paths]
    if isinstance(labels, str) and fields is not None and labels in columns:
        return [_label_str(row.get(labels)) for row in fields]
    if isinstance(labels, str) and fields is not None and not _REGEX_CHARS.intersection(labels):
        # A plain word on a manifest is a column name with a typo far more often than a regex: as a
        # regex it could only match itself and give every file the same label.
        raise SourceError(
            f"labels={labels!r} is not a column of the manifest; its columns are {columns}. For a regular "
            f"expression searched in the file names, pass re.compile({labels!r}) or one with a group")
    if isinstance(labels, str):
        try:
            pattern = re.compile(labels)
        except re.error as exc:
            raise ValueError(
                f"labels must be 'parent', a manifest column, a callable or a regular expression; "
                f"{labels!r} is not a valid regular expression ({exc})") from exc
    elif isinstance(labels, re.Pattern):
        pattern = labels
    else:
        raise TypeError(f"labels must be None, 'parent', a column name, a regex or a callable, got {labels!r}")
    names: list[str | None] = []
    for p in paths:
        match = pattern.search(os.path.basename(p))
        if match is None:
            hint = (f" (labels is not a column of the manifest either; its columns are {columns})"
                    if fields is not None else "")
            raise SourceError(f"file {p!r} does not match the label expression {pattern.pattern!r}{hint}")
        names.append(match.group(1) if pattern.groups else match.group(0))
    return names


def _label_str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)
