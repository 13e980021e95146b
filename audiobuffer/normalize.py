"""Image normalisation as a torch module: a batch of uint8 images to float,
``(x / 255 - mean) / std`` per channel, in one step on whatever device the batch is on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ._checks import check_choice, short_repr
from .decoders.image import Layout

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "Normalize"]

#: The per-channel mean of ImageNet's training images (RGB, fractions of 255), as torchvision's.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
#: The per-channel standard deviation of ImageNet's training images (RGB, as fractions of 255).
IMAGENET_STD = (0.229, 0.224, 0.225)

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Normalize(nn.Module):
    """uint8 images to float, ``(x / 255 - mean) / std`` per channel, on the batch's device.

    The batched step after :class:`~audiobuffer.ImageDecoder`: producers hand over uint8 images (a
    quarter of float32's bytes to collate, pin and copy), and the device does the arithmetic, as
    torchvision's ``ToTensor()`` then ``Normalize(mean, std)`` do per image. Input ``(N, C, H, W)``
    or one image ``(C, H, W)``; with ``layout="hwc"``, ``(N, H, W, C)`` or ``(H, W, C)``, and the
    output is the same ``(N, C, H, W)`` values in ``torch.channels_last`` memory format (no copy to
    reorder). Thread safety: holds no state that ``forward`` changes.

    Example:
        >>> norm = Normalize().to("cuda")  # doctest: +SKIP
        >>> for batch in DevicePrefetcher(loader, "cuda"):  # doctest: +SKIP
        ...     logits = model(norm(batch["image"]))

    Args:
        mean: each channel's mean, as a fraction of 255 (default ImageNet's, RGB).
        std: each channel's standard deviation, as a fraction of 255, every one > 0.
        layout: where the channels are: ``"chw"`` (before the height) or ``"hwc"`` (last).
        dtype: the floating-point type of the output.
    """

    scale: torch.Tensor  # buffers (``register_buffer``): 1 / (255 std) and -mean / std per channel
    shift: torch.Tensor

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, *, layout: Layout = "chw",
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        mean_t, std_t = _per_channel("mean", mean), _per_channel("std", std)
        if len(mean_t) != len(std_t):
            raise ValueError(f"mean and std must give one number per channel each, got "
                             f"{len(mean_t)} means and {len(std_t)} standard deviations")
        if not bool((std_t > 0).all()):
            raise ValueError(f"std must be > 0 for every channel, got {short_repr(tuple(std))}")
        check_choice("layout", layout, Layout)
        if dtype not in _FLOATS:
            floats = ", ".join(map(str, _FLOATS))
            raise TypeError(f"dtype must be a floating-point torch dtype ({floats}), got {dtype!r}")
        self.layout = layout
        self.dtype = dtype
        self.channels = len(mean_t)
        shape = (-1, 1, 1)
        self.register_buffer("scale", (1.0 / (255.0 * std_t)).reshape(shape), persistent=False)
        self.register_buffer("shift", (-mean_t / std_t).reshape(shape), persistent=False)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, layout={self.layout!r}, dtype={self.dtype}"

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The images as ``dtype``, normalised: ``(N, C, H, W)`` (``(C, H, W)`` for one image).

        Raises:
            TypeError: ``images`` is not a uint8 tensor.
            ValueError: ``images`` has not 3 or 4 dimensions, or not ``channels`` channels where
                ``layout`` puts them.
        """
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
            got = images.dtype if isinstance(images, torch.Tensor) else type(images).__name__
            raise TypeError(f"Normalize takes a uint8 tensor of images (as ImageDecoder makes), "
                            f"got {got}")
        given = tuple(images.shape)
        if images.dim() not in (3, 4):
            raise ValueError(f"Normalize takes images (N, C, H, W) or one image (C, H, W) "
                             f"(layout='hwc': channels last), got shape {given}")
        if self.layout == "hwc":  # a view: channels first in shape, last in memory
            images = images.movedim(-1, -3)
        if images.shape[-3] != self.channels:
            raise ValueError(f"Normalize has {self.channels} channels (mean and std) but the "
                             f"images have {images.shape[-3]} (shape {given}, "
                             f"layout={self.layout!r})")
        scale = self.scale.to(images.device, self.dtype)
        shift = self.shift.to(images.device, self.dtype)
        return torch.addcmul(shift, images.to(self.dtype), scale)


def _per_channel(name: str, values: Any) -> torch.Tensor:
    """``values`` as a float64 tensor of one finite number per channel."""
    numbers = (isinstance(values, Sequence) and not isinstance(values, (str, bytes))
               and bool(values)
               and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values))
    if not numbers:
        raise TypeError(f"{name} must be a sequence of numbers, one per channel, "
                        f"got {short_repr(values)}")
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name} must be finite numbers, got {short_repr(values)}")
    return tensor
