"""One epoch of an :class:`~audiobuffer.IsolatedLoader` as the trainer sees it: counts and consumed mask.

The helper process decodes and collates; the trainer marks positions consumed as batches arrive,
counts failures per the error policy, and builds the epoch's :class:`~audiobuffer.DatasetStats` from
its own counts and the helper's report at the epoch's end.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

from ...buffer import BufferStats
from ...engine.batches import PaddingMeter
from ...engine.epoch import DatasetStats, record_skip
from ...errors import DecodeError, SampleError
from ...options import ErrorPolicy
from .channel import RemoteTraceback

__all__ = ["TrainerRun"]


class TrainerRun:
    """One epoch as the trainer sees it: its generation, consumed mask and counters."""

    def __init__(self, gen: int, epoch: int, rank: int, world_size: int, consumed: bytearray, items: int,
                 num_producers: int) -> None:
        self.gen = gen
        self.epoch = epoch
        self.rank = rank
        self.world_size = world_size
        self.consumed = consumed
        self.items = items
        self.resumed = len(consumed) - items
        self.num_producers = num_producers
        self.yielded = 0
        self.failed = 0
        self.failures: list[tuple[int, str, str]] = []
        self.decode_s = 0.0
        self.wait_s = 0.0  # the trainer waiting for a full slot
        self.copy_s = 0.0  # the trainer copying slots out
        self.helper: dict[str, Any] = {}
        self.batches: int | None = None  # batches by duration: batches handed out, padding, all-failed batches
        self.padding = PaddingMeter()
        self.empty_batches = 0
        self.done = False
        self.cancelled = False
        self.start = time.perf_counter()
        self.end: float | None = None

    def snapshot(self) -> DatasetStats:
        end = self.end if self.end is not None else time.perf_counter()
        buffer = self.helper.get("buffer")
        return DatasetStats(
            epoch=self.epoch, rank=self.rank, world_size=self.world_size, worker=0, num_workers=1, items=self.items,
            num_producers=self.helper.get("num_producers", self.num_producers), resumed=self.resumed,
            yielded=self.yielded, failed=self.failed,
            failures=list(self.failures), decode_s=self.decode_s, wall_s=end - self.start, done=self.done,
            buffer=BufferStats(**buffer) if buffer else None,
            transfer={"trainer_wait_s": self.wait_s, "trainer_copy_s": self.copy_s,
                      "helper_slot_wait_s": self.helper.get("slot_wait_s", 0.0)},
            batches=self.batches, empty_batches=self.empty_batches,
            padding=None if self.batches is None else self.padding.fraction,
            producer_history=self.helper.get("producer_history", []), gil_enabled=self.helper.get("gil_enabled", True))

    def on_failure(self, message: tuple[Any, ...], policy: ErrorPolicy) -> None:
        """A sample that failed in the helper: raise it (``fatal``: the policy is ``raise``) with the
        helper's traceback chained, or count it per ``policy``."""
        _, _, fatal, index, path, producer, type_name, text, payload, trace = message
        summary = f"item {index} ({path!r}) failed in {producer} (helper process): {type_name}: {text}"
        if fatal:
            cause: BaseException = RemoteTraceback(trace)
            if payload is not None:
                try:
                    original = pickle.loads(payload)
                    original.__cause__ = cause
                    cause = original
                except Exception:
                    pass
            cls = DecodeError if type_name == "DecodeError" or isinstance(cause, DecodeError) else SampleError
            raise cls(summary, path=path, index=index, producer=producer) from cause
        record_skip(self, index, path, f"{type_name}: {text}", summary, policy)
