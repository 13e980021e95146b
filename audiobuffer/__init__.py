"""audiobuffer: keep a PyTorch training loop fed with producer threads instead of worker processes.

A pool of producer threads decodes audio (or image) files into a bounded :class:`Buffer`; a
:class:`BufferedDataset` drains it into a standard ``DataLoader`` (``num_workers=0``); batches are
padded by :func:`pad_collate`. See the README for the whole pipeline.
"""

import logging

from .buffer import Buffer, BufferStats, payload_nbytes
from .collate import pad_collate
from .dataset import BufferedDataset, DatasetStats
from .decoders import AudioDecoder, ImageDecoder
from .errors import (
    AudioBufferError,
    BufferClosed,
    ConfigError,
    DecodeError,
    SampleError,
    SourceError,
)
from .sources import AUDIO_PATTERNS, Source, WorkItem

__version__ = "0.1.0"

__all__ = [
    "AUDIO_PATTERNS",
    "AudioBufferError",
    "AudioDecoder",
    "Buffer",
    "BufferClosed",
    "BufferStats",
    "BufferedDataset",
    "ConfigError",
    "DatasetStats",
    "DecodeError",
    "ImageDecoder",
    "SampleError",
    "Source",
    "SourceError",
    "WorkItem",
    "pad_collate",
    "payload_nbytes",
]

assert __all__ == sorted(__all__), "keep __all__ sorted"

logging.getLogger(__name__).addHandler(logging.NullHandler())
