"""What a decode hands the consumer besides a sample: a :class:`Failure` in the item's place, or
:data:`DELIVERED` when the decoder delivered the result itself.

NOTE [ Delivering decoders ]
============================
A decoder may hand its results to the consumer itself instead of returning one per item: the batch
slots' writer copies each sample into a row of a batch and returns a whole batch only for the item
that completes it. Such a decoder says so with a class attribute ``delivers_itself = True`` and has
two duties:

- it returns ``DELIVERED`` for an item whose result it keeps (nothing goes into the buffer);
- it has a ``stop_waiting()`` method, which the pool calls once when it stops: the decoder may block
  on the consumer (a free slot), and only the consumer's side can wake it.

The pool runs it unordered (an ordered pool would wait for a result that never comes), with chunks of
one (a producer holding a finished batch in its chunk while it waits for a free slot could hold the
very batch the consumer needs), and never inline (the consumer would wait inside the decoder for a
slot that only the consumer itself can free). BufferedDataset refuses ordered=True and a transform
with such a decoder (the transform would have no sample to apply to).
"""

from __future__ import annotations

from typing import Any

from ..sources.source import WorkItem

__all__ = ["DELIVERED", "Failure", "delivers_itself"]


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
