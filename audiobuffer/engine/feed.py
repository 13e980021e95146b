"""The feed of a producer pool: who may take which sequence number next, under one lock.

Producers (and the consumer, decoding inline) take sequence numbers here; the ordered window and the
byte bound hold producers back, and producers above the target count retire. Everything is guarded by
:attr:`Feed.lock`; :attr:`Feed.turn` wakes producers waiting for their turn or for bytes (NOTE
[ Producer shutdown protocol ] in ``engine/pool.py``).

NOTE [ Ordered feed ]
=====================
Ordered mode. A producer may take sequence number ``s`` only while ``s < released + window``, where
``released`` counts the items the consumer has handed on in order and ``window`` is the buffer's
capacity. Items out of turn wait in the consumer's reorder dict, so the buffer never fills while the
next item in order is still being decoded (no deadlock on a slow file), and no more than ``window``
items are decoded, buffered or waiting at any time (memory bounded by the buffer size).

Ordered mode with a byte bound. Items waiting in the reorder dict are out of the buffer, so the
buffer's ``max_bytes`` alone would not bound them. The feed counts ``held``: the payload bytes of every
item admitted and not yet handed on by the consumer (in the buffer or in the reorder dict). A producer
with a finished item of ``size`` bytes waits, on :attr:`Feed.turn`, until ``held + size <= max_bytes``,
or its item is the next in order (``seq == released``), or the pool stops. The next item in order is
always admitted (it may take ``held`` past the bound by that one item, as the buffer admits one
oversized item when it is empty), so the consumer can always make progress: every sequence number
below a taken one was taken earlier, so the next one is being decoded, waiting to be admitted (and
admitted at once), or already in the buffer. The consumer subtracts an item's size when it hands it
on and wakes the waiting producers. So, beyond the byte bound, memory holds at most one item over it
plus the one finished item each producer has in hand.

NOTE [ Changing the producer count ]
====================================
(``num_producers="auto"``; the decisions: NOTE [ Producer tuning ] in ``engine/tuner.py``.) Only the
pool's consumer changes :attr:`Feed.target`, between two items it takes, under the lock. The pool
starts threads under that lock too, never once the feed stops, so ``close()`` joins every thread there
is. A producer above the target retires in :meth:`Feed.take`, before it takes a sequence number, so it
holds no item; it puts its chunk and leaves like a producer that found the feed empty. So an item is
taken once, by one thread, and delivered once, whatever the count does. At count 0 the consumer
decodes inline (``InlineDecoder`` in ``engine/pool.py``): it takes the next sequence number itself
(ordered: only when it is the one it waits for; any lower one is held by a producer and arrives
through the buffer, so the window is never needed and nothing enters the buffer or ``held``) and
yields what it decoded without a hand-over, after draining what the buffer holds; unordered, it
decodes item after item and lets the tuner look only when an observation is due. The last producer out
closes the buffer when nothing is left to take, and so does the inline consumer when it finds nothing
to take and no producer left. Inline decoding is used only with a port that hands each item on in
its place (NOTE [ Output port ] in ``engine/pool.py``: the batch slots' port would wait for a slot
only the consumer frees), never with a ``timeout`` (a decode stuck in the consumer's own thread
could not be reported).
"""

from __future__ import annotations

import threading
import time
from typing import cast

__all__ = ["Feed", "Producer"]


class Producer:
    """One producer thread's record; its counters are written by that thread alone.

    Attributes:
        thread: the thread (set by the pool before it starts).
        busy: seconds in the decoder and the port, less the waits to put; decoded: items finished,
            decoded or failed; work: their summed cost, where the pool weighs items
            (``ProducerPool``'s ``weights``).
        waited: seconds waiting for a turn or for bytes (ordered mode).
        current: ``(path, since)`` of the item in the decoder or the port, or ``None``.
        retired: set under the feed lock when it leaves above the target count.
    """

    __slots__ = ("busy", "current", "decoded", "retired", "thread", "waited", "work")

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.busy = 0.0
        self.waited = 0.0
        self.decoded = 0
        self.work = 0.0
        self.current: tuple[str, float] | None = None
        self.retired = False


class Feed:
    """The sequence numbers ``0 .. count-1`` of one epoch, handed out once each.

    Args:
        count: how many items the epoch has.
        ordered: hold producers to the window (see NOTE [ Ordered feed ]).
        window: the buffer's capacity.
        max_bytes: the buffer's byte bound in ordered mode, else ``None``.

    Thread safety: every method may be called from any thread. The counts (``target``, ``active``,
    ``live``) are changed only with :attr:`lock` held.
    """

    def __init__(self, count: int, *, ordered: bool, window: int, max_bytes: int | None) -> None:
        self.lock = threading.Lock()
        self.turn = threading.Condition(self.lock)  # ordered mode: a producer's turn came, or bytes
        self.count = count
        self.next_seq = 0
        self.released = 0
        self.stopping = False
        self.target = 0  # the producer count wanted (0: the consumer decodes inline)
        self.active = 0  # producers not retired
        self.live = 0  # producer threads not yet finished (retiring ones included)
        self._ordered = ordered
        self._window = window
        self._max_bytes = max_bytes
        self._held = 0
        self._sizes: dict[int, int] = {}  # seq -> payload bytes, of the items counted in _held

    @property
    def byte_bound(self) -> bool:
        """Whether producers must :meth:`admit` their items (ordered, with a byte bound)."""
        return self._max_bytes is not None

    def stop(self) -> bool:
        """Take no more; wake every producer waiting for its turn or for bytes. Whether it is the first stop."""
        with self.lock:
            first, self.stopping = not self.stopping, True
            self.turn.notify_all()
            return first

    def take(self, me: Producer) -> int | None:
        """The next sequence number for producer ``me``, or ``None``: the feed is empty, the pool stops
        or ``me`` retires (at an item boundary: it holds no item)."""
        with self.lock:
            if self.stopping or self.next_seq >= self.count:
                return None
            if self.active > self.target:
                self.active -= 1
                me.retired = True
                return None
            seq = self.next_seq
            self.next_seq += 1
            if self._ordered and seq >= self.released + self._window:
                start = time.perf_counter()
                while seq >= self.released + self._window and not self.stopping:
                    self.turn.wait()
                me.waited += time.perf_counter() - start
                if self.stopping:
                    return None
            return seq

    def admit(self, me: Producer, seq: int, size: int) -> bool:
        """(Ordered, byte-bounded.) Wait until ``size`` bytes fit the bound or ``seq`` is next; count them.

        Returns ``False`` when the pool stops instead. See NOTE [ Ordered feed ].
        """
        max_bytes = cast(int, self._max_bytes)  # called only when byte_bound
        with self.lock:
            start = time.perf_counter()
            while not (self.stopping or seq == self.released or self._held + size <= max_bytes):
                self.turn.wait()
            me.waited += time.perf_counter() - start
            if self.stopping:
                return False
            self._held += size
            self._sizes[seq] = size
            return True

    def leave(self, me: Producer | None) -> bool:
        """Producer ``me`` has finished; whether it was the last one out with nothing left to take.
        (``None``: no producer leaves; whether none is there and nothing is left to take.)"""
        with self.lock:
            if me is not None:
                if not me.retired:
                    self.active -= 1
                self.live -= 1
            return self.live == 0 and (self.stopping or self.next_seq >= self.count)

    def take_inline(self, expected: int | None) -> tuple[int | None, bool]:
        """(Consumer.) ``(seq, done)``: the next sequence number to decode inline, ``None`` if there is
        none to take (ordered: ``expected`` is not next); ``done`` when nothing is left to take and no
        producer is left to deliver."""
        with self.lock:
            seq: int | None = self.next_seq
            if self.stopping or self.next_seq >= self.count or (expected is not None and seq != expected):
                seq = None
            else:
                self.next_seq += 1
            return seq, self.live == 0 and (self.stopping or self.next_seq >= self.count)

    def release(self, seq: int) -> None:
        """(Consumer, ordered.) Item ``seq`` was handed on: move the window and free its bytes."""
        with self.lock:
            self.released = seq + 1
            if self._sizes:
                self._held -= self._sizes.pop(seq, 0)
            self.turn.notify_all()
