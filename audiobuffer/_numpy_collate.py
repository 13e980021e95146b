"""Collating sample dicts into numpy batch arrays, written wherever the caller allocates them.

The one implementation of ``pad_collate``'s layout: :func:`~audiobuffer.pad_collate` allocates with
``np.empty`` and wraps the arrays with ``torch.from_numpy``; the isolated loader's helper process
allocates inside a shared-memory slot (:class:`SlotArena`), so a batch is written once, where the
trainer reads it. Nothing here imports torch (the helper runs without it); a torch tensor in a sample
is read through its ``numpy()`` view.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["Allocate", "RowStack", "SlotArena", "collate_numpy"]

#: ``(shape, dtype) -> array`` where a batch array is written.
Allocate = Callable[[tuple[int, ...], np.dtype], np.ndarray]
_NUMBER_TYPES = (bool, int, float, np.number, np.bool_)
_NUMBER_KINDS = "biufc"  # the numpy kinds a tensor can hold
_ALIGN = 64  # every array in a slot starts on a cache line
_ENCODED_HINT = (" (ImageDecoder(jpeg='device') hands JPEG bytes over for DecodeJpeg to decode on "
                 "the device: batch them with image_collate, in BufferedDataset or BatchSlotLoader, "
                 "or decode here with jpeg='host')")


def _as_array(value: Any) -> np.ndarray | None:
    """A numpy view of an array or CPU tensor (no copy), or ``None`` for anything else."""
    if isinstance(value, np.ndarray):
        return value
    numpy = getattr(value, "numpy", None)  # a torch.Tensor, without importing torch
    if numpy is None:
        return None
    try:  # torch refuses a tensor on a GPU (TypeError) and one that requires grad (RuntimeError)
        array = numpy()
    except (TypeError, RuntimeError):
        return None
    return array if isinstance(array, np.ndarray) else None


def _empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


def collate_numpy(samples: Sequence[Mapping[str, Any]], *, key: str = "audio", pad_value: float = 0.0,
                  allocate: Allocate = _empty, rows: np.ndarray | None = None) -> dict[str, Any]:
    """Collate sample dicts into a dict of numpy arrays and lists (see :func:`~audiobuffer.pad_collate`).

    ``key`` is padded along its last axis to the longest in the batch; ``lengths`` holds each sample's
    ``num_frames`` (else its length); numbers and equal-shape arrays of numbers are stacked; anything
    else stays a list. Arrays are written into what ``allocate`` returns, each byte once (with the default
    allocator and a zero pad, the padded array starts as zeroed memory and only the samples are copied).
    ``rows``: ``key``'s batch array, a row a sample, already written (:meth:`RowStack.rows`):
    taken as it is, neither checked against the samples nor copied into what ``allocate`` returns.

    Raises:
        TypeError: ``samples`` is empty, holds something other than mappings, or ``key`` holds a
            non-array or an array of something other than numbers (an object array, strings).
        KeyError: a sample lacks ``key`` or a key the first sample has.
        ValueError: the ``key`` arrays differ in anything but their last axis.
    """
    if not samples:
        raise TypeError("pad_collate needs at least one sample")
    first = samples[0]
    if not isinstance(first, Mapping):
        raise TypeError(f"pad_collate takes sample dicts, got {type(first).__name__}")
    if key not in first:
        raise KeyError(f"pad_collate: samples have no {key!r} (keys: {sorted(first)}); set key=")
    names = first.keys()
    for sample in samples:
        if not isinstance(sample, dict) and not isinstance(sample, Mapping):  # the dict test is the cheap one
            raise TypeError(f"pad_collate takes sample dicts, got {type(sample).__name__}")
        if not names <= sample.keys():
            missing = [k for k in first if k not in sample]
            raise KeyError(f"pad_collate: sample {sample.get('path', '?')!r} lacks {missing}")
    batch: dict[str, Any] = {}
    if rows is None:
        batch[key], lengths = _pad([s[key] for s in samples], key, pad_value, allocate)
    else:  # every sample's array of one shape: nothing to pad
        batch[key], lengths = rows, [rows.shape[-1]] * len(samples)
    if "num_frames" in first:
        lengths = [s["num_frames"] for s in samples]
    # each one int(): a 1-element tensor too
    batch["lengths"] = _place(np.fromiter(lengths, dtype=np.int64, count=len(samples)), allocate)
    for name in first:
        if name != key:
            batch[name] = _collate_field([s[name] for s in samples], allocate)
    return batch


def _pad(values: list[Any], key: str, pad_value: float, allocate: Allocate) -> tuple[np.ndarray, list[int]]:
    """``values`` padded along their last axis into one array, and each one's length."""
    checked: list[np.ndarray] = []
    for value in values:
        a = value if value.__class__ is np.ndarray else _as_array(value)
        if a is None:
            hint = _ENCODED_HINT if type(value).__name__ == "EncodedImage" else ""
            raise TypeError(f"pad_collate: {key!r} must hold CPU tensors or numpy arrays, got "
                            f"{type(value).__name__}{hint}")
        if a.dtype.kind not in _NUMBER_KINDS:
            raise TypeError(f"pad_collate: {key!r} must hold numbers, got an array of dtype {a.dtype}: convert it in "
                            f"the decoder or a transform (np.asarray(audio, dtype=np.float32))")
        checked.append(a)
    shapes = [a.shape for a in checked]
    lead = shapes[0][:-1]
    if not all(shape and shape[:-1] == lead for shape in shapes):
        raise ValueError(f"pad_collate: {key!r} arrays must differ only in their last axis, got shapes {shapes}")
    lengths = [shape[-1] for shape in shapes]
    longest = max(lengths)
    shape, dtype = (len(checked), *lead, longest), checked[0].dtype
    if min(lengths) == longest:  # nothing to pad (fixed-size crops): one copy in C, no zeroing
        out = allocate(shape, dtype)
        np.concatenate([a[np.newaxis] for a in checked], axis=0, out=out, casting="unsafe")
        return out, lengths
    # pad_collate's default: calloc's zeros, then the rows (for a large batch the kernel zeroes the
    # fresh pages as they are first written); else each byte written once, the pad value into the
    # tails only
    zeroed = (allocate is _empty and dtype.kind in "biuf" and pad_value.__class__ in (int, float)
              and pad_value == 0 and math.copysign(1.0, pad_value) > 0)  # not -0.0
    out = np.zeros(shape, dtype) if zeroed else allocate(shape, dtype)
    for row, a, n in zip(out, checked, lengths):
        row[..., :n] = a
        if n < longest and not zeroed:
            row[..., n:] = pad_value
    return out, lengths


def _place(array: np.ndarray, allocate: Allocate) -> np.ndarray:
    """``array`` written where ``allocate`` says (with pad_collate's allocator, ``array`` itself:
    it is already a fresh array of its own)."""
    if allocate is _empty:
        return array
    out = allocate(array.shape, array.dtype)
    out[...] = array
    return out


def _collate_field(values: list[Any], allocate: Allocate) -> Any:
    first = values[0]
    if isinstance(first, _NUMBER_TYPES):
        if not all(isinstance(v, _NUMBER_TYPES) for v in values):
            return values
        return _place(np.asarray(values), allocate)
    head = None if isinstance(first, str) else _as_array(first)
    if head is None:  # paths, label names: a list
        return values
    arrays = [head] + [_as_array(v) for v in values[1:]]
    if all(a is not None for a in arrays):
        checked: list[np.ndarray] = arrays  # type: ignore[assignment]
        if len({(a.shape, a.dtype) for a in checked}) == 1 and checked[0].dtype.kind in _NUMBER_KINDS:
            out = allocate((len(checked), *checked[0].shape), checked[0].dtype)
            for row, a in zip(out, checked):
                row[...] = a
            return out
    return values


class RowStack:
    """The ``key`` arrays of one batch of ``size`` samples, each written into the batch array as
    its sample arrives: the copy of a batch spread over the time its samples take to come, instead
    of all of it after the last (NOTE [ Batches stacked on arrival ] in ``collate.py``).

    It takes an array only while every one so far has the first's shape and dtype (as
    :func:`collate_numpy` would stack them, with nothing to pad); anything else (a longer array
    to pad to, another dtype, something that is not an array of numbers, a sample that is not a
    mapping) stops it, and :func:`collate_numpy` collates the batch as it would any other,
    errors included.
    """

    __slots__ = ("_array", "_filled", "_size", "key", "stopped")

    def __init__(self, size: int, key: str) -> None:
        self._size = size
        self.key = key
        self._array: np.ndarray | None = None
        self._filled = 0
        self.stopped = False

    def add(self, sample: Any) -> None:
        """Write ``sample``'s array into the next row, or stop (nothing raised here)."""
        if self.stopped:
            return
        value = sample.get(self.key) if isinstance(sample, Mapping) else None
        a = value if value.__class__ is np.ndarray else _as_array(value)
        array = self._array
        if array is None and a is not None and a.ndim > 0 and a.dtype.kind in _NUMBER_KINDS:
            try:  # a batch_size far above the samples there are: pad_collate's own allocation
                array = self._array = np.empty((self._size, *a.shape), dtype=a.dtype)
            except MemoryError:
                array = None
        if a is None or array is None or a.shape != array.shape[1:] or a.dtype != array.dtype \
                or self._filled == self._size:
            self.stopped = True
            self._array = None  # its memory goes now
            return
        array[self._filled] = a
        self._filled += 1

    def rows(self, count: int) -> np.ndarray | None:
        """The array of the ``count`` samples added; ``None`` where it stopped (or took fewer)."""
        if self.stopped or self._array is None or self._filled != count:
            return None
        return self._array if count == self._size else self._array[:count]


class SlotArena:
    """An allocator that carves aligned arrays out of one buffer, for :func:`collate_numpy`.

    When the buffer is too small it keeps going with private arrays and records the bytes it would
    have needed in :attr:`needed`, so the caller can grow the buffer and collate again. An array of
    Python objects cannot live in shared memory, however large: it raises ``TypeError``.
    """

    def __init__(self, buf: memoryview | None) -> None:
        self._buf = buf
        self._size = 0 if buf is None else len(buf)
        self.offset = 0
        #: ``id(array) -> offset`` of each array carved out (empty after an overflow).
        self.placed: dict[int, int] = {}
        self.overflow = False

    @property
    def needed(self) -> int:
        """Bytes the arrays asked for so far, alignment included."""
        return self.offset

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError(f"an array of dtype {dtype} holds Python objects, which cannot go into a shared-memory "
                            f"batch slot")
        start = -(-self.offset // _ALIGN) * _ALIGN
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.offset = start + nbytes
        if self.overflow or self._buf is None or self.offset > self._size:
            self.overflow = True
            self.placed.clear()
            return np.empty(shape, dtype=dtype)
        array: np.ndarray = np.ndarray(shape, dtype=dtype, buffer=self._buf, offset=start)
        self.placed[id(array)] = start
        return array
