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
from .device import DevicePrefetcher, DeviceTensorLoader
from .errors import (
    AudioBufferError,
    BufferClosed,
    ConfigError,
    DecodeError,
    ResumeError,
    SampleError,
    SourceError,
    StallError,
)
from .slots import BatchSlotLoader, SlotStats
from .sources import AUDIO_PATTERNS, IMAGE_PATTERNS, Source, WorkItem

__version__ = "0.1.0"

__all__ = [
    "AUDIO_PATTERNS",
    "AudioBufferError",
    "AudioDecoder",
    "BatchSlotLoader",
    "Buffer",
    "BufferClosed",
    "BufferStats",
    "BufferedDataset",
    "ConfigError",
    "DatasetStats",
    "DecodeError",
    "DevicePrefetcher",
    "DeviceTensorLoader",
    "IMAGE_PATTERNS",
    "ImageDecoder",
    "ResumeError",
    "SampleError",
    "SlotStats",
    "Source",
    "SourceError",
    "StallError",
    "WorkItem",
    "pad_collate",
    "payload_nbytes",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
