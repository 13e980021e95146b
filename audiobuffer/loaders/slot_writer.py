"""The slots of a :class:`~audiobuffer.BatchSlotLoader` and the decoder that fills them.

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

NOTE [ Slots across epochs ]
============================
A slot is free, handed out (its batch may still be held), or busy: being filled, full on its way to
the buffer, or waiting in it. However an epoch ends (run out, loop left, an exception, ``close()``),
the producer pool's close aborts the buffer (dropping the full slots in it), calls
:meth:`SlotWriter.stop_waiting`, which wakes producers waiting for a slot, and joins them
(NOTE [ Producer shutdown protocol ] in ``_producers.py``, NOTE [ Delivering decoders ] in
``_outcomes.py``). The loader then returns every busy slot to the free list, so the next epoch starts
with all of them. Each epoch has a generation number: a producer that outlived the join (a decoder
stuck past ``JOIN_TIMEOUT``) carries the old one and gets no row in a later epoch, and a slot with a
row still being written at the end is forgotten, not reused.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..engine.outcomes import DELIVERED
from ..errors import BufferClosed, SampleError
from ..sources.source import WorkItem
from . import slot_rows as _slot_rows
from .slot_rows import Field, RowWriteFailed, layout

if TYPE_CHECKING:
    from .slots import SlotStats

__all__ = ["Slot", "SlotWriter", "storage_refs"]

_use_count: Callable[[Any], int] | None = getattr(torch._C, "_storage_Use_Count", None)


def storage_refs(tensor: torch.Tensor) -> int:
    """How many references the storage of ``tensor`` has (NOTE [ Slot reuse safety ])."""
    if _use_count is None:
        return 1 << 30  # unknown: treat as referenced
    return _use_count(tensor.untyped_storage()._cdata)


class Slot:
    """One batch: tensors ``(batch_size, *shape)``, their numpy views, lists, and fill counts."""

    def __init__(self, fields: list[Field], batch_size: int, pin: bool) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.arrays: dict[str, np.ndarray] = {}
        self.lists: dict[str, list[Any]] = {}
        for f in fields:
            if f.shape is None:
                self.lists[f.key] = [None] * batch_size
            else:
                tensor = torch.empty((batch_size, *f.shape), dtype=f.dtype, pin_memory=pin)
                self.tensors[f.key] = tensor
                self.arrays[f.key] = tensor.numpy()
        self.baseline = {k: storage_refs(t) for k, t in self.tensors.items()}
        self.claimed = 0
        self.written = 0

    def referenced(self) -> bool:
        return any(storage_refs(t) > self.baseline[k] for k, t in self.tensors.items())

    def batch(self, rows: int) -> dict[str, Any]:
        out: dict[str, Any] = {k: t[:rows] for k, t in self.tensors.items()}
        out.update((k, v[:rows]) for k, v in self.lists.items())
        return out


class SlotWriter:
    """The decoder the producers run: decode, convert, then write into a slot row.

    It delivers whole batches itself (NOTE [ Delivering decoders ] in ``_outcomes.py``): it returns
    the slot for the item that completes it and ``DELIVERED`` for the others. See also NOTE [ Slot
    reuse safety ], NOTE [ Slots across epochs ] and NOTE [ Slot rows ] (in ``_slot_rows.py``).
    """

    delivers_itself = True

    def __init__(self, decoder: Callable[[WorkItem], Any], transform: Callable[[Any], Any] | None,
                 batch_size: int, num_slots: int, pin: bool, stats: SlotStats) -> None:
        self.decoder = decoder
        self.transform = transform
        self.batch_size = batch_size
        self.num_slots = num_slots
        self.pin = pin
        self.stats = stats
        self.fields: list[Field] | None = None  # the samples' keys, set by the first sample
        self._columns: list[Field] = []  # the slot's: the fields and a derived "lengths"
        self._lengths_from: int | None = None  # "lengths" copies this field (num_frames) ...
        self._lengths_const: np.ndarray | None = None  # ... or is this constant (the audio's length)
        self._cond = threading.Condition(threading.Lock())
        self._slots: list[Slot] = []  # every slot owned: free, handed out or busy
        self._free: list[Slot] = []
        self._handed: deque[Slot] = deque()
        self._busy = 0  # slots being filled, full on their way to the consumer, or in the buffer
        self._filling: Slot | None = None
        self._closed = False
        self._generation = 0  # one per epoch: NOTE [ Slots across epochs ]

    # -- producer side -------------------------------------------------------------------------

    def __call__(self, item: WorkItem) -> Any:
        generation = self._generation
        sample = self.decoder(item)
        if self.transform is not None:
            sample = self.transform(sample)
        if not isinstance(sample, dict):
            raise SampleError(f"BatchSlotLoader needs dict samples, got {type(sample).__name__} from {item.path!r}",
                              path=item.path, index=item.index)
        with self._cond:
            if self.fields is None:
                self._set_layout(sample)
            fields, columns = self.fields, self._columns
            lengths_from, lengths_const = self._lengths_from, self._lengths_const
        values = _slot_rows.convert(sample, fields, item)  # type: ignore[arg-type]  # NOTE [ Slot rows ]: before the claim
        if lengths_from is not None:
            values.append(values[lengths_from])
        elif lengths_const is not None:
            values.append(lengths_const)
        with self._cond:
            slot = self._current_slot(generation)
            row = slot.claimed
            slot.claimed += 1
            if slot.claimed == self.batch_size:
                self._filling = None
        try:
            for f, value in zip(columns, values):
                if f.shape is None:
                    slot.lists[f.key][row] = value
                else:
                    slot.arrays[f.key][row] = value  # numpy copy: releases the GIL, wakes no torch thread pool
        except BaseException as exc:
            raise RowWriteFailed(f"writing item {item.index} ({item.path!r}) into its batch slot row failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
        with self._cond:
            slot.written += 1
            done = slot.written == self.batch_size
        return slot if done else DELIVERED

    def _set_layout(self, sample: dict[str, Any]) -> None:
        """The slot's columns, from the first sample (lock held); "lengths" as ``pad_collate`` makes it."""
        fields = layout(sample)
        columns = list(fields)
        keys = {f.key: i for i, f in enumerate(fields)}
        if "lengths" not in keys:
            frames = fields[keys["num_frames"]] if "num_frames" in keys else None
            audio = fields[keys["audio"]] if "audio" in keys else None
            if frames is not None and frames.shape == () and frames.np_dtype is not None \
                    and frames.np_dtype.kind in "iu":
                self._lengths_from = keys["num_frames"]
            elif audio is not None and audio.shape:
                self._lengths_const = np.asarray(audio.shape[-1], dtype=np.int64)
            if self._lengths_from is not None or self._lengths_const is not None:
                columns.append(Field("lengths", (), torch.int64))
        self._columns = columns
        self.fields = fields

    def _current_slot(self, generation: int) -> Slot:
        """The slot being filled (lock held), taking one if there is none: free, reclaimed, new, or new
        after retiring a held one. Re-checked after every wait: another producer may have taken one."""
        while self._filling is None:
            if self._closed or generation != self._generation:
                raise BufferClosed("the slot loader's epoch has ended")
            if not self._free:
                self._reclaim()
            if self._free:
                self.stats.reused += 1
                slot = self._free.pop()
            elif len(self._slots) < self.num_slots:
                self.stats.allocated += 1
                slot = Slot(self._columns, self.batch_size, self.pin)
                self._slots.append(slot)
            elif self._busy == 0 and self._handed:
                # Every slot is handed out and still held: the consumer cannot free one before it gets
                # a batch, which needs this producer's row. Give the oldest up to the caller.
                self._slots.remove(self._handed.popleft())
                self.stats.retired += 1
                continue
            else:
                self._cond.wait()  # a hand-out, a reclaim, the end of the epoch or close() wakes us
                continue
            slot.claimed = slot.written = 0
            self._busy += 1
            self._filling = slot
        if self._closed or generation != self._generation:
            raise BufferClosed("the slot loader's epoch has ended")
        return self._filling

    def _reclaim(self) -> None:
        """Move handed-out slots nothing references back to the free list (lock held)."""
        if not self._handed:
            return
        keep: deque[Slot] = deque()
        for slot in self._handed:
            (keep if slot.referenced() else self._free).append(slot)
        self._handed = keep

    # -- consumer side -------------------------------------------------------------------------

    def hand_out(self, slot: Slot, rows: int) -> dict[str, Any]:
        with self._cond:
            # The batch's views exist before a producer woken here can look for a free slot: made
            # after the lock, the slot would look unreferenced and could be refilled under them.
            batch = slot.batch(rows)
            self._busy -= 1
            self._handed.append(slot)
            self.stats.batches += 1
            self.stats.samples += rows
            self._cond.notify_all()
        return batch

    def reclaim(self) -> None:
        with self._cond:
            before = len(self._free)
            self._reclaim()
            if len(self._free) > before:
                self._cond.notify_all()

    def take_partial(self) -> Slot | None:
        """The slot left part-filled at the end of an epoch (its claimed rows are all written by then)."""
        with self._cond:
            slot, self._filling = self._filling, None
            return slot

    def begin_epoch(self) -> int:
        """Open the writer for a new epoch; returns the epoch's generation."""
        with self._cond:
            self._generation += 1
            self._closed = False
            return self._generation

    def stop_waiting(self) -> None:
        """Wake producers of the running epoch that wait for a slot: the pool is stopping.

        The pool calls it (NOTE [ Delivering decoders ] in ``_outcomes.py``) before joining its
        threads; :meth:`end_epoch` opens the next generation only after that join.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def end_epoch(self) -> None:
        """Every busy slot back to the free list, once the epoch's producers are joined.

        NOTE [ Slots across epochs ]: the full slots the buffer's abort dropped, the part-filled one
        and any on their way to the buffer are free again; a slot with a row still being written (by
        a producer that outlived the join) is forgotten rather than reused.
        """
        with self._cond:
            self._generation += 1
            self._closed = True
            kept = {id(s) for s in self._handed} | {id(s) for s in self._free}
            for slot in list(self._slots):
                if id(slot) in kept:
                    continue
                if slot.claimed == slot.written:
                    self._free.append(slot)
                else:
                    self._slots.remove(slot)
            self._busy = 0
            self._filling = None
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

