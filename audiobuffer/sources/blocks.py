"""Block reads of an ``index.json``'s members: one ranged request for a block of neighbouring members.

An epoch in a block order (NOTE [ Block order ] in ``engine/plan.py``) asks for the members of a
block close together. :class:`BlockReads`, shared by one epoch's producers, reads each block once:
the first producer that needs one of its members fetches the block's whole byte range with one
ranged request (:func:`~audiobuffer.sources.storage.read_range`, with its timeouts and retries); the
others wait for it, and every member is sliced from it. A block is dropped once all the members the
epoch reads from it were read, and the least recently used beyond ``capacity`` blocks, so memory stays
a few blocks per producer. A block that cannot be read fails each of its members' reads, each named.
A block starts at its first member's tar header, so that each member is checked against the header
before it (NOTE [ Members where an index says ] in
``formats/tarheader.py``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ..errors import StorageError
from .formats.tarheader import HEADER, check_member
from .retry import where
from .storage import Storage
from .table import ItemTable

__all__ = ["BlockReads"]

#: Seconds a waiting producer allows beyond the fetching one's own bound (its tries, waits and timeouts).
_WAIT_SLACK = 30.0


class _Block:
    """One block being read, or read: ``data`` once ``done`` is set, unless ``error``."""

    __slots__ = ("data", "done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.data = b""
        self.error: BaseException | None = None


class BlockReads:
    """One epoch's reads of index members, a block at a time. Thread-safe.

    Args:
        table: the source's items (an index's: with shards, offsets and sizes).
        starts: the first item of each block (``engine.plan.block_starts``): a block is consecutive
            members of one shard, one contiguous byte range.
        indices: the items this epoch reads (a member twice where the plan pads with it): a block is
            dropped once its members among them were read.
        storage: the source's storage (its options, retries and timeouts).
        capacity: the most blocks held at once (the least recently used goes first).

    Attributes:
        requests: ranged requests made (a block each, a refetch after an eviction too).
    """

    def __init__(self, table: ItemTable, starts: np.ndarray, indices: np.ndarray, *,
                 storage: Storage, capacity: int) -> None:
        if table.offsets is None or table.sizes is None or table.shard_of is None or table.shards is None \
                or table.members is None:
            raise ValueError("block reads need an index's members (names, offsets and sizes)")
        self._table = table
        self._starts = np.asarray(starts, dtype=np.int64)
        self._storage = storage
        self._capacity = max(1, capacity)
        self._left = np.bincount(self.block_of(np.asarray(indices, dtype=np.int64)),
                                 minlength=len(self._starts)).astype(np.int64)
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._lock = threading.Lock()
        self.requests = 0
        retry = storage.retry
        timeout = retry.timeout
        # how long a producer waits for a block another fetches: that one's own bound, and some
        self._wait = None if timeout is None else (
            retry.attempts * 2 * timeout + sum(retry.delay(k) for k in range(1, retry.attempts)) + _WAIT_SLACK)

    def block_of(self, index: np.ndarray | int) -> Any:
        """The block of item ``index`` (or of each of an array of items)."""
        return np.searchsorted(self._starts, index, side="right") - 1

    def held(self) -> int:
        """Blocks held now (read or being read)."""
        with self._lock:
            return len(self._blocks)

    def read(self, index: int) -> bytes:
        """Member ``index``'s bytes, from its block (read now, or by another producer).

        Raises:
            StorageError: its block could not be read (naming the member, the block's error chained),
                or another producer's read of it did not end in time.
        """
        table = self._table
        b = int(self.block_of(index))
        with self._lock:
            block = self._blocks.get(b)
            fetch = block is None
            if block is None:
                block = self._blocks[b] = _Block()
                while len(self._blocks) > self._capacity:
                    self._blocks.popitem(last=False)  # those reading it keep their reference
                self.requests += 1
            else:
                self._blocks.move_to_end(b)
        first = int(self._starts[b])
        last = int(self._starts[b + 1]) - 1 if b + 1 < len(self._starts) else len(table) - 1
        start = max(int(table.offsets[first]) - HEADER, 0)  # type: ignore[index]  # the first one's header too
        url = table.shards[table.shard_of[index]]  # type: ignore[index]
        member = table.members[index]  # type: ignore[index]
        try:
            if fetch:
                self._fetch(block, url, start, first, last)
            elif not block.done.wait(self._wait):
                raise StorageError(f"cannot read {where(url, member)}: the block of items {first}..{last} that "
                                   f"holds it was still being read after {self._wait:.0f} s", url=url, member=member)
            error = block.error
            if error is not None:
                raise StorageError(f"cannot read {where(url, member)} (read in one block with its neighbours): "
                                   f"{error}", url=url, member=member, attempts=getattr(error, "attempts", 1),
                                   transient=getattr(error, "transient", False)) from error
            offset, size = int(table.offsets[index]), int(table.sizes[index])  # type: ignore[index]
            at = offset - start
            check_member(block.data[max(at - HEADER, 0):at], url, member, offset, size)
            return block.data[at:at + size]
        finally:
            with self._lock:
                self._left[b] -= 1
                if self._left[b] <= 0 and self._blocks.get(b) is block:
                    del self._blocks[b]

    def _fetch(self, block: _Block, url: str, start: int, first: int, last: int) -> None:
        table = self._table
        end = int(table.offsets[last]) + int(table.sizes[last])  # type: ignore[index]
        names = table.members
        member = None if names is None else f"{names[first]}..{names[last]}"
        try:
            block.data = self._storage.read_range(url, start, end - start, member=member)
        except BaseException as exc:  # an interrupt too: the waiting producers must not wait for nothing
            block.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            block.done.set()
