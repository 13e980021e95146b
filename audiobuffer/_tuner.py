"""The producer-count tuner behind ``num_producers="auto"``: decisions from observations, nothing else.

The pool feeds it what it sees every ``interval`` seconds (items finished, seconds the consumer waited
for data, seconds producers waited for room); the tuner answers with the count it wants. It owns no
thread and reads no clock, so every decision can be tested with scripted observations.

NOTE [ Producer tuning ]
========================
Start with one producer. Each interval the tuner looks at the last one:

- The consumer waited for data for more than ``starved`` of the interval (the producers are the
  bottleneck) and the count is below the ceiling: add a producer, remembering the rate (items/s)
  before the addition. One interval later (``settle``: the new thread warms up), the next interval's
  rate is compared with the remembered one. Below ``gain`` times it, the addition did not help (the
  GIL or the cores are the limit): the producer is retired and the ceiling drops to the count before,
  so the tuner stops adding.
- With one producer and a starved consumer, the tuner also tries decoding in the consumer's own
  thread (count 0, "inline"): no hand-over at all, which is fastest when a decode is mostly
  GIL-held Python (tiny WAV files). Inline stays only if its rate beats one producer's by ``gain``.
- Producers waited for room for more than ``idle`` of the interval each (the consumer is the
  bottleneck): retire one, down to one.

A decision is never taken on an interval with fewer than ``min_items`` finished items (too noisy).
Every change is recorded in :attr:`ProducerTuner.history` as ``(time, count, reason)``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProducerTuner", "TunerSample"]


@dataclass(frozen=True)
class TunerSample:
    """What the pool saw over one interval (all counters cumulative since the epoch started)."""

    time: float  # seconds, any monotonic clock
    items: int  # items finished (decoded or failed)
    consumer_wait_s: float  # seconds the consumer waited for data
    producer_wait_s: float  # seconds producers waited for room, summed over producers


class ProducerTuner:
    """Chooses how many producer threads decode (0: the consumer decodes inline), from observations.

    Args:
        max_producers: the ceiling (the usable cores).
        start: the count to start with.
        interval: seconds between decisions.
        starved: fraction of an interval the consumer may wait for data before a producer is added.
        idle: fraction of an interval each producer may wait for room before one is retired.
        gain: the least rate ratio that keeps an addition (or inline decoding).
        min_items: the fewest items an interval must have finished for a decision.
        allow_inline: whether count 0 (decoding in the consumer's thread) may be tried.
    """

    def __init__(self, max_producers: int, *, start: int = 1, interval: float = 0.25, starved: float = 0.1,
                 idle: float = 0.5, gain: float = 1.1, min_items: int = 8, allow_inline: bool = True) -> None:
        self.max_producers = max(1, max_producers)
        self.count = max(0, min(start, self.max_producers))
        self.interval = interval
        self.starved = starved
        self.idle = idle
        self.gain = gain
        self.min_items = min_items
        self.allow_inline = allow_inline
        self.ceiling = self.max_producers
        #: ``(time, count, reason)`` of every change, the first entry being the start.
        self.history: list[tuple[float, int, str]] = []
        self._last: TunerSample | None = None
        self._trial: tuple[int, float] | None = None  # (count before the trial, its rate)
        self._settling = False
        self._inline_tried = False

    def due(self, now: float) -> bool:
        """Whether an observation is due (the pool calls :meth:`observe` only then)."""
        return self._last is None or now - self._last.time >= self.interval

    def observe(self, sample: TunerSample) -> int:
        """Take one interval's counters; return the count wanted from now on."""
        last, self._last = self._last, sample
        if last is None:
            self.history.append((sample.time, self.count, "start"))
            return self.count
        span = sample.time - last.time
        items = sample.items - last.items
        if span <= 0 or items < self.min_items:
            return self.count
        rate = items / span
        if self._settling:  # the interval right after a change: the new setup warms up
            self._settling = False
            return self.count
        if self._trial is not None:
            return self._judge(sample.time, rate)
        consumer_wait = (sample.consumer_wait_s - last.consumer_wait_s) / span
        producer_wait = (sample.producer_wait_s - last.producer_wait_s) / span / max(1, self.count)
        if self.count > 1 and producer_wait > self.idle:
            return self._change(sample.time, self.count - 1, f"producers waited {producer_wait:.0%} for room")
        if consumer_wait > self.starved:
            if self.count == 1 and self.allow_inline and not self._inline_tried:
                self._inline_tried = True
                self._trial = (1, rate)
                return self._change(sample.time, 0, f"consumer waited {consumer_wait:.0%}: trying inline")
            if 0 < self.count < self.ceiling:
                self._trial = (self.count, rate)
                return self._change(sample.time, self.count + 1, f"consumer waited {consumer_wait:.0%}")
        return self.count

    def _judge(self, now: float, rate: float) -> int:
        before, before_rate = self._trial  # type: ignore[misc]
        self._trial = None
        if rate >= before_rate * self.gain:
            self.history.append((now, self.count, f"kept: {rate:.0f}/s against {before_rate:.0f}/s"))
            return self.count
        if self.count > before:
            self.ceiling = before
        return self._change(now, before, f"back: {rate:.0f}/s against {before_rate:.0f}/s")

    def _change(self, now: float, count: int, reason: str) -> int:
        self.count = count
        self._settling = True
        self.history.append((now, count, reason))
        return count
