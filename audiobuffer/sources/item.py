"""The unit of work a producer hands its decoder (:class:`WorkItem`), the clock of its reads
(:class:`ReadClock`), and the file patterns a folder source matches by default. No I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.random  # noqa: F401 - else imported by the first draw, 5 ms of the first batch

__all__ = ["AUDIO_PATTERNS", "IMAGE_PATTERNS", "ReadClock", "WorkItem"]

#: Glob patterns a directory source matches by default: the audio containers libsndfile reads.
AUDIO_PATTERNS: tuple[str, ...] = (
    "**/*.wav", "**/*.flac", "**/*.ogg", "**/*.opus", "**/*.mp3", "**/*.aiff", "**/*.aif", "**/*.sph",
)
#: Glob patterns an :class:`~audiobuffer.ImageDecoder` reads from a directory by default: the common
#: formats Pillow decodes, with the upper-case suffixes cameras write.
IMAGE_PATTERNS: tuple[str, ...] = (
    "**/*.png", "**/*.jpg", "**/*.jpeg", "**/*.bmp", "**/*.gif", "**/*.tif", "**/*.tiff", "**/*.webp",
    "**/*.PNG", "**/*.JPG", "**/*.JPEG",
)


@dataclass(frozen=True, init=False)
class WorkItem:
    """One unit of work for a decoder: a file, its label and metadata, and where it sits in the epoch.

    Attributes:
        index: the item's position in the source (stable across epochs and shards).
        path: the file to decode.
        label: the class index of the label (into ``Source.classes``), or ``None`` without labels.
        label_name: the label as found (folder name, regex match or manifest value), or ``None``.
        fields: the other columns of a manifest row (empty for directories and file lists; ``None``
            given to the constructor means empty).
        epoch: the epoch this item belongs to.
        seed: the dataset's seed.
        seq: the item's position in this shard's order for this epoch (0, 1, 2, ...).
        read: ``None`` (decoders open ``path``), or a callable returning the file's bytes (a member
            of a tar shard, an object in remote storage), called by the decoder in its thread.
        segment: ``None`` (the whole file), or the part of the file this item is, as ``(start,
            duration)`` in seconds (``duration`` ``None``: to the end): an utterance in a long
            recording. :class:`~audiobuffer.AudioDecoder` reads only that part, and crops within it.
    """

    index: int
    path: str
    label: int | None = None
    label_name: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    epoch: int = 0
    seed: int = 0
    seq: int = 0
    read: Callable[[], bytes] | None = field(default=None, compare=False, repr=False)
    segment: tuple[float, float | None] | None = None

    def __init__(self, index: int, path: str, label: int | None = None, label_name: str | None = None,
                 fields: Mapping[str, Any] | None = None, epoch: int = 0, seed: int = 0, seq: int = 0,
                 read: Callable[[], bytes] | None = None, segment: tuple[float, float | None] | None = None
                 ) -> None:
        # One item is made per sample, in the consumer's thread when it decodes inline. A frozen
        # dataclass's own __init__ sets each field through object.__setattr__; writing the instance
        # dict directly gives the same object for a fraction of the time (BENCHMARKS.md).
        attrs = self.__dict__
        attrs["index"] = index
        attrs["path"] = path
        attrs["label"] = label
        attrs["label_name"] = label_name
        attrs["fields"] = {} if fields is None else fields
        attrs["epoch"] = epoch
        attrs["seed"] = seed
        attrs["seq"] = seq
        attrs["read"] = read
        attrs["segment"] = segment

    def rng(self) -> np.random.Generator:
        """A random generator seeded by (seed, epoch, index).

        Random choices made with it (a random crop, say) are reproducible whatever thread decodes
        the item and in whatever order.
        """
        return np.random.default_rng([self.seed, self.epoch, self.index])


class ReadClock:
    """Seconds producers spent waiting for bytes (reads of members, objects and shard blocks). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds

    def timed(self, read: Callable[[], bytes]) -> Callable[[], bytes]:
        """``read``, its time counted here."""
        def timed_read() -> bytes:
            start = time.perf_counter()
            try:
                return read()
            finally:
                self.add(time.perf_counter() - start)
        return timed_read
