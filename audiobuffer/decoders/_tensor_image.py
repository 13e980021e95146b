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

Header. A JPEG's size, colour space and EXIF orientation are read without Pillow (whose header
parse is Python, holding the GIL the other producers wait on): simplejpeg reads the frame header,
:func:`jpeg_header` the first APP1 Exif segment's IFD0 orientation. Anything it does not read
plainly (no simplejpeg, CMYK, an XMP packet, which Pillow also reads an orientation from, two Exif
segments, a TIFF header not classic TIFF's, an orientation not a SHORT or behind an entry whose
data lies past the segment (Pillow stops reading there), marker bytes out of place,
a marker without a length before the first scan, a JFIF, Adobe, ICC or Photoshop segment cut
shorter than Pillow's parser reads, an image past Pillow's decompression-bomb limit) goes to
Pillow's ``Image.open``, which reads it as the Pillow backend does (or refuses it).

Resize. ``torch.nn.functional.interpolate`` with ``antialias=True`` ("nearest-exact" without) on a
``(1, 3, h, w)`` view of the ``(h, w, 3)`` array: channels-last memory, torch's vectorised uint8
path, no conversion to float. The crop, the flip and the layout are numpy views, as for the Pillow
backend, and the one copy is the sample's: torch runs only the resize. The box is rounded to whole
pixels of the decoded image (as torchvision's crops are) and only its pixels take part. The
results differ from Pillow's resize by a few levels where the filters' rounding differs; the boxes
and flips are the same draws.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from .image import CropBox

__all__ = ["TORCH_RESAMPLE", "JpegHeader", "decode_jpeg", "jpeg_header", "resized_crop", "upright"]

#: The resize filters of the torch backend: interpolate's mode, and whether it antialiases.
TORCH_RESAMPLE = {"nearest": ("nearest-exact", False), "bilinear": ("bilinear", True),
                  "bicubic": ("bicubic", True)}


#: The colour spaces of a JPEG's frame that simplejpeg turns into RGB as Pillow does (its modes
#: RGB and L); CMYK and YCCK go to Pillow.
_TURBO_SPACES = ("YCbCr", "Gray", "RGB")
_EXIF = b"Exif\x00\x00"
_XMP = b"http://ns.adobe.com/xap/1.0/\x00"
_ORIENTATION_TAG = 0x0112
#: The TIFF headers of an Exif segment read here (classic TIFF, its magic 42 in its byte order);
#: Pillow reads no orientation from others, or reads them otherwise (BigTIFF).
_TIFF_ORDERS = {b"II*\x00": "little", b"MM\x00*": "big"}
#: Markers without a length (TEM, RSTn, SOI, EOI; 0x00 is a stuffed byte): Pillow and libjpeg
#: step over them, so a length read after one would be the next segment's bytes.
_NO_LENGTH = frozenset((0x00, 0x01, *range(0xD0, 0xDA)))
_SHORT = 3  # the TIFF field type of the orientation
#: The bytes of one value of each TIFF field type Pillow reads (other types it skips).
_TIFF_UNITS = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4,
               16: 8}


class JpegHeader(NamedTuple):
    """What :func:`jpeg_header` reads: the stored size and the EXIF orientation (1 to 8; 1 when
    there is none)."""

    height: int
    width: int
    orientation: int


def _import_simplejpeg() -> Any:
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


#: simplejpeg, or ``None`` where it is not installed: imported with this module, not by the first
#: producer to decode (the others would wait on its import)
_TURBO = _import_simplejpeg()


def decode_jpeg(raw: bytes, height: int, width: int, reduction: int) -> np.ndarray | None:
    """The ``(h, w, 3)`` uint8 RGB pixels of a JPEG of ``height`` x ``width`` (as stored) decoded at
    ``1 / reduction`` of its sides; ``None`` where simplejpeg is missing or refuses the file (Pillow
    then reads it)."""
    turbo = _TURBO
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


def jpeg_header(raw: bytes) -> JpegHeader | None:
    """The header of a JPEG that simplejpeg decodes to RGB, read without Pillow; ``None`` for
    anything else, which Pillow then reads (NOTE [ The torch backend ], Header)."""
    turbo = _TURBO
    if turbo is None or raw[:3] != b"\xff\xd8\xff":
        return None
    orientation = _exif_orientation(raw)
    if orientation is None:
        return None
    try:
        height, width, space, _ = turbo.decode_jpeg_header(raw)
    except ValueError:
        return None
    if space not in _TURBO_SPACES or _bomb(int(height) * int(width)):
        return None
    return JpegHeader(int(height), int(width), orientation)


def _bomb(pixels: int) -> bool:
    """Whether Pillow would warn about or refuse an image of ``pixels`` (a decompression bomb)."""
    from PIL import Image

    return Image.MAX_IMAGE_PIXELS is not None and pixels > Image.MAX_IMAGE_PIXELS


def _exif_orientation(raw: bytes) -> int | None:
    """The orientation of the one Exif segment before the first scan, 1 without one; ``None`` where
    the segments are not plain (an XMP packet, two Exif segments, bytes out of place, a marker
    without a length)."""
    at, found = 2, None
    while at + 4 <= len(raw):
        if raw[at] != 0xFF:
            return None
        marker = raw[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0xDA:  # the first scan: the segments Pillow reads are behind
            return 1 if found is None else _tiff_orientation(found)
        if marker in _NO_LENGTH:
            return None
        length = int.from_bytes(raw[at + 2:at + 4], "big")
        if length < 2:
            return None
        payload = raw[at + 4:at + 2 + length]
        if marker == 0xE1 and payload.startswith(_EXIF):
            if found is not None:
                return None
            found = payload[len(_EXIF):]
        elif (marker == 0xE1 and payload.startswith(_XMP)) or _pillow_may_refuse(marker, payload):
            return None
        at += 2 + length
    return None


def _pillow_may_refuse(marker: int, payload: bytes) -> bool:
    """Whether Pillow's header parser may raise on this segment, one cut short that libjpeg passes
    over (Pillow then reads the file, and refuses it as under the Pillow backend)."""
    if (marker, payload[:4]) == (0xE0, b"JFIF") or (marker, payload[:5]) == (0xEE, b"Adobe"):
        return len(payload) < 7  # the version, bytes 5-6
    if marker == 0xE2 and payload.startswith(b"ICC_PROFILE\x00"):
        return len(payload) < 14  # the number of chunks, byte 13
    if marker == 0xED and payload.startswith(b"Photoshop 3.0\x00"):
        at = 14  # resources: "8BIM", a code, the name's length, the name, a size, the data
        while payload[at:at + 4] == b"8BIM":
            if at + 6 > len(payload):  # the code cut short: Pillow stops there
                return False
            at += 6
            if at >= len(payload):  # the name's length missing: Pillow raises
                return True
            at += 1 + payload[at]
            at += (at & 1) + 4
            if at > len(payload):  # the size cut short: Pillow stops there
                return False
            at += int.from_bytes(payload[at - 4:at], "big")
            at += at & 1
    return False


def _tiff_orientation(tiff: bytes) -> int | None:
    """The orientation tag of the first IFD of ``tiff`` (1 without one), or ``None`` (also for a
    header other than classic TIFF's)."""
    order: Any = _TIFF_ORDERS.get(tiff[:4])
    if order is None or len(tiff) < 8:
        return None
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd + 2 > len(tiff):
        return None
    for n in range(int.from_bytes(tiff[ifd:ifd + 2], order)):
        entry = tiff[ifd + 2 + 12 * n:ifd + 14 + 12 * n]
        if len(entry) < 12:
            return None
        kind, count = int.from_bytes(entry[2:4], order), int.from_bytes(entry[4:8], order)
        if int.from_bytes(entry[:2], order) == _ORIENTATION_TAG:
            if kind != _SHORT or count != 1:
                return None
            return int.from_bytes(entry[8:10], order)
        size = count * _TIFF_UNITS.get(kind, 0)
        if size > 4 and int.from_bytes(entry[8:12], order) + size > len(tiff):
            return None  # data out of the segment: Pillow stops reading the IFD there
    return 1


def upright(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """``pixels`` (``(h, w, 3)``) turned as Pillow's ``ImageOps.exif_transpose`` turns an image of
    that EXIF ``orientation`` (1 to 8), a contiguous copy."""
    if orientation in (5, 6, 7, 8):
        pixels = pixels.transpose(1, 0, 2)
    step = {2: (1, -1), 3: (-1, -1), 4: (-1, 1), 5: (1, 1), 6: (1, -1), 7: (-1, -1),
            8: (-1, 1)}.get(orientation, (1, 1))
    # a copy: ascontiguousarray keeps the negative stride of a mirrored side of one pixel (numpy
    # calls it contiguous), which torch.from_numpy refuses
    return np.array(pixels[::step[0], ::step[1]], order="C")


def _pixel_box(box: CropBox, height: int, width: int) -> tuple[int, int, int, int]:
    """``box`` rounded to whole pixels of a ``height`` x ``width`` image, inside it, >= 1 pixel."""
    top = min(max(0, int(round(box.top))), height - 1)
    left = min(max(0, int(round(box.left))), width - 1)
    h = min(max(1, int(round(box.height))), height - top)
    w = min(max(1, int(round(box.width))), width - left)
    return top, left, h, w


def resized_crop(pixels: np.ndarray, box: CropBox | None, size: tuple[int, int] | None,
                 resample: str) -> np.ndarray:
    """``box`` of the upright ``(h, w, 3)`` ``pixels`` (the whole image: ``None``) resized to
    ``size`` (``None``: not resized): an ``(H, W, 3)`` uint8 array, ``pixels`` itself where
    nothing is cropped or resized (the caller copies an array it may not write).

    The views are numpy's and torch runs one operation, the resize (each torch call lets the GIL go
    and takes it back, which the other producers wait on)."""
    if box is not None:
        top, left, h, w = _pixel_box(box, pixels.shape[0], pixels.shape[1])
        pixels = pixels[top:top + h, left:left + w]
    if size is None or pixels.shape[:2] == size:
        return pixels if box is None else pixels.copy()  # a crop: not a view of the whole
    import torch

    mode, antialias = TORCH_RESAMPLE[resample]
    if not pixels.flags.writeable:  # Pillow's buffer: a tensor needs an array it may write
        pixels = pixels.copy()
    image = torch.from_numpy(pixels.transpose(2, 0, 1)[np.newaxis])  # channels-last memory
    resized = torch.nn.functional.interpolate(image, size=size, mode=mode, antialias=antialias)
    return resized.numpy()[0].transpose(1, 2, 0)  # channels last in, channels last out: C order
