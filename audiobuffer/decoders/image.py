"""Image decoding with Pillow, or with simplejpeg and torch (``backend="torch"``): 8-bit RGB, a
resize or a crop (random or central) scaled to a size, an optional flip, a uint8 tensor.

Pillow is an optional dependency (``pip install 'audiobuffer[image]'``): it is imported when an
:class:`ImageDecoder` is made, never by ``import audiobuffer``. Pillow, simplejpeg and torch release
the GIL while they decode and resize, so producer threads decode images in parallel.
"""

from __future__ import annotations

import io
import math
from typing import Any, Literal, NamedTuple, overload

import numpy as np

from .._checks import check_choice, short_repr
from ..errors import DecodeError
from ..sources.item import IMAGE_PATTERNS
from ._common import ItemLike, as_item, as_tensor, check_flag, describe, sample_fields
from ._tensor_image import TORCH_RESAMPLE, decode_jpeg, jpeg_header, resized_crop, upright

__all__ = ["Backend", "CropBox", "EncodedImage", "ImageCrop", "ImageDecoder", "JpegDecode",
           "Layout", "Resample", "center_box", "random_resized_box"]

#: The resize filter (``ImageDecoder(resample=...)``), a Pillow ``Image.Resampling`` in lower case.
Resample = Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"]
#: What part of the image is scaled to ``size`` (``ImageDecoder(crop=...)``).
ImageCrop = Literal["random_resized", "center"]
#: The order of the image's dimensions: ``(3, H, W)`` or channels last, ``(H, W, 3)``.
Layout = Literal["chw", "hwc"]
#: Where a JPEG is decoded (``ImageDecoder(jpeg=...)``): in the producer, or on the device.
JpegDecode = Literal["host", "device"]
#: What decodes and resizes (NOTE [ The torch backend ] in ``_tensor_image.py``).
Backend = Literal["pillow", "torch"]
_TRIES = 10  # random boxes tried before the central fallback, as torchvision's RandomResizedCrop
_DRAFT_SCALES = (8, 4, 2)  # the reductions a JPEG decodes at directly (DCT scaling)
_EXIF_ORIENTATION = 0x0112  # the EXIF tag; 1 is upright, 2 to 8 are mirrored and/or rotated
# Integer greyscale modes with 16 bits per pixel. Pillow opens 16-bit PNGs and TIFFs as "I;16"
# (older versions as "I", 32-bit signed, holding the same 0..65535 values).
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_DEVICE_MODES = ("RGB", "L")  # the JPEGs decoded on the device (CMYK ones are decoded here)
#: Pillow's ``Image.Transpose`` that turns an image of each EXIF orientation upright, as
#: ``ImageOps.exif_transpose`` turns it (which also writes the EXIF back, and raises struct.error
#: where it cannot: a tag Pillow knows as a number stored as text).
_TRANSPOSES = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE",
               6: "ROTATE_270", 7: "TRANSVERSE", 8: "ROTATE_90"}


class CropBox(NamedTuple):
    """A crop in pixels of the (upright) image: its top-left corner and its size."""

    top: float
    left: float
    height: float
    width: float


class EncodedImage(NamedTuple):
    """A JPEG's bytes and what the device does with them (``ImageDecoder(jpeg="device")``): decode,
    turn upright, resize ``box`` to ``size``, flip (:class:`audiobuffer.jpeg.DecodeJpeg`)."""

    #: The file's bytes, 1-D uint8.
    data: np.ndarray
    #: The stored image's height and width, from the JPEG header (before the EXIF orientation).
    height: int
    width: int
    #: The EXIF orientation to apply, 1 to 8 (1: upright as stored).
    orientation: int
    #: The box of the upright image resized to ``size`` (the whole image without a crop).
    box: CropBox
    #: Only the box's pixels take part (a random crop: crop, then resize), else the filter reads
    #: past a fractional box's edges (``resize(size, box=box)``).
    crop_first: bool
    #: The output's (height, width).
    size: tuple[int, int]
    resample: str
    flip: bool
    layout: str
    #: The file, for errors.
    path: str


def random_resized_box(height: int, width: int, rng: np.random.Generator, *,
                       scale: tuple[float, float] = (0.08, 1.0),
                       ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> CropBox:
    """A random crop of a ``height`` x ``width`` image, by torchvision's ``RandomResizedCrop`` rule.

    Up to 10 tries: an area drawn uniformly in ``scale`` (fractions of the image's area), an aspect
    (width / height) drawn log-uniformly in ``ratio``, the sides rounded to pixels; the first box
    that fits is placed uniformly at random. When none fits, the central box of the whole image, its
    aspect clamped into ``ratio``. A pure function: the same generator state gives the same box.

    Example:
        >>> random_resized_box(300, 400, np.random.default_rng(0))  # doctest: +SKIP
        CropBox(top=104, left=61, height=124, width=163)
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(_TRIES):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return CropBox(top, left, h, w)
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif aspect > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return CropBox((height - h) // 2, (width - w) // 2, h, w)


def center_box(height: int, width: int, size: tuple[int, int], fraction: float) -> CropBox:
    """The central crop of an image ``height`` x ``width`` that evaluation scales to ``size``.

    The largest box of ``size``'s aspect that fits, shrunk to ``fraction`` of its sides: for a
    square ``size`` that is ``Resize(round(size / fraction))`` then ``CenterCrop(size)``, in one
    resize.
    """
    fit = min(height / size[0], width / size[1]) * fraction
    h, w = size[0] * fit, size[1] * fit
    return CropBox((height - h) / 2, (width - w) / 2, h, w)


class ImageDecoder:
    """Decode an image file into a ``(3, H, W)`` uint8 tensor (``layout="hwc"``: ``(H, W, 3)``).

    The sample dict holds ``image``, ``path``, ``index``, and the ``label`` and ``label_name`` when the
    source has labels, plus a manifest's other columns. A work item whose ``read`` is set (a shard
    member, a remote object) is decoded from the bytes it returns.

    For training and evaluation (``size`` given):

    - ``crop="random_resized"``: a random box by torchvision's ``RandomResizedCrop`` rule
      (:func:`random_resized_box`, with ``scale`` and ``ratio``) scaled to ``size``.
    - ``crop="center"``: the central box :func:`center_box` (``crop_fraction`` of the sides)
      scaled to ``size``, as ``Resize(256)`` then ``CenterCrop(224)`` do for
      ``crop_fraction=224/256``.
    - ``crop=None``: the whole image resized to ``size`` (its aspect is not kept).
    - ``flip=True``: a horizontal flip, half the time.

    Every random draw comes from the work item's generator (:meth:`WorkItem.rng`, seeded by the
    dataset's seed, the epoch and the item's index), so an epoch's crops are the same whatever
    thread decodes them, a resumed epoch gives the same crops, and each item (so each rank's share)
    differs. A JPEG whose crop is scaled down by 2 or more is decoded at a reduced scale (Pillow's
    draft mode, DCT scaling by 1/2, 1/4 or 1/8, never below ``size``); ``draft=False`` decodes
    every pixel.

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
      keeps the stored pixels. Crops, ``size`` and flips apply after the rotation.
    - **Several frames** (animated GIF, APNG or WebP, multi-page TIFF): the first frame only.

    With ``jpeg="device"`` a producer reads a JPEG's bytes and header only (its size and EXIF
    orientation), draws the crop box and the flip as above, and hands over an
    :class:`EncodedImage`; :class:`audiobuffer.jpeg.DecodeJpeg` decodes a batch of them on the
    device (nvjpeg through torchvision) and crops, resizes and flips there, with Pillow's filter
    and rounding, to the image ``draft=False`` gives (within what the two JPEG decoders differ
    by). Other files (PNG, CMYK JPEGs) are decoded in the producer as usual. Batch with
    ``image_collate``, which keeps such a batch's ``image`` a list.

    ``backend="torch"`` is the faster path for training (BENCHMARKS.md, "Images"): a JPEG is
    decoded by libjpeg-turbo through simplejpeg (``pip install 'audiobuffer[image]'``; the same
    pixels Pillow decodes, checked by the tests), cropped and flipped as numpy views, and resized
    by torch's antialiased ``interpolate`` as ``torchvision.transforms.v2`` resizes tensors. The
    boxes and flips are the same draws as ``"pillow"``'s; the resize differs from Pillow's by a few
    levels where the two round differently (under 0.1 of 255 on average on photos), and boxes are
    rounded to whole pixels. Other files, CMYK JPEGs and JPEGs libjpeg warns about are read by
    Pillow as under ``"pillow"``, so a file fails or succeeds alike under both (NOTE [ The torch
    backend ] in ``_tensor_image.py``). It needs torch in the process (the isolated loader's
    helper imports it).

    Thread safety: an instance holds no mutable state; one decoder serves all producer threads.

    Example:
        >>> decode = ImageDecoder(224, crop="random_resized", flip=True)  # doctest: +SKIP
        >>> decode("cat.jpg")["image"].shape  # doctest: +SKIP
        torch.Size([3, 224, 224])

    Args:
        size: ``None`` keeps each image's size; an int ``n`` gives ``n x n``; or
            ``(height, width)``.
        crop: ``None`` (the whole image), ``"random_resized"`` (training) or ``"center"``
            (evaluation); a crop needs ``size``.
        scale: ``crop="random_resized"``: the range of the box's area, as fractions of the image's.
        ratio: ``crop="random_resized"``: the range of the box's aspect (width / height).
        crop_fraction: ``crop="center"``: the fraction of the largest central box kept, in (0, 1].
        flip: flip horizontally with probability 0.5.
        layout: ``"chw"`` for ``(3, H, W)``; ``"hwc"`` for ``(H, W, 3)`` (channels last: a batch's
            ``permute(0, 3, 1, 2)`` is then in ``torch.channels_last`` memory format, with no copy).
        draft: decode a JPEG at a reduced scale when its crop is scaled down by 2 or more.
        resample: the resize filter: ``"nearest"``, ``"bilinear"``, ``"bicubic"``, ``"lanczos"``,
            ``"box"`` or ``"hamming"``.
        apply_exif_orientation: turn photos upright as their EXIF orientation tag says.
        tensors: hand ``image`` over as a torch tensor; ``False`` keeps the numpy array (no torch
            needed: the isolated loader's helper process sets it on its copy).
        jpeg: ``"host"`` decodes JPEGs here; ``"device"`` leaves their decoding, crop, resize and
            flip to :class:`audiobuffer.jpeg.DecodeJpeg` on the device (needs ``size``).
        backend: ``"pillow"``: Pillow decodes and resizes (the pixels ``jpeg="device"`` gives);
            ``"torch"``: simplejpeg decodes JPEGs, torch crops and resizes (``resample``
            ``"nearest"``, ``"bilinear"`` or ``"bicubic"``); with ``jpeg="device"``, it applies
            to the files the producers decode.
    """

    #: The glob patterns a directory source matches when this decoder reads it
    #: (:class:`~audiobuffer.BufferedDataset` uses them unless given ``patterns=``).
    patterns = IMAGE_PATTERNS
    #: The sample key of what it decodes: the one a loader that batches samples itself stacks
    #: (:class:`~audiobuffer.IsolatedLoader` unless given ``key=``).
    sample_key = "image"
    #: Its work runs outside the GIL (C decoding and resizing, Pillow's or simplejpeg's and
    #: torch's): ``num_producers="auto"`` starts at the most producers (NOTE [ Producer tuning ]).
    #: ``False`` with ``jpeg="device"``, whose producers read a JPEG's header in Python.
    releases_gil = True
    #: It runs no matrix product: its producers hold no BLAS limit (NOTE [ BLAS threads ]).
    calls_blas = False

    def __init__(self, size: int | tuple[int, int] | None = None, *, crop: ImageCrop | None = None,
                 scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 crop_fraction: float = 0.875, flip: bool = False, layout: Layout = "chw",
                 draft: bool = True, resample: Resample = "bilinear",
                 apply_exif_orientation: bool = True, tensors: bool = True,
                 jpeg: JpegDecode = "host", backend: Backend = "pillow") -> None:
        try:
            from PIL import Image
        except ImportError as exc:
            raise ImportError("ImageDecoder needs Pillow: pip install 'audiobuffer[image]'") from exc
        if size is not None:
            pair = (size, size) if isinstance(size, int) else tuple(size)
            if len(pair) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in pair):
                raise ValueError(f"size must be None, an int >= 1 or (height, width), got {size!r}")
            size = pair
        if crop is not None:
            check_choice("crop", crop, ImageCrop)
            if size is None:
                raise ValueError(f"crop={crop!r} scales its box to size: give size= (an int or "
                                 "(height, width)), got size=None")
        check_choice("resample", resample, Resample)
        check_choice("layout", layout, Layout)
        check_choice("jpeg", jpeg, JpegDecode)
        check_choice("backend", backend, Backend)
        if backend == "torch" and resample not in TORCH_RESAMPLE:
            filters = ", ".join(map(repr, TORCH_RESAMPLE))
            raise ValueError(f"backend='torch' resizes with {filters}, got resample={resample!r}: "
                             f"give one of those, or backend='pillow'")
        if jpeg == "device" and size is None:
            raise ValueError("jpeg='device' stacks the batch's images on the device: give size= "
                             "(an int or (height, width)), got size=None")
        for name, flag in (("flip", flip), ("draft", draft),
                           ("apply_exif_orientation", apply_exif_orientation)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self._filter = getattr(Image.Resampling, resample.upper())
        self.size: tuple[int, int] | None = size
        self.crop = crop
        self.scale = _check_range("scale", scale, most=1.0)
        self.ratio = _check_range("ratio", ratio)
        self.crop_fraction = _check_fraction(crop_fraction)
        self.flip = flip
        self.layout = layout
        self.draft = draft
        self.resample = resample
        self.apply_exif_orientation = apply_exif_orientation
        self.tensors = check_flag("tensors", tensors)
        self.jpeg = jpeg
        self.backend = backend
        self.releases_gil = jpeg == "host"

    def __repr__(self) -> str:
        crop = ""
        if self.crop == "random_resized":
            crop = f"crop='random_resized', scale={self.scale}, ratio={self.ratio}, "
        elif self.crop == "center":
            crop = f"crop='center', crop_fraction={self.crop_fraction}, "
        jpeg = ", jpeg='device'" if self.jpeg == "device" else ""
        backend = ", backend='torch'" if self.backend == "torch" else ""
        return (f"ImageDecoder(size={self.size}, {crop}flip={self.flip}, layout={self.layout!r}, "
                f"resample={self.resample!r}, "
                f"apply_exif_orientation={self.apply_exif_orientation}{jpeg}{backend})")

    def __call__(self, item: ItemLike) -> dict[str, Any]:
        from PIL import Image  # imported in __init__ already; not held, so the instance pickles

        item = as_item(item)
        rng = item.rng() if self.flip or self.crop == "random_resized" else None
        sample = sample_fields(item)
        # a shard member's or a remote object's bytes (a StorageError is raised as it is, not as a
        # DecodeError)
        raw = item.read() if item.read is not None else None
        source: Any = item.path if raw is None else io.BytesIO(raw)
        try:
            if self.jpeg == "device" or self.backend == "torch":  # the device or simplejpeg
                raw = _read_file(item.path) if raw is None else raw  # decodes the bytes
                source = io.BytesIO(raw)
            if raw is not None and self.backend == "torch" and self.jpeg == "host":
                pixels = self._torch_image(raw, item.path, rng)
            else:
                with Image.open(source) as im:  # the first frame of a multi-frame file
                    if raw is not None and self.jpeg == "device" and (
                            im.format == "JPEG" and im.mode in _DEVICE_MODES):
                        sample["image"] = self._encoded(im, raw, item.path, rng)
                        return sample
                    if self.backend == "pillow":
                        pixels = self._pixels(im, item.path, rng)
                if raw is not None and self.backend == "torch":  # not for the device
                    pixels = self._torch_image(raw, item.path, rng)
        except DecodeError:
            raise
        except Image.UnidentifiedImageError as exc:  # its message names a BytesIO, not the file
            raise DecodeError(f"cannot decode {item.path!r}: it is not an image Pillow reads "
                              f"({_first_bytes(source)})", path=item.path) from exc
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise DecodeError(f"cannot decode {item.path!r}: {describe(exc)}", path=item.path) from exc
        if rng is not None and self.flip and rng.random() < 0.5:
            pixels = pixels[:, ::-1]
        if self.layout == "chw":
            pixels = pixels.transpose(2, 0, 1)
        pixels = np.ascontiguousarray(pixels)  # a copy, unless channels last and not flipped
        if not pixels.flags.writeable:  # Pillow's own buffer: a tensor needs an array it may write
            pixels = pixels.copy()
        sample["image"] = as_tensor(pixels) if self.tensors else pixels
        return sample

    def _encoded(self, im: Any, raw: bytes, path: str,
                 rng: np.random.Generator | None) -> EncodedImage:
        """What the device needs to make this JPEG's image: its bytes, box and flip, drawn as
        :meth:`_pixels` and ``__call__`` draw them (the same generator, in the same order)."""
        assert self.size is not None  # jpeg="device" needs size (checked in __init__)
        orientation, box = self._upright_box(im, rng)
        width, height = im.size
        up_height, up_width = (width, height) if orientation in (5, 6, 7, 8) else (height, width)
        flip = rng is not None and self.flip and rng.random() < 0.5
        return EncodedImage(
            data=np.frombuffer(raw, dtype=np.uint8).copy(), height=height, width=width,
            orientation=orientation,
            box=CropBox(0, 0, up_height, up_width) if box is None else box,
            crop_first=self.crop == "random_resized", size=self.size, resample=self.resample,
            flip=flip, layout=self.layout, path=path)

    def _box(self, height: int, width: int, rng: np.random.Generator | None) -> CropBox | None:
        """The box of the upright ``height`` x ``width`` image that is scaled to ``size``."""
        if self.crop == "random_resized":
            assert rng is not None  # made whenever crop == "random_resized"
            return random_resized_box(height, width, rng, scale=self.scale, ratio=self.ratio)
        if self.crop == "center":
            assert self.size is not None  # checked in __init__
            return center_box(height, width, self.size, self.crop_fraction)
        return None

    def _upright_box(self, im: Any, rng: np.random.Generator | None) -> tuple[int, CropBox | None]:
        """The open image's EXIF orientation to apply, and the box of the upright image that is
        scaled to ``size`` (``None``: the whole image)."""
        orientation = _orientation(im) if self.apply_exif_orientation else 1
        return orientation, self._stored_box(im.height, im.width, orientation, rng)

    def _stored_box(self, height: int, width: int, orientation: int,
                    rng: np.random.Generator | None) -> CropBox | None:
        """The box of the upright image scaled to ``size`` (``None``: the whole image), for an
        image stored ``height`` x ``width`` to be turned by EXIF ``orientation``."""
        if self.crop is None:
            return None
        if orientation in (5, 6, 7, 8):  # turned a quarter: the upright image's sides swap
            width, height = height, width
        return self._box(height, width, rng)

    def _pixels(self, im: Any, path: str, rng: np.random.Generator | None) -> np.ndarray:
        """The open image's pixels, upright, cropped and resized: an ``(H, W, 3)`` uint8 array."""
        orientation, box = self._upright_box(im, rng)
        im, reduction = self._pillow_upright(im, path, orientation, box)
        if box is not None:
            assert self.size is not None  # a crop needs size (checked in __init__)
            box = _on_reduced(box, reduction)
            corners: tuple[float, float, float, float] | None = (
                box.left, box.top, box.left + box.width, box.top + box.height)
            if self.crop == "random_resized" and reduction == 1:
                # torchvision crops, then resizes: pixels outside the box take no part
                im, corners = im.crop(corners), None
            im = im.resize((self.size[1], self.size[0]), self._filter, box=corners)
        elif self.size is not None and im.size != (self.size[1], self.size[0]):
            im = im.resize((self.size[1], self.size[0]), self._filter)
        return np.asarray(im)

    def _pillow_upright(self, im: Any, path: str, orientation: int,
                        box: CropBox | None) -> tuple[Any, int]:
        """The open image decoded by Pillow, upright, 8-bit RGB, and the reduction it was decoded
        at (a draft: 1/2, 1/4 or 1/8 of its sides where ``box`` allows; else 1)."""
        from PIL import Image

        reduction = 1
        if box is not None and self.draft:
            assert self.size is not None  # a crop needs size (checked in __init__)
            reduction = _draft(im, box, self.size)
        if orientation in _TRANSPOSES:
            im = im.transpose(getattr(Image.Transpose, _TRANSPOSES[orientation]))
        return _to_rgb(im, path), reduction

    def _torch_image(self, raw: bytes, path: str,
                     rng: np.random.Generator | None) -> np.ndarray:
        """The torch backend's image (NOTE [ The torch backend ] in ``_tensor_image.py``): upright,
        cropped and resized, an ``(H, W, 3)`` uint8 array. A JPEG whose header reads plainly
        is not opened with Pillow unless simplejpeg refuses its data; the box is drawn once."""
        from PIL import Image

        header = jpeg_header(raw)
        if header is not None:
            orientation = header.orientation if self.apply_exif_orientation else 1
            box = self._stored_box(header.height, header.width, orientation, rng)
            image = self._turbo(raw, header.height, header.width, orientation, box)
            if image is not None:
                return image
        with Image.open(io.BytesIO(raw)) as im:  # the first frame of a multi-frame file
            if header is None:
                orientation, box = self._upright_box(im, rng)
                if im.format == "JPEG" and im.mode in _DEVICE_MODES:
                    image = self._turbo(raw, im.height, im.width, orientation, box)
                    if image is not None:
                        return image
            pillow, reduction = self._pillow_upright(im, path, orientation, box)
            pixels = np.asarray(pillow)
        return resized_crop(pixels, _on_reduced(box, reduction), self.size, self.resample)

    def _turbo(self, raw: bytes, height: int, width: int, orientation: int,
               box: CropBox | None) -> np.ndarray | None:
        """A JPEG stored ``height`` x ``width`` decoded by simplejpeg (at a reduced scale where
        ``box`` allows), turned upright, ``box`` resized; ``None`` where simplejpeg refuses it."""
        wanted = _reduction(box, self.size) if self.draft and box is not None else 1
        pixels = decode_jpeg(raw, height, width, wanted)
        if pixels is None:
            return None
        # decoded at exactly 1/wanted (decode_jpeg): not width / decoded width, which is off for
        # small sides (ceil(50 / 8) = 7 pixels: 50 / 7 rounds to 7)
        if orientation != 1:
            pixels = upright(pixels, orientation)
        return resized_crop(pixels, _on_reduced(box, wanted), self.size, self.resample)


def _orientation(im: Any) -> int:
    """The EXIF orientation of ``im`` that turns it (2 to 8), else 1."""
    orientation = im.getexif().get(_EXIF_ORIENTATION, 1)
    return int(orientation) if orientation in (2, 3, 4, 5, 6, 7, 8) else 1


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@overload
def _on_reduced(box: CropBox, reduction: int) -> CropBox: ...


@overload
def _on_reduced(box: CropBox | None, reduction: int) -> CropBox | None: ...


def _on_reduced(box: CropBox | None, reduction: int) -> CropBox | None:
    """``box`` on the image decoded at ``1/reduction`` of its sides (the last row and column of
    blocks cover what is left: under a mirroring orientation the box moves by less than one reduced
    pixel)."""
    if box is None or reduction == 1:
        return box
    return CropBox(*(v / reduction for v in box))


def _reduction(box: CropBox, size: tuple[int, int] | None) -> int:
    """The largest of 2, 4 and 8 that leaves ``box`` ``size``'s pixels (1: none)."""
    if size is None:
        return 1
    most = min(box.height / size[0], box.width / size[1])
    return next((s for s in _DRAFT_SCALES if s <= most), 1)


def _draft(im: Any, box: CropBox, size: tuple[int, int]) -> int:
    """Ask a JPEG to decode at 1/2, 1/4 or 1/8 scale where ``box`` still has ``size``'s pixels; the
    reduction it will decode at (1: none; other formats ignore drafts)."""
    wanted = _reduction(box, size)
    if wanted == 1 or im.format != "JPEG":
        return 1
    width, height = im.size
    # Pillow picks the largest reduction r with size // r >= the asked size in both dimensions;
    # asking (width // wanted, height // wanted) picks `wanted` exactly, as the box's sides, so the
    # image's, are at least `wanted` pixels.
    drafted = im.draft(im.mode, (width // wanted, height // wanted))
    if drafted is None:  # several tiles (progressive scans are one tile), or drafted already
        return 1
    return int(round(width / drafted[1][2]))


def _check_range(name: str, value: Any, *, most: float | None = None) -> tuple[float, float]:
    """``value`` as a ``(low, high)`` pair of finite numbers, ``0 < low <= high`` (``<= most``)."""
    bound = "" if most is None else f" <= {most}"
    wrong = TypeError if not isinstance(value, (tuple, list)) else ValueError
    numbers = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    if numbers:
        low, high = float(value[0]), float(value[1])
        if 0 < low <= high and (most is None or high <= most):
            return low, high
    raise wrong(f"{name} must be a pair (low, high) of numbers with 0 < low <= high{bound}, "
                f"got {short_repr(value)}")


def _check_fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"crop_fraction must be a number in (0, 1], got {short_repr(value)}")
    if not 0 < value <= 1:
        raise ValueError(f"crop_fraction must be a number in (0, 1], got {value!r}")
    return float(value)


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


def _first_bytes(source: Any) -> str:
    """What a file that is no image starts with, for its error message."""
    try:
        if isinstance(source, io.BytesIO):
            head = source.getvalue()[:16]
        else:
            with open(source, "rb") as f:
                head = f.read(16)
    except OSError:
        return "it cannot be read again"
    return f"its first bytes: {head!r}" if head else "it is empty"
