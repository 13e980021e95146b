"""Where the work items come from: files, manifests, indexes of shards, and labels.

A :class:`Source` is listed once into an item table of columns (a folder with glob patterns, a
CSV/TSV/JSONL/Parquet manifest, an ``index.json`` of shards, or a list; local or through fsspec), labels
resolved, and is immutable afterwards; it turns an epoch plan's indices into :class:`WorkItem` objects
as producers ask for them.
What data files name stays inside the data: a remote manifest's paths inside its bucket or host, an
index's shards inside its folder (``allow_outside`` lifts both). Tar shards without an index are
streamed instead (:class:`~audiobuffer.sources.stream.ShardStream`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..errors import SourceError
from . import table as item_table
from .blocks import BlockReads
from .formats.lhotse import is_lhotse, read_lhotse
from .index import index_columns, read_member
from .item import AUDIO_PATTERNS, IMAGE_PATTERNS, ReadClock, WorkItem
from .listing import (
    LABEL_COLUMN,
    MANIFEST_SUFFIXES,
    Listing,
    list_files,
    names_shards,
    table_of_paths,
)
from .storage import RetrySpec, Storage, StorageUser, is_url
from .table import (
    ABSENT,
    Coded,
    Column,
    ItemTable,
    Region,
    Strings,
    TableView,
    as_column,
    numbers_arrow,
    seconds_array,
)

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


logger = logging.getLogger(__name__)

#: Characters that make a ``labels`` string a regular expression rather than a manifest column name.
_REGEX_CHARS = frozenset(".^$*+?{}[]|()\\")

SourceSpec = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]
LabelSpec = Union[None, str, "re.Pattern[str]", Callable[[str], Hashable]]


def list_source(source: Any, *, patterns: Sequence[str], path_column: str, storage: Storage,
                allow_outside: bool = False) -> Listing:
    """List ``source``: a folder, a manifest, an ``index.json`` of shards (paths or URLs, read
    through ``storage``), or a list of files.

    What data names is confined unless ``allow_outside``: an index's shards to its folder, a remote
    manifest's files to its bucket or host (a local manifest is the user's own: any path).

    Raises:
        SourceError: the source does not exist, is malformed or cannot be listed.
        StorageError: a remote manifest or index cannot be read.
        TypeError: ``source`` is none of these.
    """
    if is_lhotse(source):
        return _list_lhotse(source, storage, allow_outside)
    if isinstance(source, (str, os.PathLike)) and not names_shards(source):
        text = os.fspath(source)
        if Path(text.split("?", 1)[0] if is_url(text) else text).suffix.lower() == ".json":
            return _list_index(text, storage, allow_outside)
    return list_files(source, patterns=patterns, path_column=path_column, storage=storage,
                      allow_outside=allow_outside)


def _list_index(url: str, storage: Storage, allow_outside: bool) -> Listing:
    if not is_url(url) and not Path(url).is_file():
        raise SourceError(f"index {url!r} does not exist")
    index = index_columns(url, storage=storage, allow_outside=allow_outside)
    shards = index.shards
    keys = list(index.fields)
    table = table_of_paths(_member_paths(shards, index.shard_of, index.names),
                           columns=[LABEL_COLUMN, *(k for k in keys if k != LABEL_COLUMN)], fields=index.fields,
                           labels=index.labels, shards=list(shards), shard_of=index.shard_of, offsets=index.offsets,
                           sizes=index.sizes, members=index.members, durations=index.durations)
    return Listing(table, f"index {url!r} ({len(shards)} shards)", classes=index.classes)


def _member_paths(shards: Sequence[str], shard_of: np.ndarray, names: Strings) -> Any:
    """Each member's ``<shard>/<name>``: joined by pyarrow (a string array) in a large index, or one by one
    (a list) in a small one (:data:`~audiobuffer.sources.table.ARROW_ROWS`) or where a name is not UTF-8."""
    if len(names) >= item_table.ARROW_ROWS:
        try:
            import pyarrow as pa
            import pyarrow.compute as pc

            # Not pa.array or pa.scalar: they import pandas (sources/table.py says why that matters).
            slash = Strings.from_strings(["/"]).arrow().cast(pa.large_string())[0]
            folders = Strings.from_strings(shards).arrow().cast(pa.large_string()).take(
                numbers_arrow(shard_of.astype(np.int64)))
            return pc.binary_join_element_wise(folders, names.arrow().cast(pa.large_string()), slash)
        except (ImportError, ValueError):  # pa.ArrowInvalid: a name of undecodable bytes
            pass
    return [shards[s] + "/" + name for s, name in zip(shard_of.tolist(), names.tolist())]


def _list_lhotse(source: Any, storage: Storage, allow_outside: bool) -> Listing:
    """A Lhotse manifest's items: each a segment of its recording (NOTE [ Lhotse manifests ] in
    ``formats/lhotse.py``)."""
    found = read_lhotse(source, storage=storage, allow_outside=allow_outside)
    keys = list(dict.fromkeys(k for row in found.fields for k in row))
    fields = {key: as_column([row.get(key, ABSENT) for row in found.fields]) for key in keys}
    segments = np.array([(start, np.nan if duration is None else duration) for start, duration in found.segments],
                        dtype=np.float64).reshape(-1, 2)
    durations = np.array([np.nan if d is None else d for d in (row.get("duration") for row in found.fields)],
                         dtype=np.float64)
    table = table_of_paths(found.paths, columns=keys, fields=fields, durations=durations, segments=segments)
    return Listing(table, found.description)


def _segments(table: ItemTable, description: str, start_column: str, duration_column: str | None) -> np.ndarray:
    """Each row's segment of its file, ``(start, duration)`` seconds, from a manifest's columns, in bulk.

    Raises:
        SourceError: the source has no such column, or a row's value is not a number of seconds >= 0.
    """
    if table.fields is None:
        raise SourceError(f"start_column={start_column!r} reads a manifest's column; {description} has no columns")
    out = np.full((len(table), 2), np.nan, dtype=np.float64)
    for k, name in enumerate((start_column, duration_column)):
        if name is None:
            continue
        column = table.column(name)
        if column is None:
            raise SourceError(f"{description} has no column {name!r}; its columns are {table.columns}")
        seconds, valid = seconds_array(column)
        if not valid.all():
            row = int(np.flatnonzero(~valid)[0])
            value = column[row]
            raise SourceError(f"{description} row {row + 1}: {name} {None if value is ABSENT else value!r} is not "
                              f"a number of seconds >= 0")
        out[:, k] = seconds
    return out


def _natural_key(name: str) -> tuple[int, Any]:
    """Sort numbers numerically and before words, so class "10" comes after class "9"."""
    try:
        return (0, int(name))
    except ValueError:
        return (1, name)


def class_order(names: Iterable[str], labels: Any, *,
                recorded: Sequence[str] | None = None) -> list[str]:
    """The class names in the order their indices follow.

    A folder tree's (``labels="parent"``): plain ``sorted``, as torchvision's ``ImageFolder``
    numbers its class folders ('10' before '2'), so a checkpoint's class indices carry over. The
    packed labels of an index (``labels="label"``) that records its ``classes``: in that order, the
    one the packed source numbered them in, less those no item has. Any other label's: numbers
    numerically and before words, so a column of class numbers keeps them.
    """
    if recorded is not None and isinstance(labels, str) and labels == LABEL_COLUMN:
        found = set(names)
        return [name for name in recorded if name in found]
    return sorted(names) if labels == "parent" else sorted(names, key=_natural_key)


_CLASS_NUMBER = re.compile(r"0|[1-9][0-9]*")


def warn_renumbered(classes: Sequence[str], labels: Any, description: str) -> None:
    """Log that ``classes``, sorted as numbers (:func:`class_order`), are class numbers other than
    0 to K-1, so a sample's ``label`` (a place in ``classes``) is not the number it was given."""
    numbers = [int(name) for name in classes if _CLASS_NUMBER.fullmatch(name)]
    if len(numbers) < len(classes) or numbers == list(range(len(numbers))):
        return
    moved = ", ".join(f"{n} -> {i}" for i, n in enumerate(numbers) if n != i)
    logger.warning("labels=%r of %s are class numbers other than 0 to %d, renumbered by their "
                   "order (%.80s): a sample's label is its number's place, and label_name the "
                   "number as written", labels, description, len(numbers) - 1, moved)


class Source(StorageUser):
    """The files of a dataset with their labels and fields, local or remote.

    Args:
        source: a directory (matched with ``patterns``), a CSV/TSV/JSONL/Parquet manifest with a path
            column, the ``index.json`` of packed shards (members read by byte range), or a list of file
            paths; each may be a URL (``s3://``, ``gs://``, ``https://``...) read through fsspec.
        patterns: glob patterns, relative to a directory source (``**`` recurses).
        labels: where labels come from: ``None`` (no labels); ``"parent"`` (the parent folder's name);
            the name of a manifest column (of an index: ``"label"``, the label it was packed with, or
            a packed manifest's column); a regular expression searched in the file name (its first
            group, or the whole match without groups; a member's original name); or a callable from
            path to label. Classes are numbered in sorted order (:func:`class_order`): folder names
            as torchvision's ``ImageFolder`` sorts them ('10' before '2'), other labels with
            numbers numerically ('2' before '10').
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

    The items are held in columns (:attr:`table`, an :class:`~audiobuffer.sources.table.ItemTable`),
    so a source of millions of files takes tens of bytes per file; ``paths``, ``fields`` and
    ``label_names`` are read-only sequences made an item at a time. A remote file's or index member's
    work item reads its bytes in the producer thread that decodes it (:attr:`WorkItem.read`): one
    request per file, one ranged request sized to the member.

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
        storage = Storage.of(storage_options, retry)
        if not isinstance(allow_outside, bool):
            raise TypeError(f"allow_outside must be True or False, got {allow_outside!r}")
        listing = list_source(source, patterns=patterns, path_column=path_column, storage=storage,
                              allow_outside=allow_outside)
        self.description: str = listing.description
        #: The items, in columns.
        self.table: ItemTable = listing.table
        #: How this source reads its files: fsspec options, retries and timeouts.
        self.storage = storage
        if not len(self.table):
            raise SourceError(f"no files in {self.description}")
        if start_column is not None:
            self.table.segments = _segments(self.table, self.description, start_column, duration_column)
        names = _label_column(labels, self.table)
        #: Whether the labels are folder names, numbered as torchvision's ``ImageFolder`` does.
        self.folder_labels = isinstance(labels, str) and labels == "parent"
        #: The sorted label names; a sample's ``label`` is an index into this list.
        self.classes: list[str] = []
        if names is not None:
            # a value no item has is no class (bincount, not unique, which imports numpy.ma)
            used = np.flatnonzero(np.bincount(names.codes[names.codes >= 0])).tolist()
            found = {names.values[c] for c in used if names.values[c] is not None}
            self.classes = class_order(found, labels, recorded=listing.classes)
            if listing.classes is None and not self.folder_labels:
                warn_renumbered(self.classes, labels, self.description)
            order = {name: i for i, name in enumerate(self.classes)}
            remap = np.array([order.get(v, -1) if v is not None else -1 for v in names.values] + [-1], dtype=np.int32)
            self.table.label_of = remap[names.codes]
        #: The label name to class index map.
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(self.classes)}

    def __len__(self) -> int:
        return len(self.table)

    @property
    def label_of(self) -> np.ndarray | None:
        """Each item's class (an index into ``classes``; -1: no label), or ``None`` without labels."""
        return self.table.label_of

    def __repr__(self) -> str:
        labels = f", classes={len(self.classes)}" if self.label_of is not None else ""
        return f"Source({self.description}, items={len(self)}{labels})"

    @property
    def paths(self) -> Sequence[str]:
        """Each item's path or URL (an index member's ``<shard>/<name>``), made as read."""
        return TableView(len(self.table), self.table.path)

    @property
    def fields(self) -> Sequence[dict[str, Any]] | None:
        """Each item's fields (a manifest's other columns, an index member's fields), or ``None`` for a
        folder or a list of files."""
        table = self.table
        return None if table.fields is None else TableView(len(table), table.row)

    @property
    def label_names(self) -> Sequence[str | None] | None:
        """Each item's label name (``None`` where it has none), or ``None`` without labels."""
        label_of, classes = self.label_of, self.classes
        if label_of is None:
            return None
        return TableView(len(label_of), lambda i: classes[label_of[i]] if label_of[i] >= 0 else None)

    @property
    def known_durations(self) -> list[float | None] | None:
        """Each item's duration in seconds where the source knows it without reading the file (an
        index's members, measured by ``audiobuffer pack``; a Lhotse cut's; ``None`` where unknown), else
        ``None``."""
        durations = self.table.durations
        return None if durations is None else [None if np.isnan(d) else d for d in durations.tolist()]

    def has_urls(self) -> bool:
        """Whether any path is a URL (looked at once; local paths then skip the test per item)."""
        has = self.__dict__.get("_urls")
        if has is None:
            table = self.table
            data = table.names.data
            has = any(is_url(p) for p in table.prefixes) or bool(np.any((data[:-1] == 58) & (data[1:] == 58)))  # "::"
            self.__dict__["_urls"] = has
        return has

    def fingerprint(self) -> str:
        """A digest of the file list (its order included): a saved state names the source it came from."""
        fingerprint = self.__dict__.get("_fingerprint")
        if fingerprint is None:
            fingerprint = self.__dict__["_fingerprint"] = self.table.fingerprint()
        return fingerprint

    def subset(self, indices: Sequence[int]) -> Source:
        """A source of the files at ``indices``, keeping this source's classes (so label indices agree).

        Use it to split one source into train and test sets.
        """
        if not len(indices):
            raise SourceError(f"an empty subset of {self.description}")
        idx = np.asarray(indices, dtype=np.int64)
        part = object.__new__(Source)
        part.description = f"{len(idx)} files of {self.description}"
        part.table = self.table.take(idx)
        part.storage = self.storage
        part.classes = list(self.classes)
        part.class_to_idx = dict(self.class_to_idx)
        return part

    def shared(self, make_region: Callable[[int], Region]) -> tuple[Source, Source]:
        """This source with its table moved into a region of memory another process maps (NOTE [ Shared
        item table ] in ``table.py``): the copy to use here from now on, and the copy to pickle for that
        process, which sends the region's handle, not the items."""
        self.has_urls()  # looked at here, once: the copies carry the answer
        table, reference = self.table.share(make_region)
        here, there = object.__new__(type(self)), object.__new__(type(self))  # a subclass (a Mixture) stays one
        here.__dict__.update(self.__dict__)
        there.__dict__.update(self.__dict__)
        here.table, there.table = table, reference  # type: ignore[assignment]  # unpickles as an ItemTable
        return here, there

    def item(self, index: int, *, epoch: int = 0, seed: int = 0, seq: int = 0,
             clock: ReadClock | None = None, blocks: BlockReads | None = None) -> WorkItem:
        """The work item for the source's ``index``-th file (with ``read`` set for an index member or a URL,
        its time counted by ``clock`` when given; an index member's read from its block in ``blocks``
        when given)."""
        table = self.table
        label: int | None = None
        name: str | None = None
        if self.label_of is not None:
            code = int(self.label_of[index])
            if code >= 0:
                label, name = code, self.classes[code]
        path = table.path(index)
        read: Callable[[], bytes] | None = None
        if table.offsets is not None and blocks is not None:  # an index member, sliced from its block
            read = functools.partial(blocks.read, index)
        elif table.offsets is not None:  # an index member: one ranged request, with its tar header
            read = functools.partial(read_member, table.shards[table.shard_of[index]],  # type: ignore[index]
                                     int(table.offsets[index]), int(table.sizes[index]),  # type: ignore[index]
                                     member=table.members[index],  # type: ignore[index]
                                     storage=self.storage)
        elif self.has_urls() and is_url(path):
            read = functools.partial(self.storage.read_bytes, path)
        if read is not None and clock is not None:
            read = clock.timed(read)
        segment: tuple[float, float | None] | None = None
        if table.segments is not None:
            start, duration = table.segments[index].tolist()
            segment = (start, None if math.isnan(duration) else duration)
        return WorkItem(index, path, label, name, None if table.fields is None else table.row(index),
                        epoch, seed, seq, read, segment)


def _label_column(labels: LabelSpec, table: ItemTable) -> Coded | None:
    """Each item's label name (``None`` for none) as a coded column, resolved in bulk where it can be:
    by folder for ``"parent"``, by distinct value for a column."""
    if labels is None:
        return None
    columns = table.columns
    has_columns = table.fields is not None
    if callable(labels) and not isinstance(labels, re.Pattern):
        return Coded.encode([_label_str(labels(p)) for p in table.paths()])
    if labels == "parent":
        values = [Path(prefix + "x").parent.name for prefix in table.prefixes]
        codes = table.prefix_of.astype(np.int32)
        lengths = table.names.offsets[1:] - table.names.offsets[:-1]
        for i in np.flatnonzero(lengths <= 1).tolist():  # a rest of "" or "." that pathlib drops: by itself
            codes[i] = len(values)
            values.append(Path(table.path(i)).parent.name)
        return Coded(codes, values)
    if isinstance(labels, str) and has_columns and labels in columns:
        column = table.column(labels)
        return _label_names(column, len(table))
    if isinstance(labels, str) and has_columns and not _REGEX_CHARS.intersection(labels):
        # A plain word on a manifest is a column name with a typo far more often than a regex: as a
        # regex it could only match itself and give every file the same label.
        raise SourceError(
            f"labels={labels!r} is not a column of the manifest; its columns are {columns}. For a regular "
            f"expression searched in the file names, pass re.compile({labels!r}) or one with a group")
    pattern = _label_pattern(labels)
    names = table.names.tolist() if os.name != "nt" else [os.path.basename(p) for p in table.paths()]
    found: list[str | None] = []
    search, group = pattern.search, 1 if pattern.groups else 0
    for n, basename in enumerate(names):
        match = search(basename)
        if match is None:
            hint = (f" (labels is not a column of the manifest either; its columns are {columns})"
                    if has_columns else "")
            raise SourceError(f"file {table.path(n)!r} does not match the label expression {pattern.pattern!r}{hint}")
        found.append(match.group(group))
    return Coded.encode(found)


def _label_names(column: Column | None, n: int) -> Coded:
    """A column's values as label names: ``str(value)``, ``None`` for a missing or empty one."""
    if column is None:
        return Coded(np.full(n, -1, dtype=np.int32), [])
    if isinstance(column, Coded):
        values = [_label_str(None if v is ABSENT else v) for v in column.values]
        lookup: dict[str | None, int] = {}
        remap = np.array([lookup.setdefault(v, len(lookup)) for v in values] + [lookup.setdefault(None, len(lookup))],
                         dtype=np.int32)
        return Coded(remap[column.codes], list(lookup))
    if isinstance(column, Strings):
        try:
            import pyarrow.compute as pc

            encoded = pc.dictionary_encode(column.arrow())
            values = [_label_str(v.decode("utf-8", "surrogateescape")) for v in encoded.dictionary.to_pylist()]
            return _label_names(Coded(np.asarray(encoded.indices, dtype=np.int32), values), n)
        except ImportError:
            pass
    return Coded.encode([_label_str(None if v is ABSENT else v) for v in (column[i] for i in range(n))])


def _label_pattern(labels: Any) -> re.Pattern[str]:
    if isinstance(labels, str):
        try:
            return re.compile(labels)
        except re.error as exc:
            raise ValueError(
                f"labels must be 'parent', a manifest column, a callable or a regular expression; "
                f"{labels!r} is not a valid regular expression ({exc})") from exc
    if isinstance(labels, re.Pattern):
        return labels
    raise TypeError(f"labels must be None, 'parent', a column name, a regex or a callable, got {labels!r}")


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
