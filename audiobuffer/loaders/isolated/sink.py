"""An epoch of the isolated loader as the messages its trainer reads, wherever it is decoded.

The one consumer (``engine/epoch.feed``) hands batches to a :class:`MessageSink`, which collates
them and sends :class:`~.protocol.Batch`, :class:`~.protocol.SampleFailed`,
:class:`~.protocol.Skipped` and :class:`~.protocol.EpochEnd`: in the helper process into
shared-memory slots (``helper.py``), and in the trainer, while the helper warms up, into tensors
(``loader.py``). Nothing here imports torch: the helper imports this module too.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..._numpy_collate import SlotArena, collate_numpy
from ...engine.pool import Failure
from ...errors import HelperError, SampleError
from ...options import gil_enabled
from ...sources.item import WorkItem
from .protocol import Batch, EpochEnd, FromHelper, SampleFailed, Skipped

if TYPE_CHECKING:
    from ...engine.epoch import EpochRun

__all__ = ["MessageSink", "misfits"]


class MessageSink:
    """One epoch's batches, failures and end as messages (``engine/epoch.BatchSink``).

    A subclass places a batch: :meth:`take` a slot, :meth:`collate` into it (``(segment, fields)``),
    :meth:`give_back` a slot whose batch did not go; ``send(message)`` delivers each message.
    """

    def __init__(self, run: EpochRun, gen: int, key: str,
                 send: Callable[[FromHelper], None]) -> None:
        self.run = run
        self.gen = gen
        self.key = key
        self.send = send
        #: The epoch's source indices, which the rows of a batch by duration name (its padding).
        self.indices = run.layout.indices if run.layout.sizes is not None else None

    def take(self) -> int:
        return -1

    def give_back(self, slot: int) -> None:
        pass

    def collate(self, slot: int, samples: list[Any]) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def end_stats(self) -> dict[str, Any]:
        """What the sink adds to :class:`~.protocol.EpochEnd`'s stats."""
        return {}

    def put(self, samples: list[Any], seqs: list[int], positions: list[int]) -> dict[int, Failure]:
        """Collate ``samples`` and send them with ``positions``, and, for a batch by duration, each
        row's source index; or name the samples that cannot join a batch."""
        slot = self.take()
        try:
            segment, fields = self.collate(slot, samples)
            rows = None if self.indices is None else [int(self.indices[seq]) for seq in seqs]
            self.send(Batch(self.gen, slot, segment, fields, positions[:], len(samples),
                            self.run.pool.decode_seconds, rows))
        except HelperError:  # no room left in /dev/shm
            self.give_back(slot)
            raise
        except Exception:  # a sample that cannot be collated, or a field that does not pickle
            self.give_back(slot)
            found = misfits(samples, self.key)
            if not found:
                raise  # not the samples': a bug of ours, or the epoch was stopped
            return {i: self._misfit(seqs[i], cause) for i, cause in found.items()}
        return {}

    def _misfit(self, seq: int, cause: Exception) -> Failure:
        item = self.run.make_item(seq)
        error = SampleError(f"its sample cannot join a batch: {type(cause).__name__}: {cause} "
                            f"(a batch's samples are dicts with the keys of its first one, "
                            f"{self.key!r} an array of numbers that differs from the first one's "
                            f"only in its last axis, and values that pickle: convert them in the "
                            f"decoder or a transform)", path=item.path, index=item.index)
        error.__cause__ = cause
        return Failure(error, item, "collate")

    def skip(self, position: int) -> None:
        self.send(Skipped(self.gen, position))

    def fail(self, failure: Failure, *, fatal: bool) -> None:
        exc = failure.exc
        payload: bytes | None
        try:
            payload = pickle.dumps(exc)
            pickle.loads(payload)
        except Exception:
            payload = None
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        item = cast(WorkItem, failure.item)  # a producer's Failure always has its item
        self.send(SampleFailed(self.gen, fatal, item.index, item.path, failure.producer,
                               type(exc).__name__, str(exc), payload, text))

    def end(self, positions: list[int]) -> None:
        """What only the decoding side knows of the epoch; the trainer counts samples and
        failures."""
        pool = self.run.pool
        stats = {"decode_s": pool.decode_seconds, "buffer": self.run.buffer.stats.as_dict(),
                 "num_producers": pool.num_producers, "producer_history": pool.history,
                 "gil_enabled": gil_enabled(), "augment_s": self.run.augment_s(),
                 **self.end_stats()}
        self.send(EpochEnd(self.gen, stats, positions))


def misfits(samples: list[Any], key: str) -> dict[int, Exception]:
    """Which of ``samples`` cannot go into a batch with the first one that can, and why: each is
    collated alone or beside that one, as into a slot, and pickled as the batch message would be."""
    found: dict[int, Exception] = {}
    first = None
    for i, sample in enumerate(samples):
        try:
            pickle.dumps(collate_numpy([sample] if first is None else [first, sample], key=key,
                                       allocate=SlotArena(None)), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            found[i] = exc
        else:
            if first is None:
                first = sample
    return found
