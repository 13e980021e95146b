"""Recycled batch slots: producers write samples straight into rows of preallocated (pinned) batches.

caffe's ``prefetch_free`` / ``prefetch_full`` pair, made safe for Python callers. For fixed-shape
samples (audio cropped and padded to one length, images resized), a slot is a set of batch tensors
``(batch_size, *shape)``, allocated once, in pinned memory when CUDA is available. A producer that has
decoded a sample claims the next row of the slot being filled and copies the sample into it; the
producer that writes a slot's last row hands the slot to the consumer. There is no per-batch
allocation, no collate copy and no pinning copy: one copy from the decoder's array into the row.

The slots and the decoder that fills them live in ``_slot_writer.py`` (NOTE [ Slot reuse safety ],
NOTE [ Slots across epochs ]); how a sample is checked and converted to a row, in ``_slot_rows.py``
(NOTE [ Slot rows ]).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch

from .._checks import check_choice, check_decoder, check_int
from ..sources.source import Source, SourceSpec, WorkItem
from .dataset import BufferedDataset, DatasetStats
from .slot_writer import SlotWriter

__all__ = ["BatchSlotLoader", "SlotStats"]


class SlotStats:
    """Counters of a :class:`BatchSlotLoader`, over all its epochs.

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

    def as_dict(self) -> dict[str, int]:
        return dict(allocated=self.allocated, reused=self.reused, retired=self.retired, batches=self.batches,
                    samples=self.samples)

    def __repr__(self) -> str:
        return f"SlotStats({', '.join(f'{k}={v}' for k, v in self.as_dict().items())})"


class BatchSlotLoader:
    """Batches of fixed-shape samples, written by producer threads straight into recycled slots.

    Takes the place of ``BufferedDataset`` + ``DataLoader(collate_fn=pad_collate, pin_memory=True)``
    when every sample has the same shape: each producer copies its decoded sample into a row of a
    preallocated, pinned batch, so there is no collate copy, no pinning copy and no per-batch
    allocation. Batches are dicts of ``(B, ...)`` tensors (tensors and numbers in the samples) and
    lists (everything else), with the keys ``pad_collate`` gives: ``lengths`` is each sample's
    ``num_frames`` when samples carry it, else the length of ``audio``'s last axis. The first sample
    sets each key's dtype and shape; a later sample that does not fit (another shape, ``None`` or a
    float in an integer column, a bool in a number column) fails as that item, under ``on_error``.
    Rows come in the order producers finish. Batches may be kept as long as you like: a slot still
    referenced is never refilled (see NOTE [ Slot reuse safety ] in ``audiobuffer/_slot_writer.py``). Put a
    :class:`~audiobuffer.DevicePrefetcher` on top to copy batches to the GPU.

    Leaving the loop early, an exception or :meth:`close` stop the producers and free every slot
    that is not handed out, so the next epoch runs in full.

    Thread safety: one thread iterates, one epoch at a time; :meth:`close` and :meth:`stats` may be
    called from any thread.

    Example:
        >>> loader = BatchSlotLoader("data/fsdd/recordings", AudioDecoder(8000, crop_seconds=1.0),
        ...                          batch_size=32, labels=r"^(\\d+)_")  # doctest: +SKIP
        >>> for batch in DevicePrefetcher(loader, "cuda"):  # doctest: +SKIP
        ...     batch["audio"], batch["lengths"]  # (32, 8000) and (32,) on the GPU, from a recycled pinned slot

    Args:
        source, decoder: as for :class:`~audiobuffer.BufferedDataset`.
        batch_size: rows per batch.
        num_slots: slots owned at a time (at least 2; more lets producers run further ahead).
        drop_last: drop the last, short batch of an epoch.
        pin_memory: ``"auto"`` pins when CUDA is available.
        transform: applied to each sample before it is written into its row.
        Other keywords: as for :class:`~audiobuffer.BufferedDataset` (``num_producers``, ``shuffle``,
            ``seed``, ``on_error``, ``labels``, ...), but not ``buffer_size`` (``num_slots`` sizes the
            buffer) or ``ordered`` (rows come as producers finish).
    """

    def __init__(self, source: SourceSpec | Source, decoder: Callable[[WorkItem], Any], *, batch_size: int,
                 num_slots: int = 4, drop_last: bool = False, pin_memory: bool | str = "auto",
                 transform: Callable[[Any], Any] | None = None, **options: Any) -> None:
        check_int("batch_size", batch_size, 1)
        check_int("num_slots", num_slots, 2)
        check_choice("pin_memory", pin_memory, Literal["auto", True, False])
        check_decoder(decoder)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be None or callable, got {transform!r}")
        for name, why in (("buffer_size", "num_slots sizes it"), ("ordered", "rows come as producers finish")):
            if name in options:
                raise TypeError(f"BatchSlotLoader takes no {name}: {why}")
        pin = torch.cuda.is_available() if pin_memory == "auto" else bool(pin_memory)
        self.batch_size = batch_size
        self.num_slots = num_slots
        self.drop_last = bool(drop_last)
        self.pin_memory = pin
        self.slot_stats = SlotStats()
        self._writer = SlotWriter(decoder, transform, batch_size, num_slots, pin, self.slot_stats)
        # The slots cover the buffer: producers never hold more complete slots than there are.
        # The writer delivers whole batches itself (NOTE [ Delivering decoders ] in _outcomes.py).
        self.dataset = BufferedDataset(source, self._writer, buffer_size=num_slots, **options)
        self._lock = threading.Lock()
        self._running = False
        self._rows = 0  # samples handed out in the current (or last) epoch

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __repr__(self) -> str:
        ds = self.dataset
        return (f"BatchSlotLoader({ds.source.description}, {self._writer.decoder!r}, items={len(ds.source)}, "
                f"batch_size={self.batch_size}, num_slots={self.num_slots}, drop_last={self.drop_last}, "
                f"pin_memory={self.pin_memory}, num_producers={ds.num_producers!r}, shuffle={ds.shuffle}, "
                f"on_error={ds.on_error!r})")

    @property
    def classes(self) -> list[str]:
        return self.dataset.classes

    def set_epoch(self, epoch: int) -> None:
        """As :meth:`BufferedDataset.set_epoch`."""
        self.dataset.set_epoch(epoch)

    def stats(self) -> DatasetStats | None:
        """The current or last epoch's stats, as :meth:`BufferedDataset.stats` gives them.

        ``yielded`` counts samples (rows handed out) and ``failed`` the items that failed, so at the
        end of an epoch ``yielded + failed == items``, less the rows of a short last batch that
        ``drop_last`` dropped. ``buffer`` counts batches; :attr:`slot_stats` counts batches and slots
        over all epochs.
        """
        stats = self.dataset.stats()
        return None if stats is None else dataclasses.replace(stats, yielded=self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            if self._running:
                raise RuntimeError("this BatchSlotLoader is already running an epoch (an iterator neither exhausted "
                                   "nor closed); finish or close that loop before starting another")
            self._running = True
        try:
            writer = self._writer
            writer.begin_epoch()
            self._rows = 0
            epoch = iter(self.dataset)
            try:
                for slot in epoch:
                    self._rows += self.batch_size
                    yield writer.hand_out(slot, self.batch_size)
                    writer.reclaim()  # the caller is back: the batch before the one it holds is free now
                if self.dataset.stats().done and not self.drop_last:  # type: ignore[union-attr]
                    partial = writer.take_partial()
                    if partial is not None:
                        self._rows += partial.claimed
                        yield writer.hand_out(partial, partial.claimed)
            finally:
                # The pool aborts its buffer, wakes producers waiting for a slot (it calls
                # writer.stop_waiting) and joins them; then every slot not handed out is free again.
                epoch.close()
                writer.end_epoch()
        finally:
            with self._lock:
                self._running = False

    def close(self) -> None:
        """Stop a running epoch's producers. Idempotent, any thread."""
        self.dataset.close()
        self._writer.close()

    def __enter__(self) -> BatchSlotLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
