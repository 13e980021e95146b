"""The producer thread pool: threads that decode work items into a :class:`Buffer`, as many as asked or tuned.

NOTE [ Producer shutdown protocol ]
===================================
Parties: one consumer (the thread iterating the pool), the producer threads, one Buffer per epoch.

Normal end. Each producer takes sequence numbers from the feed until it is empty, then leaves. The
producers count themselves out under the feed lock; the last one out with the feed empty closes the
buffer (so does the consumer, decoding inline, when it finds the feed empty and no producer left), so
the consumer drains what is left and then sees ``BufferClosed``: the epoch is over. There is no
sentinel item, so any object (``None`` included) can be a sample.

Failures. An exception from the decoder (the transform, or the port) is caught per item and travels
through the buffer as a :class:`Failure` in the item's place, so the consumer applies its error policy
in order and every item is counted as yielded or failed. Anything else that escapes a producer (a bug
of ours, a ``BaseException``) aborts the buffer with an error that names the producer: the consumer
raises it. A producer never dies silently.

Early end. The consumer leaving its loop, raising, being garbage-collected, or someone calling
``close()`` from any thread all come to :meth:`ProducerPool.close`: it sets the stop flag under the
feed lock and wakes producers waiting for their turn (ordered mode), aborts the buffer (dropping its
items and waking producers blocked in ``put`` with ``BufferClosed``), then joins every thread against
one deadline of ``JOIN_TIMEOUT`` seconds. A producer checks the flag before taking each item, so it
finishes at most the item in hand. A port that waits for the consumer (the batch slots' port waits
for a free slot) is woken by its ``stop()``, which the pool calls once after the abort and before
the join (NOTE [ Output port ] in this module); without it such a producer would sit out the
whole join. Threads are daemons: a decoder stuck in a system call cannot keep the interpreter
alive, and ``close()`` logs a warning naming any thread that outlived the join. ``close()`` is
idempotent and safe to call from any thread but a producer's own. :meth:`ProducerPool.stop` is the
first half alone (flag, wake, abort, the port's ``stop``; no join): a pool registers it with the
cancel scope of the thread that builds it, so a ``DevicePrefetcher`` whose loop is left stops the
pool its thread waits on, from the consumer's thread (NOTE [ Prefetch cancellation ] in
``audiobuffer/engine/cancel.py``). :meth:`ProducerPool.start` runs under the same
protocol: if a thread cannot be started (``RuntimeError: can't start new thread``), it calls
``close()``, which stops and joins the threads already started, and re-raises.

Changing the count, and decoding inline: NOTE [ Changing the producer count ] in ``engine/feed.py``.

Chunks. In an unordered pool a producer keeps its finished items (in its :class:`Chunk`, which
its port puts them in) and puts them in one ``put_many`` when it has ``CHUNK_ITEMS`` of them, when
the oldest has waited ``CHUNK_SECONDS``, or when the feed is empty. Where producers are the
bottleneck, the consumer sleeps in ``get`` and would otherwise be woken (a thread switch and a GIL
hand-over) for every item: tens of microseconds each, as much as decoding a short WAV file. An
ordered pool puts one item at a time: a producer holding the item the
consumer waits for in its chunk while it waits for its turn would deadlock. A producer flushes before
it starts a decode if its chunk is already ``CHUNK_SECONDS`` old; so a file that takes long to decode
holds back at most the ``CHUNK_ITEMS - 1`` items its producer finished just before it, while the
other producers keep delivering. A port that waits for the consumer runs with chunks of 1, or the
items held in the chunk could be the very ones the consumer needs to make progress.

Ordered mode, and ordered mode with a byte bound: NOTE [ Ordered feed ] in ``engine/feed.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from .._checks import check_int, check_seconds
from ..buffer import Buffer, payload_nbytes
from ..errors import AudioBufferError, BufferClosed, ProducerError, SampleError, StallError
from ..options import usable_cores
from ..sources import storage
from . import blas
from .cancel import on_cancel
from .feed import Feed, Producer
from .tuner import PoolTuning, TunerMemory, default_tuner

if TYPE_CHECKING:
    import numpy as np

    from ..sources.item import WorkItem

__all__ = [
    "BufferPort",
    "Chunk",
    "ConsumerWait",
    "Failure",
    "InlineDecoder",
    "JOIN_TIMEOUT",
    "Port",
    "ProducerPool",
    "WARN_INTERVAL",
]

logger = logging.getLogger(__name__)


# NOTE [ Output port ]
# ====================
# What a producer does with what it decoded is the pool's port: one object the pool is given, which
# hands each item's output on through the producer's :class:`Chunk` (the one place outputs are
# chunked, NOTE [ Producer shutdown protocol ], Chunks). The default, :class:`BufferPort`, puts
# ``(seq, sample or Failure)`` into the buffer in the item's place. The batch slots' port writes
# each sample into a row of a batch and puts only the batch an item completes; a streamed epoch's
# port puts each sample of a shard. A port has:
#
# - ``deliver(seq, item, out, chunk)``: hand on ``out``, what the decoder returned for ``item`` (or
#   its :class:`Failure`). An ``Exception`` it raises (a sample that does not fit a slot) is the
#   item's failure: the pool puts ``(seq, Failure)`` in the item's place. ``BufferClosed`` means
#   the pool was closed; a ``BaseException`` is a crash naming the item, as from the decoder.
# - ``in_place``: each item gives one output, in its place. Only such a port runs in an ordered
#   pool (which waits for each seq's output) or lets the consumer decode inline (which takes the
#   output itself, past the port).
# - ``waits_for_consumer``: ``deliver`` may block until the consumer frees room (a free slot). Such
#   a port runs with chunks of one: a producer holding a finished batch in its chunk while it waits
#   could hold the very batch the consumer needs.
# - ``stop()``: the pool stops; the pool calls it once, after the buffer's abort and before the
#   join, to wake producers waiting inside ``deliver`` for the consumer (only its side can).
class Port(Protocol):
    """What a pool's producers hand their decoded items to (NOTE [ Output port ])."""

    in_place: bool
    waits_for_consumer: bool

    def deliver(self, seq: int, item: WorkItem, out: Any, chunk: Chunk) -> None: ...

    def stop(self) -> None: ...


class BufferPort:
    """The default output port (NOTE [ Output port ]): each ``(seq, out)`` into the buffer in the
    item's place. Stateless; one may serve any number of pools."""

    in_place = True
    waits_for_consumer = False

    def deliver(self, seq: int, item: WorkItem, out: Any, chunk: Chunk) -> None:
        chunk.put((seq, out))

    def stop(self) -> None:
        pass

    def __repr__(self) -> str:
        return "BufferPort()"


class Failure:
    """An error travelling through a buffer in the place of what failed, so that the consumer meets it
    in order, after what came before it: a producer's item that could not be decoded (with the item
    and the producer's name), or a prefetch thread's loader error (``DevicePrefetcher``, no item)."""

    __slots__ = ("exc", "item", "producer")

    def __init__(self, exc: BaseException, item: WorkItem | None = None, producer: str | None = None) -> None:
        self.exc = exc
        self.item = item
        self.producer = producer


#: The least seconds between two "waiting for data" warnings of one pool.
WARN_INTERVAL = 30.0


class ConsumerWait:
    """Takes from a buffer for one consumer, warning after ``warn_after`` and failing after ``timeout``.

    Args:
        warn_after: log a "waiting for data" warning when the consumer has waited this many seconds
            for the next sample (at most one every ``WARN_INTERVAL`` seconds); ``None`` or
            ``float("inf")``: never.
        timeout: raise :class:`StallError` when the consumer has waited this many seconds;
            ``None`` or ``float("inf")``: never.
        describe: what the producers are doing, for the warning and the error.

    Thread safety: one consumer thread uses it.
    """

    def __init__(self, warn_after: float | None, timeout: float | None, describe: Callable[[], str]) -> None:
        self._warn_after = warn_after
        self._timeout = timeout
        self._describe = describe
        self._last_warning = -float("inf")

    def get(self, take: Callable[..., Any]) -> Any:
        """``take()`` (the buffer's get or get_many), with the warning and the stall timeout."""
        if self._warn_after is None and self._timeout is None:
            return take()
        start = time.monotonic()
        deadline = start + self._timeout if self._timeout is not None else float("inf")
        while True:
            now = time.monotonic()
            wait = deadline - now
            if self._warn_after is not None:
                wait = min(wait, self._warn_after)
            try:
                return take(timeout=max(0.0, wait))
            except TimeoutError:
                now = time.monotonic()
                if now >= deadline:
                    raise StallError(f"no sample for {self._timeout} s (timeout); {self._describe()}") from None
                if now - self._last_warning >= WARN_INTERVAL:
                    self._last_warning = now
                    logger.warning("waiting for data: the consumer has waited %.1f s for a sample (%s); add "
                                   "producers or make decoding cheaper", now - start, self._describe())


class InlineDecoder:
    """Decodes items in the consumer's own thread, taking their sequence numbers from ``feed``.

    Args:
        make_item, decode: the pool's.
        feed: the pool's feed (``Feed.take_inline``).
        buffer: the pool's buffer, closed here when nothing is left to take and no producer is left.
        name: the name failures carry as their producer's.

    Thread safety: the consumer thread alone calls :meth:`next` and :meth:`run`; the counters may be read
    anywhere.
    """

    def __init__(self, make_item: Callable[[int], WorkItem], decode: Callable[[WorkItem], Any], feed: Feed,
                 buffer: Buffer, name: str, weights: Sequence[float] | np.ndarray | None = None) -> None:
        self._make_item = make_item
        self._weights = weights
        self.work = 0.0  # the finished items' summed weights
        self._decode = decode
        self._feed = feed
        self._buffer = buffer
        self.name = name
        self.busy = 0.0  # seconds in the decoder
        self.decoded = 0  # items finished, decoded or failed
        storage.close_kept_files()  # this thread outlives the epoch: its shard files must not (made in it)

    def next(self, expected: int | None) -> tuple[int, Any] | None:
        """Take the next sequence number (ordered: only if it is ``expected``) and decode it here;
        ``None`` if there is none to take. Closes the buffer when nothing is left to take and no
        producer is left, as the last producer out would."""
        seq, done = self._feed.take_inline(expected)
        if seq is None:
            if done:
                self._buffer.close()
            return None
        return seq, self._decode_one(seq)

    def run(self, until: Callable[[], bool]) -> Generator[tuple[int, Any], None, int]:
        """Decode the next items here one after another, yielding each ``(seq, sample or Failure)``,
        until ``until()`` is true (asked after each item: the tuner wants to look) or none is left
        to take; return how many. Closes the buffer as :meth:`next` does."""
        take, decode_one = self._feed.take_inline, self._decode_one
        count = 0
        while True:
            seq, done = take(None)
            if seq is None:
                if done:
                    self._buffer.close()
                return count
            yield seq, decode_one(seq)
            count += 1
            if until():
                return count

    def _decode_one(self, seq: int) -> Any:
        """The sample of item ``seq``, or its :class:`Failure`; counted in :attr:`busy` and :attr:`decoded`."""
        item = self._make_item(seq)
        start = time.perf_counter()
        try:
            return self._decode(item)
        except Exception as exc:  # as from a producer: the consumer applies on_error
            return Failure(exc, item, self.name)
        except KeyboardInterrupt:
            raise  # Ctrl-C reaches the main thread, which may be this one: it stays what it is
        except BaseException as exc:
            raise SampleError(f"decoding inline crashed on item {item.index} ({item.path!r}): "
                              f"{type(exc).__name__}: {exc}", path=item.path, index=item.index,
                              producer=self.name) from exc
        finally:
            self.busy += time.perf_counter() - start
            self.decoded += 1
            if self._weights is not None:
                self.work += self._weights[seq]


#: Seconds :meth:`ProducerPool.close` waits, in all, for the producer threads to finish.
JOIN_TIMEOUT = 10.0
#: A producer hands its finished items over in chunks of up to this many (unordered pools) ...
CHUNK_ITEMS = 16
#: ... or as soon as its oldest finished item has waited this long (seconds), or at the end.
CHUNK_SECONDS = 0.002


class Chunk:
    """One producer's finished outputs on their way into the buffer, put together (NOTE [ Producer
    shutdown protocol ], Chunks); the port hands each output to it (NOTE [ Output port ]).

    Args:
        buffer: the pool's buffer.
        size: how many outputs to hold at most; 1 puts each at once.
        producer: the producer's name, for the failures put through it.
        admit: with a size of 1, asked before each put, false when the pool stops (the byte bound
            of an ordered pool, NOTE [ Ordered feed ]).

    Thread safety: one producer thread uses it.
    """

    __slots__ = ("_admit", "_buffer", "_oldest", "_pairs", "_size", "producer", "put_s")

    def __init__(self, buffer: Buffer, size: int, producer: str,
                 admit: Callable[[Any], bool] | None = None) -> None:
        self._buffer = buffer
        self._size = size
        self._admit = admit
        self._pairs: list[Any] = []
        self._oldest = 0.0  # when the oldest output held was put in
        self.producer = producer
        self.put_s = 0.0  # seconds waiting to put: for room in the buffer, for the byte bound

    def put(self, pair: Any) -> None:
        """Hand ``pair`` on: at once with a size of 1, else with the chunk when it is full or old.

        Raises:
            BufferClosed: the pool was closed.
        """
        if self._size == 1:
            start = time.perf_counter()
            try:
                if self._admit is not None and not self._admit(pair):
                    raise BufferClosed("the producer pool was closed")
                self._buffer.put(pair)
            finally:
                self.put_s += time.perf_counter() - start
            return
        now = time.perf_counter()
        pairs = self._pairs
        if not pairs:
            self._oldest = now
        pairs.append(pair)
        if len(pairs) >= self._size or now - self._oldest >= CHUNK_SECONDS:
            self.flush()

    def flush(self, now: float | None = None) -> None:
        """Put what is held; given ``now``, only if the oldest has waited ``CHUNK_SECONDS``."""
        pairs = self._pairs
        if not pairs or (now is not None and now - self._oldest < CHUNK_SECONDS):
            return
        self._pairs = []
        start = time.perf_counter()
        try:
            self._buffer.put_many(pairs)
        finally:
            self.put_s += time.perf_counter() - start


class ProducerPool:
    """Decode ``count`` work items with producer threads into ``buffer``; iterate the results.

    Iterating the pool yields ``(seq, sample)`` pairs, the sample being a :class:`Failure` for an item
    that failed, once each: in sequence order with ``ordered=True``, else as they come. See
    NOTE [ Producer shutdown protocol ].

    Args:
        make_item: builds the work item with sequence number ``seq`` (0 .. count-1).
        count: how many items this epoch has.
        decode: turns a work item into a sample; runs in the producer threads (or, decoding inline,
            in the consumer's).
        buffer: where finished samples wait for the consumer (a fresh one per pool).
        num_producers: how many threads decode (no more than ``count``, at least 1), or ``"auto"``:
            a tuner sets the count as the pool runs, from 0 (the consumer decodes inline) up to the
            usable cores (NOTE [ Producer tuning ] in ``engine/tuner.py``).
        ordered: yield in sequence order. With a byte-bounded buffer, the samples waiting to be
            handed on in order count against its ``max_bytes`` too (NOTE [ Ordered feed ]).
        warn_after: log a "waiting for data" warning when the consumer has waited this many
            seconds for the next sample (at most one every ``WARN_INTERVAL`` seconds);
            ``float("inf")`` never warns.
        timeout: raise :class:`StallError` when the consumer has waited this many seconds for the
            next sample, naming what each producer is stuck on; ``float("inf")`` never does.
        chunk_items: the most finished items a producer hands over at once; ``None``: up to
            ``CHUNK_ITEMS``, no more than its share of the buffer. Ordered pools use 1.
        name: the threads' name prefix (``{name}-{i}``).
        tuner, memory: with ``"auto"``, a tuner instead of the default (tests script one); a TunerMemory.
        start_at_cores: with ``"auto"`` and no count in ``memory``, start at the most producers
            instead of inline (a decode that runs outside the GIL: NOTE [ Producer tuning ]).
        weights: with ``"auto"``, each sequence number's cost (batches by duration: its seconds), so
            that the tuner judges work per second, not items (NOTE [ Producer tuning ]); ``None``: items
            cost alike.
        port: what a producer does with each decoded item (NOTE [ Output port ]); ``None``: a
            :class:`BufferPort`, each into the buffer in the item's place.
        blas_threads: the BLAS threads held while the pool runs, from :meth:`start` to :meth:`close`
            (NOTE [ BLAS threads ] in ``engine/blas.py``); ``None``: BLAS as it is.
    """

    def __init__(self, make_item: Callable[[int], WorkItem], count: int,
                 decode: Callable[[WorkItem], Any], buffer: Buffer, *, num_producers: int | Literal["auto"],
                 ordered: bool = False, warn_after: float | None = None, timeout: float | None = None,
                 chunk_items: int | None = None, name: str = "audiobuffer-producer", tuner: Any = None,
                 memory: TunerMemory | None = None, start_at_cores: bool = False,
                 weights: Sequence[float] | np.ndarray | None = None,
                 port: Port | None = None, blas_threads: int | None = None) -> None:
        check_int("count", count, 0)
        auto = num_producers == "auto"
        if not auto:
            check_int("num_producers", num_producers, 1, also="or 'auto'")
        if chunk_items is not None:
            check_int("chunk_items", chunk_items, 1)
        check_seconds("warn_after", warn_after)
        check_seconds("timeout", timeout)
        if not isinstance(buffer, Buffer):
            raise TypeError(f"buffer must be a Buffer, got {buffer!r}")
        self._make_item = make_item
        self._count = count
        self._decode = decode
        self._buffer = buffer
        self._ordered = ordered
        self._name = name
        self._port = BufferPort() if port is None else port
        if not self._port.in_place and ordered:
            raise ValueError(f"{self._port!r} does not hand each item on in its place and cannot "
                             f"run in an ordered pool (NOTE [ Output port ] in engine/pool.py)")
        # Inline decoding: only for an in-place port, never under a stall timeout (see the NOTEs).
        self._allow_inline = auto and self._port.in_place and timeout is None
        most = max(1, min(usable_cores() if auto else cast(int, num_producers), count))
        self._weights = weights if auto else None
        if weights is not None and len(weights) != count:
            raise ValueError(f"weights must have one value per item ({count}), got {len(weights)}")
        start = most if start_at_cores else None
        self._tuning = PoolTuning(tuner or default_tuner(most, allow_inline=self._allow_inline,
                                                         memory=memory, start=start),
                                  name, self._counters, memory=memory,
                                  work=self._work if self._weights is not None else None) if auto else None
        self._pinned = None if auto else most
        # Chunks: 1 in ordered mode and for a port that waits for the consumer (see the NOTEs),
        # else no larger than a producer's share of the buffer.
        self._chunk = 1 if ordered or self._port.waits_for_consumer else (
            chunk_items or max(1, min(CHUNK_ITEMS, buffer.capacity // (2 * most))))
        self._wait = ConsumerWait(warn_after, timeout, self._describe)
        self._feed = Feed(count, ordered=ordered, window=buffer.capacity,
                          max_bytes=buffer.max_bytes if ordered else None)
        self._producers: list[Producer] = []  # every producer started, in order; appended under the feed lock
        self._inline = InlineDecoder(make_item, decode, self._feed, buffer, f"{name}-inline", self._weights)
        self._started = False
        self._blas_threads = blas_threads
        self._release_blas = blas.hold(None)
        # A DevicePrefetcher's thread builds pools in a cancel scope: leaving its loop stops this one
        # (NOTE [ Prefetch cancellation ] in audiobuffer/engine/cancel.py).
        self._unregister = on_cancel(self.stop)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the producer threads (every attribute they read is set by now). If a thread cannot be
        started, the pool is closed (the threads already started are stopped and joined), and it raises."""
        if self._started:
            raise RuntimeError("a ProducerPool is started once")
        self._started = True
        self._release_blas = blas.hold(self._blas_threads)  # released by close()
        try:
            self._set_target(self._tuning.begin() if self._tuning is not None else cast(int, self._pinned))
        except BaseException:
            # The threads started so far would wait for the consumer forever: stop them first.
            self.close()
            raise

    def stop(self) -> None:
        """Tell the producers and the consumer to stop, and return at once. Idempotent, any thread.
        Producers finish the item in hand and take no more; the consumer's iteration ends as after
        :meth:`close`, which still has to be called to join the threads."""
        if self._feed.stop():  # the first stop; the abort also when closed: no unlocked peek decides it
            self._buffer.abort(BufferClosed("the producer pool was closed"))
            # wakes producers waiting in the port for the consumer (NOTE [ Output port ])
            self._port.stop()

    def close(self, timeout: float = JOIN_TIMEOUT) -> None:
        """Stop and join the producers (NOTE [ Producer shutdown protocol ]); remember the tuned count. Idempotent."""
        self.stop()
        self._unregister()
        if self._tuning is not None:
            self._tuning.finish()
        deadline = time.monotonic() + timeout
        current = threading.current_thread()
        threads = self.threads  # complete: no thread starts once the feed stops
        for thread in threads:
            if thread is not current and thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive() and t is not current]
        self._release_blas()
        if alive:
            logger.warning("producer threads still running %.1f s after close(), stuck in a decoder: %s",
                           timeout, ", ".join(alive))

    @property
    def count(self) -> int:
        """How many items this pool decodes."""
        return self._count

    @property
    def stopped(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._feed.stopping

    @property
    def threads(self) -> list[threading.Thread]:
        """Every producer thread started so far, retired ones included."""
        with self._feed.lock:
            return [cast(threading.Thread, p.thread) for p in self._producers]

    @property
    def num_producers(self) -> int:
        """The producer count wanted now (0: the consumer decodes inline), or the pinned one."""
        return self._feed.target if self._pinned is None else self._pinned

    @property
    def history(self) -> list[tuple[float, int, str]]:
        """``(seconds since start, count, reason)`` of each decision on the count; one entry when pinned."""
        if self._tuning is None:
            return [(0.0, cast(int, self._pinned), "pinned")]
        return self._tuning.history

    @property
    def decode_seconds(self) -> float:
        """Seconds spent in the decoder (and the port, less its waits to put) so far, summed over
        producers (and the consumer, inline)."""
        return sum(p.busy for p in list(self._producers)) + self._inline.busy

    @property
    def inline_seconds(self) -> float:
        """Of :attr:`decode_seconds`, the seconds the consumer decoded in its own thread."""
        return self._inline.busy

    @property
    def decoded(self) -> int:
        """Items finished (decoded or failed) so far."""
        return sum(p.decoded for p in list(self._producers)) + self._inline.decoded

    # -- the count -------------------------------------------------------------------------------

    def _set_target(self, count: int) -> None:
        """Want ``count`` producers from now on and start those missing; see NOTE [ Producer shutdown protocol ].

        Producers above the target retire by themselves (``Feed.take``). With nothing left to take and
        no producer left, it closes the buffer (none would). Raises what ``Thread.start`` raises; the
        target then stays at the producers that did start.
        """
        feed = self._feed
        with feed.lock:
            if feed.stopping:
                return
            feed.target = count if count > 0 or self._allow_inline else 1
            while feed.active < feed.target and feed.next_seq < feed.count:
                me = Producer()
                me.thread = threading.Thread(target=self._run, args=(me,), name=f"{self._name}-{len(self._producers)}",
                                             daemon=True)
                try:
                    me.thread.start()  # under the lock: it waits in Feed.take until the lock is free
                except BaseException:
                    feed.target = feed.active
                    raise
                self._producers.append(me)
                feed.active += 1
                feed.live += 1
        if feed.leave(None):  # an empty epoch, or the consumer took the last item inline
            self._buffer.close()

    def _tune(self) -> None:
        """(Consumer.) Let the tuner look when an observation is due, and apply its count."""
        if self._tuning is not None:
            self._tuning.tick(self._feed.target, self._set_target)

    def _work(self) -> float:
        """The finished items' summed weights (``weights`` given)."""
        return sum(p.work for p in list(self._producers)) + self._inline.work

    def _counters(self) -> tuple[int, float, float]:
        """(items finished, seconds the consumer waited for data, seconds producers waited for room)."""
        stats = self._buffer.stats
        waited = sum(p.waited for p in list(self._producers))
        return self.decoded, stats.get_wait_s, stats.put_wait_s + waited

    # -- producer side -------------------------------------------------------------------------

    def _run(self, me: Producer) -> None:
        """The body of a producer thread: decode items from the feed and hand each to the port until
        the feed is empty.

        Follows NOTE [ Producer shutdown protocol ] at the top of this module: an exception from the
        decoder or the port goes into the buffer as a :class:`Failure` in the item's place; anything
        else that escapes aborts the buffer with an error naming the producer (and the item, if it
        escaped with one in hand); ``BufferClosed`` means the pool was closed; the last producer out
        closes the buffer.
        """
        name = cast(threading.Thread, me.thread).name
        feed, buffer, weights, port = self._feed, self._buffer, self._weights, self._port
        deliver = port.deliver
        admit = None
        if feed.byte_bound:  # ordered, chunks of 1 (NOTE [ Ordered feed ])
            def admit(pair: Any) -> bool:
                return feed.admit(me, pair[0], payload_nbytes(pair[1]))
        chunk = Chunk(buffer, self._chunk, name, admit)
        holding: WorkItem | None = None  # the item in the decoder or the port, for a crash report
        try:
            while True:
                seq = feed.take(me)
                if seq is None:
                    break
                item = self._make_item(seq)
                start, put_s = time.perf_counter(), chunk.put_s
                chunk.flush(start)  # old finished items are not kept through another decode
                me.current = (item.path, start)
                holding = item
                try:
                    out: Any = self._decode(item)
                except Exception as exc:  # reported to the consumer, which applies on_error
                    out = Failure(exc, item, name)
                try:
                    deliver(seq, item, out, chunk)
                except BufferClosed:
                    raise
                except Exception as exc:  # the port refused it: the item's failure, in its place
                    chunk.put((seq, Failure(exc, item, name)))
                holding = None  # a BaseException (SystemExit, KeyboardInterrupt, ...) leaves it set
                me.current = None
                me.busy += time.perf_counter() - start - (chunk.put_s - put_s)  # less waits to put
                me.decoded += 1
                if weights is not None:
                    me.work += weights[seq]
            chunk.flush()
        except BufferClosed:
            pass  # the pool was closed: the consumer has gone
        except BaseException as exc:
            err: AudioBufferError
            if holding is not None:  # it escaped the decoder or the port: name the item, its file
                err = SampleError(
                    f"producer {name} crashed on item {holding.index} ({holding.path!r}): "
                    f"{type(exc).__name__}: {exc}", path=holding.path, index=holding.index,
                    producer=name)
            else:
                err = ProducerError(f"producer {name} crashed: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            buffer.abort(err)
        finally:
            if feed.leave(me):
                buffer.close()

    # -- consumer side -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        """Yield each ``(seq, sample or Failure)`` once; ends when the producers are done or the pool closes."""
        return self._iter_ordered() if self._ordered else self._iter_unordered()

    def _iter_unordered(self) -> Iterator[tuple[int, Any]]:
        """``__iter__`` of an unordered pool: pairs in the order they were finished."""
        feed, buffer = self._feed, self._buffer
        get_many = buffer.get_many  # one lock acquisition for all that is ready
        due = self._tuning.due if self._tuning is not None else (lambda: True)  # inline runs only with a tuner
        while True:
            # inline, once what producers left is drained, until the tuner wants to look
            if feed.target == 0 and not len(buffer) and (yield from self._inline.run(due)):
                self._tune()
                continue
            try:
                chunk = self._wait.get(get_many)
            except BufferClosed:
                return
            for pair in chunk:
                if feed.stopping:  # close() ends the loop, not the chunk in hand
                    return
                yield pair
            self._tune()

    def _iter_ordered(self) -> Iterator[tuple[int, Any]]:
        """``__iter__`` of an ordered pool: pairs in ``seq`` order, each releasing the window by one."""
        pending: dict[int, Any] = {}
        feed, buffer = self._feed, self._buffer
        for expected in range(self._count):
            while expected not in pending:
                if feed.target == 0 and not len(buffer):
                    pair = self._inline.next(expected)
                    if pair is not None:
                        pending[expected] = pair[1]
                        break
                try:
                    seq, out = self._wait.get(buffer.get)
                except BufferClosed:
                    return
                pending[seq] = out
            out = pending.pop(expected)
            feed.release(expected)
            yield expected, out
            self._tune()

    def _describe(self) -> str:
        """What the producers are doing, for the consumer's warning and stall error."""
        perf_now = time.perf_counter()
        busy = [f"{cast(threading.Thread, p.thread).name} on {cur[0]!r} for {perf_now - cur[1]:.1f} s"
                for p in list(self._producers) if (cur := p.current) is not None]
        state = ("stuck in the decoder: " + ", ".join(busy)) if busy else "no producer is decoding"
        return f"{self.decoded} of {self._count} items decoded, {self._feed.target} producers; {state}"
