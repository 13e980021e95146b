"""What a pool's consumer thread does besides yielding: wait for data (the "waiting for data" warning
and the stall timeout), and decode inline when the producer count is 0 (NOTE [ Changing the producer
count ] in ``_feed.py``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from typing import Any

from ..buffer import Buffer
from ..errors import SampleError, StallError
from ..sources import storage
from ..sources.source import WorkItem
from .feed import Feed
from .outcomes import Failure

__all__ = ["WARN_INTERVAL", "ConsumerWait", "InlineDecoder"]

logger = logging.getLogger("audiobuffer.engine.pool")  # the pool's logger: its warnings, its name

#: The least seconds between two "waiting for data" warnings of one pool.
WARN_INTERVAL = 30.0


class ConsumerWait:
    """Takes from a buffer for one consumer, warning after ``warn_after`` and failing after ``timeout``.

    Args:
        warn_after: log a "waiting for data" warning when the consumer has waited this many seconds
            for the next sample (at most one every ``WARN_INTERVAL`` seconds); ``None`` or
            ``float("inf")``: never.
        timeout: raise :class:`StallError` when the consumer has waited this many seconds;
            ``None`` or ``float("inf")``: never.
        describe: what the producers are doing, for the warning and the error.

    Thread safety: one consumer thread uses it.
    """

    def __init__(self, warn_after: float | None, timeout: float | None, describe: Callable[[], str]) -> None:
        self._warn_after = warn_after
        self._timeout = timeout
        self._describe = describe
        self._last_warning = -float("inf")

    def get(self, take: Callable[..., Any]) -> Any:
        """``take()`` (the buffer's get or get_many), with the warning and the stall timeout."""
        if self._warn_after is None and self._timeout is None:
            return take()
        start = time.monotonic()
        deadline = start + self._timeout if self._timeout is not None else float("inf")
        while True:
            now = time.monotonic()
            wait = deadline - now
            if self._warn_after is not None:
                wait = min(wait, self._warn_after)
            try:
                return take(timeout=max(0.0, wait))
            except TimeoutError:
                now = time.monotonic()
                if now >= deadline:
                    raise StallError(f"no sample for {self._timeout} s (timeout); {self._describe()}") from None
                if now - self._last_warning >= WARN_INTERVAL:
                    self._last_warning = now
                    logger.warning("waiting for data: the consumer has waited %.1f s for a sample (%s); add "
                                   "producers or make decoding cheaper", now - start, self._describe())


class InlineDecoder:
    """Decodes items in the consumer's own thread, taking their sequence numbers from ``feed``.

    Args:
        make_item, decode: the pool's.
        feed: the pool's feed (``Feed.take_inline``).
        buffer: the pool's buffer, closed here when nothing is left to take and no producer is left.
        name: the name failures carry as their producer's.

    Thread safety: the consumer thread alone calls :meth:`next` and :meth:`run`; the counters may be read
    anywhere.
    """

    def __init__(self, make_item: Callable[[int], WorkItem], decode: Callable[[WorkItem], Any], feed: Feed,
                 buffer: Buffer, name: str) -> None:
        self._make_item = make_item
        self._decode = decode
        self._feed = feed
        self._buffer = buffer
        self.name = name
        self.busy = 0.0  # seconds in the decoder
        self.decoded = 0  # items finished, decoded or failed
        storage.close_kept_files()  # this thread outlives the epoch: its shard files must not (made in it)

    def next(self, expected: int | None) -> tuple[int, Any] | None:
        """Take the next sequence number (ordered: only if it is ``expected``) and decode it here;
        ``None`` if there is none to take. Closes the buffer when nothing is left to take and no
        producer is left, as the last producer out would."""
        seq, done = self._feed.take_inline(expected)
        if seq is None:
            if done:
                self._buffer.close()
            return None
        return seq, self._decode_one(seq)

    def run(self, until: Callable[[], bool]) -> Generator[tuple[int, Any], None, int]:
        """Decode the next items here one after another, yielding each ``(seq, sample or Failure)``,
        until ``until()`` is true (asked after each item: the tuner wants to look) or none is left
        to take; return how many. Closes the buffer as :meth:`next` does."""
        take, decode_one = self._feed.take_inline, self._decode_one
        count = 0
        while True:
            seq, done = take(None)
            if seq is None:
                if done:
                    self._buffer.close()
                return count
            yield seq, decode_one(seq)
            count += 1
            if until():
                return count

    def _decode_one(self, seq: int) -> Any:
        """The sample of item ``seq``, or its :class:`Failure`; counted in :attr:`busy` and :attr:`decoded`."""
        item = self._make_item(seq)
        start = time.perf_counter()
        try:
            return self._decode(item)
        except Exception as exc:  # as from a producer: the consumer applies on_error
            return Failure(exc, item, self.name)
        except KeyboardInterrupt:
            raise  # Ctrl-C reaches the main thread, which may be this one: it stays what it is
        except BaseException as exc:
            raise SampleError(f"decoding inline crashed on item {item.index} ({item.path!r}): "
                              f"{type(exc).__name__}: {exc}", path=item.path, index=item.index,
                              producer=self.name) from exc
        finally:
            self.busy += time.perf_counter() - start
            self.decoded += 1
