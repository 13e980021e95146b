"""Tar shards streamed from start to end, without an index: the source and its producers' decoder.

NOTE [ Streamed shards ]
========================
A :class:`ShardStream` is a source whose unit of work is a shard. The epoch plan
(``_plan.plan_epoch`` over the shards) orders the shards (shuffled by ``seed + epoch``) and splits
them by rank and DataLoader worker, as it splits files. Each producer takes a shard and streams it
whole and in order (:func:`~audiobuffer.sources.iter_shard`; remote shards in ranged blocks of
``STREAM_BLOCK`` bytes), with ``shuffle=True`` through a shuffle buffer of :data:`SHUFFLE_BUFFER`
samples seeded by (seed, epoch, shard) (WebDataset's ``shuffle(n)``), decoding each sample as it
comes and putting it into the epoch's buffer itself (:class:`ShardReader` is a delivering decoder,
NOTE [ Delivering decoders ] in ``_outcomes.py``). Producers waiting on the network hold no GIL,
so shards stream in parallel. Every sample of the shards an epoch plans is yielded exactly once.

Resume is at shard boundaries. One producer puts a shard's samples into the FIFO buffer in order,
the last one tagged, so the consumer marks a shard consumed when it hands on that last sample
(``EpochRun.mark``); a saved state lists the shards consumed, and a resumed epoch streams every other
shard whole: the samples of a shard that was partly handed on before the state was saved come again.

A streamed sample's work item has ``index = shard number * MEMBER_STRIDE + its position in the
shard``, its ``path`` is ``<shard>/<original name>`` and its fields and label come from its
``<key>.json`` sidecar (``labels="label"``) or from its name. A shard that ends early yields the
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
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..buffer import Buffer
from ..engine.outcomes import DELIVERED, Failure
from ..engine.plan import plan_epoch
from ..engine.pool import CHUNK_SECONDS
from ..errors import DecodeError, SourceError, StorageError
from . import storage
from .index import INDEX_NAME, read_index
from .listing import LABEL_COLUMN
from .source import LabelSpec, ReadClock, WorkItem, _natural_key, _resolve_labels
from .storage import RetrySpec
from .tar import ShardSample, Truncated, iter_shard, shuffle_buffer

__all__ = ["MEMBER_STRIDE", "SHUFFLE_BUFFER", "ShardReader", "ShardStream", "check_streamable"]

logger = logging.getLogger(__name__)

#: Samples in each producer's shuffle buffer when a streamed epoch is shuffled.
SHUFFLE_BUFFER = 100
#: A streamed sample's index is its shard's number times this, plus its position in the shard.
MEMBER_STRIDE = 1 << 32
#: Threads that list shards without an index at once.
SCAN_THREADS = 16


@dataclass(frozen=True)
class _Listed:
    counts: tuple[int, ...]  # samples per shard, in the order of ShardStream.shards
    paths: list[str]
    rows: list[dict[str, Any]]
    columns: list[str]


class ShardStream:
    """Tar shards read from start to end, as a source (any WebDataset shards; no index needed).

    See NOTE [ Streamed shards ] in ``audiobuffer/_stream.py``.

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
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"storage_options must be a mapping of fsspec options or None, got {storage_options!r}")
        self.storage_options = None if storage_options is None else dict(storage_options)
        self.retry = storage.as_retry(retry)
        #: The shards, in order (braces expanded, globs listed).
        self.shards = storage.expand_urls(shards, storage_options=storage_options, retry=retry)
        if not self.shards:
            raise SourceError(f"no shards in {shards!r}")
        missing = [s for s in self.shards if not storage.is_url(s) and not os.path.isfile(s)]
        if missing:  # local ones are checked here; a remote one missing is its epoch's failure, named
            raise SourceError(f"shard {missing[0]!r} does not exist ({len(missing)} of {len(self.shards)} "
                              f"shards missing)")
        self.description = (f"{len(self.shards)} tar shards streamed ({self.shards[0]!r}"
                            f"{' ...' if len(self.shards) > 1 else ''})")
        self.labels = labels
        self._listed: _Listed | None = None
        self._index_tried = False
        names: set[str] = set()
        if labels is not None:
            listed = self.listing()
            found = _resolve_labels(labels, listed.paths, listed.rows if listed.columns else None, listed.columns)
            names = {n for n in found or () if n is not None}
        #: The sorted label names; a sample's ``label`` is an index into this list.
        self.classes: list[str] = sorted(names, key=_natural_key)
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(self.classes)}

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

    def epoch_length(self, *, shuffle: bool, seed: int, epoch: int, rank: int, world_size: int,
                     even_shards: str | None) -> int:
        """Samples rank ``rank`` streams in ``epoch`` (its shards' samples; ranks differ with shard sizes)."""
        counts = self._counts()
        plan = plan_epoch(len(self.shards), shuffle=shuffle, seed=seed, epoch=epoch, rank=rank,
                          world_size=world_size, even_shards=even_shards)
        return sum(counts[int(i)] for i in plan.indices)

    def shard_item(self, number: int, *, epoch: int, seed: int, seq: int) -> WorkItem:
        """The work item of shard ``number``: a producer's unit of work in a streamed epoch."""
        return WorkItem(index=number, path=self.shards[number], epoch=epoch, seed=seed, seq=seq)

    def sample_item(self, shard: WorkItem, sample: ShardSample, position: int) -> WorkItem:
        """The work item of a sample streamed from ``shard``: its bytes, fields and label.

        Raises:
            SourceError: its label does not match the label expression or is not one of the classes.
        """
        meta = sample.meta or {}
        fields = _fields(meta)
        data = sample.data
        item = WorkItem(index=shard.index * MEMBER_STRIDE + position, path=sample.path, fields=fields,
                        epoch=shard.epoch, seed=shard.seed, seq=shard.seq, read=lambda: data)
        if self.labels is None:
            return item
        columns = self.listing().columns
        row = {**fields, LABEL_COLUMN: meta.get(LABEL_COLUMN)}
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
        url = storage.sibling(self.shards[0], INDEX_NAME)
        try:
            index = read_index(url, storage_options=self.storage_options, retry=self.retry)
        except StorageError as exc:
            if exc.transient:
                raise
            return None  # no index there
        except SourceError:
            return None  # a file of that name that is no index of ours
        members: dict[str, list[Any]] = {}
        for member in index.members:
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
        return _Listed(tuple(counts), paths, rows, _columns(rows))

    def _scan(self) -> _Listed:
        logger.info("listing %d shards without an index: reading each once (pack with an index to skip this)",
                    len(self.shards))
        threads = max(1, min(SCAN_THREADS, len(self.shards)))
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="audiobuffer-scan") as pool:
            scanned = list(pool.map(self._scan_one, self.shards))
        paths = [path for shard in scanned for path, _ in shard]
        rows = [row for shard in scanned for _, row in shard]
        return _Listed(tuple(len(s) for s in scanned), paths, rows, _columns(rows))

    def _scan_one(self, url: str) -> list[tuple[str, dict[str, Any]]]:
        out = []
        try:
            for sample in iter_shard(url, storage_options=self.storage_options, retry=self.retry):
                meta = sample.meta or {}
                fields = _fields(meta)
                out.append((sample.path, {**fields, LABEL_COLUMN: meta.get(LABEL_COLUMN)} if meta else {}))
        except DecodeError as exc:  # truncated: each epoch reports it (on_error); list what it holds
            logger.warning("%s", exc)
        return out


def _fields(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A sidecar's manifest fields (``{}`` without)."""
    fields = meta.get("fields")
    return dict(fields) if isinstance(fields, Mapping) else {}


def _same(shard: str) -> str:
    """A shard's path or URL in one spelling, to match the index's shards with the ones given."""
    return shard if storage.is_url(shard) else os.path.normcase(os.path.abspath(shard))


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for row in rows for k in row))


def check_streamable(decoder: Any, ordered: bool) -> None:
    """Refuse what a streamed source cannot do: an ordered epoch, a decoder that delivers itself."""
    if ordered:
        raise ValueError("ordered=True needs random access to the members: give the shards' index.json "
                         "(audiobuffer pack writes one) instead of the shards, or ordered=False")
    if getattr(decoder, "delivers_itself", False) is True:
        raise ValueError(f"{decoder!r} delivers its samples itself, and so do streamed shards: give the "
                         f"shards' index.json (audiobuffer pack writes one) instead of the shards")


class ShardReader:
    """The decoder a streamed epoch's producers run: an item is a shard, whose samples it decodes and
    puts into the epoch's buffer itself (see NOTE [ Streamed shards ]).

    Each output goes in as ``((shard position, last), sample or Failure)``: ``last`` on the shard's
    final output, so that the consumer marks the shard consumed when it hands that one on. Outputs go
    in chunks of up to ``chunk`` (a chunk waits at most ``CHUNK_SECONDS``), as a pool's producers
    hand theirs over; it waits only for room in the buffer, never for the consumer otherwise.
    Thread safety: one instance serves every producer of an epoch.
    """

    delivers_itself = True

    def __init__(self, stream: ShardStream, decode: Callable[[WorkItem], Any], buffer: Buffer[Any],
                 clock: ReadClock, *, shuffle: bool, chunk: int = 1) -> None:
        self._stream = stream
        self._chunk = chunk
        self._decode = decode
        self._buffer = buffer
        self._clock = clock
        self._shuffle = shuffle
        self._stopped = threading.Event()

    def stop_waiting(self) -> None:
        """The pool stops: read no further (a producer blocked in ``put`` wakes by the buffer's abort)."""
        self._stopped.set()

    def __call__(self, shard: WorkItem) -> Any:
        put_many, size = self._buffer.put_many, self._chunk
        held = None  # each output is put once the next one is known, so that the last is tagged
        chunk: list[tuple[tuple[int, bool], Any]] = []  # handed over together (NOTE [ Producer shutdown protocol ])
        oldest = 0.0
        outputs = self._outputs(shard)
        try:
            for out in outputs:
                if held is not None:
                    now = time.perf_counter()
                    if not chunk:
                        oldest = now
                    chunk.append(((shard.seq, False), held))
                    if len(chunk) >= size or now - oldest >= CHUNK_SECONDS:
                        put_many(chunk)
                        chunk = []
                held = out
            if held is not None and not self._stopped.is_set():
                chunk.append(((shard.seq, True), held))
            if chunk:
                put_many(chunk)
        finally:
            outputs.close()  # a stop or a closed buffer: the shard's stream is closed now, not when collected
        return DELIVERED

    def _outputs(self, shard: WorkItem) -> Generator[Any, None, None]:
        producer = threading.current_thread().name
        failed: list[Exception] = []
        reader = self._read(shard.path, failed)
        samples: Iterator[tuple[int, ShardSample]] = enumerate(reader)
        if self._shuffle:
            rng = np.random.default_rng([shard.seed, shard.epoch, shard.index])
            samples = shuffle_buffer(samples, SHUFFLE_BUFFER, rng)
        count = 0
        try:
            for position, sample in samples:
                if self._stopped.is_set():
                    return
                count += 1
                try:
                    item = self._stream.sample_item(shard, sample, position)
                except SourceError as exc:
                    yield Failure(exc, WorkItem(index=shard.index * MEMBER_STRIDE + position, path=sample.path,
                                                epoch=shard.epoch, seed=shard.seed, seq=shard.seq), producer)
                    continue
                try:
                    yield self._decode(item)
                except Exception as exc:  # the consumer applies on_error
                    yield Failure(exc, item, producer)
        finally:
            reader.close()
        if failed:  # the shard ended early or could not be read: one failure for the rest of it
            cause = failed[0]
            where = cause.path if isinstance(cause, Truncated) and cause.path else shard.path
            yield Failure(cause, WorkItem(index=shard.index * MEMBER_STRIDE + count, path=where, epoch=shard.epoch,
                                        seed=shard.seed, seq=shard.seq), producer)

    def _read(self, url: str, failed: list[Exception]) -> Generator[ShardSample, None, None]:
        """The shard's samples; a failure to read ends them and is kept in ``failed``."""
        stream = self._stream
        samples = iter_shard(url, storage_options=stream.storage_options, retry=stream.retry)
        try:
            while True:
                start = time.perf_counter()
                try:
                    sample = next(samples)
                except StopIteration:
                    return
                except Exception as exc:
                    failed.append(exc)
                    return
                finally:
                    self._clock.add(time.perf_counter() - start)
                yield sample
        finally:
            samples.close()
