"""Streamed tar shards in an epoch: the decoder a streamed epoch's producers run, which streams a whole
shard and puts its samples into the epoch's buffer itself (NOTE [ Streamed shards ] in
``audiobuffer/sources/stream.py``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np

from ..buffer import Buffer
from ..errors import SourceError
from ..sources.source import ReadClock, WorkItem
from ..sources.stream import MEMBER_STRIDE, SHUFFLE_BUFFER, ShardStream
from ..sources.tar import ShardSample, Truncated, iter_shard, shuffle_buffer
from .pool import CHUNK_SECONDS, DELIVERED, Failure

__all__ = ["ShardReader", "check_streamable"]

logger = logging.getLogger(__name__)


def check_streamable(decoder: Any, ordered: bool) -> None:
    """Refuse what a streamed source cannot do: an ordered epoch, a decoder that delivers itself."""
    if ordered:
        raise ValueError("ordered=True needs random access to the members: give the shards' index.json "
                         "(audiobuffer pack writes one) instead of the shards, or ordered=False")
    if getattr(decoder, "delivers_itself", False) is True:
        raise ValueError(f"{decoder!r} delivers its samples itself, and so do streamed shards: give the "
                         f"shards' index.json (audiobuffer pack writes one) instead of the shards")


class ShardReader:
    """The decoder a streamed epoch's producers run: an item is a shard, whose samples it decodes and
    puts into the epoch's buffer itself (see NOTE [ Streamed shards ]).

    Each output goes in as ``((shard position, last), sample or Failure)``: ``last`` on the shard's
    final output, so that the consumer marks the shard consumed when it hands that one on. Outputs go
    in chunks of up to ``chunk`` (a chunk waits at most ``CHUNK_SECONDS``), as a pool's producers
    hand theirs over; it waits only for room in the buffer, never for the consumer otherwise.
    Thread safety: one instance serves every producer of an epoch.
    """

    delivers_itself = True

    def __init__(self, stream: ShardStream, decode: Callable[[WorkItem], Any], buffer: Buffer[Any],
                 clock: ReadClock, *, shuffle: bool, chunk: int = 1) -> None:
        self._stream = stream
        self._chunk = chunk
        self._decode = decode
        self._buffer = buffer
        self._clock = clock
        self._shuffle = shuffle
        self._stopped = threading.Event()

    def stop_waiting(self) -> None:
        """The pool stops: read no further (a producer blocked in ``put`` wakes by the buffer's abort)."""
        self._stopped.set()

    def __call__(self, shard: WorkItem) -> Any:
        put_many, size = self._buffer.put_many, self._chunk
        held = None  # each output is put once the next one is known, so that the last is tagged
        chunk: list[tuple[tuple[int, bool], Any]] = []  # handed over together (NOTE [ Producer shutdown protocol ])
        oldest = 0.0
        outputs = self._outputs(shard)
        try:
            for out in outputs:
                if held is not None:
                    now = time.perf_counter()
                    if not chunk:
                        oldest = now
                    chunk.append(((shard.seq, False), held))
                    if len(chunk) >= size or now - oldest >= CHUNK_SECONDS:
                        put_many(chunk)
                        chunk = []
                held = out
            if held is not None and not self._stopped.is_set():
                chunk.append(((shard.seq, True), held))
            if chunk:
                put_many(chunk)
        finally:
            outputs.close()  # a stop or a closed buffer: the shard's stream is closed now, not when collected
        return DELIVERED

    def _outputs(self, shard: WorkItem) -> Generator[Any, None, None]:
        producer = threading.current_thread().name
        failed: list[Exception] = []
        reader = self._read(shard.path, failed)
        samples: Iterator[tuple[int, ShardSample]] = enumerate(reader)
        if self._shuffle:
            rng = np.random.default_rng([shard.seed, shard.epoch, shard.index])
            samples = shuffle_buffer(samples, SHUFFLE_BUFFER, rng)
        count = 0
        try:
            for position, sample in samples:
                if self._stopped.is_set():
                    return
                count += 1
                try:
                    item = self._stream.sample_item(shard, sample, position)
                except SourceError as exc:
                    yield Failure(exc, WorkItem(index=shard.index * MEMBER_STRIDE + position, path=sample.path,
                                                epoch=shard.epoch, seed=shard.seed, seq=shard.seq), producer)
                    continue
                try:
                    yield self._decode(item)
                except Exception as exc:  # the consumer applies on_error
                    yield Failure(exc, item, producer)
        finally:
            reader.close()
        if failed:  # the shard ended early or could not be read: one failure for the rest of it
            cause = failed[0]
            where = cause.path if isinstance(cause, Truncated) and cause.path else shard.path
            yield Failure(cause, WorkItem(index=shard.index * MEMBER_STRIDE + count, path=where, epoch=shard.epoch,
                                        seed=shard.seed, seq=shard.seq), producer)

    def _read(self, url: str, failed: list[Exception]) -> Generator[ShardSample, None, None]:
        """The shard's samples; a failure to read ends them and is kept in ``failed``."""
        stream = self._stream
        samples = iter_shard(url, storage_options=stream.storage_options, retry=stream.retry)
        try:
            while True:
                start = time.perf_counter()
                try:
                    sample = next(samples)
                except StopIteration:
                    return
                except Exception as exc:
                    failed.append(exc)
                    return
                finally:
                    self._clock.add(time.perf_counter() - start)
                yield sample
        finally:
            samples.close()
