"""JPEG decoding on the device: a batch of :class:`~audiobuffer.decoders.image.EncodedImage` (a
JPEG's bytes, its crop box and flip) decoded in one call, cropped, resized and flipped there.

The resize is Pillow's, written with torch: the same filter taps, the same fixed-point rounding,
the same order of passes (NOTE [ Pillow's resize on the device ]), so an image decoded to the
same pixels comes out as :class:`~audiobuffer.ImageDecoder` makes it on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .decoders._common import describe
from .decoders.image import CropBox, EncodedImage
from .errors import DecodeError

__all__ = ["Decode", "DecodeJpeg", "resized_crop", "torchvision_decode"]

#: ``decode(data, device)``: JPEG bytes (1-D uint8 CPU tensors) to ``(3, H, W)`` uint8 RGB
#: tensors on ``device``, in the stored orientation, one per input.
Decode = Callable[[list[torch.Tensor], torch.device], Sequence[torch.Tensor]]

# NOTE [ Pillow's resize on the device ]
# ======================================
# Pillow resizes in two passes, each a weighted sum of the taps of a filter (triangle for
# bilinear) stretched by the scale when shrinking (an antialiased resize). The horizontal pass
# runs first, except (Pillow 13 on) where the height shrinks by more than twice as many pixels
# as the width does.
# The box's corners are single-precision floats. Each output pixel's taps are found as
# `precompute_coeffs` in Pillow's Resample.c does, their weights normalised to sum to 1 and
# turned into integers of 22 fractional bits; a pass sums pixel * weight, adds half a unit and
# shifts right, clipping to 0..255, so the first pass's output is rounded to uint8 before the
# second pass reads it. Here each pass gathers the taps and sums them in int32, as Pillow does
# (the sums fit: 255 times the positive weights): the result is Pillow's to the bit, on any
# device. "nearest" is Pillow's affine scaling: the pixel under each output pixel's centre.
_BITS = 22  # PRECISION_BITS in Pillow's Resample.c: 32 - 8 (a pixel) - 2 (headroom)
_ONE = float(1 << _BITS)
_HALF = 1 << (_BITS - 1)
_F32_054 = float(np.float32(0.54))  # Pillow's hamming window uses float constants
_F32_046 = float(np.float32(0.46))


def _box_filter(x: np.ndarray) -> np.ndarray:
    return ((x > -0.5) & (x <= 0.5)).astype(np.float64)


def _bilinear_filter(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def _hamming_filter(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    px = x * math.pi
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.sin(px) / px * (_F32_054 + _F32_046 * np.cos(px / 1.0))
    return np.where(x == 0.0, 1.0, np.where(x >= 1.0, 0.0, w))


def _bicubic_filter(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _sinc(x: np.ndarray) -> np.ndarray:
    px = x * math.pi
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x == 0.0, 1.0, np.sin(px) / px)


def _lanczos_filter(x: np.ndarray) -> np.ndarray:
    return np.where((x >= -3.0) & (x < 3.0), _sinc(x) * _sinc(x / 3), 0.0)


#: Each filter and its support, as Pillow defines them.
_FILTERS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float]] = {
    "box": (_box_filter, 0.5), "bilinear": (_bilinear_filter, 1.0),
    "hamming": (_hamming_filter, 1.0), "bicubic": (_bicubic_filter, 2.0),
    "lanczos": (_lanczos_filter, 3.0),
}


def _taps(in_size: int, lo: float, hi: float, out_size: int,
          resample: str) -> tuple[np.ndarray, np.ndarray]:
    """Each output pixel's source pixels and integer weights along one axis, ``(out_size, k)``
    each (unused taps: weight 0), as Pillow computes them.

    NOTE [ Pillow's resize on the device ].
    """
    in0, in1 = np.float32(lo), np.float32(hi)
    scale = float(np.float32(in1 - in0)) / out_size
    if resample == "nearest":  # ImagingScaleAffine: the centre, stepped by adding the scale
        steps = np.full(out_size, scale)
        steps[0] = float(in0) + scale * 0.5
        index = np.minimum(np.floor(np.cumsum(steps)), in_size - 1).astype(np.int64)[:, None]
        return index, np.full((out_size, 1), _ONE)
    filt, support = _FILTERS[resample]
    filterscale = max(scale, 1.0)
    support = support * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = float(in0) + (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum(np.floor(center - support + 0.5), 0).astype(np.int64)
    count = np.minimum(np.floor(center + support + 0.5), in_size).astype(np.int64) - xmin
    taps = np.arange(ksize)
    index = xmin[:, None] + taps[None, :]
    used = taps[None, :] < count[:, None]
    weight = np.where(used, filt((index - center[:, None] + 0.5) * (1.0 / filterscale)), 0.0)
    total = np.zeros(out_size)
    for t in range(ksize):  # summed in Pillow's order, tap after tap
        total = total + weight[:, t]
    weight = np.where(total[:, None] != 0.0, weight / np.where(total == 0.0, 1.0, total)[:, None],
                      weight)
    fixed = np.where(weight < 0, np.trunc(-0.5 + weight * _ONE), np.trunc(0.5 + weight * _ONE))
    return np.where(used, index, xmin[:, None]), fixed


def _vertical_first(height: int, width: int, size: tuple[int, int]) -> bool:
    """Whether Pillow resizes ``height`` x ``width`` to ``size`` vertical pass first."""
    shrink = height - size[0]
    return _PILLOW_ORDERS and shrink > 0 and shrink > (width - size[1]) * 2


def _pillow_orders() -> bool:
    """Whether the Pillow here picks the order of its passes (13 on; without Pillow: yes)."""
    try:
        from PIL import __version__
    except ImportError:
        return True
    major = __version__.split(".")[0]
    return not major.isdigit() or int(major) >= 13


_PILLOW_ORDERS = _pillow_orders()


def _pass(image: torch.Tensor, index: np.ndarray, weight: np.ndarray, dim: int) -> torch.Tensor:
    """One pass along ``dim`` of a uint8 image: Pillow's sums, rounded and clipped to uint8."""
    device = image.device
    taps = torch.from_numpy(index).to(device)
    weights = torch.from_numpy(weight.astype(np.int32)).to(device)
    out_size, k = taps.shape
    gathered = image.index_select(dim, taps.reshape(-1))
    shape = list(image.shape)
    shape[dim:dim + 1] = [out_size, k]
    gathered = gathered.reshape(shape)
    if dim != image.dim() - 1:  # the taps last, to weigh and sum them
        gathered = gathered.movedim(dim + 1, -1)
        weights_view = weights.reshape(out_size, 1, k)
    else:
        weights_view = weights
    summed = (gathered.to(torch.int32) * weights_view).sum(-1, dtype=torch.int32)
    return ((summed + _HALF) >> _BITS).clamp_(0, 255).to(torch.uint8)


def resized_crop(image: torch.Tensor, box: CropBox, size: tuple[int, int], *,
                 resample: str = "bilinear", crop_first: bool = True) -> torch.Tensor:
    """``box`` of a ``(C, H, W)`` uint8 image resized to ``size`` as Pillow resizes it, on the
    image's device: ``(C, size[0], size[1])`` uint8.

    ``crop_first=True`` is Pillow's ``crop(box)`` then ``resize(size)`` (only the box's pixels
    take part; the box must be whole pixels); ``False`` is ``resize(size, box=box)``, whose filter
    reaches past a fractional box's edges into the image.
    """
    if resample not in _FILTERS and resample != "nearest":
        raise ValueError(f"resample must be one of {', '.join(['nearest', *_FILTERS])}, "
                         f"got {resample!r}")
    height, width = image.shape[-2:]
    if crop_first:
        top, left, h, w = (int(v) for v in box)
        image = image[..., top:top + h, left:left + w]
        y_taps = _taps(h, 0.0, float(h), size[0], resample)
        x_taps = _taps(w, 0.0, float(w), size[1], resample)
    else:
        y_taps = _taps(height, box.top, box.top + box.height, size[0], resample)
        x_taps = _taps(width, box.left, box.left + box.width, size[1], resample)
    whole = crop_first or tuple(box) == (0, 0, height, width)
    if whole and tuple(image.shape[-2:]) == tuple(size):
        return image.contiguous()  # Pillow copies an image resized to its own size
    across, down = image.dim() - 1, image.dim() - 2
    if _vertical_first(image.shape[-2], image.shape[-1], size):
        return _pass(_pass(image, *y_taps, dim=down), *x_taps, dim=across)
    first, last = int(y_taps[0].min()), int(y_taps[0].max()) + 1  # the rows the taps read
    narrow = _pass(image[..., first:last, :], *x_taps, dim=across)
    return _pass(narrow, y_taps[0] - first, y_taps[1], dim=down)


_ORIENT: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {  # EXIF orientation -> upright
    2: lambda t: t.flip(-1),
    3: lambda t: t.flip(-1, -2),
    4: lambda t: t.flip(-2),
    5: lambda t: t.transpose(-1, -2),
    6: lambda t: torch.rot90(t, -1, (-2, -1)),
    7: lambda t: t.transpose(-1, -2).flip(-1, -2),
    8: lambda t: torch.rot90(t, 1, (-2, -1)),
}


def torchvision_decode() -> Decode:
    """``torchvision.io.decode_jpeg`` as a :data:`Decode`: on CUDA, one batched nvjpeg call.

    Raises:
        ImportError: torchvision is not installed, or does not load with this torch.
    """
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception as exc:  # ImportError, or a build for another torch (OSError, RuntimeError)
        raise ImportError(
            f"DecodeJpeg decodes with torchvision.io.decode_jpeg (nvjpeg on a GPU), which does not "
            f"load here ({describe(exc)}): install torchvision, the build that matches this torch "
            f"{torch.__version__} (https://pytorch.org/get-started/locally/), or pass decode=; or "
            f"decode on the CPU with ImageDecoder(jpeg='host')") from exc

    def decode(data: list[torch.Tensor], device: torch.device) -> Sequence[torch.Tensor]:
        out = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        return [out] if isinstance(out, torch.Tensor) else out

    return decode


class DecodeJpeg:
    """Decode a batch's JPEGs on the device, then crop, resize and flip them there.

    The batched step for :class:`~audiobuffer.ImageDecoder` made with ``jpeg="device"``, whose
    producers read each JPEG's bytes and header, draw its crop box and flip as the CPU path does,
    and hand over an :class:`~audiobuffer.decoders.image.EncodedImage`. This decodes every one in
    one call (``torchvision.io.decode_jpeg``: nvjpeg, batched, on a GPU), turns each upright as
    its EXIF orientation says, resizes its box to the decoder's ``size`` with Pillow's filter and
    rounding (NOTE [ Pillow's resize on the device ]), flips it, and stacks the batch: the
    ``(B, 3, H, W)`` uint8 (``layout="hwc"``: ``(B, H, W, 3)``) that ``jpeg="host"`` would give.
    Images the producers decoded (not JPEG, or CMYK) are moved to the device as they are.

    Called with a batch dict it returns a new dict with ``key`` decoded; with a list of images
    (or a tensor: a batch already decoded) it returns the tensor. Give it to
    :class:`~audiobuffer.DevicePrefetcher` as ``transform=`` and the decode runs in the prefetch
    thread, on its side stream, during the previous step. Thread safety: holds no state that a
    call changes.

    Example:
        >>> decoder = ImageDecoder(224, crop="random_resized", jpeg="device")  # doctest: +SKIP
        >>> data = BufferedDataset(root, decoder)  # doctest: +SKIP
        >>> loader = DataLoader(data, 64, collate_fn=image_collate)  # doctest: +SKIP
        >>> step = DecodeJpeg("cuda")  # doctest: +SKIP
        >>> for batch in DevicePrefetcher(loader, "cuda", transform=step):  # doctest: +SKIP
        ...     logits = model(normalize(batch["image"]))

    Args:
        device: where the images are decoded and returned.
        key: the batch key that holds the images.
        decode: ``decode(data, device)``, JPEG bytes (1-D uint8 CPU tensors) to ``(3, H, W)``
            uint8 RGB tensors on ``device`` in the stored orientation; default
            :func:`torchvision_decode`.

    Raises:
        ImportError: no ``decode`` is given and torchvision does not load.
    """

    def __init__(self, device: str | torch.device = "cuda", *, key: str = "image",
                 decode: Decode | None = None) -> None:
        if not isinstance(key, str):
            raise TypeError(f"key must be a str (the batch key of the images), got {key!r}")
        if decode is not None and not callable(decode):
            raise TypeError(f"decode must be a callable decode(data, device), got {decode!r}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} was asked for, but CUDA is not available "
                             f"here; use 'cpu' (with decode=) or ImageDecoder(jpeg='host')")
        self.key = key
        self.decode = torchvision_decode() if decode is None else decode

    def __repr__(self) -> str:
        name = getattr(self.decode, "__qualname__", type(self.decode).__name__)
        return f"DecodeJpeg(device={str(self.device)!r}, key={self.key!r}, decode={name})"

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, Mapping):
            if self.key not in batch:
                raise KeyError(f"DecodeJpeg: the batch has no {self.key!r} (keys: "
                               f"{sorted(batch)}); set key=")
            out = dict(batch)
            out[self.key] = self.images(batch[self.key])
            return out
        return self.images(batch)

    def images(self, images: Any) -> torch.Tensor:
        """``images`` (a list of :class:`EncodedImage` and decoded images, or a tensor of decoded
        images) as one uint8 tensor on the device.

        Raises:
            DecodeError: a JPEG does not decode, or decodes to another size than its header's
                (the error names the file).
            ValueError: the images do not come out at one shape.
        """
        if isinstance(images, torch.Tensor):
            return images.to(self.device)
        if not isinstance(images, (list, tuple)) or not images:
            raise TypeError(f"DecodeJpeg takes a non-empty list of images (image_collate's "
                            f"batch['image'] with ImageDecoder(jpeg='device')), got "
                            f"{type(images).__name__}")
        encoded = [i for i, e in enumerate(images) if isinstance(e, EncodedImage)]
        decoded = dict(zip(encoded, self._decode([images[i] for i in encoded])))
        out: list[torch.Tensor] = []
        for i, entry in enumerate(images):
            image = _finish(decoded[i], entry) if i in decoded else torch.as_tensor(entry).to(
                self.device)
            if out and image.shape != out[0].shape:
                raise ValueError(f"DecodeJpeg: the batch's images differ in shape: "
                                 f"{tuple(out[0].shape)} and {tuple(image.shape)} (item "
                                 f"{_name(entry)}); give ImageDecoder a size")
            out.append(image)
        return torch.stack(out)

    def _decode(self, encoded: list[EncodedImage]) -> Sequence[torch.Tensor]:
        """Every JPEG decoded in one call; on a failure, each alone, to name the file."""
        if not encoded:
            return []
        data = [torch.from_numpy(e.data) for e in encoded]
        try:
            images = self.decode(data, self.device)
        except Exception as exc:
            for entry, one in zip(encoded, data):
                try:
                    self.decode([one], self.device)
                except Exception as alone:
                    raise DecodeError(f"cannot decode {entry.path!r} on {self.device}: "
                                      f"{describe(alone)}", path=entry.path) from alone
            paths = [e.path for e in encoded]
            raise DecodeError(f"cannot decode a batch of {len(encoded)} JPEGs on {self.device} "
                              f"(each decodes alone): {describe(exc)}; files {paths[:4]}"
                              f"{' ...' if len(paths) > 4 else ''}",
                              path=paths[0]) from exc
        if len(images) != len(encoded):
            raise ValueError(f"decode returned {len(images)} images for {len(encoded)} JPEGs")
        return images


def _finish(image: torch.Tensor, entry: EncodedImage) -> torch.Tensor:
    """A decoded JPEG turned upright, its box resized, flipped and laid out as its decoder says."""
    if (not isinstance(image, torch.Tensor) or image.dtype != torch.uint8
            or tuple(image.shape) != (3, entry.height, entry.width)):
        got = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise DecodeError(f"{entry.path!r} decoded to {got}, not the uint8 (3, {entry.height}, "
                          f"{entry.width}) its JPEG header says", path=entry.path)
    turn = _ORIENT.get(entry.orientation)
    if turn is not None:
        image = turn(image)
    image = resized_crop(image, entry.box, entry.size, resample=entry.resample,
                         crop_first=entry.crop_first)
    if entry.flip:
        image = image.flip(-1)
    return image.permute(1, 2, 0) if entry.layout == "hwc" else image


def _name(entry: Any) -> str:
    return repr(entry.path) if isinstance(entry, EncodedImage) else type(entry).__name__
