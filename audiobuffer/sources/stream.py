"""Tar shards streamed from start to end, without an index: :class:`ShardStream`, a source whose unit
of work is a shard, and :func:`as_source`, which picks the kind of source a loader was given. The
producers' decoder and port that stream a shard: :class:`~audiobuffer.engine.streamed.ShardReader`.

NOTE [ Streamed shards ]
========================
A :class:`ShardStream` is a source whose unit of work is a shard. The epoch plan
(:func:`~audiobuffer.engine.plan.plan_epoch` over the shards) orders the shards (shuffled by
``seed + epoch``) and splits them by rank and DataLoader worker, as it splits files. Each producer
takes a shard and streams it whole and in order (:func:`~audiobuffer.sources.iter_shard`; remote
shards in ranged blocks of ``STREAM_BLOCK`` bytes), with ``shuffle=True`` through a shuffle buffer
of :data:`SHUFFLE_BUFFER` samples seeded by (seed, epoch, shard) (WebDataset's ``shuffle(n)``),
decoding each sample as it comes and putting it into the epoch's buffer (``ShardReader`` is the
pool's output port, NOTE [ Output port ] in ``engine/pool.py``). Producers waiting on the
network hold no GIL, so shards stream in parallel. Every sample of the shards an epoch plans is
yielded exactly once.

Resume is at shard boundaries. One producer puts a shard's samples into the FIFO buffer in order,
the last one tagged, so the consumer marks a shard consumed when it hands on that last sample
(``EpochRun.mark`` in ``engine/epoch.py``); a saved state lists the shards consumed, and a resumed
epoch streams every other shard whole: the samples of a shard that was partly handed on before the
state was saved come again.

A streamed sample's work item has ``index = shard number * MEMBER_STRIDE + its position in the
shard`` and its ``path`` is ``<shard>/<original name>``. Its fields are its other members
(:func:`~audiobuffer.sources.tar.sample_fields`: the keys of ``<key>.json``, ``<key>.cls``, ``<key>.txt``...;
for a shard ``audiobuffer pack`` wrote, the manifest fields its sidecar records, as by index), and
``labels=`` names one of them, or reads the label from the name. A shard that ends early yields the
samples before the cut, then one failure naming the shard and the member cut (``on_error`` applies);
a shard that cannot be read at all is one such failure.

The listing (samples per shard, their names and labels: what ``len()`` and ``classes`` need) comes
from the ``index.json`` beside the shards when it lists them all. With ``labels`` (the classes must be
known before the first epoch) and no such index, every shard is read through once when the source is
made (a pass over the data: pack with an index to skip it). Without either, ``len()`` is unknown (a
``TypeError``, as for any iterable without a length) and nothing is read before the first epoch.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
import threading
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DecodeError, SourceError, StorageError
from .formats.parquet import (
    RowSample,
    class_names,
    holds_audio,
    is_parquet,
    open_parquet,
    read_row_group,
    row_name,
)
from .formats.parquet import audio_column as audio_column_of
from .index import INDEX_NAME, index_columns
from .source import (
    LABEL_COLUMN,
    LabelSpec,
    Source,
    SourceSpec,
    WorkItem,
    _natural_key,
    _resolve_labels,
    class_order,
    names_shards,
    warn_renumbered,
)
from .storage import RetrySpec, Storage, StorageUser, is_url, sibling
from .tar import (
    MEMBER_STRIDE,
    SHUFFLE_BUFFER,
    ShardSample,
    is_packed_sidecar,
    packed_class_order,
    shard_samples,
)

__all__ = ["MEMBER_STRIDE", "SHUFFLE_BUFFER", "ParquetStream", "ShardStream", "as_source"]

logger = logging.getLogger(__name__)

#: Threads that list shards without an index at once.
SCAN_THREADS = 16


@dataclass(frozen=True)
class _Listed:
    counts: tuple[int, ...]  # samples per shard, in the order of ShardStream.shards
    paths: list[str]
    rows: list[dict[str, Any]]
    columns: list[str]
    classes: Sequence[str] | None = None  # the order an index records (class_order's recorded)


class ShardStream(StorageUser):
    """Tar shards read from start to end, as a source (any WebDataset shards; no index needed).

    See NOTE [ Streamed shards ] at the top of this module.

    Args:
        shards: a path, URL or brace pattern of shards (``shard-{000000..000011}.tar``), a glob, or
            a list of them.
        labels: as for :class:`~audiobuffer.Source`: ``"label"`` (the sidecar's), a sidecar field,
            ``"parent"``, a regular expression searched in each sample's original file name, or a
            callable from path to label.
        storage_options: options for the fsspec filesystem of URLs.
        retry: how transient storage failures are retried.

    Raises:
        SourceError: no shard is named, a glob matches nothing, or a label does not fit.
        StorageError: the listing (when made) cannot read a shard or the index.
    """

    def __init__(self, shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 labels: LabelSpec = None, storage_options: Mapping[str, Any] | None = None,
                 retry: RetrySpec = None) -> None:
        #: How the shards are read: fsspec options, retries and timeouts.
        self.storage = Storage.of(storage_options, retry)
        #: The shards, in order (braces expanded, globs listed).
        self.shards = self._expand(shards, "shards")
        missing = [s for s in self.shards if not is_url(s) and not os.path.isfile(s)]
        if missing:  # local ones are checked here; a remote one missing is its epoch's failure, named
            raise SourceError(f"shard {missing[0]!r} does not exist ({len(missing)} of {len(self.shards)} "
                              f"shards missing)")
        self.description = (f"{len(self.shards)} tar shards streamed ({self.shards[0]!r}"
                            f"{' ...' if len(self.shards) > 1 else ''})")
        self.labels = labels
        self._listed: _Listed | None = None
        self._index_tried = False
        names: set[str] = set()
        recorded = None
        if labels is not None:
            listed = self.listing()
            found = _resolve_labels(labels, listed.paths, listed.rows if listed.columns else None, listed.columns)
            names = {n for n in found or () if n is not None}
            recorded = listed.classes
        #: The sorted label names; a sample's ``label`` is an index into this list.
        self.classes: list[str] = class_order(names, labels, recorded=recorded)
        if recorded is None and labels != "parent":
            warn_renumbered(self.classes, labels, self.description)
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(self.classes)}

    def _expand(self, spec: Any, what: str) -> list[str]:
        """The paths or URLs ``spec`` names (braces expanded, globs listed).

        Raises:
            SourceError: ``spec`` names nothing.
        """
        found = self.storage.expand_urls(spec)
        if not found:
            raise SourceError(f"no {what} in {spec!r}")
        return found

    #: What to give a loader that needs random access instead of this source.
    random_access_hint = "give the shards' index.json (audiobuffer index or audiobuffer pack writes one)"
    #: Why no epoch can be ordered, and what to do instead (``None``: ``random_access_hint``).
    ordered_hint: str | None = None

    def __len__(self) -> int:
        """Samples in all the shards, from the listing (see NOTE [ Streamed shards ]).

        Raises:
            TypeError: the length is unknown: no index lists the shards and no ``labels`` had them read.
        """
        return sum(self._counts())

    def __repr__(self) -> str:
        return f"ShardStream({self.description}, classes={len(self.classes)})"

    def fingerprint(self) -> str:
        """A digest of the shard list: a saved state names the shards it came from."""
        digest = hashlib.sha256()
        for shard in self.shards:
            digest.update(shard.encode("utf-8", "surrogateescape") + b"\0")
        return f"shards:{len(self.shards)}:{digest.hexdigest()[:16]}"

    def samples_in(self, shards: Sequence[int]) -> int:
        """Samples in the shards numbered ``shards`` (an epoch's share of them; shards differ in size).

        Raises:
            TypeError: the length is unknown (see :meth:`__len__`).
        """
        counts = self._counts()
        return sum(counts[int(i)] for i in shards)

    def read_shard(self, number: int) -> Generator[ShardSample, None, None]:
        """The samples of shard ``number``, from start to end (:func:`~audiobuffer.sources.iter_shard`)."""
        return shard_samples(self.shards[number], storage=self.storage)

    def label_row(self, sample: ShardSample) -> dict[str, Any]:
        """What ``labels=`` may name of a sample: its fields, and a packed sidecar's ``label``."""
        if is_packed_sidecar(sample.meta):
            return {**sample.fields, LABEL_COLUMN: sample.label}
        return dict(sample.fields)

    def shard_item(self, number: int, *, epoch: int, seed: int, seq: int) -> WorkItem:
        """The work item of shard ``number``: a producer's unit of work in a streamed epoch."""
        return WorkItem(index=number, path=self.shards[number], epoch=epoch, seed=seed, seq=seq)

    def sample_item(self, shard: WorkItem, sample: ShardSample, position: int) -> WorkItem:
        """The work item of a sample streamed from ``shard``: its bytes, fields and label.

        Raises:
            SourceError: its label does not match the label expression or is not one of the classes.
        """
        fields = dict(sample.fields)
        data = sample.data
        item = WorkItem(index=shard.index * MEMBER_STRIDE + position, path=sample.path, fields=fields,
                        epoch=shard.epoch, seed=shard.seed, seq=shard.seq, read=lambda: data)
        if self.labels is None:
            return item
        columns = self.listing().columns
        row = self.label_row(sample)
        name = (_resolve_labels(self.labels, [item.path], [row] if columns else None, columns) or [None])[0]
        if name is not None and name not in self.class_to_idx:
            raise SourceError(f"{item.path!r}: label {name!r} is not one of the {len(self.classes)} classes "
                              f"listed when the dataset was made (the shards changed since?)")
        label = None if name is None else self.class_to_idx[name]
        return WorkItem(index=item.index, path=item.path, label=label, label_name=name, fields=fields,
                        epoch=item.epoch, seed=item.seed, seq=item.seq, read=item.read)

    # -- the listing ---------------------------------------------------------------------------

    def listing(self) -> _Listed:
        """Samples per shard with their paths and sidecars: from the index beside the shards, else a scan."""
        listed = self._indexed()
        if listed is None:
            listed = self._listed = self._scan()
        return listed

    def _indexed(self) -> _Listed | None:
        """The listing if it was made, else from the index beside the shards (looked for once), else ``None``."""
        if self._listed is None and not self._index_tried:
            self._index_tried = True
            self._listed = self._from_index()
        return self._listed

    def _counts(self) -> tuple[int, ...]:
        listed = self._indexed()
        if listed is None:
            raise TypeError(f"the length of {self.description} is unknown: no index.json beside them lists them "
                            f"(audiobuffer pack writes one), and without labels= they were not read through")
        return listed.counts

    def _from_index(self) -> _Listed | None:
        url = sibling(self.shards[0], INDEX_NAME)
        try:
            index = index_columns(url, storage=self.storage)
        except StorageError as exc:
            if exc.transient:
                raise
            return None  # no index there
        except SourceError:
            return None  # a file of that name that is no index of ours
        members: dict[str, list[Any]] = {}
        for member in map(index.member, range(len(index))):
            members.setdefault(_same(member.shard), []).append(member)
        if not {_same(s) for s in self.shards} <= {_same(s) for s in index.shards}:
            return None  # the index lists other shards
        paths: list[str] = []
        rows: list[dict[str, Any]] = []
        counts = []
        for shard in self.shards:
            listed = members.get(_same(shard), [])
            counts.append(len(listed))
            paths.extend(f"{shard}/{m.name}" for m in listed)
            rows.extend({**m.fields, LABEL_COLUMN: m.label} for m in listed)
        return _Listed(tuple(counts), paths, rows, _columns(rows), classes=index.classes)

    def _scan(self) -> _Listed:
        logger.info("listing %d shards without an index: reading each once (pack with an index to skip this)",
                    len(self.shards))
        threads = max(1, min(SCAN_THREADS, len(self.shards)))
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="audiobuffer-scan") as pool:
            scanned = list(pool.map(self._scan_one, self.shards))
        paths = [path for shard in scanned for path, _, _ in shard]
        rows = [row for shard in scanned for _, row, _ in shard]
        classes = packed_class_order(meta for shard in scanned for _, _, meta in shard)
        return _Listed(tuple(len(s) for s in scanned), paths, rows, _columns(rows), classes=classes)

    def _scan_one(self, url: str) -> list[tuple[str, dict[str, Any], Mapping[str, Any] | None]]:
        out = []
        try:
            for sample in shard_samples(url, storage=self.storage):
                out.append((sample.path, self.label_row(sample), sample.meta))
        except DecodeError as exc:  # truncated: each epoch reports it (on_error); list what it holds
            logger.warning("%s", exc)
        return out


class ParquetStream(ShardStream):
    """Hugging Face audio and image datasets in Parquet, streamed a row group at a time, as a
    source.

    See NOTE [ Parquet audio datasets ] in ``formats/parquet.py``: the unit of work (a "shard" to the epoch plan)
    is a row group; ``len()`` comes from the files' footers.

    Args:
        files: a path, URL, brace pattern or glob of ``.parquet`` files, or a list of them.
        labels: a column (a ``ClassLabel`` column gives its names, in its order), ``"parent"``, a
            regular expression searched in each sample's original file name, or a callable from path
            to label.
        audio_column: the column of encoded audio or images (default: ``"audio"``, else
            ``"image"``, else the only struct column with a binary ``bytes`` field).
        path_column: ``None`` (a row's audio bytes, or the file its path names where it has
            none), or the audio column's path field (``"audio.path"``): every row's audio from the
            file its path names.
        storage_options: options for the fsspec filesystem of URLs.
        retry: how transient storage failures are retried.

    Raises:
        SourceError: no file is named, a file is not Parquet or has no audio column, or a label does not fit.
        StorageError: a file cannot be read.
        ValueError: ``path_column`` is not the audio column's path field.
    """

    random_access_hint = ("Parquet row groups are streamed: read the dataset with BufferedDataset, or give its "
                          "files as a folder or a manifest")
    ordered_hint = ("Parquet row groups are streamed: each producer reads a row group whole, so "
                    "row groups interleave. For the rows in the files' order give shuffle=False "
                    "and num_producers=1 (and ordered=False); for random access give the audio "
                    "files as a folder or a manifest")

    def __init__(self, files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 labels: LabelSpec = None, audio_column: str | None = None,
                 path_column: str | None = None, storage_options: Mapping[str, Any] | None = None,
                 retry: RetrySpec = None) -> None:
        if path_column is not None and not isinstance(path_column, str):
            raise TypeError(f"path_column must be a string or None, got {path_column!r}")
        self.storage = Storage.of(storage_options, retry)
        #: The Parquet files, in order.
        self.files = self._expand(files, "Parquet files")
        units: list[tuple[int, int, int]] = []  # (file, row group, its first row in the file)
        counts: list[int] = []
        self._columns: list[str] = []
        self._names: list[dict[str, list[str]]] = []  # each file's ClassLabel names, by column
        self._from_paths = path_column is not None
        for n, url in enumerate(self.files):
            meta = open_parquet(url, storage=self.storage)
            self._columns.append(audio_column_of(meta.schema_arrow, url, audio_column))
            wanted = f"{self._columns[-1]}.path"
            if path_column is not None and path_column != wanted:
                raise ValueError(f"path_column={path_column!r} is not the path field of the audio "
                                 f"column of Parquet file {url!r}: give path_column={wanted!r} to "
                                 f"read each row's audio from the file its path names, or none to "
                                 f"read its bytes (and the file of a row without them)")
            self._names.append(class_names(meta.schema_arrow))
            first = 0
            for group in range(meta.metadata.num_row_groups):
                rows = meta.metadata.row_group(group).num_rows
                units.append((n, group, first))
                counts.append(rows)
                first += rows
        self._units = units
        self._names_of = dict(zip(self.files, self._names))  # a sample's file to its names, per sample
        #: One name per row group, ``<file>#<row group>``: the epoch plan's shards.
        self.shards = [f"{self.files[f]}#{g}" for f, g, _ in units]
        self.description = (f"{len(self.files)} Parquet file{'s' * (len(self.files) != 1)}, {len(units)} row "
                            f"group{'s' * (len(units) != 1)} "
                            f"({self.files[0]!r}{' ...' if len(self.files) > 1 else ''})")
        self.labels = labels
        self._counts_only = _Listed(tuple(counts), [], [], [])
        self._listed = None
        self._index_tried = True
        self._open = threading.local()  # each producer thread's open files (pyarrow's are not shared)
        names: set[str] = set()
        listed = None
        if labels is not None:
            listed = self.listing()
            found = _resolve_labels(labels, listed.paths, listed.rows if listed.columns else None, listed.columns)
            names = {n for n in found or () if n is not None}
        declared = None
        if listed is not None and labels in listed.columns:
            declared = self._class_label(labels, names)
        #: The label names: a ``ClassLabel`` column's in its order (a sample's ``label`` is its
        #: number), else sorted.
        self.classes = class_order(names, labels) if declared is None else declared
        if declared is None and labels != "parent":
            warn_renumbered(self.classes, labels, self.description)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    def _class_label(self, column: Any, found: set[str]) -> list[str] | None:
        """The names of ``column`` where the files declare it a ``ClassLabel``: every file, the same
        names in the same order; ``None`` where none does.

        Raises:
            SourceError: the files declare it differently, or a row holds a number outside the
                names.
        """
        declared = [names.get(column) for names in self._names]
        by = next((n for n, names in enumerate(declared) if names is not None), None)
        if by is None:
            return None
        names = list(declared[by] or ())
        for url, other in zip(self.files, declared):
            if other != names:
                theirs = "not one" if other is None else f"of {other}"
                raise SourceError(f"column {column!r} is a ClassLabel of {names} in Parquet file "
                                  f"{self.files[by]!r} but {theirs} in {url!r}: a label's number "
                                  f"must mean one name in every file; read the files apart")
        outside = sorted(found - set(names), key=_natural_key)
        if outside:
            raise SourceError(f"column {column!r} of {self.description} is a ClassLabel of "
                              f"{len(names)} names but holds {outside[:5]}: numbers outside them "
                              f"(datasets writes -1 for a row without a label); drop those rows, "
                              f"or give labels=None")
        return names

    def __repr__(self) -> str:
        return f"ParquetStream({self.description}, classes={len(self.classes)})"

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_open"}  # open files stay with their thread

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _open=threading.local())

    def read_shard(self, number: int) -> Generator[ShardSample, None, None]:
        """The samples of row group ``number`` (in the order of :attr:`shards`)."""
        f, group, first = self._units[number]
        url = self.files[f]
        opened: dict[int, Any] = self._open.__dict__.setdefault("files", {})
        handle = opened.get(f)
        if handle is None:
            handle = opened[f] = open_parquet(url, storage=self.storage)
        return read_row_group(handle, url, group, first, self._columns[f], storage=self.storage,
                              from_paths=self._from_paths)

    def sample_item(self, shard: WorkItem, sample: ShardSample, position: int) -> WorkItem:
        """The work item of a row streamed from row group ``shard``; a row without audio bytes reads
        its audio (or fails) when it is decoded, alone."""
        item = super().sample_item(shard, sample, position)
        if not isinstance(sample, RowSample) or sample.read is None:
            return item
        return WorkItem(index=item.index, path=item.path, label=item.label,
                        label_name=item.label_name, fields=item.fields, epoch=item.epoch,
                        seed=item.seed, seq=item.seq, read=sample.read)

    def label_row(self, sample: ShardSample) -> dict[str, Any]:
        """A sample's fields, a ``ClassLabel`` column's number given as its name."""
        names = self._names_of.get(sample.shard, {})
        row = dict(sample.fields)
        for column, labels in names.items():
            value = row.get(column)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(labels):
                row[column] = labels[value]
        return row

    def listing(self) -> _Listed:
        """Rows per row group, and with ``labels=`` each row's path and the columns it can name."""
        if self._listed is None:
            if self.labels is None:
                return self._counts_only
            self._listed = self._read_listing()
        return self._listed

    def _indexed(self) -> _Listed | None:
        return self._listed if self._listed is not None else self._counts_only

    def _read_listing(self) -> _Listed:
        column = self.labels if isinstance(self.labels, str) else None
        paths: list[str] = []
        rows: list[dict[str, Any]] = []
        columns: list[str] = []
        for n, url in enumerate(self.files):
            meta = open_parquet(url, storage=self.storage)
            names = list(meta.schema_arrow.names)
            columns = [c for c in names if c != self._columns[n]]
            wanted = [f"{self._columns[n]}.path"] + ([column] if column in columns else [])
            table = meta.read(columns=wanted)
            originals = table.column(0).combine_chunks().field("path").to_pylist()
            values = table.column(1).to_pylist() if table.num_columns > 1 else [None] * table.num_rows
            labels = self._names[n].get(column or "")
            for row, (original, value) in enumerate(zip(originals, values)):
                paths.append(f"{url}/{row_name(url, row, original)}")
                if labels is not None and isinstance(value, int) and 0 <= value < len(labels):
                    value = labels[value]
                rows.append({column: value} if column in columns else {})
        return _Listed(self._counts_only.counts, paths, rows, columns if isinstance(self.labels, str) else [])


def _same(shard: str) -> str:
    """A shard's path or URL in one spelling, to match the index's shards with the ones given."""
    return shard if is_url(shard) else os.path.normcase(os.path.abspath(shard))


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for row in rows for k in row))


def as_source(source: SourceSpec | Source | ShardStream, *, patterns: Sequence[str], labels: LabelSpec,
              path_column: str, explicit_patterns: Sequence[str] | None = None,
              storage_options: Mapping[str, Any] | None = None, start_column: str | None = None,
              duration_column: str | None = None) -> Source | ShardStream:
    """``source`` itself if it is ready, else the :class:`Source` it describes, or the
    :class:`~audiobuffer.sources.stream.ShardStream` of the tar shards it names (a path, URL, brace pattern or
    glob ending in ``.tar``, or a list of them), or the :class:`ParquetStream` of the Parquet files it names.

    ``labels``, ``patterns`` (``explicit_patterns``, as the caller was given them), ``path_column``,
    ``storage_options`` and ``start_column`` (with its ``duration_column``) describe how to list a source:
    with a ready one they would be ignored, so they are refused.
    """
    if not isinstance(source, (Source, ShardStream)):
        audio = is_parquet(source) and holds_audio(source, storage=Storage.of(storage_options))
        streamed = names_shards(source) or audio
        if streamed and start_column is not None:
            raise ValueError(f"start_column={start_column!r} reads segments of files a manifest lists; streamed "
                             f"samples are whole")
        if names_shards(source):
            return ShardStream(source, labels=labels, storage_options=storage_options)
        if audio:  # path_column: the audio column's path field, or the default for none
            paths = None if path_column == "path" else path_column
            return ParquetStream(source, labels=labels, path_column=paths,
                                 storage_options=storage_options)
        return Source(source, patterns=patterns, labels=labels, path_column=path_column,
                      storage_options=storage_options, start_column=start_column, duration_column=duration_column)
    given = [name for name, value, default in (("labels", labels, None), ("patterns", explicit_patterns, None),
                                               ("path_column", path_column, "path"),
                                               ("storage_options", storage_options, None),
                                               ("start_column", start_column, None)) if value != default]
    if given:
        raise ValueError(f"{', '.join(given)} describe how to list a source; give them to Source(...), not together "
                         f"with a ready Source")
    return source
