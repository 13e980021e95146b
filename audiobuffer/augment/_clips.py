"""The recordings an augmentation mixes in (noise, room impulse responses): :class:`Clips`, any
source audiobuffer reads, decoded at the rate of the audio they are mixed into.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._checks import short_repr
from ..decoders.audio import AudioDecoder
from ..errors import SourceError
from ..sources.item import AUDIO_PATTERNS
from ..sources.source import Source

__all__ = ["Clips"]

#: Decoded clips a :class:`Clips` keeps (least recently used out first).
_CACHED = 32


class Clips:
    """The items of a source, decoded to mono float32 at a given rate, a few kept decoded.

    The source (a folder, a file list, a manifest, an ``index.json`` of shards, local or remote) is
    listed when the :class:`Clips` is made, so that a wrong one fails there; a pickled copy carries
    its description only and lists it again on first use, so an ``IsolatedLoader``'s helper lists
    and reads it there.

    Thread safety: any thread may call :meth:`clip`; the listing happens once.
    """

    def __init__(
        self, name: str, source: Any, *, storage_options: Mapping[str, Any] | None = None
    ) -> None:
        if isinstance(source, Source):
            pass
        elif isinstance(source, (str, os.PathLike)):
            source = os.fspath(source)
        elif (
            isinstance(source, Sequence)
            and source
            and all(isinstance(s, (str, os.PathLike)) for s in source)
        ):
            source = [os.fspath(s) for s in source]
        else:
            raise TypeError(
                f"{name} must be a folder, a file list, a manifest or an index.json (a path or "
                f"URL), a non-empty list of paths, or a Source, got {short_repr(source)}"
            )
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(
                f"storage_options must be a mapping of fsspec options or None, got "
                f"{short_repr(storage_options)}"
            )
        self.name = name
        self.spec = source
        self.storage_options = None if storage_options is None else dict(storage_options)
        self._init_runtime()
        self._list()  # now, so that a wrong source fails here rather than in every item

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._source: Source | None = self.spec if isinstance(self.spec, Source) else None
        self._decoded: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.spec, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __repr__(self) -> str:
        return short_repr(self.spec) if not isinstance(self.spec, Source) else self.spec.description

    @property
    def source(self) -> Source:
        """The listed source (listed again on first use in a pickled copy)."""
        return self._list()

    def _list(self) -> Source:
        """The listed source, listed on the first call.

        Raises:
            SourceError: it cannot be listed, or holds no audio files.
        """
        with self._lock:
            if self._source is None:
                try:
                    listed = Source(self.spec, patterns=AUDIO_PATTERNS,
                                    storage_options=self.storage_options)
                except SourceError as exc:
                    raise SourceError(f"{self.name}: {exc}") from exc
                if len(listed) == 0:
                    raise SourceError(f"{self.name}={short_repr(self.spec)} holds no audio files")
                self._source = listed
            return self._source

    def __len__(self) -> int:
        return len(self.source)

    def clip(self, index: int, sample_rate: int) -> np.ndarray:
        """Item ``index`` of the source as mono float32 at ``sample_rate`` Hz.

        Raises:
            DecodeError: the item cannot be decoded.
        """
        key = (index, sample_rate)
        with self._lock:
            found = self._decoded.get(key)
            if found is not None:
                self._decoded.move_to_end(key)
                return found
        decoder = AudioDecoder(sample_rate=sample_rate, mono=True, fallback=None)
        audio = np.asarray(decoder(self.source.item(index))["audio"], dtype=np.float32)
        audio.setflags(write=False)  # shared by the threads that mix it in
        with self._lock:
            self._decoded[key] = audio
            while len(self._decoded) > _CACHED:
                self._decoded.popitem(last=False)
        return audio
