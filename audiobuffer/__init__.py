"""audiobuffer: keep a PyTorch training loop fed with producer threads instead of worker processes.

A pool of producer threads decodes audio (or image) files into a bounded :class:`Buffer`; a
:class:`BufferedDataset` drains it into a standard ``DataLoader`` (``num_workers=0``); batches are
padded by :func:`pad_collate`. :class:`IsolatedLoader` runs the same producers in one helper process,
so that the training thread's GIL stays free. See the README for the whole pipeline.

Names are imported on first use (PEP 562): ``import audiobuffer`` does not import torch, so the
isolated loader's helper process, which imports this package, runs without it.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "AUDIO_PATTERNS": ".sources",
    "AudioBufferError": ".errors",
    "AudioDecoder": ".decoders",
    "BatchSlotLoader": ".loaders.slots",
    "Buffer": ".buffer",
    "BufferClosed": ".errors",
    "BufferStats": ".buffer",
    "BufferedDataset": ".loaders.dataset",
    "ConfigError": ".errors",
    "DatasetStats": ".loaders.dataset",
    "DecodeError": ".errors",
    "DecodeJpeg": ".jpeg",
    "DevicePrefetcher": ".loaders.device",
    "DeviceTensorLoader": ".loaders.device",
    "HelperError": ".errors",
    "IMAGE_PATTERNS": ".sources",
    "ImageDecoder": ".decoders",
    "IsolatedLoader": ".loaders.isolated.loader",
    "Normalize": ".normalize",
    "ProducerError": ".errors",
    "ResumeError": ".errors",
    "SampleError": ".errors",
    "SlotStats": ".loaders.slots",
    "Source": ".sources",
    "SourceError": ".errors",
    "StallError": ".errors",
    "StorageError": ".errors",
    "WorkItem": ".sources",
    "make_demo_corpus": ".cli.demo",
    "merge_states": ".engine.resize",
    "mix": ".sources",
    "pad_collate": ".collate",
    "payload_nbytes": ".buffer",
    "probe_budgets": ".probe",
}

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
    "DecodeJpeg",
    "DevicePrefetcher",
    "DeviceTensorLoader",
    "HelperError",
    "IMAGE_PATTERNS",
    "ImageDecoder",
    "IsolatedLoader",
    "Normalize",
    "ProducerError",
    "ResumeError",
    "SampleError",
    "SlotStats",
    "Source",
    "SourceError",
    "StallError",
    "StorageError",
    "WorkItem",
    "make_demo_corpus",
    "merge_states",
    "mix",
    "pad_collate",
    "payload_nbytes",
    "probe_budgets",
]
assert set(__all__) == set(_EXPORTS), "__all__ and _EXPORTS name the same things"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'audiobuffer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from .buffer import Buffer, BufferStats, payload_nbytes
    from .cli.demo import make_demo_corpus
    from .collate import pad_collate
    from .decoders import AudioDecoder, ImageDecoder
    from .engine.resize import merge_states
    from .errors import (
        AudioBufferError,
        BufferClosed,
        ConfigError,
        DecodeError,
        HelperError,
        ProducerError,
        ResumeError,
        SampleError,
        SourceError,
        StallError,
        StorageError,
    )
    from .jpeg import DecodeJpeg
    from .loaders.dataset import BufferedDataset, DatasetStats
    from .loaders.device import DevicePrefetcher, DeviceTensorLoader
    from .loaders.isolated.loader import IsolatedLoader
    from .loaders.slots import BatchSlotLoader, SlotStats
    from .normalize import Normalize
    from .probe import probe_budgets
    from .sources.mixture import mix
    from .sources.source import AUDIO_PATTERNS, IMAGE_PATTERNS, Source, WorkItem

logging.getLogger(__name__).addHandler(logging.NullHandler())
