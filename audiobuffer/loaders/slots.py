"""Recycled batch slots: producers write samples straight into rows of preallocated (pinned) batches.

caffe's ``prefetch_free`` / ``prefetch_full`` pair, made safe for Python callers: :class:`BatchSlotLoader`,
its slots (:class:`SlotWriter`), the pool's port that fills them (:class:`SlotPort`), and how a
sample becomes a row.

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
the producer pool's close aborts the buffer (dropping the full slots in it), calls its port's
``stop``, :meth:`SlotWriter.stop_waiting`, which wakes producers waiting for a slot, and joins them
(NOTE [ Producer shutdown protocol ] and NOTE [ Output port ] in ``engine/pool.py``). The loader
then returns every busy slot to the free list, so the next epoch starts with all of them. Each
epoch has a generation number, which its port carries: a producer that outlived the join (a decoder
stuck past ``JOIN_TIMEOUT``) writes through the old port and gets no row in a later epoch, and a
slot with a row still being written at the end is forgotten, not reused.

NOTE [ Slot rows ]
==================
A producer converts its sample to the slot's columns before it claims a row: each value must have
its column's shape and a dtype of a kind the column takes (an integer column takes integers, not a
float, a bool or ``None``; a float column takes integers and floats, not bools), and is cast to the
column's dtype, out-of-range integers refused. A sample that does not fit is that item's failure,
with no row claimed, so its batch mates are kept and no row is left unwritten (a hole that would be
handed out holding a previous batch's data). Once claimed, a row is filled by a same-dtype,
same-shape numpy copy and list stores, which cannot fail; if one does anyway, the producer ends the
epoch with an error naming the file rather than leave a hole.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Literal

import numpy as np
import torch

from .._checks import check_choice, check_decoder, check_int
from ..engine.epoch import RunningEpochs, run_epoch
from ..engine.pipeline import Pipeline
from ..engine.pool import Chunk, Failure
from ..engine.stats import DatasetStats
from ..errors import BufferClosed, SampleError
from ..options import LoaderOptions, check_keywords
from ..sources.source import Source, SourceSpec, WorkItem
from ..sources.stream import ShardStream
from ._state import EpochCursor, PipelineViews, dataloader_worker

__all__ = [
    "BatchSlotLoader",
    "FITS",
    "Field",
    "RowWriteFailed",
    "Slot",
    "SlotPort",
    "SlotStats",
    "SlotWriter",
    "convert",
    "layout",
    "storage_refs",
]


class Field:
    """How one sample key is stored in a slot: a tensor row, or a list entry."""

    __slots__ = ("key", "shape", "dtype", "np_dtype")

    def __init__(self, key: str, shape: tuple[int, ...] | None, dtype: torch.dtype | None) -> None:
        self.key = key
        self.shape = shape  # None: kept in a list
        self.dtype = dtype
        self.np_dtype: np.dtype | None = None
        if dtype is not None:
            try:
                self.np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            except TypeError as exc:  # bfloat16 and other dtypes numpy has not
                raise SampleError(f"{key!r} has dtype {dtype}, which a batch slot cannot hold (numpy has no such "
                                  f"dtype): convert it in the decoder or a transform") from exc


def layout(sample: dict[str, Any]) -> list[Field]:
    fields = []
    for key, value in sample.items():
        if isinstance(value, torch.Tensor):
            fields.append(Field(key, tuple(value.shape), value.dtype))
        elif isinstance(value, np.ndarray) and value.dtype != object:
            fields.append(Field(key, value.shape, torch.from_numpy(value[:0].copy()).dtype))
        elif isinstance(value, (bool, np.bool_)):
            fields.append(Field(key, (), torch.bool))
        elif isinstance(value, (int, np.integer)):
            fields.append(Field(key, (), torch.int64))
        elif isinstance(value, (float, np.floating)):
            fields.append(Field(key, (), torch.float64))
        else:
            fields.append(Field(key, None, None))
    return fields


#: The numpy kinds a column of each kind takes: no float or bool into an integer column, no bool into
#: a number column, no number into a bool column (numpy's own casting rules allow bool -> int).
FITS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf", "c": "iufc"}


def describe(value: Any) -> str:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"a {type(value).__name__} of dtype {value.dtype}"
    text = repr(value)
    return f"{text[:40] + '...' if len(text) > 40 else text} ({type(value).__name__})"


def convert(sample: dict[str, Any], fields: list[Field], item: WorkItem) -> list[Any]:
    """The sample's values, each converted to its column's dtype and checked against its shape.

    Raises :class:`SampleError` naming the key, the value and the file for a sample that does not
    fit the slot: NOTE [ Slot rows ].
    """
    if len(sample) != len(fields) or any(f.key not in sample for f in fields):
        raise SampleError(f"sample keys {sorted(sample)} in {item.path!r} differ from the batch slot's "
                          f"{sorted(f.key for f in fields)} (set by the first sample): "
                          "every sample needs the same keys",
                          path=item.path, index=item.index)
    values = []
    for f in fields:
        value = sample[f.key]
        if f.shape is None:
            values.append(value)
            continue
        dtype: np.dtype = f.np_dtype  # type: ignore[assignment]
        try:
            array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        except (TypeError, ValueError, RuntimeError) as exc:  # ragged lists, dtypes numpy has not
            array = None
            cause: BaseException | None = exc
        else:
            cause = None
        if array is None or array.dtype.kind not in FITS.get(dtype.kind, dtype.kind):
            raise SampleError(
                f"{f.key!r} is {describe(value)} in {item.path!r}, but the batch slot's {f.key!r} column is "
                f"{dtype} (set by the first sample): give every sample the same type of {f.key!r}, converting "
                f"it in a transform if need be", path=item.path, index=item.index) from cause
        if array.shape != f.shape:
            raise SampleError(
                f"{f.key!r} has shape {array.shape}, the batch slot {f.shape}, in {item.path!r}: BatchSlotLoader "
                f"needs fixed-shape samples (crop_seconds with pad=True for audio, a size for images)",
                path=item.path, index=item.index)
        if array.dtype != dtype:
            converted = array.astype(dtype)
            if dtype.kind in "iu" and not np.array_equal(converted, array):
                raise SampleError(f"{f.key!r} holds values out of the range of the batch slot's {dtype} column in "
                                  f"{item.path!r}", path=item.path, index=item.index)
            array = converted
        values.append(array)
    return values


class RowWriteFailed(BaseException):
    """Copying a converted sample into its claimed row failed (NOTE [ Slot rows ]: it cannot).

    A ``BaseException`` on purpose: the producer pool reports it as a crash that ends the epoch,
    whatever ``on_error`` says, rather than as one item's failure that could be skipped while the
    row it leaves unwritten is handed out or holds its batch mates back.
    """


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
    """The batch slots: producers write each decoded sample into a row of one, and the consumer
    hands each full one out as a batch. Each epoch's producers reach it through its
    :class:`SlotPort` (:meth:`begin_epoch`). See NOTE [ Slot reuse safety ], NOTE [ Slots across
    epochs ] and NOTE [ Slot rows ].
    """

    def __init__(self, batch_size: int, num_slots: int, pin: bool, stats: SlotStats) -> None:
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

    def write(self, generation: int, item: WorkItem, sample: Any) -> Slot | None:
        """Write ``sample`` into a row; the slot if that row completes it, else ``None``.

        Raises:
            SampleError: the sample does not fit the slot (NOTE [ Slot rows ]); no row is claimed.
            BufferClosed: epoch ``generation`` has ended.
            RowWriteFailed: the claimed row could not be written.
        """
        if not isinstance(sample, dict):
            raise SampleError(f"BatchSlotLoader needs dict samples, got {type(sample).__name__} from {item.path!r}",
                              path=item.path, index=item.index)
        with self._cond:
            if self.fields is None:
                self._set_layout(sample)
            fields, columns = self.fields, self._columns
            lengths_from, lengths_const = self._lengths_from, self._lengths_const
        values = convert(sample, fields, item)  # type: ignore[arg-type]  # NOTE [ Slot rows ]: before the claim
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
        return slot if done else None

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

    def begin_epoch(self) -> SlotPort:
        """Open the writer for a new epoch; returns the port of the epoch's producers."""
        with self._cond:
            self._generation += 1
            self._closed = False
            return SlotPort(self, self._generation)

    def stop_waiting(self) -> None:
        """Wake producers of the running epoch that wait for a slot: the pool is stopping.

        The pool calls it through the port (NOTE [ Output port ] in ``engine/pool.py``) before
        joining its threads; :meth:`end_epoch` opens the next generation only after that join.
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


class SlotPort:
    """One epoch's output port of the producer pool (NOTE [ Output port ] in ``engine/pool.py``):
    each decoded sample goes into a row of a slot, and only the slot a row completes goes into the
    buffer, at once. A sample that does not fit is its item's failure, put in its place.

    It waits for the consumer (a producer waits for a free slot), so its pool runs unordered, with
    chunks of one and no inline decoding. It carries its epoch's generation: a producer that
    outlived the epoch's join gets no row in a later one (NOTE [ Slots across epochs ]).
    """

    in_place = False
    waits_for_consumer = True

    def __init__(self, writer: SlotWriter, generation: int) -> None:
        self.writer = writer
        self.generation = generation

    def __repr__(self) -> str:
        return f"SlotPort(generation={self.generation})"

    def deliver(self, seq: int, item: WorkItem, out: Any, chunk: Chunk) -> None:
        if out.__class__ is Failure:
            chunk.put((seq, out))
            return
        slot = self.writer.write(self.generation, item, out)
        if slot is not None:
            chunk.put((seq, slot))

    def stop(self) -> None:
        self.writer.stop_waiting()


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


class BatchSlotLoader(PipelineViews):
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
    referenced is never refilled (see NOTE [ Slot reuse safety ] in ``audiobuffer/loaders/slots.py``). Put a
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
        source: as for :class:`~audiobuffer.BufferedDataset`.
        decoder: as for :class:`~audiobuffer.BufferedDataset`.
        batch_size: rows per batch.
        num_slots: slots owned at a time (at least 2; more lets producers run further ahead).
        drop_last: drop the last, short batch of an epoch.
        pin_memory: ``"auto"`` pins when CUDA is available.
        transform: applied to each sample before it is written into its row.
        **options: as for :class:`~audiobuffer.BufferedDataset` (``num_producers``, ``shuffle``,
            ``seed``, ``on_error``, ``labels``, ...), but not ``buffer_size`` (``num_slots`` sizes the
            buffer), ``ordered`` (rows come as producers finish) or ``max_batch_seconds`` (its slots
            are of one batch size).
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
        check_keywords("BatchSlotLoader", options, ["batch_size", "num_slots", "drop_last", "pin_memory", "transform"])
        # each value checked first
        loader_options = LoaderOptions(buffer_size=num_slots, transform=transform, **options)
        if loader_options.max_batch_seconds is not None:
            raise ValueError("BatchSlotLoader takes no max_batch_seconds: its slots hold batch_size rows; batch by "
                            "duration with BufferedDataset or IsolatedLoader")
        pin = torch.cuda.is_available() if pin_memory == "auto" else bool(pin_memory)
        self.batch_size = batch_size
        self.num_slots = num_slots
        self.drop_last = bool(drop_last)
        self.pin_memory = pin
        self.slot_stats = SlotStats()
        # The producers write rows through the writer's port, which puts only whole batches (NOTE
        # [ Output port ] in engine/pool.py); the slots cover the buffer: producers never hold more
        # complete slots than there are.
        self._writer = SlotWriter(batch_size, num_slots, pin, self.slot_stats)
        #: What the epochs run over: the source, the decoder, the options (one copy of each).
        self.pipeline = Pipeline.build(source, decoder, loader_options)
        if isinstance(self.pipeline.source, ShardStream):
            raise ValueError(f"BatchSlotLoader writes each sample into a row of a batch, and "
                             f"streamed shards put their samples into the buffer as they stream: "
                             f"{self.pipeline.source.random_access_hint}")
        self._cursor = EpochCursor(self.pipeline)
        self._epochs = RunningEpochs("BatchSlotLoader")
        self._lock = threading.Lock()
        self._running = False
        self._rows = 0  # samples handed out in the current (or last) epoch

    def __len__(self) -> int:
        n = self._cursor.length()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __repr__(self) -> str:
        options = self.pipeline.options
        return (f"BatchSlotLoader({self.source.description}, {self.pipeline.decoder!r}, "
                f"items={len(self.source)}, "
                f"batch_size={self.batch_size}, num_slots={self.num_slots}, drop_last={self.drop_last}, "
                f"pin_memory={self.pin_memory}, num_producers={options.num_producers!r}, "
                f"shuffle={options.shuffle}, on_error={options.on_error!r})")

    def stats(self) -> DatasetStats | None:
        """The current or last epoch's stats, as :meth:`BufferedDataset.stats` gives them.

        ``yielded`` counts samples (rows handed out) and ``failed`` the items that failed, so at the
        end of an epoch ``yielded + failed == items``, less the rows of a short last batch that
        ``drop_last`` dropped. ``buffer`` counts batches; :attr:`slot_stats` counts batches and slots
        over all epochs.
        """
        run = self._epochs.last
        return None if run is None else dataclasses.replace(run.snapshot(), yielded=self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            if self._running:
                raise RuntimeError("this BatchSlotLoader is already running an epoch (an iterator neither exhausted "
                                   "nor closed); finish or close that loop before starting another")
            self._running = True
        try:
            writer = self._writer
            port = writer.begin_epoch()
            self._rows = 0
            shard, _ = self._cursor.begin(dataloader_worker())  # no state_dict: nothing to resume
            run = run_epoch(self.pipeline, shard, port=port)
            epoch = self._epochs.run(run, self.pipeline.options.on_error)
            try:
                for slot in epoch:
                    self._rows += self.batch_size
                    yield writer.hand_out(slot, self.batch_size)
                    writer.reclaim()  # the caller is back: the batch before the one it holds is free now
                if run.done and not self.drop_last:
                    partial = writer.take_partial()
                    if partial is not None:
                        self._rows += partial.claimed
                        yield writer.hand_out(partial, partial.claimed)
            finally:
                # The pool aborts its buffer, wakes producers waiting for a slot (its port calls
                # writer.stop_waiting) and joins them; then every slot not handed out is free again.
                epoch.close()
                writer.end_epoch()
        finally:
            with self._lock:
                self._running = False

    def close(self) -> None:
        """Stop a running epoch's producers and refuse new epochs. Idempotent, any thread."""
        self._epochs.close()
        self._writer.close()

    def __enter__(self) -> BatchSlotLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
