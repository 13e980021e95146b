"""``pad_collate``: batch variable-length audio samples into padded tensors plus lengths.

Padding and stacking run in numpy and each batch tensor is made once with ``torch.from_numpy``: on few
cores a torch operator here would wake torch's intra-op thread pool, which then spins on the cores
the producer threads decode on (README, "Threads and cores").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ._numpy_collate import collate_numpy
from .decoders.image import EncodedImage

__all__ = ["image_collate", "pad_collate"]


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
    batch = collate_numpy(samples, key=key, pad_value=pad_value)
    for name, value in batch.items():
        if isinstance(value, np.ndarray):
            batch[name] = torch.from_numpy(value)
        elif isinstance(value[0], torch.Tensor) and all(
                isinstance(v, torch.Tensor) and v.shape == value[0].shape for v in value):
            batch[name] = torch.stack(value)  # GPU tensors or tensors that require grad
    return batch


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
