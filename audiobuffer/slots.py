"""Recycled batch slots: producers write samples straight into rows of preallocated (pinned) batches.

caffe's ``prefetch_free`` / ``prefetch_full`` pair, made safe for Python callers. For fixed-shape
samples (audio cropped and padded to one length, images resized), a slot is a set of batch tensors
``(batch_size, *shape)``, allocated once, in pinned memory when CUDA is available. A producer that has
decoded a sample claims the next row of the slot being filled and copies the sample into it; the
producer that writes a slot's last row hands the slot to the consumer. There is no per-batch
allocation, no collate copy and no pinning copy: one copy from the decoder's array into the row.

NOTE [ Slot reuse safety ]
==========================
A slot handed to the caller is reused only when nothing outside the loader references its memory.
Every slot tensor's storage use count is compared with the count taken when the slot was made: any
view the caller still holds (the batch, a slice of it, a numpy view) keeps it above. The check runs
when the consumer asks for the next batch (so the batch of the previous loop step is free by the
time the one before it is reused) and when a producer needs a slot. Copies to the device are covered
by ``DevicePrefetcher``, which keeps the host batch until its copy has finished.

If producers need a slot and every slot is either handed out and still referenced, a producer retires
the oldest one (the caller keeps that memory; the loader forgets it) and allocates a new slot. A
caller who holds every batch (``list(loader)``) thus costs allocations, never a hang or an overwrite.
Producers wait for a slot only while others are being written or wait in the buffer for the
consumer, whose next hand-out wakes them. ``torch._C._storage_Use_Count`` is a private torch API: if a
torch release drops it, every handed-out slot counts as referenced, which is always safe.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ._producers import NO_OUTPUT
from .dataset import BufferedDataset, DatasetStats, ErrorPolicy, EvenShards
from .errors import BufferClosed, SampleError
from .sources import AUDIO_PATTERNS, LabelSpec, Source, SourceSpec, WorkItem

__all__ = ["BatchSlotLoader", "SlotStats"]

_use_count: Optional[Callable[[Any], int]] = getattr(torch._C, "_storage_Use_Count", None)


def _storage_refs(tensor: torch.Tensor) -> int:
    if _use_count is None:
        return 1 << 30  # unknown: treat as referenced (see NOTE [ Slot reuse safety ])
    return _use_count(tensor.untyped_storage()._cdata)


class _Field:
    """How one sample key is stored in a slot: a tensor row, or a list entry."""

    __slots__ = ("key", "shape", "dtype")

    def __init__(self, key: str, shape: Optional[Tuple[int, ...]], dtype: Optional[torch.dtype]) -> None:
        self.key = key
        self.shape = shape  # None: kept in a list
        self.dtype = dtype


def _layout(sample: Dict[str, Any]) -> List[_Field]:
    fields = []
    for key, value in sample.items():
        if isinstance(value, torch.Tensor):
            fields.append(_Field(key, tuple(value.shape), value.dtype))
        elif isinstance(value, np.ndarray) and value.dtype != object:
            fields.append(_Field(key, value.shape, torch.from_numpy(value[:0].copy()).dtype))
        elif isinstance(value, bool):
            fields.append(_Field(key, (), torch.bool))
        elif isinstance(value, (int, np.integer)):
            fields.append(_Field(key, (), torch.int64))
        elif isinstance(value, (float, np.floating)):
            fields.append(_Field(key, (), torch.float64))
        else:
            fields.append(_Field(key, None, None))
    return fields


class _Slot:
    """One batch: tensors ``(batch_size, *shape)``, their numpy views, lists, and fill counts."""

    def __init__(self, fields: List[_Field], batch_size: int, pin: bool) -> None:
        self.tensors: Dict[str, torch.Tensor] = {}
        self.arrays: Dict[str, np.ndarray] = {}
        self.lists: Dict[str, List[Any]] = {}
        for f in fields:
            if f.shape is None:
                self.lists[f.key] = [None] * batch_size
            else:
                tensor = torch.empty((batch_size, *f.shape), dtype=f.dtype, pin_memory=pin)
                self.tensors[f.key] = tensor
                self.arrays[f.key] = tensor.numpy()
        self.baseline = {k: _storage_refs(t) for k, t in self.tensors.items()}
        self.claimed = 0
        self.written = 0

    def referenced(self) -> bool:
        return any(_storage_refs(t) > self.baseline[k] for k, t in self.tensors.items())

    def batch(self, rows: int) -> Dict[str, Any]:
        out: Dict[str, Any] = {k: t[:rows] for k, t in self.tensors.items()}
        out.update((k, v[:rows]) for k, v in self.lists.items())
        return out


class SlotStats:
    """Counters of a :class:`BatchSlotLoader`.

    Attributes:
        allocated: slots made (each ``num_slots`` or fewer at a time).
        reused: times a handed-out slot came back to be filled again.
        retired: slots given up to a caller that kept their batch while producers needed room.
        batches: batches handed out.
        samples: samples in them.
    """

    def __init__(self) -> None:
        self.allocated = 0
        self.reused = 0
        self.retired = 0
        self.batches = 0
        self.samples = 0

    def as_dict(self) -> Dict[str, int]:
        return dict(allocated=self.allocated, reused=self.reused, retired=self.retired, batches=self.batches,
                    samples=self.samples)

    def __repr__(self) -> str:
        return f"SlotStats({', '.join(f'{k}={v}' for k, v in self.as_dict().items())})"


class _SlotWriter:
    """The decoder the producers run: decode, then write into a slot row (NOTE [ Slot reuse safety ])."""

    def __init__(self, decoder: Callable[[WorkItem], Any], transform: Optional[Callable[[Any], Any]],
                 batch_size: int, num_slots: int, pin: bool, stats: SlotStats) -> None:
        self.decoder = decoder
        self.transform = transform
        self.batch_size = batch_size
        self.num_slots = num_slots
        self.pin = pin
        self.stats = stats
        self.fields: Optional[List[_Field]] = None
        self._cond = threading.Condition(threading.Lock())
        self._free: List[_Slot] = []
        self._handed: deque[_Slot] = deque()
        self._owned = 0
        self._busy = 0  # slots being written or waiting in the buffer for the consumer
        self._filling: Optional[_Slot] = None
        self._closed = False

    # -- producer side -------------------------------------------------------------------------

    def __call__(self, item: WorkItem) -> Any:
        sample = self.decoder(item)
        if self.transform is not None:
            sample = self.transform(sample)
        if not isinstance(sample, dict):
            raise SampleError(f"BatchSlotLoader needs dict samples, got {type(sample).__name__}")
        with self._cond:
            if self.fields is None:
                self.fields = _layout(sample)
            fields = self.fields
        values = self._check(sample, fields, item)  # before a row is claimed: a bad sample leaves no hole
        with self._cond:
            slot = self._current_slot()
            row = slot.claimed
            slot.claimed += 1
            if slot.claimed == self.batch_size:
                self._filling = None
        for f, value in zip(fields, values):
            if f.shape is None:
                slot.lists[f.key][row] = value
            else:
                slot.arrays[f.key][row] = value  # numpy copy: releases the GIL, wakes no torch thread pool
        with self._cond:
            slot.written += 1
            done = slot.written == self.batch_size
        return slot if done else NO_OUTPUT

    def _check(self, sample: Dict[str, Any], fields: List[_Field], item: WorkItem) -> List[Any]:
        if len(sample) != len(fields) or any(f.key not in sample for f in fields):
            raise SampleError(f"sample keys {sorted(sample)} differ from the batch slot's {sorted(f.key for f in fields)}")
        values = []
        for f in fields:
            value = sample[f.key]
            if f.shape is not None:
                if isinstance(value, torch.Tensor):
                    value = value.detach().cpu().numpy()
                shape = tuple(np.shape(value))
                if shape != f.shape:
                    raise SampleError(
                        f"{f.key!r} has shape {shape}, the batch slot {f.shape}: BatchSlotLoader needs fixed-shape "
                        f"samples (crop_seconds with pad=True for audio, a size for images)")
            values.append(value)
        return values

    def _current_slot(self) -> _Slot:
        """The slot being filled (lock held), taking one if there is none: free, reclaimed, new, or new
        after retiring a held one. Re-checked after every wait: another producer may have taken one."""
        while self._filling is None:
            if self._closed:
                raise BufferClosed("the slot loader was closed")
            if not self._free:
                self._reclaim()
            if self._free:
                self.stats.reused += 1
                slot = self._free.pop()
            elif self._owned < self.num_slots:
                self._owned += 1
                self.stats.allocated += 1
                slot = _Slot(self.fields, self.batch_size, self.pin)  # type: ignore[arg-type]
            elif self._busy == 0 and self._handed:
                # Every slot is handed out and still held: the consumer cannot free one before it gets
                # a batch, which needs this producer's row. Give the oldest up to the caller.
                self._handed.popleft()
                self._owned -= 1
                self.stats.retired += 1
                continue
            else:
                self._cond.wait()  # a hand-out or close() wakes us
                continue
            slot.claimed = slot.written = 0
            self._busy += 1
            self._filling = slot
        if self._closed:
            raise BufferClosed("the slot loader was closed")
        return self._filling

    def _reclaim(self) -> None:
        """Move handed-out slots nothing references back to the free list (lock held)."""
        if not self._handed:
            return
        keep: deque[_Slot] = deque()
        for slot in self._handed:
            (keep if slot.referenced() else self._free).append(slot)
        self._handed = keep

    # -- consumer side -------------------------------------------------------------------------

    def hand_out(self, slot: _Slot, rows: int) -> Dict[str, Any]:
        with self._cond:
            self._busy -= 1
            self._handed.append(slot)
            self.stats.batches += 1
            self.stats.samples += rows
            self._cond.notify_all()
        return slot.batch(rows)

    def reclaim(self) -> None:
        with self._cond:
            before = len(self._free)
            self._reclaim()
            if len(self._free) > before:
                self._cond.notify_all()

    def take_partial(self) -> Optional[_Slot]:
        """The slot left part-filled at the end of an epoch (its claimed rows are all written by then)."""
        with self._cond:
            slot, self._filling = self._filling, None
            return slot

    def discard_partial(self) -> None:
        """Put the part-filled slot, if any, back on the free list."""
        with self._cond:
            slot, self._filling = self._filling, None
            if slot is not None:
                self._busy -= 1
                self._free.append(slot)

    def open(self) -> None:
        with self._cond:
            self._closed = False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class BatchSlotLoader:
    """Batches of fixed-shape samples, written by producer threads straight into recycled slots.

    Takes the place of ``BufferedDataset`` + ``DataLoader(collate_fn=..., pin_memory=True)`` when every
    sample has the same shape: each producer copies its decoded sample into a row of a preallocated,
    pinned batch, so there is no collate copy, no pinning copy and no per-batch allocation. Batches
    are dicts of ``(B, ...)`` tensors (tensors and numbers in the samples) and lists (everything else);
    their rows come in the order producers finish. Batches may be kept as long as you like: a slot
    still referenced is never refilled (see NOTE [ Slot reuse safety ] in ``audiobuffer/slots.py``).
    Put a :class:`~audiobuffer.DevicePrefetcher` on top to copy batches to the GPU.

    Thread safety: one thread iterates; :meth:`close` may be called from any thread.

    Example:
        >>> loader = BatchSlotLoader("data/fsdd/recordings", AudioDecoder(8000, crop_seconds=1.0),
        ...                          batch_size=32, labels=r"^(\\d+)_")  # doctest: +SKIP
        >>> for batch in DevicePrefetcher(loader, "cuda"):  # doctest: +SKIP
        ...     batch["audio"]  # (32, 8000) on the GPU, copied from a recycled pinned slot

    Args:
        source, decoder: as for :class:`~audiobuffer.BufferedDataset`.
        batch_size: rows per batch.
        num_slots: slots owned at a time (at least 2; more lets producers run further ahead).
        drop_last: drop the last, short batch of an epoch.
        pin_memory: ``"auto"`` pins when CUDA is available.
        Other arguments: as for :class:`~audiobuffer.BufferedDataset` (samples are always unordered).
    """

    def __init__(self, source: Union[SourceSpec, Source], decoder: Callable[[WorkItem], Any], *, batch_size: int,
                 num_slots: int = 4, drop_last: bool = False, pin_memory: Union[bool, str] = "auto",
                 num_producers: Optional[int] = None, shuffle: bool = False, seed: int = 0,
                 on_error: ErrorPolicy = "raise", transform: Optional[Callable[[Any], Any]] = None,
                 labels: LabelSpec = None, patterns: Sequence[str] = AUDIO_PATTERNS, path_column: str = "path",
                 rank: Optional[int] = None, world_size: Optional[int] = None, even_shards: EvenShards = "pad",
                 warn_after: Optional[float] = None, timeout: Optional[float] = None) -> None:
        for name, value, least in (("batch_size", batch_size, 1), ("num_slots", num_slots, 2)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if pin_memory not in ("auto", True, False):
            raise ValueError(f"pin_memory must be 'auto', True or False, got {pin_memory!r}")
        if not callable(decoder):
            raise TypeError(f"decoder must be callable (WorkItem -> sample), got {decoder!r}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be None or callable, got {transform!r}")
        pin = torch.cuda.is_available() if pin_memory == "auto" else bool(pin_memory)
        self.batch_size = batch_size
        self.num_slots = num_slots
        self.drop_last = bool(drop_last)
        self.pin_memory = pin
        self.slot_stats = SlotStats()
        self._writer = _SlotWriter(decoder, transform, batch_size, num_slots, pin, self.slot_stats)
        # The slots cover the buffer: producers never hold more complete slots than there are.
        self.dataset = BufferedDataset(
            source, self._writer, num_producers=num_producers, buffer_size=num_slots, shuffle=shuffle, seed=seed,
            ordered=False, on_error=on_error, labels=labels, patterns=patterns, path_column=path_column, rank=rank,
            world_size=world_size, even_shards=even_shards, warn_after=warn_after, timeout=timeout)
        # The writer waits for free slots, which only the consumer releases: a producer must hand
        # each full slot over at once (NOTE [ Producer shutdown protocol ], Chunks).
        self.dataset._chunk_items = 1

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def classes(self) -> List[str]:
        return self.dataset.classes

    def set_epoch(self, epoch: int) -> None:
        """As :meth:`BufferedDataset.set_epoch`."""
        self.dataset.set_epoch(epoch)

    def stats(self) -> Optional[DatasetStats]:
        """The epoch's stats (its ``yielded`` counts full slots; :attr:`slot_stats` counts samples)."""
        return self.dataset.stats()

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        writer = self._writer
        writer.open()
        epoch = iter(self.dataset)
        try:
            for slot in epoch:
                yield writer.hand_out(slot, self.batch_size)
                writer.reclaim()  # the caller is back: the batch before the one it holds is free now
            if self.dataset.stats().done and not self.drop_last:
                partial = writer.take_partial()
                if partial is not None:
                    yield writer.hand_out(partial, partial.claimed)
        finally:
            writer.close()  # wakes producers waiting for a slot
            epoch.close()
            writer.discard_partial()

    def close(self) -> None:
        """Stop a running epoch's producers. Idempotent, any thread."""
        self._writer.close()
        self.dataset.close()

    def __enter__(self) -> "BatchSlotLoader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
