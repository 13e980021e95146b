"""Collating sample dicts into numpy batch arrays, written wherever the caller allocates them.

The one implementation of ``pad_collate``'s layout. :func:`~audiobuffer.pad_collate` allocates with
``np.empty`` and wraps the arrays with ``torch.from_numpy``; the isolated loader's helper process
allocates inside a shared-memory slot (:class:`SlotArena`), so a batch is written once, straight where
the trainer reads it. Nothing here imports torch: the helper process runs without it. A torch tensor
in a sample (from a user's decoder that made one) is read through its ``numpy()`` view.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["Allocate", "SlotArena", "collate_numpy"]

#: ``(shape, dtype) -> array`` where a batch array is written.
Allocate = Callable[[tuple[int, ...], np.dtype], np.ndarray]
_NUMBER_TYPES = (bool, int, float, np.number, np.bool_)
_ALIGN = 64  # every array in a slot starts on a cache line


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
                  allocate: Allocate = _empty) -> dict[str, Any]:
    """Collate sample dicts into a dict of numpy arrays and lists (see :func:`~audiobuffer.pad_collate`).

    ``key`` is padded along its last axis to the longest in the batch; ``lengths`` holds each sample's
    ``num_frames`` (else its length); numbers and equal-shape arrays are stacked; anything else stays
    a list. Arrays are written into what ``allocate`` returns, each byte once.

    Raises:
        TypeError: ``samples`` is empty, holds something other than mappings, or ``key`` holds a
            non-array.
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
    for sample in samples:
        missing = [k for k in first if k not in sample]
        if missing:
            raise KeyError(f"pad_collate: sample {sample.get('path', '?')!r} lacks {missing}")
    batch: dict[str, Any] = {}
    batch[key], lengths = _pad([s[key] for s in samples], key, pad_value, allocate)
    if "num_frames" in first:
        lengths = np.fromiter((s["num_frames"] for s in samples), dtype=np.int64, count=len(samples))
    out = allocate(lengths.shape, lengths.dtype)
    out[...] = lengths
    batch["lengths"] = out
    for name in first:
        if name != key:
            batch[name] = _collate_field([s[name] for s in samples], allocate)
    return batch


def _pad(values: list[Any], key: str, pad_value: float, allocate: Allocate) -> tuple[np.ndarray, np.ndarray]:
    arrays = [_as_array(v) for v in values]
    for value, a in zip(values, arrays):
        if a is None:
            raise TypeError(f"pad_collate: {key!r} must hold CPU tensors or numpy arrays, got {type(value).__name__}")
    checked: list[np.ndarray] = arrays  # type: ignore[assignment]
    lead = checked[0].shape[:-1]
    for a in checked:
        if a.ndim == 0 or a.shape[:-1] != lead:
            raise ValueError(f"pad_collate: {key!r} arrays must differ only in their last axis, got "
                             f"shapes {[x.shape for x in checked]}")
    lengths = np.fromiter((a.shape[-1] for a in checked), dtype=np.int64, count=len(checked))
    longest = int(lengths.max())
    # Each byte written once: the samples into their rows, the pad value into the tails only.
    out = allocate((len(checked), *lead, longest), checked[0].dtype)
    for row, a, n in zip(out, checked, lengths.tolist()):
        row[..., :n] = a
        if n < longest:
            row[..., n:] = pad_value
    return out, lengths


def _collate_field(values: list[Any], allocate: Allocate) -> Any:
    first = values[0]
    if isinstance(first, _NUMBER_TYPES):
        if not all(isinstance(v, _NUMBER_TYPES) for v in values):
            return values
        numbers = np.asarray(values)
        out = allocate(numbers.shape, numbers.dtype)
        out[...] = numbers
        return out
    head = None if isinstance(first, str) else _as_array(first)
    if head is None:  # paths, label names: a list
        return values
    arrays = [head] + [_as_array(v) for v in values[1:]]
    if all(a is not None for a in arrays):
        checked: list[np.ndarray] = arrays  # type: ignore[assignment]
        if len({(a.shape, a.dtype) for a in checked}) == 1 and checked[0].dtype != object:
            out = allocate((len(checked), *checked[0].shape), checked[0].dtype)
            for row, a in zip(out, checked):
                row[...] = a
            return out
    return values


class SlotArena:
    """An allocator that carves aligned arrays out of one buffer, for :func:`collate_numpy`.

    When the buffer is too small it keeps going with private arrays and records the bytes it would
    have needed in :attr:`needed`, so the caller can grow the buffer and collate again.
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
        start = -(-self.offset // _ALIGN) * _ALIGN
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.offset = start + nbytes
        if self.overflow or self._buf is None or self.offset > self._size or dtype.hasobject:
            self.overflow = True
            self.placed.clear()
            return np.empty(shape, dtype=dtype)
        array: np.ndarray = np.ndarray(shape, dtype=dtype, buffer=self._buf, offset=start)
        self.placed[id(array)] = start
        return array
