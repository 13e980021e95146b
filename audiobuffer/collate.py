"""``pad_collate``: batch variable-length audio samples into padded tensors plus lengths.

Padding and stacking run in numpy and each batch tensor is made once with ``torch.from_numpy``: on few
cores a torch operator here would wake torch's intra-op thread pool, which then spins on the cores
the producer threads decode on (README, "Threads and cores").

NOTE [ Batches stacked on arrival ]
===================================
A ``DataLoader`` collates a batch after its last sample has come: the copy of the whole batch (64
images of 224 x 224: 9.6 MB, its pages touched for the first time in the first batch) then runs on
a core the producers are decoding the next batch on, and the batch waits for it.
``BufferedDataset.stacked_batches(batch_size)`` yields :func:`pad_collate`'s batches itself
(:func:`stack_on_arrival`): each sample's ``key`` array is written into its row of the batch
array as the sample arrives (a :class:`~audiobuffer._numpy_collate.RowStack`), in the consumer's
waits for the next one, so only the last row is left when the last sample comes. The batches are
those ``pad_collate`` makes of the same samples: a batch whose arrays differ in shape or dtype is
collated from its samples at its end, as ``pad_collate`` does it. ``BatchSlotLoader`` goes further
for fixed shapes (NOTE [ Slot rows ] in ``loaders/slots.py``): its producers write each sample
into a recycled slot, so no copy is left to the consumer at all; here the consumer copies, into a
fresh array a batch, and any sample (ragged, any keys) keeps ``pad_collate``'s batch.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ._checks import check_int
from ._numpy_collate import RowStack, collate_numpy
from .decoders.image import EncodedImage
from .options import MAX_BATCH_SIZE

__all__ = ["image_collate", "pad_collate", "stack_on_arrival"]


def pad_collate(samples: Sequence[Mapping[str, Any]], *, key: str = "audio",
                pad_value: float = 0.0) -> dict[str, Any]:
    """Collate sample dicts into one batch dict, padding ``key`` along its last axis.

    - ``key`` (``(frames,)`` or ``(channels, frames)`` per sample) becomes ``(B, [channels,] T)``,
      ``T`` the longest in the batch, padded with ``pad_value``; ``lengths`` holds each sample's
      ``num_frames`` when samples carry it (the real audio before any padding), else its length.
    - Other arrays and tensors of numbers of one shape are stacked; numbers become a tensor; anything
      else (paths, label names, arrays of unequal shapes, of strings or of objects) stays a list.

    Works as ``DataLoader(..., collate_fn=pad_collate, pin_memory=True)``; for another key use
    ``functools.partial(pad_collate, key="wave")``.

    Example:
        >>> batch = pad_collate([{"audio": torch.ones(3)}, {"audio": torch.ones(5)}])
        >>> batch["audio"].shape, batch["lengths"].tolist()
        (torch.Size([2, 5]), [3, 5])

    Raises:
        TypeError: ``samples`` is empty or holds something other than mappings, or ``key`` holds
            something other than arrays of numbers (an object array, strings).
        KeyError: a sample lacks ``key`` or a key the first sample has.
        ValueError: the ``key`` arrays differ in anything but their last axis.
    """
    return _tensors(collate_numpy(samples, key=key, pad_value=pad_value))


def _tensors(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch``'s numpy arrays as tensors (no copy), its lists of like tensors stacked."""
    for name, value in batch.items():
        if isinstance(value, np.ndarray):
            batch[name] = torch.from_numpy(value)
        elif isinstance(value[0], torch.Tensor) and all(
                isinstance(v, torch.Tensor) and v.shape == value[0].shape for v in value):
            batch[name] = torch.stack(value)  # GPU tensors or tensors that require grad
    return batch


def check_batch_size(batch_size: Any, drop_last: Any) -> int:
    """``batch_size`` if it is an ``int`` in [1, ``MAX_BATCH_SIZE``] and ``drop_last`` a bool.

    Raises:
        TypeError, ValueError: either one of another type or value.
    """
    check_int("batch_size", batch_size, 1, MAX_BATCH_SIZE)
    if not isinstance(drop_last, bool):
        raise TypeError(f"drop_last must be True or False, got {drop_last!r}")
    return batch_size


def stack_on_arrival(samples: Iterator[Any], batch_size: int, *, key: str,
                     drop_last: bool = False) -> Generator[dict[str, Any], None, None]:
    """:func:`pad_collate`'s batches of ``batch_size`` of ``samples`` (the last one shorter, or
    dropped with ``drop_last``), each ``key`` array written into its batch as it arrives (NOTE [
    Batches stacked on arrival ]). Closing the iterator closes ``samples``.

    Raises:
        TypeError, ValueError: ``batch_size`` or ``drop_last`` of the wrong type or value, by the
            call, before a sample is taken (:func:`check_batch_size`).
    """
    check_batch_size(batch_size, drop_last)
    return _stack_on_arrival(samples, batch_size, key, drop_last)


def _stack_on_arrival(samples: Iterator[Any], batch_size: int, key: str,
                      drop_last: bool) -> Generator[dict[str, Any], None, None]:
    try:
        while True:
            stack = RowStack(batch_size, key)
            batch: list[Any] = []
            for sample in samples:
                stack.add(sample)
                batch.append(sample)
                if len(batch) == batch_size:
                    break
            if not batch or (drop_last and len(batch) < batch_size):
                return
            yield _tensors(collate_numpy(batch, key=key, rows=stack.rows(len(batch))))
            if len(batch) < batch_size:
                return
    finally:
        close = getattr(samples, "close", None)
        if close is not None:
            close()


def image_collate(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Stack fixed-size images (``ImageDecoder`` samples): ``pad_collate`` on ``"image"``, without ``lengths``.

    A batch that holds JPEGs left to the device (``ImageDecoder(jpeg="device")``) keeps ``image``
    a list, for :class:`audiobuffer.jpeg.DecodeJpeg`; the other keys are collated as usual.
    """
    if any(isinstance(s.get("image"), EncodedImage) for s in samples if isinstance(s, Mapping)):
        images = [s["image"] for s in samples]
        stand_in = np.zeros(1, dtype=np.uint8)  # the other keys collate (and are checked) as usual
        batch = pad_collate([{**s, "image": stand_in} for s in samples], key="image")
        batch["image"] = images
    else:
        batch = pad_collate(samples, key="image")
    batch.pop("lengths")
    return batch
