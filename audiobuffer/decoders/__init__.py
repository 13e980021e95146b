"""Decoders: callables from one :class:`~audiobuffer.WorkItem` to one sample dict.

Decoders know nothing of threads or buffers; they hold no mutable state, so one instance serves every
producer thread at once. Any callable with the same shape works in their place.
"""

from .audio import AudioDecoder
from .image import ImageDecoder

__all__ = ["AudioDecoder", "ImageDecoder"]
