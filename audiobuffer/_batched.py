"""Batches by duration as they run: a dataset's durations and batch setup, one shard's epoch of batches
laid out for the producer pool, and the consumer side that turns decoded samples back into batches.

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
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._batching import BatchPlan, plan_batches
from ._durations import Failure as HeaderFailure
from ._durations import read_durations
from ._epoch import MAX_LISTED_FAILURES, DatasetStats, EpochRun
from ._options import DEFAULT_BUCKETS, ErrorPolicy
from ._outcomes import Failure
from ._producers import ProducerPool
from ._tuner import TunerMemory
from .buffer import Buffer
from .sources import ReadClock

__all__ = ["Assembler", "BatchEpochRun", "DurationBatching", "EpochBatches", "PaddingMeter", "count_header_failures",
           "start_epoch"]

#: How many plans a :class:`DurationBatching` remembers (planning a large corpus takes a while).
_REMEMBERED_PLANS = 4


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
        crop = getattr(decoder, "crop_seconds", None)
        crop = float(crop) if isinstance(crop, (int, float)) and not isinstance(crop, bool) else None
        durations, failures = read_durations(source, duration_column=duration_column, crop_seconds=crop,
                                             num_threads=num_threads, on_error=on_error)
        content = durations
        if crop is not None and getattr(decoder, "pad", False) is True:
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
    """One epoch of batches by duration: :class:`~audiobuffer._epoch.EpochRun` whose consumed mask counts
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
