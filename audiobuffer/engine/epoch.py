"""One epoch of a :class:`~audiobuffer.BufferedDataset` as it runs: how it starts (plan, items, pool),
its counts, its stats, its error policy, and the check that tells the main process its epochs ran in
DataLoader workers."""

from __future__ import annotations

import logging
import multiprocessing
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.context import get_spawning_popen
from typing import Any, cast

import numpy as np

from ..buffer import Buffer, BufferStats
from ..errors import DecodeError, SampleError
from ..options import ErrorPolicy, LoaderOptions, gil_enabled
from ..sources.source import ReadClock, WorkItem
from ..sources.stream import ShardStream
from .plan import plan_epoch, shard_length
from .pool import CHUNK_ITEMS, Failure, ProducerPool, delivers_itself
from .streamed import ShardReader, check_streamable
from .tuner import TunerMemory

__all__ = ["MAX_LISTED_FAILURES", "Compose", "DatasetStats", "EpochRun", "WorkerEpochs", "check_combination",
           "epoch_length",
           "record_skip", "start_epoch"]

logger = logging.getLogger(__name__)

#: How many failed items :class:`DatasetStats` lists by name (all are counted).
MAX_LISTED_FAILURES = 100


@dataclass
class DatasetStats:
    """What one epoch of a :class:`BufferedDataset` did (one rank, one DataLoader worker).

    Attributes:
        epoch: the epoch number.
        rank: this process's rank; world_size: how many ranks share the epoch.
        worker: the DataLoader worker id (0 without workers); num_workers: how many workers share it.
        items: this shard's items in the epoch (those left to do, in a resumed epoch); of streamed tar
            shards, the samples read so far (yielded, failed, or waiting for their batch), since a shard's
            count is known only once it has streamed: final when ``done``.
        shards: of streamed tar shards, the shards this epoch streams (those left to do, in a resumed
            epoch); ``None`` for other sources.
        num_producers: the producer threads decoding now (or at the end): the pinned count, or the
            count ``"auto"`` has settled on; 0 means the consumer decodes in its own thread.
        resumed: items already consumed before a resume (0 in a fresh epoch); of streamed tar shards,
            the shards (resume is at shard boundaries).
        yielded: samples handed to the consumer.
        failed: items whose decoder or transform raised (skipped with "warn" or "skip").
        failures: ``(index, path, message)`` of the first 100 failed items.
        decode_s: seconds the producers spent decoding, summed over producers, without ``read_s``.
        read_s: seconds the producers spent waiting for bytes (shard members, remote objects, streamed
            shards), summed over producers: I/O, not decoding.
        wall_s: seconds from the epoch's start to its end (or to now, while it runs).
        done: whether the epoch ran to its end.
        buffer: the buffer's counters (waits on both sides, fill).
        transfer: an :class:`~audiobuffer.IsolatedLoader`'s hand-over between its processes: seconds the
            trainer waited for a batch (``trainer_wait_s``) and copied slots out (``trainer_copy_s``), and
            seconds the helper waited for a free slot (``helper_slot_wait_s``); ``None`` in process.
        producer_history: the producer count over time, as ``(seconds since the epoch started, count,
            reason)``: each decision of ``num_producers="auto"`` (the first is the start), or one
            ``"pinned"`` entry.
        gil_enabled: whether the GIL was enabled (``sys._is_gil_enabled()``; always before 3.13).
        batches: with ``max_batch_seconds``, the batches handed out (``None`` without).
        empty_batches: batches whose samples all failed (skipped).
        padding: with ``max_batch_seconds``, the padding of the batches handed out: padded seconds /
            seconds in batches, each batch padded to its longest item (``None`` without).

    With ``max_batch_seconds``, ``items``, ``failed`` and ``failures`` also count the items whose header
    could not be read (in rank 0's first DataLoader worker, every epoch: those items are in no batch).
    Once an epoch is done, ``yielded + failed == items`` for every source.
    """

    epoch: int
    rank: int
    world_size: int
    worker: int
    num_workers: int
    items: int
    num_producers: int
    shards: int | None = None
    resumed: int = 0
    yielded: int = 0
    failed: int = 0
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    decode_s: float = 0.0
    read_s: float = 0.0
    wall_s: float = 0.0
    done: bool = False
    buffer: BufferStats | None = None
    transfer: dict[str, float] | None = None
    batches: int | None = None
    empty_batches: int = 0
    padding: float | None = None
    producer_history: list[tuple[float, int, str]] = field(default_factory=list)
    gil_enabled: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The stats as plain builtins."""
        return asdict(self)


class EpochRun:
    """One running (or finished) epoch: its pool and buffer, and the consumer's counts."""

    def __init__(self, number: int, rank: int, world_size: int, worker: int, num_workers: int,
                 pool: ProducerPool, buffer: Buffer[Any], consumed: bytearray,
                 positions: np.ndarray | None, *, clock: ReadClock | None = None, streamed: bool = False) -> None:
        self.number = number
        self.clock = clock if clock is not None else ReadClock()
        #: Marks the consumer's ``seq`` consumed (a streamed epoch: a shard, by its last sample).
        self.mark: Callable[[Any], None] = self._mark_shard if streamed else self._mark_item
        #: One byte per position of this shard's epoch order: 1 once yielded or failed.
        self.consumed = consumed
        #: The shard positions the pool's sequence numbers stand for (a resumed epoch skips some).
        self.positions = positions
        self.rank = rank
        self.world_size = world_size
        self.worker = worker
        self.num_workers = num_workers
        self.pool = pool
        self.buffer = buffer
        #: Streamed shards: the pool's items are shards, and ``items`` counts samples as they come.
        self.shards = pool.count if streamed else None
        self.items = 0 if streamed else pool.count
        self.resumed = len(consumed) - pool.count  # consumed before a load_state_dict
        self.yielded = 0
        self.failed = 0
        self.failures: list[tuple[int, str, str]] = []
        self.done = False
        self.start = time.perf_counter()
        self.end: float | None = None

    def _mark_item(self, seq: int) -> None:
        self.consumed[seq if self.positions is None else self.positions[seq]] = 1

    def _mark_shard(self, tag: Any) -> None:
        shard, last = self.shard_of(tag)
        if last:
            self.consumed[shard] = 1

    def shard_of(self, tag: Any) -> tuple[int, bool]:
        """A streamed epoch's tag as ``(shard position, whether it is the shard's last output)``: a
        ShardReader tags each output ``(position, last)`` (NOTE [ Streamed shards ] in ``_stream.py``); a
        bare seq is the pool's own failure for a shard whose reader itself crashed, its last output."""
        if tag.__class__ is tuple:
            return tag[0], tag[1]
        return (tag if self.positions is None else int(self.positions[tag])), True

    def snapshot(self) -> DatasetStats:
        """The epoch's stats now."""
        end = self.end if self.end is not None else time.perf_counter()
        return DatasetStats(
            epoch=self.number, rank=self.rank, world_size=self.world_size, worker=self.worker,
            num_workers=self.num_workers, items=self.items, shards=self.shards, resumed=self.resumed,
            num_producers=self.pool.num_producers,
            yielded=self.yielded, failed=self.failed, failures=list(self.failures),
            decode_s=max(0.0, self.pool.decode_seconds - self.clock.seconds), read_s=self.clock.seconds,
            wall_s=end - self.start, done=self.done, buffer=self.buffer.stats,
            producer_history=self.pool.history, gil_enabled=gil_enabled())

    def consume(self, policy: ErrorPolicy) -> Iterator[Any]:
        """Yield each sample from the pool once, marking its position consumed; apply ``policy`` to failures."""
        mark, streamed = self.mark, self.shards is not None
        for seq, out in self.pool:
            mark(seq)
            if streamed:
                self.items += 1
            if out.__class__ is Failure:
                self.fail(out, policy)
                continue
            self.yielded += 1
            yield out

    def fail(self, failure: Failure, policy: ErrorPolicy) -> None:
        """Apply the error policy to a failed item: raise it, or count (and log) it and go on."""
        item, exc = cast(WorkItem, failure.item), failure.exc  # a producer's Failure always has its item
        message = (f"item {item.index} ({item.path!r}) failed in {failure.producer}: "
                   f"{type(exc).__name__}: {exc}")
        if policy == "raise":
            cls = DecodeError if isinstance(exc, DecodeError) else SampleError
            raise cls(message, path=item.path, index=item.index, producer=failure.producer) from exc
        record_skip(self, item.index, item.path, f"{type(exc).__name__}: {exc}", message, policy)


class WorkerEpochs:
    """Counts epochs started in DataLoader worker processes, so the main process can tell that its own
    ``stats()`` and ``state_dict()`` do not describe them, and warn once.

    The count lives in shared memory that workers inherit (fork) or receive as they are spawned. A
    ``RawValue`` (no lock): a lock would be a semaphore, with a resource tracker process under spawn;
    two workers adding one at once still leave the count different from what the main process saw.
    """

    def __init__(self) -> None:
        self._count: Any = multiprocessing.RawValue("q", 0)
        self._seen = 0  # the count when this process last started an epoch
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        # Shared memory travels only to a process being started (a spawned DataLoader worker); any other
        # copy (pickle.dumps, deepcopy) gets a counter of its own.
        return {"count": self._count if get_spawning_popen() is not None else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._count = state["count"] if state["count"] is not None else multiprocessing.RawValue("q", 0)
        self._seen = 0
        self._warned = False

    def started(self, in_worker: bool) -> None:
        """An epoch starts here: in a DataLoader worker, or in this (main) process."""
        if in_worker:
            self._count.value += 1
        else:
            self._seen = self._count.value

    def warn_if_elsewhere(self, method: str) -> None:
        """Warn (once) when epochs ran in DataLoader workers since this process last started one."""
        if self._warned or self._count.value == self._seen:
            return
        self._warned = True
        warnings.warn(
            f"BufferedDataset.{method} in the main process: this dataset's epochs ran in DataLoader "
            f"worker processes (num_workers > 0), which keep their stats and progress; here stats() "
            f"is None (or an older epoch) and state_dict() marks the start of the epoch. Use "
            f"DataLoader(num_workers=0): the producer threads already decode in parallel.",
            UserWarning, stacklevel=4)


class Compose:
    """``transform(decoder(item))``, picklable when both are."""

    def __init__(self, decoder: Callable[[WorkItem], Any], transform: Callable[[Any], Any]) -> None:
        self.decoder = decoder
        self.transform = transform

    def __call__(self, item: WorkItem) -> Any:
        return self.transform(self.decoder(item))


def start_epoch(dataset: Any, decode: Callable[[WorkItem], Any], *, number: int, rank: int, world_size: int,
                worker: int, num_workers: int, resume: bytes | None, memory: TunerMemory | None = None,
                make_run: Callable[..., EpochRun] = EpochRun) -> EpochRun:
    """The (not yet started) epoch of one shard of ``dataset`` (a ``BufferedDataset``), one sample at a time.

    A :class:`~audiobuffer.Source` plans its files; a :class:`~audiobuffer.sources.stream.ShardStream` plans its
    shards, each streamed whole by one producer (NOTE [ Streamed shards ] in ``_stream.py``). ``make_run``
    takes :class:`EpochRun`'s arguments (``_batched`` passes the run that batches streamed samples).
    """
    source, seed, clock = dataset.source, dataset.seed, ReadClock()
    streamed = isinstance(source, ShardStream)
    plan = plan_epoch(len(source.shards) if streamed else len(source), shuffle=dataset.shuffle, seed=seed,
                      epoch=number, rank=rank, world_size=world_size, worker=worker, num_workers=num_workers,
                      even_shards=dataset.even_shards, consumed=resume)
    indices = plan.indices
    buffer: Buffer[Any] = Buffer(dataset.buffer_size, max_bytes=dataset.max_bytes)

    def make_item(seq: int) -> WorkItem:
        # A resumed epoch's items keep the positions they had in the full epoch; I/O time is counted
        # apart from decoding (read_s).
        return source.item(int(indices[seq]), epoch=number, seed=seed, seq=plan.position(seq), clock=clock)

    def make_shard(seq: int) -> WorkItem:
        return source.shard_item(int(indices[seq]), epoch=number, seed=seed, seq=plan.position(seq))

    if streamed:  # chunks as a pool's own: no more than a producer's share of the buffer (at its most)
        most = min(dataset.options.most_producers(), max(1, len(plan)))
        decode = ShardReader(source, decode, buffer, clock, shuffle=dataset.shuffle,
                             chunk=max(1, min(CHUNK_ITEMS, dataset.buffer_size // (2 * most))))
    pool = ProducerPool(make_shard if streamed else make_item, len(plan), decode, buffer,
                        num_producers=dataset.num_producers, memory=memory,
                        ordered=dataset.ordered, warn_after=dataset.warn_after, timeout=dataset.timeout)
    return make_run(number, rank, world_size, worker, num_workers, pool, buffer, bytearray(plan.consumed),
                    plan.positions, clock=clock, streamed=streamed)


def record_skip(run: Any, index: int, path: str, reason: str, summary: str, policy: ErrorPolicy) -> None:
    """Count a failed item that the policy skips (``warn``: log ``summary`` too) in ``run``'s
    ``failed`` and ``failures``; shared by in-process epochs and the isolated loader's trainer side."""
    run.failed += 1
    if len(run.failures) < MAX_LISTED_FAILURES:
        run.failures.append((index, path, reason))
    if policy == "warn":
        logger.warning("skipping %s", summary)


def check_combination(source: Any, decoder: Any, options: LoaderOptions) -> None:
    """Refuse options that do not fit together with this source and decoder (each valid on its own).

    Raises:
        ValueError: a delivering decoder (NOTE [ Delivering decoders ] in ``_outcomes.py``) with
            ``ordered``, a ``transform`` or ``max_batch_seconds``; streamed shards with ``ordered``, a
            delivering decoder, or ``max_batch_seconds`` without ``duration_column``.
    """
    if isinstance(source, ShardStream):
        check_streamable(decoder, options.ordered)
        if options.max_batch_seconds is not None and options.duration_column is None:
            raise ValueError("max_batch_seconds on streamed shards needs duration_column: the field of each "
                             "sample's <key>.json sidecar that holds its duration in seconds (streamed shards "
                             "give no durations before they stream), or read the shards through their "
                             "index.json (audiobuffer pack writes one, with each member's duration)")
    if delivers_itself(decoder) and (options.ordered or options.transform is not None
                                     or options.max_batch_seconds is not None):
        raise ValueError(f"{decoder!r} delivers its samples itself: it takes no ordered=True, no transform and "
                         f"no max_batch_seconds (NOTE [ Delivering decoders ] in audiobuffer/_outcomes.py)")


def epoch_length(ds: Any, rank: int, world_size: int) -> int:
    """Items rank ``rank`` of dataset ``ds`` yields in its current epoch (its DataLoader workers together);
    batches, when it batches by duration.

    Raises:
        TypeError: the length is unknown: streamed shards without a listing, or batched by duration.
    """
    if ds.batching is not None:
        return len(ds.batching.plan(shuffle=ds.shuffle, seed=ds.seed, epoch=ds.epoch, rank=rank,
                                    world_size=world_size, even_shards=ds.even_shards))
    if isinstance(ds.source, ShardStream):
        if ds.options.max_batch_seconds is not None:
            raise TypeError(f"the number of batches of streamed shards is unknown before they stream (batches are "
                            f"cut as the samples arrive), so {ds.source.description} batched by duration has no "
                            f"len(); read the shards through their index.json for planned batches")
        plan = plan_epoch(len(ds.source.shards), shuffle=ds.shuffle, seed=ds.seed, epoch=ds.epoch, rank=rank,
                          world_size=world_size, even_shards=ds.even_shards)
        return ds.source.samples_in(plan.indices.tolist())
    return shard_length(len(ds.source), rank=rank, world_size=world_size, even_shards=ds.even_shards)
