"""What one epoch of a loader did: :class:`DatasetStats`, the counts and timings a loader's ``stats()``
returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..buffer import BufferStats

__all__ = ["MAX_LISTED_FAILURES", "DatasetStats", "PaddingMeter"]

#: How many failed items :class:`DatasetStats` lists by name (all are counted).
MAX_LISTED_FAILURES = 100


@dataclass
class DatasetStats:
    """What one epoch of a :class:`BufferedDataset` did (one rank, one DataLoader worker).

    Attributes:
        epoch: the epoch number.
        rank: this process's rank; world_size: how many ranks share the epoch.
        worker: the DataLoader worker id (0 without workers); num_workers: how many workers share it.
        items: this shard's items in the epoch (those left to do, in a resumed epoch); of streamed tar
            shards, the samples read so far (yielded, failed, or waiting for their batch), since a shard's
            count is known only once it has streamed: final when ``done``.
        shards: of streamed tar shards, the shards this epoch streams (those left to do, in a resumed
            epoch); ``None`` for other sources.
        num_producers: the producer threads decoding now (or at the end): the pinned count, or the
            count ``"auto"`` has settled on; 0 means the consumer decodes in its own thread.
        resumed: items already consumed before a resume (0 in a fresh epoch); of streamed tar shards,
            the shards (resume is at shard boundaries).
        yielded: samples handed to the consumer.
        failed: items whose decoder or transform raised (skipped with "warn" or "skip").
        failures: ``(index, path, message)`` of the first 100 failed items.
        decode_s: seconds the producers spent decoding, summed over producers, without ``read_s``.
        inline_s: of ``decode_s`` (and ``read_s``), the seconds the consumer decoded in its own thread
            (``num_producers="auto"`` at 0): time the consumer spent on its input, as a wait would be.
        read_s: seconds the producers spent waiting for bytes (shard members, remote objects, streamed
            shards), summed over producers: I/O, not decoding.
        augment_s: of ``decode_s``, the seconds the decoder's augmentations ran (``AudioDecoder(augment=
            ...)``), summed over producers (a decoder shared by two loaders at once counts both).
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
        batches: with ``max_batch_seconds``, the batches handed out (``None`` without).
        empty_batches: batches whose samples all failed (skipped).
        padding: with ``max_batch_seconds``, the padding of the batches handed out: padded seconds /
            seconds in batches, each batch padded to its longest item, from each sample's ``num_frames``
            of real audio where samples carry it (a crop's zero padding counts as padding), else from
            the durations (``None`` without ``max_batch_seconds``).
        sources: of a mixture (``audiobuffer.mix``), this shard's draws of the epoch from each source, by
            name (those left to do, in a resumed epoch; failures included); ``None`` for other sources.

    With ``max_batch_seconds``, ``items``, ``failed`` and ``failures`` also count the items whose header
    could not be read (in rank 0's first DataLoader worker, every epoch: those items are in no batch).
    Once an epoch is done, ``yielded + failed == items`` for every source.
    """

    epoch: int
    rank: int
    world_size: int
    worker: int
    num_workers: int
    items: int
    num_producers: int
    shards: int | None = None
    resumed: int = 0
    yielded: int = 0
    failed: int = 0
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    decode_s: float = 0.0
    inline_s: float = 0.0
    read_s: float = 0.0
    augment_s: float = 0.0
    wall_s: float = 0.0
    done: bool = False
    buffer: BufferStats | None = None
    transfer: dict[str, float] | None = None
    batches: int | None = None
    empty_batches: int = 0
    padding: float | None = None
    sources: dict[str, int] | None = None
    producer_history: list[tuple[float, int, str]] = field(default_factory=list)
    gil_enabled: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The stats as plain builtins."""
        return asdict(self)


class PaddingMeter:
    """The padding of the batches handed out: padded seconds / seconds in batches, each batch padded to
    its longest item, and each item's own padding (a sample padded to a crop) counted too.

    A batch is measured from its samples where they say what they hold (an ``AudioDecoder`` sample's
    ``num_frames`` of real audio against the batch's longest ``audio``, whatever the crop and pad), else
    estimated from the items' durations.
    """

    def __init__(self) -> None:
        self.padded = 0.0
        self.real = 0.0

    def add(self, seconds: np.ndarray, content: np.ndarray | None = None) -> None:
        """Count one batch, given its items' lengths and the seconds of audio in them (``seconds``
        when ``None``)."""
        if len(seconds):
            self.padded += len(seconds) * float(seconds.max())
            self.real += float((seconds if content is None else content).sum())

    def add_samples(self, samples: Sequence[Any]) -> bool:
        """Count one batch from its samples (dicts with ``audio``, ``num_frames`` and ``sample_rate``): each
        padded to the longest ``audio``. ``False``, counting nothing, where a sample lacks them."""
        try:
            frames = np.array([s["audio"].shape[-1] for s in samples], dtype=np.float64)
            real = np.array([s["num_frames"] for s in samples], dtype=np.float64)
            rates = np.array([s["sample_rate"] for s in samples], dtype=np.float64)
        except (TypeError, KeyError, AttributeError, IndexError, ValueError):
            return False
        if np.any(real > frames):  # a transform changed the audio (features): not frames of it
            return False
        return self._add_frames(real, float(frames.max(initial=0.0)), rates)

    def add_collated(self, batch: Any) -> bool:
        """Count one collated batch (``pad_collate``'s: ``audio`` ``(B, [C,] T)``, ``lengths`` and
        ``sample_rate``); ``False``, counting nothing, where it lacks them."""
        try:
            width = float(batch["audio"].shape[-1])
            real, rates = _numbers(batch["lengths"]), _numbers(batch["sample_rate"])
        except (TypeError, KeyError, AttributeError, IndexError, ValueError):
            return False
        return self._add_frames(real, width, rates)

    def _add_frames(self, real: np.ndarray, width: float, rates: np.ndarray) -> bool:
        if real.ndim != 1 or rates.shape not in (real.shape, ()) or not np.all(rates > 0) or np.any(real > width):
            return False
        self.padded += float((width / np.broadcast_to(rates, real.shape)).sum())
        self.real += float((real / rates).sum())
        return True

    @property
    def fraction(self) -> float:
        return (self.padded - self.real) / self.padded if self.padded > 0 else 0.0


def _numbers(value: Any) -> np.ndarray:
    """A tensor (on any device), an array or a number as a float64 array."""
    if hasattr(value, "cpu"):
        value = value.cpu()
    return np.asarray(value, dtype=np.float64)
