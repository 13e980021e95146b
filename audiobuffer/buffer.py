"""A bounded, thread-safe FIFO buffer between producer threads and a consumer: :class:`Buffer`.

It follows CPython's ``Lib/queue.py``: one lock shared by two conditions, ``has_data`` and ``has_pos``;
every wait a ``while not predicate: cond.wait(remaining)`` loop against a ``time.monotonic()``
deadline, woken at least every ``WAIT_SLICE`` seconds (NOTE [ Interruptible waits ]); a notify on
every change of state, and no sleep. It knows nothing of torch or audio: ``max_bytes`` counts what
:func:`payload_nbytes` finds (``nbytes`` attributes, ``bytes``, and dicts, lists and tuples of them).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from ._checks import check_int
from .errors import BufferClosed

__all__ = ["Buffer", "BufferClosed", "BufferStats", "payload_nbytes"]


def payload_nbytes(item: Any) -> int:
    """Bytes held by the array payloads of ``item``, walking dicts, lists and tuples.

    Objects with an ``nbytes`` attribute (numpy arrays, torch tensors, memoryviews) count that;
    ``bytes`` and ``bytearray`` their length; anything else counts as 0.
    """
    if isinstance(item, (bytes, bytearray)):
        return len(item)
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(item, dict):
        return sum(payload_nbytes(value) for value in item.values())
    if isinstance(item, (list, tuple)):
        return sum(payload_nbytes(value) for value in item)
    return 0


@dataclass(frozen=True)
class BufferStats:
    """A snapshot of a :class:`Buffer`'s counters.

    Attributes:
        capacity: the item bound.
        max_bytes: the byte bound, or ``None``.
        puts: items put so far.
        gets: items taken so far.
        put_wait_s: total seconds producers spent waiting for room (the consumer was the bottleneck).
        get_wait_s: total seconds consumers spent waiting for data (the producers were the bottleneck).
        mean_fill: mean number of items in the buffer as each ``get`` / ``get_many`` call found it.
        peak_fill: the most items the buffer ever held.
        peak_bytes: the most payload bytes it ever held (counted only with ``max_bytes``).
    """

    capacity: int
    max_bytes: int | None
    puts: int
    gets: int
    put_wait_s: float
    get_wait_s: float
    mean_fill: float
    peak_fill: int
    peak_bytes: int

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as a plain dict."""
        return asdict(self)


T = TypeVar("T")

# NOTE [ Interruptible waits ]
# ============================
# On Windows, before CPython 3.14 (gh-125541), acquiring a lock without a timeout cannot be
# interrupted: Ctrl-C does nothing while the trainer's thread waits for a stalled pipeline with
# ``timeout=None``. So every wait the trainer's thread can make (a buffer's get, the prefetcher's
# hand-over, the helper's channel, futures the trainer collects) is a loop of waits of at most
# WAIT_SLICE seconds: the signal handler runs between two of them. A wake-up re-checks its predicate
# and waits again; nothing is polled for, since every change of state still notifies.
WAIT_SLICE = 0.25


def _waiters_of(cond: threading.Condition) -> Collection[Any]:
    """The threads waiting on ``cond``, a live collection: empty means nobody waits.

    ``Condition.notify()`` costs an ownership check and a walk of its waiters even when there are
    none, the common case while data flows, so the hot paths read this (with the lock held) and notify
    only when it is not empty. Waiters register and leave under that same lock, so none is missed, GIL
    or no GIL. ``_waiters`` is a private attribute of CPython's ``threading.Condition``, a deque made
    once in its constructor and changed in place (PyPy has it too); this is the one place reading it.
    """
    return cond._waiters  # type: ignore[attr-defined]


def _check_timeout(timeout: float) -> None:
    """Reject a negative or NaN ``timeout`` up front, whether or not the call would wait."""
    if not timeout >= 0:  # NaN too
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")


class Buffer(Generic[T]):
    """A bounded FIFO buffer with blocking, timed ``put`` and ``get``, ``close`` and ``abort``.

    Bounded by ``capacity`` items and, optionally, by ``max_bytes`` of payload. An item larger than
    ``max_bytes`` on its own is admitted when the buffer is empty, so that it cannot block forever.

    Thread safety: every method may be called from any thread.

    Example:
        >>> buf = Buffer(2)
        >>> buf.put("a"); buf.put("b"); buf.close()
        >>> list(buf)
        ['a', 'b']

    Args:
        capacity: the most items held at once (>= 1).
        max_bytes: the most payload bytes held at once, or ``None`` for no byte bound.
    """

    def __init__(self, capacity: int, *, max_bytes: int | None = None) -> None:
        check_int("capacity", capacity, 1)
        if max_bytes is not None:
            check_int("max_bytes", max_bytes, 1, also="or None")
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._items: deque[T] = deque()
        self._sizes: deque[int] = deque()  # payload bytes of each item, kept only with max_bytes
        self._nbytes = 0
        self._closed = False
        self._abort_exc: BaseException | None = None
        self._lock = threading.Lock()
        # Both conditions share the lock, as in queue.py.
        # has_data: consumers (get, get_many) wait on it for an item; put, put_many and _put_bounded
        # notify it when they add items, close() and abort() notify all.
        self._has_data = threading.Condition(self._lock)
        # has_pos: producers (put, put_many) wait on it for room (or bytes); get and get_many notify it
        # when they take items, close() and abort() notify all.
        self._has_pos = threading.Condition(self._lock)
        self._data_waiters = _waiters_of(self._has_data)  # see _waiters_of: a notify only for a waiter
        self._pos_waiters = _waiters_of(self._has_pos)
        # Counters, all guarded by the lock.
        self._puts = 0
        self._gets = 0
        self._put_wait = 0.0
        self._get_wait = 0.0
        self._fill_sum = 0
        self._takes = 0  # get and get_many calls that took something
        self._peak_fill = 0
        self._peak_bytes = 0

    # -- state ---------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """The item bound."""
        return self._capacity

    @property
    def max_bytes(self) -> int | None:
        """The byte bound, or ``None``."""
        return self._max_bytes

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` or :meth:`abort` was called."""
        return self._closed

    @property
    def nbytes(self) -> int:
        """Payload bytes held now (counted only with ``max_bytes``)."""
        return self._nbytes

    def __len__(self) -> int:
        # Without the lock: a hint that may be stale at once. Where one thread alone takes items, a
        # non-zero count it sees stays until it takes them; a zero may be stale.
        return len(self._items)

    def __repr__(self) -> str:
        with self._lock:
            items, nbytes = len(self._items), self._nbytes
            state = "aborted" if self._abort_exc is not None else "closed" if self._closed else "open"
        held = f"items={items}" if self._max_bytes is None else f"items={items}, nbytes={nbytes}"
        return f"Buffer(capacity={self._capacity}, max_bytes={self._max_bytes}, {held}, state={state!r})"

    @property
    def stats(self) -> BufferStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return BufferStats(
                capacity=self._capacity,
                max_bytes=self._max_bytes,
                puts=self._puts,
                gets=self._gets,
                put_wait_s=self._put_wait,
                get_wait_s=self._get_wait,
                mean_fill=self._fill_sum / self._takes if self._takes else 0.0,
                peak_fill=self._peak_fill,
                peak_bytes=self._peak_bytes,
            )

    # -- producer side -------------------------------------------------------------------------

    def put(self, item: T, timeout: float | None = None) -> None:
        """Append ``item``, waiting for room.

        Args:
            item: any object, ``None`` included.
            timeout: seconds to wait for room; ``None`` (or ``float("inf")``) waits as long as it takes.

        Raises:
            BufferClosed: the buffer is closed or aborted (also when that happens during the wait).
            TimeoutError: no room came within ``timeout``.
            ValueError: ``timeout`` is negative or NaN.
        """
        if timeout is not None:
            _check_timeout(timeout)
        if self._max_bytes is not None:
            self._put_bounded(item, timeout)
            return
        with self._lock:
            items = self._room_or_closed(timeout)
            items.append(item)
            self._puts += 1
            if len(items) > self._peak_fill:
                self._peak_fill = len(items)
            if self._data_waiters:
                self._has_data.notify()

    def put_many(self, items: list[T], timeout: float | None = None) -> None:
        """Append ``items`` in order, as many at a time as there is room for.

        One lock acquisition and one wake-up per stretch of room rather than per item: a producer
        that hands over its work in chunks saves the consumer a wake-up per item. With a byte bound
        the items go one by one.

        Raises:
            BufferClosed: the buffer is closed or aborted (items not yet placed are not added).
            TimeoutError: some room did not come within ``timeout`` (each wait has it in full).
            ValueError: ``timeout`` is negative or NaN.
        """
        if timeout is not None:
            _check_timeout(timeout)
        if self._max_bytes is not None:
            for item in items:
                self._put_bounded(item, timeout)
            return
        placed, total = 0, len(items)
        while placed < total:
            with self._lock:
                queue = self._room_or_closed(timeout)
                room = min(self._capacity - len(queue), total - placed)
                queue.extend(items[placed:placed + room])
                placed += room
                self._puts += room
                if len(queue) > self._peak_fill:
                    self._peak_fill = len(queue)
                if self._data_waiters:
                    self._has_data.notify_all()

    def _put_bounded(self, item: T, timeout: float | None) -> None:
        """``put`` with a byte bound: the item's payload is counted and must fit."""
        size = payload_nbytes(item)
        with self._lock:
            if not self._put_ready(size):
                self._wait(self._has_pos, lambda: self._put_ready(size), timeout, "put")
            if self._closed:
                raise BufferClosed("put() on a closed buffer") from self._abort_exc
            self._items.append(item)
            self._sizes.append(size)
            self._nbytes += size
            self._puts += 1
            self._peak_fill = max(self._peak_fill, len(self._items))
            self._peak_bytes = max(self._peak_bytes, self._nbytes)
            self._has_data.notify()

    def _room_or_closed(self, timeout: float | None) -> deque[T]:
        """(Lock held, no byte bound.) Wait for room for an item; raise if the buffer is closed."""
        items = self._items
        if len(items) >= self._capacity and not self._closed:
            self._wait(self._has_pos, self._has_room, timeout, "put")
        if self._closed:
            raise BufferClosed("put on a closed buffer") from self._abort_exc
        return items

    def _has_room(self) -> bool:
        return self._closed or len(self._items) < self._capacity

    def _put_ready(self, size: int) -> bool:
        if self._closed:
            return True
        n = len(self._items)
        if n >= self._capacity:
            return False
        return self._max_bytes is None or n == 0 or self._nbytes + size <= self._max_bytes

    def close(self) -> None:
        """Refuse further puts; consumers drain what is left, then get :class:`BufferClosed`.

        Wakes every waiter. Idempotent.
        """
        with self._lock:
            self._closed = True
            self._has_data.notify_all()
            self._has_pos.notify_all()

    def abort(self, exc: BaseException) -> None:
        """Fail the buffer: drop what it holds and make every ``get`` raise ``exc``.

        Wakes every waiter: blocked consumers raise ``exc``, blocked producers raise
        :class:`BufferClosed` chained to ``exc``. Only the first abort's exception is kept.
        """
        if not isinstance(exc, BaseException):
            raise TypeError(f"abort() needs an exception instance, got {exc!r}")
        with self._lock:
            if self._abort_exc is None:
                self._abort_exc = exc
            self._closed = True
            self._items.clear()
            self._sizes.clear()
            self._nbytes = 0
            self._has_data.notify_all()
            self._has_pos.notify_all()

    # -- consumer side -------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> T:
        """Remove and return the oldest item, waiting for one.

        Args:
            timeout: seconds to wait for an item; ``None`` (or ``float("inf")``) waits as long as it takes.

        Raises:
            BufferClosed: the buffer is closed and drained.
            TimeoutError: no item came within ``timeout``.
            BaseException: the exception given to :meth:`abort`.
            ValueError: ``timeout`` is negative or NaN.
        """
        if timeout is not None:
            _check_timeout(timeout)
        with self._lock:
            items = self._ready_items(timeout)
            item = items.popleft()
            self._gets += 1
            if self._max_bytes is not None:
                self._nbytes -= self._sizes.popleft()
                self._has_pos.notify_all()  # the freed bytes may fit any waiting producer
            elif self._pos_waiters:
                self._has_pos.notify()
            return item

    def get_many(self, max_items: int | None = None, timeout: float | None = None) -> list[T]:
        """Remove and return every item there is (up to ``max_items``), waiting for at least one.

        One lock acquisition for the lot: a consumer that drains the buffer this way pays the
        locking once per call rather than once per item.

        Raises:
            BufferClosed: the buffer is closed and drained.
            TimeoutError: no item came within ``timeout``.
            BaseException: the exception given to :meth:`abort`.
            ValueError: ``timeout`` is negative or NaN, or ``max_items`` is not an integer >= 1.
        """
        if timeout is not None:
            _check_timeout(timeout)
        if max_items is not None and (isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1):
            raise ValueError(f"max_items must be None or an integer >= 1, got {max_items!r}")
        with self._lock:
            items = self._ready_items(timeout)
            n = len(items) if max_items is None else min(max_items, len(items))
            self._gets += n
            if n == len(items):
                out = list(items)
                items.clear()
            else:
                out = [items.popleft() for _ in range(n)]
            if self._max_bytes is not None:
                for _ in range(n):
                    self._nbytes -= self._sizes.popleft()
                self._has_pos.notify_all()
            elif self._pos_waiters:
                self._has_pos.notify(n)
            return out

    def _ready_items(self, timeout: float | None) -> deque[T]:
        """(Lock held.) Wait until there is an item to take; raise if aborted, or closed and drained."""
        items = self._items
        if not items and not self._closed:
            self._wait(self._has_data, self._get_ready, timeout, "get")
        if self._abort_exc is not None:
            raise self._abort_exc
        if not items:
            raise BufferClosed("the buffer is closed and drained")
        self._fill_sum += len(items)
        self._takes += 1
        return items

    def _get_ready(self) -> bool:
        return bool(self._items) or self._closed

    def __iter__(self) -> Iterator[T]:
        """Yield items until the buffer is closed and drained."""
        while True:
            try:
                yield self.get()
            except BufferClosed:
                return

    # -- helpers -------------------------------------------------------------------------------

    def _wait(self, cond: threading.Condition, ready: Callable[[], bool], timeout: float | None,
              side: str) -> None:
        """Wait on ``cond`` (lock held) until ``ready()``, adding the time waited to ``side``'s total."""
        start = time.monotonic()
        try:
            if timeout is None:
                while not ready():
                    cond.wait(WAIT_SLICE)  # NOTE [ Interruptible waits ]
                return
            deadline = start + timeout  # checked by the public method (_check_timeout)  # inf for float("inf")
            while not ready():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    what = "room in the buffer" if side == "put" else "item in the buffer"
                    raise TimeoutError(f"{side}() found no {what} within {timeout} s")
                cond.wait(min(remaining, WAIT_SLICE))  # NOTE [ Interruptible waits ]
        finally:
            if side == "put":
                self._put_wait += time.monotonic() - start
            else:
                self._get_wait += time.monotonic() - start
