"""Streamed tar shards in an epoch: the decoder and output port its producers run, which stream
a whole shard into the epoch's buffer (NOTE [ Streamed shards ] in ``sources/stream.py``), and, for
batches by duration, each sample's duration read before it is decoded and the buckets that cut
batches as the samples arrive (NOTE [ Batches by duration ] in ``engine/epoch.py``, Streamed
shards)."""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from ..errors import SourceError
from ..prepare.durations import seconds_of
from ..sources.item import ReadClock, WorkItem
from ..sources.tar import MEMBER_STRIDE, SHUFFLE_BUFFER, ShardSample, Truncated, shuffle_buffer
from .plan import batch_cost, bucket_budgets, bucket_edges
from .pool import Chunk, Failure

if TYPE_CHECKING:
    from ..sources.stream import ShardStream

__all__ = ["EDGE_SAMPLES", "DynamicBuckets", "ShardReader", "TimedDecode", "check_streamable"]

#: The most samples :class:`DynamicBuckets` estimates its bucket edges from (held until then).
EDGE_SAMPLES = 200

T = TypeVar("T")

logger = logging.getLogger(__name__)


def check_streamable(ordered: bool, hint: str, *, ordered_hint: str | None = None) -> None:
    """Refuse what a streamed source cannot do: an ordered epoch (``hint``: what to give instead;
    ``ordered_hint``, where given: why no epoch is ordered, and what to do)."""
    if ordered:
        if ordered_hint is not None:
            raise ValueError(f"ordered=True needs random access to the samples, and {ordered_hint}")
        raise ValueError(f"ordered=True needs random access to the samples: {hint}; or ordered=False")


class ShardReader:
    """A streamed epoch's decoder and output port: an item is a shard; :meth:`outputs`, the
    decoder the producers run, decodes its samples as they stream, and :meth:`deliver`, the pool's
    port (NOTE [ Output port ] in ``engine/pool.py``), puts each into the epoch's buffer (NOTE
    [ Streamed shards ]).

    Each output goes in as ``((shard position, last), sample or Failure)``: ``last`` on the
    shard's final output, so that the consumer marks the shard consumed when it hands that one on.
    Outputs go through the producer's chunk, as any pool's do, and a shard's last ones go when it
    ends; it waits only for room in the buffer, never for the consumer otherwise.
    Thread safety: one instance serves every producer of an epoch.
    """

    in_place = False  # a shard gives many outputs: no ordered pool, no inline decoding
    waits_for_consumer = False

    def __init__(self, stream: ShardStream, decode: Callable[[WorkItem], Any], clock: ReadClock, *,
                 shuffle: bool) -> None:
        self._stream = stream
        self._decode = decode
        self._clock = clock
        self._shuffle = shuffle
        self._stopped = threading.Event()

    def __repr__(self) -> str:
        return f"ShardReader({self._stream!r})"

    def stop(self) -> None:
        """The pool stops: read no further (a producer blocked in ``put`` wakes by the buffer's abort)."""
        self._stopped.set()

    def deliver(self, seq: int, shard: WorkItem, out: Any, chunk: Chunk) -> None:
        """Put each of the shard's outputs (``out``: what :meth:`outputs` returned) as it comes."""
        if out.__class__ is Failure:  # the pool's, for a shard whose outputs could not be had
            chunk.put((seq, out))
            return
        held = None  # each output is put once the next one is known, so that the last is tagged
        try:
            for sample in out:
                if held is not None:
                    chunk.put(((shard.seq, False), held))
                held = sample
            if held is not None and not self._stopped.is_set():
                chunk.put(((shard.seq, True), held))
            chunk.flush()  # the shard's last outputs now, not with the next shard's
        finally:
            out.close()  # a stop or a closed buffer: the shard's stream closes now, not when freed

    def outputs(self, shard: WorkItem) -> Generator[Any, None, None]:
        """The shard's samples decoded (or their failures) as they stream: the pool's decoder."""
        producer = threading.current_thread().name
        failed: list[Exception] = []
        reader = self._read(shard.index, failed)
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

    def _read(self, number: int, failed: list[Exception]) -> Generator[ShardSample, None, None]:
        """Shard ``number``'s samples; a failure to read ends them and is kept in ``failed``."""
        samples = self._stream.read_shard(number)
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


class DynamicBuckets(Generic[T]):
    """Batches by duration cut as the samples arrive, for what cannot be planned (streamed shards), as
    Lhotse's ``DynamicBucketingSampler`` cuts them: ``buckets`` duration buckets, each filling one batch.

    The bucket edges are ``plan.bucket_edges`` of the first samples (up to :data:`EDGE_SAMPLES`,
    fewer once they hold ``buckets x max_batch_seconds``), which wait until then. A bucket's batch grows
    while its ``plan.batch_cost`` (count x longest, plus the quadratic term with ``quadratic_duration``)
    stays within ``max_batch_seconds`` (and the count within ``max_batch_size``),
    and is handed on as soon as no sample could join it; a sample longer than the budget is a batch of
    one. :meth:`flush` hands on what is left. With one budget per bucket (``max_batch_seconds`` a
    sequence, shortest bucket first, as ``plan.bucket_budgets`` assigns them), each bucket's batch
    grows within its own; with ``edges`` (each bucket's upper edge, the last bucket also taking the
    longer samples), the buckets are fixed and no sample waits. Used by one thread.

    Example:
        >>> cutter = DynamicBuckets(4.0, 1)
        >>> cutter.add(1.0, "a"), cutter.add(2.0, "b"), cutter.add(0.5, "c"), cutter.flush()
        ([], [[(1.0, 'a'), (2.0, 'b')]], [], [[(0.5, 'c')]])
    """

    def __init__(self, max_batch_seconds: float | Sequence[float], buckets: int,
                 max_batch_size: int | None = None, quadratic_duration: float | None = None, *,
                 edges: Sequence[float] | None = None) -> None:
        self._seconds: float | tuple[float, ...]
        if isinstance(max_batch_seconds, (int, float)):
            self._seconds = self._budget = float(max_batch_seconds)
        else:
            self._seconds = tuple(float(s) for s in max_batch_seconds)
            self._budget = max(self._seconds)  # the largest: how much audio the edges wait for
        self._quadratic = quadratic_duration
        self._buckets = buckets
        self._limit = math.inf if max_batch_size is None else max_batch_size
        self._edges: list[float] | None = [] if buckets <= 1 else None  # None: still estimating them
        if edges is not None:
            self._edges = [float(edge) for edge in edges[:-1]]
        self._early: list[tuple[float, T]] = []  # the samples the edges are estimated from
        self._early_seconds = 0.0
        count = 1 if self._edges is None else len(self._edges) + 1
        # each bucket's batch being filled
        self._open: list[list[tuple[float, T]]] = [[] for _ in range(count)]
        self._longest: list[float] = [0.0] * count
        self._budgets = bucket_budgets(self._seconds, count)

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
        self._budgets = bucket_budgets(self._seconds, len(self._open))
        return [batch for seconds, entry in early for batch in self._place(seconds, entry)]

    def _place(self, seconds: float, entry: T) -> list[list[tuple[float, T]]]:
        b = bisect.bisect_left(self._edges or [], seconds)  # as plan_batches: the first edge >= seconds
        batch, done, budget = self._open[b], [], self._budgets[b]
        longest = max(self._longest[b], seconds)
        if batch and (batch_cost(len(batch) + 1, longest, self._quadratic) > budget
                      or len(batch) + 1 > self._limit):
            done.append(batch)
            batch = self._open[b] = []
            longest = seconds
        batch.append((seconds, entry))
        self._longest[b] = longest
        if (batch_cost(len(batch) + 1, longest, self._quadratic) > budget
                or len(batch) >= self._limit):
            # no sample could join
            done.append(batch)
            self._open[b], self._longest[b] = [], 0.0
        return done


class TimedDecode:
    """A streamed sample's decode, its duration read first from its sidecar's ``column`` field (NOTE
    [ Batches by duration ], Streamed shards): ``(length, content, sample)``, where ``length`` is capped by
    the decoder's crop (the crop itself where the decoder pads to it) and ``content`` is the audio in it.
    A sample without a duration there fails (a :class:`~audiobuffer.SourceError`) and is not decoded.
    ``stretch`` (the decoder's: NOTE [ Augmentations ] in ``decoders/_augment.py``) scales the duration
    before the crop. Thread safety: any producer thread may call it."""

    def __init__(self, decode: Callable[[WorkItem], Any], column: str, *, crop: float | None, pad: bool,
                 stretch: Callable[[int, int, np.ndarray], np.ndarray | None] | None = None) -> None:
        self.decode = decode
        self.column = column
        self.crop = crop
        self.pad = pad
        self.stretch = stretch if callable(stretch) else None

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
        if self.stretch is not None:
            factors = self.stretch(item.seed, item.epoch, np.array([item.index], dtype=np.int64))
            seconds = seconds if factors is None else seconds * float(factors[0])
        content = seconds if self.crop is None else min(seconds, self.crop)
        length = self.crop if self.crop is not None and self.pad else content
        return length, content, self.decode(item)
