"""What a :class:`~audiobuffer.Buffer` counts: the payload bytes of an item, and the snapshot of its counters.

Both know nothing of torch or audio: bytes are read from whatever has an ``nbytes`` attribute.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BufferStats", "payload_nbytes"]


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
