"""The producer thread pool: N named threads that decode work items into a :class:`Buffer`.

NOTE [ Producer shutdown protocol ]
===================================
Parties: one consumer (the thread iterating the pool), N producer threads, one Buffer per epoch.

Normal end. Each producer takes sequence numbers from the feed until it is empty, then leaves. The
producers count themselves out under the feed lock and the last one out closes the buffer, so the
consumer drains what is left and then sees ``BufferClosed``: the epoch is over. There is no sentinel
item, so any object (``None`` included) can be a sample.

Failures. An exception from the decoder (or the user's transform) is caught per item and travels
through the buffer as a :class:`Failure` in the item's place, so the consumer applies its error policy
in order and every item is counted as yielded or failed. Anything else that escapes a producer (a bug
of ours, a ``BaseException``) aborts the buffer with an error that names the producer: the consumer
raises it. A producer never dies silently.

Early end. The consumer leaving its loop, raising, being garbage-collected, or someone calling
``close()`` from any thread all come to :meth:`ProducerPool.close`: it sets the stop flag under the
feed lock and wakes producers waiting for their turn (ordered mode), aborts the buffer (dropping its
items and waking producers blocked in ``put`` with ``BufferClosed``), then joins every thread against
one deadline of ``JOIN_TIMEOUT`` seconds. A producer checks the flag before taking each item, so it
finishes at most the item in hand. A decoder that itself waits for the consumer (the batch slots'
writer waits for a free slot) is woken by its ``stop_waiting()``, which the pool calls once after the
abort and before the join (see NOTE [ Delivering decoders ]); without it such a producer would sit out
the whole join. Threads are
daemons: a decoder stuck in a system call cannot keep the interpreter alive, and ``close()`` logs a
warning naming any thread that outlived the join. ``close()`` is idempotent and safe to call from any
thread but a producer's own. :meth:`ProducerPool.stop` is the first half alone (flag, wake, abort,
``stop_waiting``; no join): a pool registers it with the cancel scope of the thread that builds it, so a
``DevicePrefetcher`` whose loop is left stops the pool its thread waits on, from the consumer's thread
(NOTE [ Prefetch cancellation ] in ``audiobuffer/_cancel.py``). :meth:`ProducerPool.start` runs under
the same protocol: if a thread cannot be started (``RuntimeError: can't start new thread``), it calls
``close()``, which stops and joins the threads already started, and re-raises.

Chunks. In an unordered pool a producer keeps its finished items and puts them in one ``put_many``
when it has ``CHUNK_ITEMS`` of them, when the oldest has waited ``CHUNK_SECONDS``, or when the feed
is empty. Where producers are the bottleneck, the consumer sleeps in ``get`` and would otherwise be
woken (a thread switch and a GIL hand-over) for every item: tens of microseconds each, as much as
decoding a short WAV file. An ordered pool puts one item at a time: a producer holding the item the
consumer waits for in its chunk while it waits for its turn would deadlock. A producer flushes before
it starts a decode if its chunk is already ``CHUNK_SECONDS`` old; so a file that takes long to decode
holds back at most the ``CHUNK_ITEMS - 1`` items its producer finished just before it, while the
other producers keep delivering. A decoder that itself waits for the consumer (the batch slots'
writer waits for a free slot) must run with chunks of 1, or the items held in the chunk could be
the very ones the consumer needs to make progress.

Ordered mode. A producer may take sequence number ``s`` only while ``s < released + window``, where
``released`` counts the items the consumer has handed on in order and ``window`` is the buffer's
capacity. Items out of turn wait in the consumer's reorder dict, so the buffer never fills while the
next item in order is still being decoded (no deadlock on a slow file), and no more than ``window``
items are decoded, buffered or waiting at any time (memory bounded by the buffer size).

Ordered mode with a byte bound. Items waiting in the reorder dict are out of the buffer, so the
buffer's ``max_bytes`` alone would not bound them. The pool counts ``held``: the payload bytes of every
item it has admitted and the consumer has not yet handed on (in the buffer or in the reorder dict).
A producer with a finished item of ``size`` bytes waits under the feed lock, on the same condition as
the window, until ``held + size <= max_bytes``, or its item is the next in order (``seq == released``),
or the pool stops. The next item in order is always admitted (it may take ``held`` past the bound by
that one item, as the buffer admits one oversized item when it is empty), so the consumer can always
make progress: every sequence number below a taken one was taken earlier, so the next one is being
decoded, waiting to be admitted (and admitted at once), or already in the buffer. The consumer
subtracts an item's size when it hands it on and wakes the waiting producers. So, beyond the byte
bound, memory holds at most one item over it plus the one finished item each producer has in hand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

from ._cancel import on_cancel
from ._checks import check_int, check_seconds
from .buffer import Buffer, payload_nbytes
from .errors import AudioBufferError, BufferClosed, ProducerError, SampleError, StallError
from .sources import WorkItem

__all__ = ["DELIVERED", "Failure", "JOIN_TIMEOUT", "ProducerPool", "delivers_itself"]

logger = logging.getLogger(__name__)

#: Seconds :meth:`ProducerPool.close` waits, in all, for the producer threads to finish.
JOIN_TIMEOUT = 10.0
#: The least seconds between two "waiting for data" warnings of one pool.
WARN_INTERVAL = 30.0
#: A producer hands its finished items over in chunks of up to this many (unordered pools) ...
CHUNK_ITEMS = 16
#: ... or as soon as its oldest finished item has waited this long (seconds), or at the end.
CHUNK_SECONDS = 0.002


# NOTE [ Delivering decoders ]
# A decoder may hand its results to the consumer itself instead of returning one per item: the
# batch slots' writer copies each sample into a row of a batch and returns a whole batch only for the
# item that completes it. Such a decoder says so with a class attribute ``delivers_itself = True``
# and has two duties:
#   - it returns ``DELIVERED`` for an item whose result it keeps (nothing goes into the buffer);
#   - it has a ``stop_waiting()`` method, which the pool calls once when it stops: the decoder may
#     block on the consumer (a free slot), and only the consumer's side can wake it.
# The pool runs it unordered (an ordered pool would wait for a result that never comes) and with
# chunks of one (a producer holding a finished batch in its chunk while it waits for a free slot
# could hold the very batch the consumer needs). BufferedDataset refuses ordered=True and a
# transform with such a decoder (the transform would have no sample to apply to).


class _Delivered:
    """The type of :data:`DELIVERED`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DELIVERED"


#: What a delivering decoder returns for an item whose result it keeps (NOTE [ Delivering decoders ]).
DELIVERED = _Delivered()


def delivers_itself(decode: Any) -> bool:
    """Whether ``decode`` hands its results over itself (NOTE [ Delivering decoders ])."""
    return getattr(decode, "delivers_itself", False) is True


class Failure:
    """An error travelling through a buffer in the place of what failed, so that the consumer meets it
    in order, after what came before it: a producer's item that could not be decoded (with the item
    and the producer's name), or a prefetch thread's loader error (``DevicePrefetcher``, no item)."""

    __slots__ = ("exc", "item", "producer")

    def __init__(self, exc: BaseException, item: WorkItem | None = None, producer: str | None = None) -> None:
        self.exc = exc
        self.item = item
        self.producer = producer


class ProducerPool:
    """Decode ``count`` work items with ``num_producers`` threads into ``buffer``; iterate the results.

    Iterating the pool yields ``(seq, sample)`` pairs, the sample being a :class:`Failure` for an item
    that failed, once each: in sequence order with ``ordered=True``, else as they come. See
    NOTE [ Producer shutdown protocol ].

    Args:
        make_item: builds the work item with sequence number ``seq`` (0 .. count-1).
        count: how many items this epoch has.
        decode: turns a work item into a sample; runs in the producer threads.
        buffer: where finished samples wait for the consumer (a fresh one per pool).
        num_producers: how many threads decode.
        ordered: yield in sequence order. With a byte-bounded buffer, the samples waiting to be
            handed on in order count against its ``max_bytes`` too (see the NOTE).
        warn_after: log a "waiting for data" warning when the consumer has waited this many
            seconds for the next sample (at most one every ``WARN_INTERVAL`` seconds);
            ``float("inf")`` never warns.
        timeout: raise :class:`StallError` when the consumer has waited this many seconds for the
            next sample, naming what each producer is stuck on; ``float("inf")`` never does.
        chunk_items: the most finished items a producer hands over at once; ``None``: up to
            ``CHUNK_ITEMS``, no more than its share of the buffer. Ordered pools use 1.
        name: the threads' name prefix (``{name}-{i}``).
    """

    def __init__(self, make_item: Callable[[int], WorkItem], count: int,
                 decode: Callable[[WorkItem], Any], buffer: Buffer, *, num_producers: int,
                 ordered: bool = False, warn_after: float | None = None, timeout: float | None = None,
                 chunk_items: int | None = None, name: str = "audiobuffer-producer") -> None:
        check_int("count", count, 0)
        check_int("num_producers", num_producers, 1)
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
        self._window = buffer.capacity
        self._delivering = delivers_itself(decode)
        if self._delivering and ordered:
            raise ValueError(f"{decode!r} delivers its results itself and cannot run in an ordered pool "
                             f"(NOTE [ Delivering decoders ])")
        # Chunks no larger than a producer's share of the buffer; 1 in ordered mode and for a delivering
        # decoder (see the NOTEs).
        if chunk_items is None:
            chunk_items = max(1, min(CHUNK_ITEMS, buffer.capacity // (2 * num_producers)))
        self._chunk = 1 if ordered or self._delivering else chunk_items
        self._warn_after = warn_after
        self._timeout = timeout
        self._last_warning = -float("inf")
        self._current: list[tuple[str, float] | None] = [None] * num_producers  # (path, since) per producer
        # Feed state, guarded by _feed_lock.
        self._feed_lock = threading.Lock()
        self._turn = threading.Condition(self._feed_lock)  # ordered mode: a producer's turn came
        self._next_seq = 0
        self._released = 0
        self._finished = 0
        self._stopping = False
        # Ordered mode with a byte bound: bytes admitted and not yet handed on (see the NOTE).
        self._max_bytes = buffer.max_bytes if ordered else None
        self._held = 0
        self._sizes: dict[int, int] = {}  # seq -> payload bytes, of the items counted in _held
        self._busy = [0.0] * num_producers  # decode seconds, one slot per producer
        self._decoded = [0] * num_producers
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"{name}-{i}", daemon=True)
            for i in range(num_producers)
        ]
        self._started = False
        self._closed = False
        # A DevicePrefetcher's thread builds pools in a cancel scope: leaving its loop stops this one
        # (NOTE [ Prefetch cancellation ] in audiobuffer/_cancel.py).
        self._unregister = on_cancel(self.stop)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the producer threads (every attribute they read is set by now).

        If a thread cannot be started, the pool is closed (the threads already started are
        stopped and joined) and the error is raised.
        """
        if self._started:
            raise RuntimeError("a ProducerPool is started once")
        self._started = True
        try:
            for thread in self._threads:
                thread.start()
        except BaseException:
            # The threads started so far would wait for the consumer forever: stop them first.
            self.close()
            raise

    def stop(self) -> None:
        """Tell the producers and the consumer to stop, and return at once. Idempotent, any thread.

        Producers finish the item in hand and take no more; the consumer's iteration ends as after
        :meth:`close`, which still has to be called to join the threads.
        """
        with self._feed_lock:
            self._stopping = True
            self._turn.notify_all()
            first, self._closed = not self._closed, True
        if first:
            if not self._buffer.closed or len(self._buffer):
                self._buffer.abort(BufferClosed("the producer pool was closed"))
            if self._delivering:
                # wake producers waiting inside it for the consumer (NOTE [ Delivering decoders ])
                cast(Any, self._decode).stop_waiting()

    def close(self, timeout: float = JOIN_TIMEOUT) -> None:
        """Stop and join the producers; see NOTE [ Producer shutdown protocol ]. Idempotent."""
        self.stop()
        self._unregister()
        deadline = time.monotonic() + timeout
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current and thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive() and t is not current]
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
        return self._stopping

    @property
    def threads(self) -> list[threading.Thread]:
        """The producer threads."""
        return list(self._threads)

    @property
    def decode_seconds(self) -> float:
        """Seconds the producers spent in the decoder so far, summed over producers."""
        return sum(self._busy)

    @property
    def decoded(self) -> int:
        """Items the producers have finished (decoded or failed) so far."""
        return sum(self._decoded)

    # -- producer side -------------------------------------------------------------------------

    def _take(self) -> int | None:
        """The next sequence number to decode, or ``None`` when there is none or the pool stops."""
        with self._feed_lock:
            if self._stopping or self._next_seq >= self._count:
                return None
            seq = self._next_seq
            self._next_seq += 1
            if self._ordered:
                while seq >= self._released + self._window and not self._stopping:
                    self._turn.wait()
                if self._stopping:
                    return None
            return seq

    def _run(self, slot: int) -> None:
        """The body of producer thread ``slot``: decode items from the feed into the buffer until it is empty.

        Follows NOTE [ Producer shutdown protocol ] at the top of this module: a decoder's exception
        goes into the buffer as a :class:`Failure` in the item's place; anything else that escapes
        aborts the buffer with an error naming the producer (and the item, if it escaped the
        decoder); ``BufferClosed`` means the pool was closed; the last producer out closes the buffer.
        """
        name = self._threads[slot].name
        buffer = self._buffer
        chunk: list[tuple[int, Any]] = []
        chunk_size = self._chunk
        oldest = 0.0  # when the oldest item in the chunk was finished
        decoding: WorkItem | None = None  # the item in the decoder, for a crash report
        try:
            while True:
                seq = self._take()
                if seq is None:
                    break
                item = self._make_item(seq)
                start = time.perf_counter()
                if chunk and start - oldest >= CHUNK_SECONDS:
                    buffer.put_many(chunk)  # do not keep finished items through another decode
                    chunk = []
                self._current[slot] = (item.path, start)
                decoding = item
                try:
                    out: Any = self._decode(item)
                except Exception as exc:  # reported to the consumer, which applies on_error
                    out = Failure(exc, item, name)
                decoding = None  # a BaseException (SystemExit, KeyboardInterrupt, ...) leaves it set
                self._current[slot] = None
                end = time.perf_counter()
                self._busy[slot] += end - start
                self._decoded[slot] += 1
                if out is DELIVERED:
                    continue
                if chunk_size == 1:
                    if self._max_bytes is not None and not self._admit(seq, out):
                        break  # the pool stops
                    buffer.put((seq, out))
                    continue
                if not chunk:
                    oldest = end
                chunk.append((seq, out))
                if len(chunk) >= chunk_size or end - oldest >= CHUNK_SECONDS:
                    buffer.put_many(chunk)
                    chunk = []
            if chunk:
                buffer.put_many(chunk)
        except BufferClosed:
            pass  # the pool was closed: the consumer has gone
        except BaseException as exc:
            err: AudioBufferError
            if decoding is not None:  # it escaped the decoder: name the item and its file
                err = SampleError(
                    f"producer {name} crashed on item {decoding.index} ({decoding.path!r}): "
                    f"{type(exc).__name__}: {exc}", path=decoding.path, index=decoding.index, producer=name)
            else:
                err = ProducerError(f"producer {name} crashed: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            buffer.abort(err)
        finally:
            with self._feed_lock:
                self._finished += 1
                last = self._finished == len(self._threads)
            if last:
                buffer.close()

    def _admit(self, seq: int, out: Any) -> bool:
        """(Ordered, byte-bounded.) Wait until ``out`` fits the byte bound or is next in order; count it.

        Returns ``False`` when the pool stops instead. See the NOTE, "Ordered mode with a byte bound".
        """
        size = payload_nbytes(out)
        max_bytes = self._max_bytes
        with self._feed_lock:
            while not (self._stopping or seq == self._released or self._held + size <= max_bytes):  # type: ignore[operator]
                self._turn.wait()
            if self._stopping:
                return False
            self._held += size
            self._sizes[seq] = size
            return True

    # -- consumer side -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        """Yield each ``(seq, sample or Failure)`` once; ends when the producers are done or the pool closes."""
        return self._iter_ordered() if self._ordered else self._iter_unordered()

    def _iter_unordered(self) -> Iterator[tuple[int, Any]]:
        """``__iter__`` of an unordered pool: pairs in the order they were finished."""
        get_many = self._buffer.get_many  # one lock acquisition for all that is ready
        while True:
            try:
                chunk = self._get(get_many)
            except BufferClosed:
                return
            for pair in chunk:
                if self._stopping:  # close() ends the loop, not the chunk in hand
                    return
                yield pair

    def _iter_ordered(self) -> Iterator[tuple[int, Any]]:
        """``__iter__`` of an ordered pool: pairs in ``seq`` order, each releasing the window by one."""
        pending: dict[int, Any] = {}
        for expected in range(self._count):
            while expected not in pending:
                try:
                    seq, out = self._get(self._buffer.get)
                except BufferClosed:
                    return
                pending[seq] = out
            out = pending.pop(expected)
            with self._feed_lock:
                self._released = expected + 1
                if self._sizes:
                    self._held -= self._sizes.pop(expected, 0)
                self._turn.notify_all()
            yield expected, out

    def _get(self, take: Callable[..., Any]) -> Any:
        """``take()`` (the buffer's get or get_many), with the "waiting for data" warning and the stall timeout."""
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
                    raise StallError(
                        f"no sample for {self._timeout} s (timeout); {self.decoded} of {self._count} items decoded; "
                        f"{self._describe_producers()}") from None
                if now - self._last_warning >= WARN_INTERVAL:
                    self._last_warning = now
                    logger.warning(
                        "waiting for data: the consumer has waited %.1f s for a sample (%d of %d items "
                        "decoded, %d producers); add producers or make decoding cheaper",
                        now - start, self.decoded, self._count, len(self._threads))

    def _describe_producers(self) -> str:
        perf_now = time.perf_counter()
        busy = [f"{t.name} on {cur[0]!r} for {perf_now - cur[1]:.1f} s"
                for t, cur in zip(self._threads, list(self._current)) if cur is not None]
        return ("stuck in the decoder: " + ", ".join(busy)) if busy else "no producer is decoding"
