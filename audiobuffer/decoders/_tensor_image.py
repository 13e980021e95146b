"""``ImageDecoder(backend="torch")``: a JPEG decoded by libjpeg-turbo through simplejpeg, then
turned upright, cropped and resized as a torch tensor, as ``torchvision.transforms.v2`` resizes
tensors.

NOTE [ The torch backend ]
==========================
Decode. A JPEG in YCbCr or greyscale is decoded by ``simplejpeg.decode_jpeg`` where simplejpeg is
installed (``pip install 'audiobuffer[image]'``): libjpeg-turbo with its accurate DCT and smooth
upsampling, the pixels Pillow's decoder gives (a test compares them), in one call that holds no
GIL, without Pillow's copy of RGB into its four-byte pixels. Where the box keeps ``size``'s pixels
at 1/2, 1/4 or 1/8 of the image's sides, the JPEG is decoded at that scale (DCT scaling, the rule of
``draft``). simplejpeg is strict: a file libjpeg warns about (corrupt data) raises there, and such
a file, a CMYK JPEG, a JPEG without simplejpeg and every other format are read by Pillow as the
Pillow backend reads them (draft, EXIF orientation, modes), so a file gives the same error, or the
same pixels, under either backend.

Resize. ``torch.nn.functional.interpolate`` with ``antialias=True`` ("nearest-exact" without) on a
``(1, 3, h, w)`` view of the ``(h, w, 3)`` array: channels-last memory, torch's vectorised uint8
path, no conversion to float. The box is rounded to whole pixels of the decoded image (as
torchvision's crops are) and only its pixels take part. The results differ from Pillow's resize
by a few levels where the filters' rounding differs; the boxes and flips are the same draws.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from .image import CropBox

__all__ = ["TORCH_RESAMPLE", "decode_jpeg", "resized_crop", "upright"]

#: The resize filters of the torch backend: interpolate's mode, and whether it antialiases.
TORCH_RESAMPLE = {"nearest": ("nearest-exact", False), "bilinear": ("bilinear", True),
                  "bicubic": ("bicubic", True)}


@functools.lru_cache(maxsize=1)
def _simplejpeg() -> Any:
    """simplejpeg, or ``None`` where it is not installed."""
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


def decode_jpeg(raw: bytes, height: int, width: int, reduction: int) -> np.ndarray | None:
    """The ``(h, w, 3)`` uint8 RGB pixels of a JPEG of ``height`` x ``width`` (as stored) decoded at
    ``1 / reduction`` of its sides; ``None`` where simplejpeg is missing or refuses the file (Pillow
    then reads it)."""
    turbo = _simplejpeg()
    if turbo is None:
        return None
    try:
        if reduction == 1:
            pixels: np.ndarray = turbo.decode_jpeg(raw, colorspace="RGB")
        else:  # exactly 1/reduction: no smaller scale (min_factor), none below these sides
            pixels = turbo.decode_jpeg(raw, colorspace="RGB", min_factor=reduction,
                                       min_height=-(-height // reduction),
                                       min_width=-(-width // reduction))
    except ValueError:  # a libjpeg warning (corrupt data) or a colour space it cannot convert
        return None
    return pixels


def upright(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """``pixels`` (``(h, w, 3)``) turned as Pillow's ``ImageOps.exif_transpose`` turns an image of
    that EXIF ``orientation`` (1 to 8), contiguous."""
    if orientation in (5, 6, 7, 8):
        pixels = pixels.transpose(1, 0, 2)
    step = {2: (1, -1), 3: (-1, -1), 4: (-1, 1), 5: (1, 1), 6: (1, -1), 7: (-1, -1),
            8: (-1, 1)}.get(orientation, (1, 1))
    return np.ascontiguousarray(pixels[::step[0], ::step[1]])


def _pixel_box(box: CropBox, height: int, width: int) -> tuple[int, int, int, int]:
    """``box`` rounded to whole pixels of a ``height`` x ``width`` image, inside it, >= 1 pixel."""
    top = min(max(0, int(round(box.top))), height - 1)
    left = min(max(0, int(round(box.left))), width - 1)
    h = min(max(1, int(round(box.height))), height - top)
    w = min(max(1, int(round(box.width))), width - left)
    return top, left, h, w


def resized_crop(pixels: np.ndarray, box: CropBox | None, size: tuple[int, int] | None,
                 resample: str) -> torch.Tensor:
    """``box`` of the upright ``(h, w, 3)`` ``pixels`` (the whole image: ``None``) resized to
    ``size`` (``None``: not resized): a ``(1, 3, H, W)`` uint8 tensor in channels-last memory."""
    import torch

    if not pixels.flags.writeable:  # Pillow's buffer: a tensor needs an array it may write
        pixels = pixels.copy()
    image = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
    if box is not None:
        top, left, h, w = _pixel_box(box, image.shape[2], image.shape[3])
        image = image[:, :, top:top + h, left:left + w]
    if size is None or tuple(image.shape[2:]) == size:
        return image
    mode, antialias = TORCH_RESAMPLE[resample]
    return torch.nn.functional.interpolate(image, size=size, mode=mode, antialias=antialias)
