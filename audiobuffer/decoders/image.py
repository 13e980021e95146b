"""Image decoding with Pillow: RGB, optional resize, CHW uint8 tensor.

Pillow is an optional dependency (``pip install 'audiobuffer[image]'``): it is imported when an
:class:`ImageDecoder` is made, never by ``import audiobuffer``. Pillow releases the GIL while it
decodes and resizes, so producer threads decode images in parallel.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Tuple, Union

import numpy as np

from ..errors import DecodeError
from ._common import ItemLike, as_item, as_tensor, sample_fields

__all__ = ["ImageDecoder"]

_RESAMPLE = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")


class ImageDecoder:
    """Decode an image file into a ``(3, H, W)`` uint8 tensor.

    The sample dict holds ``image``, ``path``, ``index``, and the ``label`` and ``label_name`` when the
    source has labels, plus a manifest's other columns.

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
    """

    def __init__(self, size: Optional[Union[int, Tuple[int, int]]] = None, *,
                 resample: Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"] = "bilinear"
                 ) -> None:
        try:
            from PIL import Image
        except ImportError as exc:
            raise ImportError("ImageDecoder needs Pillow: pip install 'audiobuffer[image]'") from exc
        if size is not None:
            pair = (size, size) if isinstance(size, int) else tuple(size)
            if len(pair) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in pair):
                raise ValueError(f"size must be None, an int >= 1 or (height, width), got {size!r}")
            size = pair  # type: ignore[assignment]
        if resample not in _RESAMPLE:
            raise ValueError(f"resample must be one of {_RESAMPLE}, got {resample!r}")
        self._filter = getattr(Image.Resampling, resample.upper())
        self.size: Optional[Tuple[int, int]] = size  # type: ignore[assignment]
        self.resample = resample

    def __repr__(self) -> str:
        return f"ImageDecoder(size={self.size}, resample={self.resample!r})"

    def __call__(self, item: ItemLike) -> dict[str, Any]:
        from PIL import Image  # imported in __init__ already; kept out of the instance so it pickles

        item = as_item(item)
        try:
            with Image.open(item.path) as im:
                im = im.convert("RGB")
                if self.size is not None and im.size != (self.size[1], self.size[0]):
                    im = im.resize((self.size[1], self.size[0]), self._filter)
                pixels = np.asarray(im)
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise DecodeError(f"cannot decode {item.path!r}: {exc}", path=item.path) from exc
        sample = sample_fields(item)
        sample["image"] = as_tensor(np.ascontiguousarray(pixels.transpose(2, 0, 1)))
        return sample
