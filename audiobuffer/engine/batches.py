"""Batches by duration as they run: a dataset's durations and batch setup, one shard's epoch of batches
laid out for the producer pool, and the consumer side that turns decoded samples back into batches (or,
for streamed shards, cuts them as the samples arrive).

NOTE [ Batches by duration ]
============================
Durations. Read once per dataset, at construction (``_durations.read_durations``: a manifest column, or
each file's header through the on-disk cache), so that a header failure is raised, logged or counted
per ``on_error`` before any epoch starts. A decoder's ``crop_seconds`` caps them; with its ``pad``
as well, every sample is exactly the crop long, and so is its duration here (the batch's tensor is
what the budget bounds). A file whose header failed has no duration and is in no batch.

Plan. ``_batching.plan_batches``: a pure function of the durations and the setup, so every rank and
DataLoader worker cuts the same batches and takes its own share of them, with no communication; the
resume mask counts batches. :class:`EpochBatches` lays a shard's batches out for the pool: sequence
numbers ``0 .. S-1`` run through the batches in order, so producers take a batch's samples together
and decode them in parallel.

Assembly. The consumer (:class:`Assembler`) keeps the samples of each batch until its last one has
arrived, then hands the batch on whole, in plan order within the batch. In an unordered pool batches
complete (and are yielded) in the order their last sample finishes; an ordered pool completes them in
plan order. A failed sample leaves its batch (per ``on_error``), which comes smaller; a batch whose
samples all failed is counted and skipped; either way the batch counts as consumed for resume once
complete. Only the batches with a sample still being decoded are held, so memory stays bounded by
the buffer plus those batches. The buffer holds at least two of the epoch's largest batches (more
than ``buffer_size`` if need be), so the producers decode the next batch while one trains.

Streamed shards. A :class:`~audiobuffer.sources.stream.ShardStream` cannot be planned: no duration (not even
the count) is known before a shard streams, and a shard is read from start to end. Its batches are cut
in the consumer as the samples arrive (:class:`DynamicBuckets`, as Lhotse's ``DynamicBucketingSampler``
does). A sample's duration is the ``duration_column`` field of its sidecar, read in the producer before
decoding (:class:`TimedDecode`; a sample without one fails per ``on_error``, undecoded). The bucket
edges are estimated from the first samples (``EDGE_SAMPLES`` at most, fewer once they hold ``buckets x
max_batch_seconds``); a bucket hands its batch on when no more sample may join it within the budget
(or ``max_batch_size``), and the end of the epoch hands on every bucket. Resume stays at shard
boundaries (NOTE [ Streamed shards ] in ``_stream.py``): :class:`StreamBatchRun` marks a shard consumed
once its last sample has come and every one of its samples was handed on in a batch (or failed), so a
saved state never skips a sample still waiting in a bucket. The number of batches is unknown until the
epoch ends (no ``len()``); beside the buffer, the buckets hold less than ``buckets x max_batch_seconds``
of audio.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import numpy as np

from ..buffer import Buffer
from ..errors import SourceError
from ..options import DEFAULT_BUCKETS, ErrorPolicy
from ..sources.durations import Failure as HeaderFailure
from ..sources.durations import read_durations, seconds_of
from ..sources.source import ReadClock, WorkItem
from . import epoch as _epoch
from .epoch import MAX_LISTED_FAILURES, DatasetStats, EpochRun
from .plan import BatchPlan, bucket_edges, plan_batches
from .pool import Failure, ProducerPool
from .tuner import TunerMemory

__all__ = ["EDGE_SAMPLES", "Assembler", "BatchEpochRun", "DurationBatching", "DynamicBuckets", "EpochBatches",
           "PaddingMeter", "StreamBatchRun", "TimedDecode", "count_header_failures", "decoder_crop", "start_epoch",
           "start_streamed_epoch"]

#: How many plans a :class:`DurationBatching` remembers (planning a large corpus takes a while).
_REMEMBERED_PLANS = 4
#: The most samples :class:`DynamicBuckets` estimates its bucket edges from (held until then).
EDGE_SAMPLES = 200

T = TypeVar("T")


class DurationBatching:
    """A dataset's batches by duration: the budget, the buckets, and each item's duration (read once).

    Attributes:
        max_batch_seconds, buckets, max_batch_size: the batch setup.
        durations: seconds per source item (``NaN`` where its header could not be read): a sample's
            length in its batch, the crop where the decoder pads to it.
        content: seconds of audio per source item, the rest of ``durations`` being padding (the same
            array as ``durations`` unless the decoder pads samples to its crop).
        failures: the items whose header could not be read, as ``(index, path, message)``.
    """

    def __init__(self, durations: np.ndarray, failures: list[HeaderFailure], *, max_batch_seconds: float,
                 buckets: int, max_batch_size: int | None, content: np.ndarray | None = None) -> None:
        self.durations = durations
        self.content = durations if content is None else content
        self.failures = failures
        self.max_batch_seconds = float(max_batch_seconds)
        self.buckets = buckets
        self.max_batch_size = max_batch_size
        self._plans: dict[tuple[Any, ...], BatchPlan] = {}  # the last few plans: len() and iter() of an epoch

    @classmethod
    def read(cls, source: Any, decoder: Any, *, max_batch_seconds: float, buckets: int | None,
             max_batch_size: int | None, duration_column: str | None, on_error: ErrorPolicy,
             num_threads: int) -> DurationBatching:
        """The durations of ``source``'s items, capped by ``decoder``'s crop (NOTE [ Batches by duration ]).

        Raises:
            DecodeError: a header failed with ``on_error="raise"``.
            SourceError: ``duration_column`` is missing or holds something other than durations.
        """
        crop, pad = decoder_crop(decoder)
        durations, failures = read_durations(source, duration_column=duration_column, crop_seconds=crop,
                                             num_threads=num_threads, on_error=on_error)
        content = durations
        if crop is not None and pad:
            durations = durations.copy()
            durations[~np.isnan(durations)] = crop  # padded to the crop: every sample is that long
        return cls(durations, failures, max_batch_seconds=max_batch_seconds,
                   buckets=DEFAULT_BUCKETS if buckets is None else buckets, max_batch_size=max_batch_size,
                   content=content)

    def add_padding(self, meter: PaddingMeter, indices: np.ndarray) -> None:
        """Count the batch of source items ``indices`` in ``meter``."""
        meter.add(self.durations[indices], self.content[indices])

    def plan(self, *, shuffle: bool, seed: int, epoch: int, rank: int = 0, world_size: int = 1, worker: int = 0,
             num_workers: int = 1, even_shards: str | None = "pad",
             consumed: bytes | bytearray | None = None) -> BatchPlan:
        """The batches of one shard of ``epoch`` (``_batching.plan_batches`` with this setup), remembered for
        the next few calls (a pure function: any thread may call it)."""
        key = (shuffle, seed, epoch, rank, world_size, worker, num_workers, even_shards,
               None if consumed is None else bytes(consumed))
        plan = self._plans.get(key)
        if plan is None:
            plan = plan_batches(self.durations, max_batch_seconds=self.max_batch_seconds, buckets=self.buckets,
                                max_batch_size=self.max_batch_size, shuffle=shuffle, seed=seed, epoch=epoch,
                                rank=rank, world_size=world_size, worker=worker, num_workers=num_workers,
                                even_shards=even_shards, consumed=consumed)
            if len(self._plans) >= _REMEMBERED_PLANS:
                self._plans.clear()  # one call: safe while another thread reads
            self._plans[key] = plan
        return plan

    def state(self) -> dict[str, Any]:
        """What a state dict's batch mask was counted under (``_plan.STATE_BATCHING``): the setup and a
        digest of the durations (a changed file changes the batches)."""
        digest = hashlib.sha256(np.ascontiguousarray(self.durations, dtype="<f8").tobytes()).hexdigest()[:16]
        return {"max_batch_seconds": self.max_batch_seconds, "buckets": self.buckets,
                "max_batch_size": self.max_batch_size, "durations": f"{len(self.durations)}:{digest}"}


def decoder_crop(decoder: Any) -> tuple[float | None, bool]:
    """``decoder``'s ``crop_seconds`` (``None`` without) and whether it pads every sample to that crop."""
    crop = getattr(decoder, "crop_seconds", None)
    crop = float(crop) if isinstance(crop, (int, float)) and not isinstance(crop, bool) else None
    return crop, crop is not None and getattr(decoder, "pad", False) is True


@dataclass(frozen=True)
class EpochBatches:
    """One shard's batches laid out for a producer pool (NOTE [ Batches by duration ], Plan).

    Attributes:
        plan: the shard's batch plan (batch ``b`` of this run is ``plan.batches[b]``).
        indices: the source index of each sequence number, batch after batch.
        sizes: the number of samples of each batch.
        seqs: each sequence number's position among the samples of the full epoch of this shard
            (a resumed epoch's samples keep theirs): the work item's ``seq``.
        resumed: samples of the batches consumed before a resume (0 in a fresh epoch).
    """

    plan: BatchPlan
    indices: np.ndarray
    sizes: list[int]
    seqs: np.ndarray
    resumed: int

    @classmethod
    def of(cls, batching: DurationBatching, *, consumed: bytes | bytearray | None = None,
           **setup: Any) -> EpochBatches:
        """Plan a shard's epoch (``setup``: :meth:`DurationBatching.plan`'s keywords) and lay it out."""
        plan = batching.plan(consumed=consumed, **setup)
        sizes = [len(b) for b in plan.batches]
        indices = np.concatenate(plan.batches) if sizes else np.empty(0, dtype=np.int64)
        if plan.positions is None:
            return cls(plan, indices, sizes, np.arange(len(indices), dtype=np.int64), 0)
        full = [len(b) for b in batching.plan(**setup).batches]  # the epoch as it was before the resume
        starts = np.concatenate(([0], np.cumsum(full)[:-1])).astype(np.int64) if full else np.empty(0, np.int64)
        seqs = np.concatenate([starts[p] + np.arange(n) for p, n in zip(plan.positions, sizes)]) if sizes \
            else np.empty(0, dtype=np.int64)
        return cls(plan, indices, sizes, seqs, sum(full) - sum(sizes))

    def __len__(self) -> int:
        """The number of samples (sequence numbers)."""
        return len(self.indices)


class Assembler:
    """Collects a pool's ``(seq, out)`` pairs into batches: ``sizes[b]`` consecutive sequence numbers
    make batch ``b``. Used by one consumer thread."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self._sizes = list(sizes)
        self._first = np.concatenate(([0], np.cumsum(self._sizes)[:-1])).astype(np.int64).tolist() if sizes else []
        self._batch_of = np.repeat(np.arange(len(self._sizes)), self._sizes).tolist()
        self._pending: dict[int, list[Any]] = {}
        self._left: dict[int, int] = {}

    def start(self, b: int) -> int:
        """The first sequence number of batch ``b``."""
        return self._first[b]

    def add(self, seq: int, out: Any) -> tuple[int, list[Any]] | None:
        """Take the result of ``seq``; ``(batch, its results in plan order)`` when it completes its batch."""
        b = self._batch_of[seq]
        outs = self._pending.get(b)
        if outs is None:
            outs = self._pending[b] = [None] * self._sizes[b]
            self._left[b] = self._sizes[b]
        outs[seq - self._first[b]] = out  # every place is filled before the batch is handed on
        self._left[b] -= 1
        if self._left[b]:
            return None
        del self._left[b]
        return b, self._pending.pop(b)


class PaddingMeter:
    """The padding of the batches handed out: padded seconds / seconds in batches, each batch padded to
    its longest item, and each item's own padding (a sample padded to a crop) counted too."""

    def __init__(self) -> None:
        self.padded = 0.0
        self.real = 0.0

    def add(self, seconds: np.ndarray, content: np.ndarray | None = None) -> None:
        """Count one batch, given its items' lengths and the seconds of audio in them (``seconds``
        when ``None``)."""
        if len(seconds):
            self.padded += len(seconds) * float(seconds.max())
            self.real += float((seconds if content is None else content).sum())

    @property
    def fraction(self) -> float:
        return (self.padded - self.real) / self.padded if self.padded > 0 else 0.0


class BatchEpochRun(EpochRun):
    """One epoch of batches by duration: :class:`~audiobuffer.engine.epoch.EpochRun` whose consumed mask counts
    batches and whose consumer yields whole batches (lists of samples)."""

    def __init__(self, number: int, rank: int, world_size: int, worker: int, num_workers: int,
                 pool: ProducerPool, buffer: Buffer[Any], layout: EpochBatches, batching: DurationBatching,
                 clock: ReadClock) -> None:
        plan = layout.plan
        super().__init__(number, rank, world_size, worker, num_workers, pool, buffer, bytearray(plan.consumed),
                         plan.positions, clock=clock)
        self.plan = plan
        self.resumed = layout.resumed
        self.batching = batching
        self.assembler = Assembler(layout.sizes)
        self.batches = 0
        self.empty_batches = 0
        self.padding = PaddingMeter()
        if worker == 0:
            count_header_failures(self, batching, rank)

    def consume(self, policy: ErrorPolicy) -> Iterator[list[Any]]:
        """Yield each complete batch once (NOTE [ Batches by duration ], Assembly)."""
        for seq, out in self.pool:
            if out.__class__ is Failure:
                self.fail(out, policy)  # raises under "raise"
            done = self.assembler.add(seq, out)
            if done is None:
                continue
            b, outs = done
            self.consumed[self.plan.position(b)] = 1
            kept = [i for i, o in enumerate(outs) if o.__class__ is not Failure]
            if not kept:
                self.empty_batches += 1
                continue
            self.batches += 1
            self.yielded += len(kept)
            self.batching.add_padding(self.padding, self.plan.batches[b][kept])
            yield [outs[i] for i in kept]

    def snapshot(self) -> DatasetStats:
        stats = super().snapshot()
        stats.batches, stats.empty_batches, stats.padding = self.batches, self.empty_batches, self.padding.fraction
        return stats


def count_header_failures(run: Any, batching: DurationBatching, rank: int) -> None:
    """Count the items whose header failed in ``run``'s ``failed`` and ``failures``, on rank 0 only: those
    items are in no rank's batches (already raised, logged or skipped per ``on_error`` when read)."""
    if rank != 0:
        return
    for index, path, message in batching.failures:
        run.items += 1  # an item of the epoch, failed: yielded + failed == items
        run.failed += 1
        if len(run.failures) < MAX_LISTED_FAILURES:
            run.failures.append((index, path, message))


def start_epoch(dataset: Any, decode: Any, *, number: int, rank: int, world_size: int, worker: int,
                num_workers: int, resume: bytes | None, memory: TunerMemory | None = None) -> BatchEpochRun:
    """The (not yet started) epoch of batches of one shard of ``dataset`` (a ``BufferedDataset``)."""
    batching: DurationBatching = dataset.batching
    source, seed = dataset.source, dataset.seed
    layout = EpochBatches.of(batching, consumed=resume, shuffle=dataset.shuffle, seed=seed, epoch=number, rank=rank,
                             world_size=world_size, worker=worker, num_workers=num_workers,
                             even_shards=dataset.even_shards)
    indices, seqs = layout.indices, layout.seqs
    clock = ReadClock()

    def make_item(seq: int) -> Any:  # I/O time is counted apart from decoding (read_s), as in _epoch.py
        return source.item(int(indices[seq]), epoch=number, seed=seed, seq=int(seqs[seq]), clock=clock)

    # Room for two of the largest batches at least, so producers decode ahead while a batch trains.
    capacity = max(dataset.buffer_size, 2 * max(layout.sizes, default=0))
    buffer: Buffer[Any] = Buffer(capacity, max_bytes=dataset.max_bytes)
    pool = ProducerPool(make_item, len(layout), decode, buffer,
                        num_producers=dataset.num_producers, memory=memory, ordered=dataset.ordered,
                        warn_after=dataset.warn_after, timeout=dataset.timeout)
    return BatchEpochRun(number, rank, world_size, worker, num_workers, pool, buffer, layout, batching, clock)


# -- streamed shards: batches cut as the samples arrive ------------------------------------------------

class DynamicBuckets(Generic[T]):
    """Batches by duration cut as the samples arrive, for what cannot be planned (streamed shards), as
    Lhotse's ``DynamicBucketingSampler`` cuts them: ``buckets`` duration buckets, each filling one batch.

    The bucket edges are ``_batching.bucket_edges`` of the first samples (up to :data:`EDGE_SAMPLES`,
    fewer once they hold ``buckets x max_batch_seconds``), which wait until then. A bucket's batch grows
    while count x longest stays within ``max_batch_seconds`` (and the count within ``max_batch_size``),
    and is handed on as soon as no sample could join it; a sample longer than the budget is a batch of
    one. :meth:`flush` hands on what is left. Used by one thread.

    Example:
        >>> cutter = DynamicBuckets(4.0, 1)
        >>> cutter.add(1.0, "a"), cutter.add(2.0, "b"), cutter.add(0.5, "c"), cutter.flush()
        ([], [[(1.0, 'a'), (2.0, 'b')]], [], [[(0.5, 'c')]])
    """

    def __init__(self, max_batch_seconds: float, buckets: int, max_batch_size: int | None = None) -> None:
        self._budget = float(max_batch_seconds)
        self._buckets = buckets
        self._limit = math.inf if max_batch_size is None else max_batch_size
        self._edges: list[float] | None = [] if buckets <= 1 else None  # None: still estimating them
        self._early: list[tuple[float, T]] = []  # the samples the edges are estimated from
        self._early_seconds = 0.0
        self._open: list[list[tuple[float, T]]] = [[]]  # each bucket's batch being filled
        self._longest: list[float] = [0.0]

    @property
    def held(self) -> int:
        """Samples waiting for their batch."""
        return len(self._early) + sum(len(batch) for batch in self._open)

    def add(self, seconds: float, entry: T) -> list[list[tuple[float, T]]]:
        """Take ``entry``, ``seconds`` long; the batches (as ``(seconds, entry)`` pairs) this completes."""
        if self._edges is not None:
            return self._place(seconds, entry)
        self._early.append((seconds, entry))
        self._early_seconds += seconds
        if len(self._early) < EDGE_SAMPLES and self._early_seconds < self._buckets * self._budget:
            return []
        return self._settle_edges()

    def flush(self) -> list[list[tuple[float, T]]]:
        """Every batch not yet handed on (the end of the epoch); each is within the budget."""
        done = self._settle_edges() if self._edges is None else []
        done.extend(batch for batch in self._open if batch)
        self._open = [[] for _ in self._open]
        self._longest = [0.0] * len(self._open)
        return done

    def _settle_edges(self) -> list[list[tuple[float, T]]]:
        early, self._early = self._early, []
        self._edges = bucket_edges(np.array([seconds for seconds, _ in early]), self._buckets).tolist()
        self._open = [[] for _ in range(len(self._edges) + 1)]
        self._longest = [0.0] * len(self._open)
        return [batch for seconds, entry in early for batch in self._place(seconds, entry)]

    def _place(self, seconds: float, entry: T) -> list[list[tuple[float, T]]]:
        b = bisect.bisect_left(self._edges or [], seconds)  # as plan_batches: the first edge >= seconds
        batch, done = self._open[b], []
        longest = max(self._longest[b], seconds)
        if batch and ((len(batch) + 1) * longest > self._budget or len(batch) + 1 > self._limit):
            done.append(batch)
            batch = self._open[b] = []
            longest = seconds
        batch.append((seconds, entry))
        self._longest[b] = longest
        if (len(batch) + 1) * longest > self._budget or len(batch) >= self._limit:  # no sample could join
            done.append(batch)
            self._open[b], self._longest[b] = [], 0.0
        return done


class TimedDecode:
    """A streamed sample's decode, its duration read first from its sidecar's ``column`` field (NOTE
    [ Batches by duration ], Streamed shards): ``(length, content, sample)``, where ``length`` is capped by
    the decoder's crop (the crop itself where the decoder pads to it) and ``content`` is the audio in it.
    A sample without a duration there fails (a :class:`~audiobuffer.SourceError`) and is not decoded.
    Thread safety: any producer thread may call it."""

    def __init__(self, decode: Callable[[WorkItem], Any], column: str, *, crop: float | None, pad: bool) -> None:
        self.decode = decode
        self.column = column
        self.crop = crop
        self.pad = pad

    def __call__(self, item: WorkItem) -> tuple[float, float, Any]:
        fields, column = item.fields, self.column
        if column not in fields:
            raise SourceError(f"no duration: the fields of its sidecar have no {column!r} (duration_column), "
                              f"only {sorted(fields)}; pack the files from a manifest with that column, or read "
                              f"the shards through their index.json")
        seconds = seconds_of(fields[column])
        if seconds is None:
            raise SourceError(f"no duration: the field {column!r} (duration_column) of its sidecar holds "
                              f"{fields[column]!r}, not a finite number of seconds >= 0")
        content = seconds if self.crop is None else min(seconds, self.crop)
        length = self.crop if self.crop is not None and self.pad else content
        return length, content, self.decode(item)


class StreamBatchRun(EpochRun):
    """One epoch of streamed shards batched by duration as the samples arrive (NOTE [ Batches by duration ],
    Streamed shards): :class:`~audiobuffer.engine.epoch.EpochRun` whose consumer yields whole batches and marks a
    shard consumed only once every sample of it was handed on."""

    def __init__(self, *args: Any, buckets: DynamicBuckets[tuple[float, int, Any]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buckets = buckets
        self.batches = 0
        self.padding = PaddingMeter()
        self._waiting: Counter[int] = Counter()  # shard position -> its samples in a bucket
        self._ended: set[int] = set()  # the shards whose last output came

    def consume(self, policy: ErrorPolicy) -> Iterator[list[Any]]:
        """Yield each batch once, as the buckets fill, then every bucket at the end of the epoch."""
        for tag, out in self.pool:
            self.items += 1
            shard, last = self.shard_of(tag)
            if last:
                self._ended.add(shard)
            if out.__class__ is Failure:
                self.fail(out, policy)  # raises under "raise"
                self._settle(shard)
                continue
            length, content, sample = out
            self._waiting[shard] += 1
            for batch in self.buckets.add(length, (content, shard, sample)):
                yield self._hand_on(batch)
        if not self.pool.stopped:  # the epoch's end, not a close(): the batches left in the buckets
            for batch in self.buckets.flush():
                yield self._hand_on(batch)

    def _hand_on(self, batch: list[tuple[float, tuple[float, int, Any]]]) -> list[Any]:
        """Count ``batch`` and mark the shards it completes (before the consumer gets it, as every mark)."""
        self.batches += 1
        self.yielded += len(batch)
        self.padding.add(np.array([length for length, _ in batch]), np.array([entry[0] for _, entry in batch]))
        for _, (_, shard, _) in batch:
            self._waiting[shard] -= 1
        for shard in {entry[1] for _, entry in batch}:
            self._settle(shard)
        return [entry[2] for _, entry in batch]

    def _settle(self, shard: int) -> None:
        """Mark ``shard`` consumed once its last output came and none of its samples waits in a bucket."""
        if shard in self._ended and self._waiting[shard] <= 0:
            self.consumed[shard] = 1
            del self._waiting[shard]

    def snapshot(self) -> DatasetStats:
        stats = super().snapshot()
        stats.batches, stats.padding = self.batches, self.padding.fraction
        return stats


def start_streamed_epoch(dataset: Any, decode: Any, *, number: int, rank: int, world_size: int, worker: int,
                         num_workers: int, resume: bytes | None, memory: TunerMemory | None = None) -> EpochRun:
    """The (not yet started) epoch of one shard of ``dataset`` (a ``BufferedDataset`` of streamed shards),
    batched by duration as the samples arrive (NOTE [ Batches by duration ], Streamed shards)."""
    options = dataset.options
    crop, pad = decoder_crop(dataset.decoder)
    buckets: DynamicBuckets[tuple[float, int, Any]] = DynamicBuckets(
        cast(float, options.max_batch_seconds), DEFAULT_BUCKETS if options.buckets is None else options.buckets,
        options.max_batch_size)
    timed = TimedDecode(decode, cast(str, options.duration_column), crop=crop, pad=pad)
    return _epoch.start_epoch(dataset, timed, number=number, rank=rank, world_size=world_size, worker=worker,
                              num_workers=num_workers, resume=resume, memory=memory,
                              make_run=functools.partial(StreamBatchRun, buckets=buckets))
