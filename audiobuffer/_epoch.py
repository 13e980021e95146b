"""One epoch of a :class:`~audiobuffer.BufferedDataset` as it runs: its counts, its stats, its error
policy, and the check that tells the main process its epochs ran in DataLoader workers."""

from __future__ import annotations

import logging
import multiprocessing
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.context import get_spawning_popen
from typing import Any, cast

import numpy as np

from ._options import ErrorPolicy, gil_enabled
from ._outcomes import Failure
from ._producers import ProducerPool
from .buffer import Buffer, BufferStats
from .errors import DecodeError, SampleError
from .sources import WorkItem

__all__ = ["MAX_LISTED_FAILURES", "Compose", "DatasetStats", "EpochRun", "WorkerEpochs", "record_skip"]

logger = logging.getLogger(__name__)

#: How many failed items :class:`DatasetStats` lists by name (all are counted).
MAX_LISTED_FAILURES = 100


@dataclass
class DatasetStats:
    """What one epoch of a :class:`BufferedDataset` did (one rank, one DataLoader worker).

    Attributes:
        epoch: the epoch number.
        rank: this process's rank; world_size: how many ranks share the epoch.
        worker: the DataLoader worker id (0 without workers); num_workers: how many workers share it.
        items: this shard's items in the epoch (those left to do, in a resumed epoch).
        num_producers: the producer threads decoding now (or at the end): the pinned count, or the
            count ``"auto"`` has settled on; 0 means the consumer decodes in its own thread.
        resumed: items already consumed before a resume (0 in a fresh epoch).
        yielded: samples handed to the consumer.
        failed: items whose decoder or transform raised (skipped with "warn" or "skip").
        failures: ``(index, path, message)`` of the first 100 failed items.
        decode_s: seconds the producers spent decoding, summed over producers.
        wall_s: seconds from the epoch's start to its end (or to now, while it runs).
        done: whether the epoch ran to its end.
        buffer: the buffer's counters (waits on both sides, fill).
        transfer: an :class:`~audiobuffer.IsolatedLoader`'s hand-over between its processes: seconds the
            trainer waited for a batch (``trainer_wait_s``) and copied slots out (``trainer_copy_s``), and
            seconds the helper waited for a free slot (``helper_slot_wait_s``); ``None`` in process.
        producer_history: the producer count over time, as ``(seconds since the epoch started, count,
            reason)``: each decision of ``num_producers="auto"`` (the first is the start), or one
            ``"pinned"`` entry.
        gil_enabled: whether the GIL was enabled (``sys._is_gil_enabled()``; always before 3.13).
    """

    epoch: int
    rank: int
    world_size: int
    worker: int
    num_workers: int
    items: int
    num_producers: int
    resumed: int = 0
    yielded: int = 0
    failed: int = 0
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    decode_s: float = 0.0
    wall_s: float = 0.0
    done: bool = False
    buffer: BufferStats | None = None
    transfer: dict[str, float] | None = None
    producer_history: list[tuple[float, int, str]] = field(default_factory=list)
    gil_enabled: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The stats as plain builtins."""
        return asdict(self)


class EpochRun:
    """One running (or finished) epoch: its pool and buffer, and the consumer's counts."""

    def __init__(self, number: int, rank: int, world_size: int, worker: int, num_workers: int,
                 pool: ProducerPool, buffer: Buffer[Any], consumed: bytearray,
                 positions: np.ndarray | None) -> None:
        self.number = number
        #: One byte per position of this shard's epoch order: 1 once yielded or failed.
        self.consumed = consumed
        #: The shard positions the pool's sequence numbers stand for (a resumed epoch skips some).
        self.positions = positions
        self.rank = rank
        self.world_size = world_size
        self.worker = worker
        self.num_workers = num_workers
        self.pool = pool
        self.buffer = buffer
        self.items = pool.count
        self.resumed = len(consumed) - pool.count  # consumed before a load_state_dict
        self.yielded = 0
        self.failed = 0
        self.failures: list[tuple[int, str, str]] = []
        self.done = False
        self.start = time.perf_counter()
        self.end: float | None = None

    def snapshot(self) -> DatasetStats:
        """The epoch's stats now."""
        end = self.end if self.end is not None else time.perf_counter()
        return DatasetStats(
            epoch=self.number, rank=self.rank, world_size=self.world_size, worker=self.worker,
            num_workers=self.num_workers, items=self.items, resumed=self.resumed, num_producers=self.pool.num_producers,
            yielded=self.yielded, failed=self.failed, failures=list(self.failures),
            decode_s=self.pool.decode_seconds, wall_s=end - self.start, done=self.done,
            buffer=self.buffer.stats, producer_history=self.pool.history, gil_enabled=gil_enabled())

    def fail(self, failure: Failure, policy: ErrorPolicy) -> None:
        """Apply the error policy to a failed item: raise it, or count (and log) it and go on."""
        item, exc = cast(WorkItem, failure.item), failure.exc  # a producer's Failure always has its item
        message = (f"item {item.index} ({item.path!r}) failed in {failure.producer}: "
                   f"{type(exc).__name__}: {exc}")
        if policy == "raise":
            cls = DecodeError if isinstance(exc, DecodeError) else SampleError
            raise cls(message, path=item.path, index=item.index, producer=failure.producer) from exc
        record_skip(self, item.index, item.path, f"{type(exc).__name__}: {exc}", message, policy)


class WorkerEpochs:
    """Counts epochs started in DataLoader worker processes, so the main process can tell that its own
    ``stats()`` and ``state_dict()`` do not describe them, and warn once.

    The count lives in shared memory that workers inherit (fork) or receive as they are spawned. A
    ``RawValue`` (no lock): a lock would be a semaphore, with a resource tracker process under spawn;
    two workers adding one at once still leave the count different from what the main process saw.
    """

    def __init__(self) -> None:
        self._count: Any = multiprocessing.RawValue("q", 0)
        self._seen = 0  # the count when this process last started an epoch
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        # Shared memory travels only to a process being started (a spawned DataLoader worker); any other
        # copy (pickle.dumps, deepcopy) gets a counter of its own.
        return {"count": self._count if get_spawning_popen() is not None else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._count = state["count"] if state["count"] is not None else multiprocessing.RawValue("q", 0)
        self._seen = 0
        self._warned = False

    def started(self, in_worker: bool) -> None:
        """An epoch starts here: in a DataLoader worker, or in this (main) process."""
        if in_worker:
            self._count.value += 1
        else:
            self._seen = self._count.value

    def warn_if_elsewhere(self, method: str) -> None:
        """Warn (once) when epochs ran in DataLoader workers since this process last started one."""
        if self._warned or self._count.value == self._seen:
            return
        self._warned = True
        warnings.warn(
            f"BufferedDataset.{method} in the main process: this dataset's epochs ran in DataLoader "
            f"worker processes (num_workers > 0), which keep their stats and progress; here stats() "
            f"is None (or an older epoch) and state_dict() marks the start of the epoch. Use "
            f"DataLoader(num_workers=0): the producer threads already decode in parallel.",
            UserWarning, stacklevel=4)


class Compose:
    """``transform(decoder(item))``, picklable when both are."""

    def __init__(self, decoder: Callable[[WorkItem], Any], transform: Callable[[Any], Any]) -> None:
        self.decoder = decoder
        self.transform = transform

    def __call__(self, item: WorkItem) -> Any:
        return self.transform(self.decoder(item))


def record_skip(run: Any, index: int, path: str, reason: str, summary: str, policy: ErrorPolicy) -> None:
    """Count a failed item that the policy skips (``warn``: log ``summary`` too) in ``run``'s
    ``failed`` and ``failures``; shared by in-process epochs and the isolated loader's trainer side."""
    run.failed += 1
    if len(run.failures) < MAX_LISTED_FAILURES:
        run.failures.append((index, path, reason))
    if policy == "warn":
        logger.warning("skipping %s", summary)
