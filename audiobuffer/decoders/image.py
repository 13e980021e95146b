"""Image decoding with Pillow: 8-bit RGB, optional resize, CHW uint8 tensor.

Pillow is an optional dependency (``pip install 'audiobuffer[image]'``): it is imported when an
:class:`ImageDecoder` is made, never by ``import audiobuffer``. Pillow releases the GIL while it
decodes and resizes, so producer threads decode images in parallel.
"""

from __future__ import annotations

import io
from typing import Any, Literal

import numpy as np

from .._checks import check_choice
from ..errors import DecodeError
from ..sources.item import IMAGE_PATTERNS
from ._common import ItemLike, as_item, as_tensor, check_flag, describe, sample_fields

__all__ = ["ImageDecoder", "Resample"]

#: The resize filter (``ImageDecoder(resample=...)``), a Pillow ``Image.Resampling`` in lower case.
Resample = Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"]
_EXIF_ORIENTATION = 0x0112  # the EXIF tag; 1 is upright, 2 to 8 are mirrored and/or rotated
# Integer greyscale modes with 16 bits per pixel. Pillow opens 16-bit PNGs and TIFFs as "I;16"
# (older versions as "I", 32-bit signed, holding the same 0..65535 values).
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


class ImageDecoder:
    """Decode an image file into a ``(3, H, W)`` uint8 tensor.

    The sample dict holds ``image``, ``path``, ``index``, and the ``label`` and ``label_name`` when the
    source has labels, plus a manifest's other columns. A work item whose ``read`` is set (a shard
    member, a remote object) is decoded from the bytes it returns.

    What it does with images that are not plain 8-bit RGB:

    - **16-bit greyscale** (PNG or TIFF, Pillow modes ``I;16`` and ``I``): scaled to 8 bits,
      ``round(v * 255 / 65535)`` (values of a 32-bit ``I`` image are clipped to 0..65535 first), then
      repeated into three channels. Other greyscale, palette, bilevel and CMYK images go through
      Pillow's ``convert("RGB")``. 32-bit float images (mode ``F``) have no fixed range: they are a
      :class:`~audiobuffer.DecodeError`.
    - **Alpha** (RGBA, LA, palette transparency): dropped. The colour channels are kept as stored,
      not blended onto a background.
    - **EXIF orientation**: applied (as image viewers show the photo), so a portrait photo stored
      sideways comes out upright, with height and width swapped; ``apply_exif_orientation=False``
      keeps the stored pixels. ``size`` applies after the rotation.
    - **Several frames** (animated GIF, APNG or WebP, multi-page TIFF): the first frame only.

    Thread safety: an instance holds no mutable state; one decoder serves all producer threads.

    Example:
        >>> decode = ImageDecoder(size=(224, 224))  # doctest: +SKIP
        >>> decode("cat.jpg")["image"].shape  # doctest: +SKIP
        torch.Size([3, 224, 224])

    Args:
        size: ``None`` keeps each image's size; an int ``n`` resizes to ``n x n``; ``(height, width)``
            resizes to that.
        resample: the resize filter: ``"nearest"``, ``"bilinear"``, ``"bicubic"``, ``"lanczos"``,
            ``"box"`` or ``"hamming"``.
        apply_exif_orientation: turn photos upright as their EXIF orientation tag says.
        tensors: hand ``image`` over as a torch tensor; ``False`` keeps the numpy array (no torch
            needed: the isolated loader's helper process sets it on its copy).
    """

    #: The glob patterns a directory source matches when this decoder reads it
    #: (:class:`~audiobuffer.BufferedDataset` uses them unless given ``patterns=``).
    patterns = IMAGE_PATTERNS

    def __init__(self, size: int | tuple[int, int] | None = None, *,
                 resample: Resample = "bilinear",
                 apply_exif_orientation: bool = True, tensors: bool = True) -> None:
        try:
            from PIL import Image
        except ImportError as exc:
            raise ImportError("ImageDecoder needs Pillow: pip install 'audiobuffer[image]'") from exc
        if size is not None:
            pair = (size, size) if isinstance(size, int) else tuple(size)
            if len(pair) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in pair):
                raise ValueError(f"size must be None, an int >= 1 or (height, width), got {size!r}")
            size = pair
        check_choice("resample", resample, Resample)
        if not isinstance(apply_exif_orientation, bool):
            raise TypeError(f"apply_exif_orientation must be True or False, got {apply_exif_orientation!r}")
        self._filter = getattr(Image.Resampling, resample.upper())
        self.size: tuple[int, int] | None = size
        self.resample = resample
        self.apply_exif_orientation = apply_exif_orientation
        self.tensors = check_flag("tensors", tensors)

    def __repr__(self) -> str:
        return (f"ImageDecoder(size={self.size}, resample={self.resample!r}, "
                f"apply_exif_orientation={self.apply_exif_orientation})")

    def __call__(self, item: ItemLike) -> dict[str, Any]:
        from PIL import Image, ImageOps  # imported in __init__ already; kept out of the instance so it pickles

        item = as_item(item)
        # a shard member's or a remote object's bytes (a StorageError is raised as it is, not as a DecodeError)
        source = item.path if item.read is None else io.BytesIO(item.read())
        im: Image.Image  # opened as an ImageFile; a transpose or conversion gives a plain Image
        try:
            with Image.open(source) as im:  # the first frame of a multi-frame file
                if self.apply_exif_orientation and im.getexif().get(_EXIF_ORIENTATION, 1) != 1:
                    im = ImageOps.exif_transpose(im)
                im = _to_rgb(im, item.path)
                if self.size is not None and im.size != (self.size[1], self.size[0]):
                    im = im.resize((self.size[1], self.size[0]), self._filter)
                pixels = np.asarray(im)
        except DecodeError:
            raise
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise DecodeError(f"cannot decode {item.path!r}: {describe(exc)}", path=item.path) from exc
        sample = sample_fields(item)
        image = np.ascontiguousarray(pixels.transpose(2, 0, 1))
        sample["image"] = as_tensor(image) if self.tensors else image
        return sample


def _to_rgb(im: Any, path: str) -> Any:
    """``im`` as an 8-bit RGB image (see :class:`ImageDecoder` for what each mode becomes)."""
    from PIL import Image

    if im.mode in _SIXTEEN_BIT_MODES:
        values = np.clip(np.asarray(im).astype(np.int64), 0, 65535)
        im = Image.fromarray(((values * 255 + 32767) // 65535).astype(np.uint8), "L")
    elif im.mode == "F":
        raise DecodeError(f"cannot decode {path!r}: it is a 32-bit float image (mode F), whose values have "
                          "no fixed range; convert it to 8 or 16 bits first", path=path)
    return im.convert("RGB") if im.mode != "RGB" else im
