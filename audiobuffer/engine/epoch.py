"""One epoch, set up and run: :func:`set_up_epoch` (layout, buffer, producer pool) is how every loader's
epochs start, the helper process's too; :func:`run_epoch` wraps it in the consumer that yields
samples, planned batches by duration, or batches cut as streamed samples arrive, with its counts,
error policy and stats. The helper process runs the same consumer into a :class:`BatchSink`
(:func:`feed`).

NOTE [ Batches by duration ]
============================
Durations. Read once per pipeline, at construction (``prepare/durations.read_durations``: a manifest
column, or each file's header through the on-disk cache), so that a header failure is raised, logged
or counted per ``on_error`` before any epoch starts. A decoder's ``crop_seconds`` caps them; with its
``pad`` as well, every sample is exactly the crop long, and so is its duration here (the batch's
tensor is what the budget bounds). A file whose header failed has no duration and is in no batch.

Plan. ``plan.plan_batches``: a pure function of the durations and the setup, so every rank and
DataLoader worker cuts the same batches and takes its own share of them, with no communication; the
resume mask counts batches. ``DurationBatching.lay_out`` (``pipeline.py``) lays a shard's batches out
for the pool: sequence numbers ``0 .. S-1`` run through the batches in order, so producers take a
batch's samples together and decode them in parallel.

Assembly. The consumer (:class:`Assembler`) keeps the samples of each batch until its last one has
arrived, then hands the batch on whole, in plan order within the batch. In an unordered pool batches
complete (and are yielded) in the order their last sample finishes; an ordered pool completes them in
plan order, and so does the assembler itself for ranks in step (NOTE [ Ranks in step ] in ``plan.py``:
a batch handed on a step early or late would meet another bucket's on the other ranks), holding a
complete batch until those before it are handed on. A failed sample leaves its batch (per
``on_error``), which comes smaller; a batch whose samples all failed is counted and skipped; either way
the batch counts as consumed for resume once handed on. Only the batches with a sample still being
decoded (and, in step, the complete ones behind them) are held, so memory stays bounded by the buffer
plus those batches. The buffer holds at least two of the epoch's largest batches (more
than ``buffer_size`` if need be), so the producers decode the next batch while one trains.

Streamed shards. A :class:`~audiobuffer.sources.stream.ShardStream` cannot be planned: no duration (not
even the count) is known before a shard streams, and a shard is read from start to end. Its batches
are cut in the consumer as the samples arrive (``streamed.DynamicBuckets``, as Lhotse's
``DynamicBucketingSampler`` does). A sample's duration is the ``duration_column`` field of its sidecar,
read in the producer before decoding (``streamed.TimedDecode``; a sample without one fails per
``on_error``, undecoded). The bucket edges are estimated from the first samples (``EDGE_SAMPLES`` at
most, fewer once they hold ``buckets x max_batch_seconds``); a bucket hands its batch on when no more
sample may join it within the budget (or ``max_batch_size``), and the end of the epoch hands on every
bucket. Resume stays at shard boundaries (NOTE [ Streamed shards ] in ``sources/stream.py``):
:class:`StreamBatchRun` marks a shard consumed once its last sample has come and every one of its
samples was handed on in a batch (or failed), so a saved state never skips a sample still waiting in a
bucket. The number of batches is unknown until the epoch ends (no ``len()``); beside the buffer, the
buckets hold less than ``buckets x max_batch_seconds`` of audio.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import numpy as np

from ..buffer import Buffer
from ..errors import BufferClosed, DecodeError, SampleError, StallError
from ..options import ErrorPolicy, ProducerCount, gil_enabled
from ..sources.blocks import BlockReads
from ..sources.item import ReadClock, WorkItem
from ..sources.mixture import Mixture
from ..sources.stream import ShardStream
from .plan import BLOCK_WINDOW
from .pool import Failure, Port, ProducerPool
from .stats import MAX_LISTED_FAILURES, DatasetStats, PaddingMeter
from .streamed import DynamicBuckets, ShardReader

if TYPE_CHECKING:
    from .pipeline import DurationBatching, EpochLayout, Pipeline
    from .plan import EpochShard

__all__ = ["Assembler", "BatchEpochRun", "BatchSink", "EpochCounts", "EpochRun", "EpochSetup",
           "PaddingMeter", "RunningEpochs", "StreamBatchRun", "feed", "mixture_counts", "run_epoch",
           "set_up_epoch"]

logger = logging.getLogger(__name__)

class Assembler:
    """Collects a pool's ``(seq, out)`` pairs into batches: ``sizes[b]`` consecutive sequence numbers
    make batch ``b``; ``in_order``: complete batches are handed on in plan order (ranks in step), else as
    they complete. Used by one consumer thread."""

    def __init__(self, sizes: Sequence[int], *, in_order: bool = False) -> None:
        self._in_order = in_order
        self._ready: dict[int, list[Any]] = {}  # in order: complete batches behind an incomplete one
        self._next = 0
        self._sizes = list(sizes)
        self._first = np.concatenate(([0], np.cumsum(self._sizes)[:-1])).astype(np.int64).tolist() if sizes else []
        self._batch_of = np.repeat(np.arange(len(self._sizes)), self._sizes).tolist()
        self._pending: dict[int, list[Any]] = {}
        self._left: dict[int, int] = {}

    def start(self, b: int) -> int:
        """The first sequence number of batch ``b``."""
        return self._first[b]

    def add(self, seq: int, out: Any) -> list[tuple[int, list[Any]]]:
        """Take the result of ``seq``; the batches this hands on, each as ``(batch, its results in plan
        order)``: the one ``seq`` completes, or in order, those it lets go."""
        b = self._batch_of[seq]
        outs = self._pending.get(b)
        if outs is None:
            outs = self._pending[b] = [None] * self._sizes[b]
            self._left[b] = self._sizes[b]
        outs[seq - self._first[b]] = out  # every place is filled before the batch is handed on
        self._left[b] -= 1
        if self._left[b]:
            return []
        del self._left[b]
        if not self._in_order:
            return [(b, self._pending.pop(b))]
        self._ready[b] = self._pending.pop(b)
        done = []
        while self._next in self._ready:
            done.append((self._next, self._ready.pop(self._next)))
            self._next += 1
        return done


class EpochCounts:
    """What the consumer of one epoch counts: the resume mask, items, samples handed out, failures and
    batches. In-process runs and ``IsolatedLoader``'s trainer side count alike.

    Thread safety: the consumer's thread counts; a snapshot may be taken from any thread.
    """

    def __init__(self, shard: EpochShard, layout: EpochLayout, *, batched: bool,
                 sources: dict[str, int] | None = None) -> None:
        self.sources = sources  # a mixture's draws per source
        self.number = shard.number
        self.rank = shard.rank
        self.world_size = shard.world_size
        self.worker = shard.worker
        self.num_workers = shard.num_workers
        #: One byte per unit of this shard's full epoch (a sample, a streamed shard or a batch): 1 once
        #: handed out or failed.
        self.consumed = bytearray(layout.consumed)
        #: Streamed shards: the epoch's shards, and ``items`` counts samples as they come.
        self.shards = len(layout) if layout.streamed else None
        self.items = 0 if layout.streamed else len(layout)
        self.resumed = layout.resumed
        self.yielded = 0
        self.failed = 0
        self.failures: list[tuple[int, str, str]] = []
        self.batches: int | None = 0 if batched else None  # batches by duration: those handed out
        self.empty_batches = 0
        self.padding = PaddingMeter()
        self.done = False
        self.start = time.perf_counter()
        self.end: float | None = None

    def count_failure(self, index: int, path: str, reason: str) -> None:
        """Count a failed item that the error policy skipped (:meth:`EpochRun.fail` applied it)."""
        self.failed += 1
        if len(self.failures) < MAX_LISTED_FAILURES:
            self.failures.append((index, path, reason))

    def count_header_failures(self, batching: DurationBatching) -> None:
        """Count the items whose header failed, in rank 0's first worker only: those items are in no rank's
        batches (already raised, logged or skipped per ``on_error`` when read)."""
        if self.rank != 0 or self.worker != 0:
            return
        for index, path, message in batching.failures:
            self.items += 1  # an item of the epoch, failed: yielded + failed == items
            self.count_failure(index, path, message)

    def stats(self, *, num_producers: int, **measured: Any) -> DatasetStats:
        """The counts now, with what the producers' side ``measured`` (:class:`DatasetStats`' other fields)."""
        end = self.end if self.end is not None else time.perf_counter()
        return DatasetStats(
            epoch=self.number, rank=self.rank, world_size=self.world_size, worker=self.worker,
            num_workers=self.num_workers, items=self.items, num_producers=num_producers, shards=self.shards,
            resumed=self.resumed, yielded=self.yielded, failed=self.failed, failures=list(self.failures),
            wall_s=end - self.start, done=self.done, batches=self.batches, empty_batches=self.empty_batches,
            padding=None if self.batches is None else self.padding.fraction,
            sources=None if self.sources is None else dict(self.sources), **measured)


@dataclass
class EpochSetup:
    """One epoch set up, its producers not started: the shard, its layout, the buffer, the pool that
    fills it, how a sequence number becomes a work item, and the clock of the producers' reads."""

    shard: EpochShard
    layout: EpochLayout
    buffer: Buffer[Any]
    pool: ProducerPool
    make_item: Callable[[int], WorkItem]
    clock: ReadClock
    seed: int = 0
    sources: dict[str, int] | None = None
    augment_s: Callable[[], float] = lambda: 0.0


def augment_seconds(decoder: Any) -> Callable[[], float]:
    """Seconds ``decoder``'s augmentations run from this call on (its ``augment_clock``; 0 without)."""
    clock = getattr(decoder, "augment_clock", None)
    if clock is None:
        return lambda: 0.0
    start = clock.seconds
    return lambda: max(0.0, clock.seconds - start)


def mixture_counts(pipeline: Pipeline, shard: EpochShard, layout: EpochLayout) -> dict[str, int] | None:
    """A mixture's draws from each source in ``layout`` (NOTE [ Mixtures ]); ``None`` for other sources."""
    source = pipeline.source
    if not isinstance(source, Mixture):
        return None
    return source.counts(pipeline.options.seed, shard.number, layout.indices)


def set_up_epoch(pipeline: Pipeline, shard: EpochShard, *, resume: bytes | None = None,
                 layout: EpochLayout | None = None, port: Port | None = None) -> EpochSetup:
    """Epoch ``shard`` of ``pipeline``, planned (resumed after the units ``resume`` marks) unless ``layout``
    is given: the helper process decodes the batches by duration that its trainer planned.

    A :class:`~audiobuffer.Source` lays out its items (or batches); streamed tar shards lay out their
    shards, each streamed whole by one producer (NOTE [ Streamed shards ] in ``sources/stream.py``).
    ``port``: what the producers do with each decoded item (NOTE [ Output port ] in ``pool.py``);
    ``None``: into the buffer in the item's place (streamed shards bring their own).

    Raises:
        ResumeError: ``resume`` does not have one byte per unit of this shard's epoch.
    """
    if layout is None:
        layout = pipeline.lay_out(shard, resume)
    options, source, clock = pipeline.options, pipeline.source, ReadClock()
    number, seed, indices = shard.number, options.seed, layout.indices
    # Batches by duration: room for two of the largest, so producers decode ahead while one trains.
    capacity = max(options.buffer_size, 2 * max(layout.sizes or (0,)))
    buffer: Buffer[Any] = Buffer(capacity, max_bytes=options.max_bytes)
    decode = pipeline.decode
    make_item: Callable[[int], WorkItem]
    if isinstance(source, ShardStream):
        stream = source

        def make_item(seq: int) -> WorkItem:
            return stream.shard_item(int(indices[seq]), epoch=number, seed=seed, seq=layout.seq(seq))

        if port is not None:
            raise ValueError(f"streamed shards put their samples through their own port, not {port!r}")
        reader = ShardReader(stream, decode, clock, shuffle=options.shuffle)
        decode, port = reader.outputs, reader
    elif (starts := pipeline.read_blocks()) is not None:
        # Blocks of members, each read once by the first producer to need it (NOTE [ Block order ] in plan.py)
        blocks = BlockReads(source.table, starts, indices, storage=source.storage,
                            capacity=2 * BLOCK_WINDOW + options.most_producers() + 2)
        block_source = source

        def make_item(seq: int) -> WorkItem:
            return block_source.item(int(indices[seq]), epoch=number, seed=seed, seq=layout.seq(seq), clock=clock,
                                     blocks=blocks)
    else:
        listed = source

        def make_item(seq: int) -> WorkItem:
            # A resumed epoch's items keep their places in the full epoch; I/O is timed apart (read_s).
            return listed.item(int(indices[seq]), epoch=number, seed=seed, seq=layout.seq(seq), clock=clock)

    producers = cast(ProducerCount, options.num_producers)  # LoaderOptions stores None as "auto"
    # Batches by duration: the tuner weighs each item by its seconds (NOTE [ Producer tuning ]).
    tuned = producers == "auto" and len(layout) > 0
    weights = pipeline.item_seconds(number, indices) if tuned else None
    # the decoder says what its producers do only where no transform runs after it
    decode_only = options.transform is None
    # a decode outside the GIL: no climb from inline
    parallel = decode_only and getattr(pipeline.decoder, "releases_gil", False) is True
    # a decode that runs no matrix product: no BLAS limit to hold (NOTE [ BLAS threads ])
    blas_free = decode_only and getattr(pipeline.decoder, "calls_blas", True) is False
    pool = ProducerPool(make_item, len(layout), decode, buffer, num_producers=producers, memory=pipeline.memory,
                        ordered=options.ordered, warn_after=options.warn_after, timeout=options.timeout,
                        weights=weights, port=port,
                        blas_threads=None if blas_free else options.blas_threads,
                        start_at_cores=parallel)
    return EpochSetup(shard, layout, buffer, pool, make_item, clock, seed, mixture_counts(pipeline, shard, layout),
                      augment_seconds(pipeline.decoder))


def run_epoch(pipeline: Pipeline, shard: EpochShard, *, resume: bytes | None = None,
              layout: EpochLayout | None = None, port: Port | None = None) -> EpochRun:
    """Epoch ``shard`` of ``pipeline`` with its in-process consumer, not started (:class:`RunningEpochs`
    starts it): samples, batches by duration (:class:`BatchEpochRun`), or streamed samples batched as they
    arrive (:class:`StreamBatchRun`). ``layout``, ``port``: as for :func:`set_up_epoch`.

    Raises:
        ResumeError: ``resume`` does not have one byte per unit of this shard's epoch.
    """
    setup = set_up_epoch(pipeline, shard, resume=resume, layout=layout, port=port)
    if pipeline.batching is not None:
        return BatchEpochRun(setup, pipeline.batching)
    if pipeline.budget is not None:  # streamed shards: no durations to plan from (Pipeline.build)
        return StreamBatchRun(setup, pipeline.budget.stream_buckets())
    return EpochRun(setup)


class EpochRun(EpochCounts):
    """One running (or finished) epoch: its pool and buffer, and THE consumer of its outputs, with
    its counts and error policy (:meth:`units`; in process :meth:`consume`, in the helper process
    :func:`feed`); this class yields samples.

    Thread safety: one thread consumes; :meth:`snapshot` from any thread.
    """

    def __init__(self, setup: EpochSetup, *, batched: bool = False) -> None:
        super().__init__(setup.shard, setup.layout, batched=batched, sources=setup.sources)
        self.seed = setup.seed
        self.layout = setup.layout
        self.pool = setup.pool
        self.buffer = setup.buffer
        self.clock = setup.clock
        self.make_item = setup.make_item
        self.augment_s = setup.augment_s
        #: Marks the consumer's ``seq`` consumed (a streamed epoch: a shard, by its last sample).
        self.mark: Callable[[Any], None] = self._mark_shard if setup.layout.streamed else self._mark_item
        #: Where :func:`feed` hands the epoch on (the helper process): it is told of every failure.
        self.sink: BatchSink | None = None
        #: With :func:`feed`, the positions marked consumed since the last batch it handed on.
        self.marked: list[int] | None = None

    def mark_consumed(self, position: int) -> None:
        """Mark the unit at ``position`` of the full epoch consumed (handed on or failed)."""
        self.consumed[position] = 1
        if self.marked is not None:
            self.marked.append(position)

    def _mark_item(self, seq: int) -> None:
        positions = self.layout.positions
        self.mark_consumed(seq if positions is None else positions[seq])

    def _mark_shard(self, tag: Any) -> None:
        shard, last = self.shard_of(tag)
        if last:
            self.mark_consumed(shard)

    def shard_of(self, tag: Any) -> tuple[int, bool]:
        """A streamed epoch's tag as ``(shard position, whether it is the shard's last output)``: a
        ShardReader tags each output ``(position, last)`` (NOTE [ Streamed shards ]); a bare seq is the
        pool's own failure for a shard whose reader itself crashed, its last output."""
        if tag.__class__ is tuple:
            return tag[0], tag[1]
        return self.layout.position(tag), True

    def snapshot(self) -> DatasetStats:
        """The epoch's stats now."""
        return self.stats(num_producers=self.pool.num_producers,
                          decode_s=max(0.0, self.pool.decode_seconds - self.clock.seconds), read_s=self.clock.seconds,
                          inline_s=self.pool.inline_seconds, augment_s=self.augment_s(),
                          buffer=self.buffer.stats, producer_history=self.pool.history, gil_enabled=gil_enabled())

    def consume(self, policy: ErrorPolicy) -> Iterator[Any]:
        """What the training loop takes: each output of :meth:`units`."""
        for out, _ in self.units(policy):
            yield out

    def units(self, policy: ErrorPolicy) -> Iterator[tuple[Any, Any]]:
        """Yield each sample from the pool once, as ``(sample, its seq)``, marking its position
        consumed; apply ``policy`` to failures."""
        mark, streamed = self.mark, self.shards is not None
        for seq, out in self.pool:
            mark(seq)
            if streamed:
                self.items += 1
            if out.__class__ is Failure:
                self.fail(out, policy)
                continue
            self.yielded += 1
            yield out, seq

    def fail(self, failure: Failure, policy: ErrorPolicy) -> None:
        """Apply the error policy to a failed item, the one place it is applied: tell the sink (the
        helper's trainer counts or raises it), then raise it, or count (and log) it and go on."""
        item, exc = cast(WorkItem, failure.item), failure.exc  # a producer's Failure always has its item
        if self.sink is not None:
            self.sink.fail(failure, fatal=policy == "raise")
        reason = f"{type(exc).__name__}: {exc}"
        message = f"item {item.index} ({item.path!r}) failed in {failure.producer}: {reason}"
        if policy == "raise":
            cls = DecodeError if isinstance(exc, DecodeError) else SampleError
            raise cls(message, path=item.path, index=item.index, producer=failure.producer) from exc
        self.count_failure(item.index, item.path, reason)
        if policy == "warn":
            logger.warning("skipping %s", message)


class BatchEpochRun(EpochRun):
    """One epoch of batches by duration: the consumed mask counts batches, and :meth:`consume` yields
    whole batches (lists of samples; NOTE [ Batches by duration ], Assembly).

    ``batching``: ``None`` in the helper process, which decodes the batches its trainer planned (the
    trainer counts the items whose header failed, and the padding).
    """

    def __init__(self, setup: EpochSetup, batching: DurationBatching | None) -> None:
        super().__init__(setup, batched=True)
        self.batching = batching
        self.assembler = Assembler(cast(list[int], setup.layout.sizes), in_order=setup.layout.in_step)
        if batching is not None:
            self.count_header_failures(batching)

    def consume(self, policy: ErrorPolicy) -> Iterator[list[Any]]:
        """Yield each complete batch once, but those whose samples all failed."""
        for samples, _ in self.units(policy):
            if samples:
                yield samples

    def units(self, policy: ErrorPolicy) -> Iterator[tuple[list[Any], list[int]]]:
        """Yield each complete batch once, as ``(samples, seqs)``; empty if they all failed."""
        layout, assembler = self.layout, self.assembler
        for seq, out in self.pool:
            if out.__class__ is Failure:
                self.fail(out, policy)  # raises under "raise"
            for b, outs in assembler.add(seq, out):
                self.mark_consumed(layout.position(b))
                first = assembler.start(b)
                kept = [i for i, o in enumerate(outs) if o.__class__ is not Failure]
                if not kept:
                    self.empty_batches += 1
                    yield [], []
                    continue
                self.batches = cast(int, self.batches) + 1
                self.yielded += len(kept)
                samples = [outs[i] for i in kept]
                if not self.padding.add_samples(samples) and self.batching:  # no frames: durations
                    self.batching.add_padding(self.padding, layout.indices[first:first + len(outs)][kept],
                                              seed=self.seed, epoch=self.number)
                yield samples, [first + i for i in kept]


class StreamBatchRun(EpochRun):
    """One epoch of streamed shards batched by duration as the samples arrive (NOTE [ Batches by duration ],
    Streamed shards): :meth:`consume` yields whole batches and marks a shard consumed only once every
    sample of it was handed on."""

    def __init__(self, setup: EpochSetup, buckets: DynamicBuckets[tuple[float, int, Any]]) -> None:
        super().__init__(setup, batched=True)
        self.buckets = buckets
        self._waiting: Counter[int] = Counter()  # shard position -> its samples in a bucket
        self._ended: set[int] = set()  # the shards whose last output came

    def units(self, policy: ErrorPolicy) -> Iterator[tuple[list[Any], None]]:
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
                yield self._hand_on(batch), None
        if not self.pool.stopped:  # the epoch's end, not a close(): the batches left in the buckets
            for batch in self.buckets.flush():
                yield self._hand_on(batch), None

    def _hand_on(self, batch: list[tuple[float, tuple[float, int, Any]]]) -> list[Any]:
        """Count ``batch`` and mark the shards it completes (before the consumer gets it, as every mark)."""
        self.batches = cast(int, self.batches) + 1
        self.yielded += len(batch)
        samples = [entry[2] for _, entry in batch]
        if not self.padding.add_samples(samples):  # samples without frames: their durations
            self.padding.add(np.array([length for length, _ in batch]), np.array([entry[0] for _, entry in batch]))
        for _, (_, shard, _) in batch:
            self._waiting[shard] -= 1
        for shard in {entry[1] for _, entry in batch}:
            self._settle(shard)
        return samples

    def _settle(self, shard: int) -> None:
        """Mark ``shard`` consumed once its last output came and none of its samples waits in a bucket."""
        if shard in self._ended and self._waiting[shard] <= 0:
            self.mark_consumed(shard)
            del self._waiting[shard]


class BatchSink(Protocol):
    """Where :func:`feed` hands an epoch on: the helper process's shared-memory slots, which its
    trainer copies out. The trainer counts what it is told; the error policy was applied before."""

    def put(self, samples: list[Any], seqs: list[int], positions: list[int]) -> dict[int, Failure]:
        """Hand on a batch of ``samples`` (sequence numbers ``seqs``) consuming ``positions``; or
        hand on nothing and return the samples that cannot join a batch (by place), as failures."""

    def skip(self, position: int) -> None:
        """The batch by duration at ``position`` is consumed with no batch: its samples failed."""

    def fail(self, failure: Failure, *, fatal: bool) -> None:
        """An item failed; ``fatal``: the error policy raises it and the epoch ends."""

    def end(self, positions: list[int]) -> None:
        """The epoch ran to its end; ``positions``: those consumed after the last batch."""


def feed(run: EpochRun, sink: BatchSink, policy: ErrorPolicy, *, batch_size: int | None = None,
         drop_last: bool = False) -> None:
    """Consume ``run`` (its pool started) into ``sink``: its samples in batches of ``batch_size``,
    or, with ``None``, the batches by duration it assembles, each with the positions consumed since
    the one before (its samples', the failures'). A sample the sink refuses fails as its item under
    ``policy``, and the batch goes on without it (one of ``batch_size`` fills up from the next
    samples). Returns when the epoch ends, is stopped, or ``policy`` raised a failure (the sink was
    told); raises what else the pool (``StallError``, ``BufferClosed``) or the sink raises."""
    run.sink, run.marked = sink, []
    samples: list[Any] = []
    seqs: list[int] = []
    try:
        for out, taken in run.units(policy):
            if batch_size is None:  # a whole batch by duration: empty if its samples all failed
                samples, seqs = out, taken
                while samples and not _hand_on(run, sink, samples, seqs, policy):
                    pass
                if run.marked:  # nothing handed on: the batch's position goes alone
                    sink.skip(run.marked.pop())
                continue
            samples.append(out)
            seqs.append(taken)
            if len(samples) == batch_size:
                _hand_on(run, sink, samples, seqs, policy)  # short of misfits: fills up again
        if run.pool.stopped:
            return
        while samples and not drop_last and not _hand_on(run, sink, samples, seqs, policy):
            pass
        sink.end(run.marked)
    except SampleError:  # the error policy raised a failure: run.fail told the sink, the epoch ends
        return


def _hand_on(run: EpochRun, sink: BatchSink, samples: list[Any], seqs: list[int],
             policy: ErrorPolicy) -> bool:
    """Put ``samples`` into ``sink`` with the positions marked since the last batch: ``True`` once
    put, the lists emptied; else ``False``, its misfits failed under ``policy`` and taken out."""
    misfits = sink.put(samples, seqs, cast(list[int], run.marked))
    if not misfits:
        samples.clear()
        seqs.clear()
        run.marked = []
        return True
    for i in sorted(misfits, reverse=True):
        run.fail(misfits[i], policy)  # raises under "raise"
        del samples[i], seqs[i]
    return False


#: The epochs' generators still open (weakly): closed when the interpreter exits (see closed_at_exit).
_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()
_Epoch = TypeVar("_Epoch", bound=Iterator[Any])


def feed_epoch(pipeline: Pipeline, shard: EpochShard, *, resume: bytes | None,
               layout: EpochLayout | None, sink: Callable[[EpochRun], BatchSink],
               started: Callable[[ProducerPool], bool], stalled: Callable[[StallError], None],
               batch_size: int | None, drop_last: bool) -> None:
    """Run epoch ``shard`` of ``pipeline`` (resumed after ``resume``, or over the trainer's
    ``layout`` of batches by duration) through :func:`feed` into ``sink(run)``: the isolated
    loader's helper, and its trainer while the helper warms up. ``started(pool)`` registers the
    pool before it starts, so that a stop can close it (``False``: another epoch replaced this
    one); ``stalled`` is told of a stall before the pool is closed (the close waits for the
    producer stuck in a decode)."""
    epoch = set_up_epoch(pipeline, shard, resume=resume, layout=layout)
    run = EpochRun(epoch) if epoch.layout.sizes is None else BatchEpochRun(epoch, None)
    if not started(epoch.pool):
        return
    out = sink(run)
    epoch.pool.start()
    try:
        feed(run, out, pipeline.options.on_error, batch_size=batch_size, drop_last=drop_last)
    except StallError as exc:
        stalled(exc)
    finally:
        epoch.pool.close()


def closed_at_exit(epoch: _Epoch) -> _Epoch:
    """``epoch``, closed when the interpreter exits if the loop left it open (a script that ends mid-epoch).

    A generator left open is otherwise finalized while the interpreter tears its modules down, when its
    ``finally`` (stopping producers, telling the helper) finds the modules it calls emptied and Python
    prints the failure as "Exception ignored". An ``atexit`` handler runs before that teardown.
    """
    _OPEN.add(epoch)
    return epoch


@atexit.register
def _close_open_epochs() -> None:
    for epoch in list(_OPEN):
        try:
            epoch.close()
        except Exception:  # noqa: BLE001 - at exit: what fails here has nobody left to report to
            pass


class RunningEpochs:
    """A loader's epochs in this process: the running ones, which :meth:`close` stops, and the last one,
    whose stats the loader reports (NOTE [ Producer shutdown protocol ] in ``pool.py``).

    Thread safety: :meth:`close`, :attr:`last` and :attr:`running` from any thread; one thread iterates
    an epoch.
    """

    def __init__(self, owner: str) -> None:
        self._owner = owner  # for the message of an iter() after close()
        self._lock = threading.Lock()
        self._running: set[EpochRun] = set()
        self._last: EpochRun | None = None
        self._closed = False

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a DataLoader worker's) runs epochs of its own: no threads, locks or stats travel.
        return {"owner": self._owner}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["owner"])  # type: ignore[misc]

    @property
    def last(self) -> EpochRun | None:
        """The epoch started last (running or finished), or ``None``."""
        with self._lock:
            return self._last

    @property
    def running(self) -> list[EpochRun]:
        """The epochs running now."""
        with self._lock:
            return list(self._running)

    def run(self, run: EpochRun, policy: ErrorPolicy) -> Generator[Any, None, None]:
        """Start ``run``'s producers and yield what its consumer yields; the producers stop however the
        loop ends. A generator: its ``finally`` runs on exhaustion, on an exception, on ``close()``, when
        the generator is garbage-collected, and at the latest when the interpreter exits
        (:func:`closed_at_exit`).

        Raises:
            BufferClosed: :meth:`close` was called.
        """
        return closed_at_exit(self._run(run, policy))

    def _run(self, run: EpochRun, policy: ErrorPolicy) -> Generator[Any, None, None]:
        with self._lock:
            if self._closed:
                run.pool.close()
                raise BufferClosed(f"iter() on a closed {self._owner}")
            self._running.add(run)
            self._last = run
        try:
            run.pool.start()  # inside the try: threads started before a failed start are stopped
            yield from run.consume(policy)
            run.done = not run.pool.stopped
        finally:
            run.pool.close()
            run.end = time.perf_counter()
            with self._lock:
                self._running.discard(run)

    def close(self) -> None:
        """Stop every running epoch's producers and refuse new epochs. Idempotent, any thread."""
        with self._lock:
            self._closed = True
            running = list(self._running)
        for run in running:
            run.pool.close()
