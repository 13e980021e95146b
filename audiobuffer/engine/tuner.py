"""The producer-count tuner behind ``num_producers="auto"``, and the driver that feeds it a pool's counters.

:class:`ProducerTuner` answers observations (items finished, the waits on both sides of the buffer,
CPU seconds) with the count it wants; it owns no thread and reads no clock, so every decision can be
tested with scripted observations. :class:`PoolTuning` observes a pool whenever the tuner is due.

NOTE [ Producer tuning ]
========================
Counts. 0 means the consumer decodes in its own thread ("inline": no hand-over at all, the fastest
when a decode is mostly GIL-held Python, as for tiny WAV files); 1 and more are producer threads, at
most ``max_producers`` (the usable cores).

Intervals. An observation closes an interval once it spans at least ``interval`` seconds *and* at
least ``min_items`` items finished since the last one closed; before that the window keeps growing,
so slow decodes get decisions too, just later. An interval's rate is its items per second, or, where
the pool knows what each item costs (batches by duration: each item's seconds of audio), its work per
second: batches of one duration bucket follow one another, so one interval may hold 2 s utterances
and the next 20 s ones, and in items per second a trial would be judged by the bucket it landed on.

Start small: inline when it is allowed, else one producer; except for a decoder that says its
work runs outside the GIL (``releases_gil = True``, as ``ImageDecoder``'s C decoding and
resizing) with no transform, which starts at the most producers: climbing there from inline would
only cost the epoch's first intervals, and the rules below still retire a producer the consumer
leaves idle. The first interval only warms up: the start of an epoch (first calls, cold caches, a
DataLoader's first batch) is slower than what follows, and judged against it a trial would look
better than it is. On each later interval, in this order:

- A trial is pending (the count changed when the last interval closed): keep the new count if its
  rate is at least ``gain`` times the rate before the change, and go on with the rules below on the
  same interval (so a climb takes one interval a step); else go back, and cap the count at the old
  one for ``retry`` seconds (doubled after each failed trial, at most ``max_retry``), since the
  addition did not help (the GIL or the cores are the limit). The cap lifting lets a changed
  workload (a warm page cache, a slower step) be tried again.
- Producers waited for room more than ``idle`` of the interval each (the consumer is the
  bottleneck) and there are at least two: retire one.
- Inline: try one producer (inline gives no sign of starving: the consumer never waits). One producer
  alone only overlaps decoding with the consumer's own work; if it is not faster by ``gain`` but the
  consumer waited for it (decoding is the bottleneck), the trial goes on to two producers, judged
  against inline as well, since two may decode in parallel where one cannot gain. One producer far
  slower than inline (under ``slower`` times its rate) goes back at once instead: its hand-over costs
  more than any overlap gives, which is what a decode holding the GIL does (tiny WAV files), and a
  second thread holding the same GIL only adds to that cost. The bar is low on purpose: a 20 ms
  interval of files of different lengths is a noisy rate (even compressed audio, where two producers
  pay off, can show one producer a little under inline's rate), and a wrong "back" costs the whole
  back-off, a wrong "two" one interval.
- The consumer waited for data more than ``starved`` of the interval (the producers are the
  bottleneck): try one producer more.
- No producer is added (nor the trial of one taken on to two) while the process used more than
  ``saturated`` of the usable cores in its last CPU window: a thread more finds no CPU to run on.
  This is the case of a transform that already runs on every core (numpy's BLAS threads in a
  spectrogram's filter bank), where every trial would be paid for and fail. A CPU window spans
  whole intervals (the warm-up counts) until it offers ``cpu_window`` core-seconds, since the
  process CPU clock ticks every 15.6 ms on Windows; until the first window closes there is CPU to
  spare.

Across epochs. A dataset hands each epoch's pool the :class:`TunerMemory` the previous epoch's pool
left: the new tuner starts at the count the last one settled on, and if a trial had failed there, it
stays capped at that count for what was left of the back-off when the last epoch ended (the back-off's
clock runs on across epochs, and keeps doubling), so epochs shorter than the back-off still get their
trials. So a training run pays the trials of its first epoch, not of every epoch. A count carried over
behind a back-off is checked upwards: on its first judged interval (after the check of one fewer
below, if any, went back up) the tuner tries one more in spite of the cap, by the rules above (from
inline a producer, and on to two; else only if the consumer starved). A failed trial at the start of
an epoch (cold caches, another loader still busy on the cores, a run of unusually long items) would
otherwise hold every later short epoch at the count it went back to. A check of one more that fails
backs off as any failed trial, and the next epochs that start at the same count skip it as the checks
of one fewer below skip theirs (its own count of skips; a kept check begins it again). Since
trials only add producers, a count carried over is checked downwards (once, unless skipped as
below): on its first judged interval the tuner tries one fewer (inline after one), keeps it if its
rate is within ``gain`` of the rate before, and then tries one fewer again; else it goes back
(capped only by an earlier kept step of the same walk). So a workload that got cheaper (a warm page
cache) is not held at the first epoch's count. A check that goes back up cost an interval at the
lower rate and found nothing, so the next epochs that start at the same count skip it: one epoch
after the first such check, then two, four, up to ``MAX_CHECK_SKIP`` (a kept check, or a start at
another count, begins the count again; an epoch too short to judge an interval leaves it as it is,
as it leaves the memory). A training run at a steady count then pays the check in a few epochs, not
in every one. Keeping one fewer says what a failed trial of the count above would say (it was not
``gain`` times faster), so it caps the count for the back-off just as that failed trial would
(without doubling it: one walk down is one finding): the count just left is not tried again at once.

A trial is judged on the very next interval: a new thread starts in well under a millisecond, and
the buffer is near empty when the consumer starves, so there is nothing to let settle. Every change is
recorded in :attr:`ProducerTuner.history` as ``(time, count, reason)``, the first entry being the start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from ..options import usable_cores

__all__ = ["MAX_CHECK_SKIP", "PoolTuning", "ProducerTuner", "TunerMemory", "TunerSample", "default_tuner"]

logger = logging.getLogger(__name__)


#: The most epochs in a row that skip the downward check of a count after it went back up.
MAX_CHECK_SKIP = 8


@dataclass(frozen=True)
class TunerSample:
    """What the pool has seen so far (all counters cumulative since the pool started)."""

    time: float  # seconds, any monotonic clock
    items: int  # items finished (decoded or failed)
    consumer_wait_s: float  # seconds the consumer waited for data
    producer_wait_s: float  # seconds producers waited for room, summed over producers
    cpu_s: float = 0.0  # CPU seconds the process used (all its threads)
    work: float | None = None  # the items' summed cost (seconds of audio), where items differ in cost


class TunerMemory:
    """What one pool's tuner settled on, for the next pool of the same dataset (its next epoch).

    Thread safety: what it keeps is one attribute, replaced whole, so a reader never sees half of two
    writes; where epochs of a dataset overlap (or a pool is closed from another thread), the last
    pool to close wins.
    """

    def __init__(self) -> None:
        self._settled: tuple[int | None, float | None, float | None, tuple[int | None, int, int],
                             tuple[int | None, int, int]] = (None, None, None, (None, 0, 1), (None, 0, 1))

    def __repr__(self) -> str:
        return (f"TunerMemory(count={self.count}, retry={self.retry}, wait={self.wait}, checks={self.checks}, "
                f"ups={self.ups})")

    @property
    def count(self) -> int | None:
        """The count the last tuner settled on (``None``: none has settled yet)."""
        return self._settled[0]

    @property
    def retry(self) -> float | None:
        """The back-off in seconds a failed trial above ``count`` earns next, when the last tuner went
        back to ``count`` after a failed trial and stayed there; else ``None``."""
        return self._settled[1]

    @property
    def wait(self) -> float | None:
        """With :attr:`retry`: the seconds of the current back-off still to run when the last tuner
        stopped (the next epoch waits them out, no more); else ``None``."""
        return self._settled[2]

    @property
    def checks(self) -> tuple[int | None, int, int]:
        """The downward checks (NOTE [ Producer tuning ], across epochs): ``(count, skip, wait)``, the
        count a check that went back up started from (``None``: none), how many epochs starting there
        skip the check from now on, and how many the next check that goes back up makes skip."""
        return self._settled[3]

    @property
    def ups(self) -> tuple[int | None, int, int]:
        """The checks of one more, as :attr:`checks` keeps those of one fewer: ``(count, skip, wait)``."""
        return self._settled[4]

    def remember(self, tuner: Any) -> None:
        """Keep what ``tuner`` settled on; a tuner that judged no interval (an epoch too short), or an
        object without :meth:`ProducerTuner.settled` (a scripted tuner), leaves the memory as it is."""
        settled = getattr(tuner, "settled", None)
        found = settled() if settled is not None else None
        if found is not None:
            count, retry, wait = found
            self._settled = (count, retry, wait, getattr(tuner, "checks", (None, 0, 1)),
                             getattr(tuner, "ups", (None, 0, 1)))


def _carried(kept: tuple[int | None, int, int] | None, count: int, *,
             due: bool) -> tuple[tuple[int | None, int, int], bool]:
    """A check's record (``TunerMemory.checks`` or ``ups``) as an epoch starting at ``count`` takes it
    over, and whether that epoch skips the check: kept only where it was made from this very count,
    and a skip spent where the check is ``due``."""
    record = kept if kept is not None and kept[0] == count else (None, 0, 1)
    if due and record[1] > 0:
        return (count, record[1] - 1, record[2]), True
    return record, False


class ProducerTuner:
    """Chooses how many producer threads decode (0: the consumer decodes inline), from observations.

    See NOTE [ Producer tuning ] at the top of this module.

    Args:
        max_producers: the ceiling (the usable cores).
        start: the count to start with; ``None``: 0 if ``allow_inline``, else 1.
        interval: the fewest seconds an interval spans.
        min_items: the fewest finished items an interval has.
        starved: fraction of an interval the consumer may wait for data before a producer is added.
        idle: fraction of an interval each producer may wait for room before one is retired.
        gain: the least rate ratio that keeps a trial.
        slower: from inline, one producer under this fraction of inline's rate goes back at once
            (no trial of two producers).
        retry: seconds a failed trial caps the count (doubled after each failed trial) ...
        max_retry: ... up to this many.
        allow_inline: whether count 0 (decoding in the consumer's thread) may be used.
        memory: what the previous epoch's tuner settled on: start there instead of at ``start``.
        warmup: let the first interval pass without a decision (see the NOTE).
        cores: the cores the process may use; ``None``: ``max_producers``.
        saturated: the share of ``cores`` the process may use before no producer is added (there
            is no CPU left for one) ...
        cpu_window: ... measured over windows of whole intervals offering at least this many
            core-seconds (``length x cores``): a process CPU clock ticks every 15.6 ms on Windows.
    """

    def __init__(self, max_producers: int, *, start: int | None = None, interval: float = 0.02,
                 min_items: int = 32, starved: float = 0.1, idle: float = 0.5, gain: float = 1.1,
                 slower: float = 0.75, retry: float = 0.5, max_retry: float = 60.0, allow_inline: bool = True,
                 memory: TunerMemory | None = None, warmup: bool = True, cores: int | None = None,
                 saturated: float = 0.9, cpu_window: float = 0.2) -> None:
        self.max_producers = max(1, max_producers)
        self.cores = max(1, cores if cores is not None else self.max_producers)
        self.saturated = saturated
        self.cpu_window = cpu_window
        self._cpu_from: TunerSample | None = None  # where the current CPU window started
        self._spare = True  # whether the last CPU window left CPU for one more thread
        low = 0 if allow_inline else 1
        memory = memory if memory is not None and memory.count is not None else None
        self._resumed = memory is not None
        if memory is not None:
            start = memory.count
        self.count = max(low, min(low if start is None else start, self.max_producers))
        self.interval = interval
        self.min_items = min_items
        self.starved = starved
        self.idle = idle
        self.gain = gain
        self.slower = slower
        self.allow_inline = allow_inline
        #: The largest count allowed now (lowered by a failed trial until ``_cap_until``).
        self.cap = self.max_producers
        self._retry = retry
        self._max_retry = max_retry
        self._cap_until = 0.0
        self._failed_at: int | None = None  # the count a failed trial went back to, while it stays there
        self._judged = False  # an interval past the warm-up closed
        self._low = low
        self._down = memory is not None and self.count > low  # check one fewer (a count carried over)
        #: What :class:`TunerMemory` keeps of the downward checks (see its ``checks``): carried over only
        #: from a check of this very count that went back up.
        self.checks, self._check_skipped = _carried(memory.checks if memory is not None else None, self.count,
                                                    due=self._down)
        self._down = self._down and not self._check_skipped
        self._warming = warmup  # the first interval decides nothing
        self._wait = 0.0  # what is left of a back-off carried over (seconds)
        if memory is not None and memory.retry is not None:
            self._retry, self._failed_at = memory.retry, self.count  # capped from the first observation
            self._wait = memory.retry if memory.wait is None else max(0.0, memory.wait)
        # Check one more (a count carried over behind a back-off that has not run out), unless skipped.
        self._up = self._wait > 0 and self.count < self.max_producers
        #: What :class:`TunerMemory` keeps of the checks of one more (see its ``ups``).
        self.ups, self._up_skipped = _carried(memory.ups if memory is not None else None, self.count, due=self._up)
        self._up = self._up and not self._up_skipped
        self._upward = False  # the trial being judged is the check of one more
        #: ``(time, count, reason)`` of every change, the first entry being the start.
        self.history: list[tuple[float, int, str]] = []
        self._last: TunerSample | None = None
        self._trial: tuple[int, float] | None = None  # (count before the trial, its rate)

    def due(self, now: float) -> bool:
        """Whether an observation is due (the pool calls :meth:`observe` only then)."""
        return self._last is None or now - self._last.time >= self.interval

    def observe(self, sample: TunerSample) -> int:
        """Take the counters seen so far; return the count wanted from now on."""
        last = self._last
        if last is None:
            self._last = self._cpu_from = sample
            reason = "start"
            if self._resumed:
                reason = "start where the last epoch settled"
                if self._wait > 0:  # the back-off of its failed trial goes on where it stopped
                    self.cap, self._cap_until = self.count, sample.time + self._wait
                    reason += f", no trial for {self._wait:.3g} s"
                if self._check_skipped:
                    reason += ", one fewer not checked (it did not pay from here last time)"
                if self._up_skipped:
                    reason += ", one more not checked (it did not pay from here last time)"
            self.history.append((sample.time, self.count, reason))
            return self.count
        span = sample.time - last.time
        items = sample.items - last.items
        if span < self.interval or items < self.min_items:
            return self.count  # the interval goes on until it has enough of both
        self._last = sample
        if self._warming:
            self._warming = False
            return self.count
        self._judged = True
        rate = (sample.work - last.work if sample.work is not None and last.work is not None else items) / span
        now = sample.time
        if self.cap < self.max_producers and now >= self._cap_until:
            self.cap = self.max_producers
        consumer_wait = (sample.consumer_wait_s - last.consumer_wait_s) / span
        spare = self._cpu_spare(sample)
        if self._trial is not None and not self._judge(now, rate, consumer_wait, spare):
            return self.count  # back to the count before the trial, or on to the next one
        if self._down and self.count > self._low:
            self._trial = (self.count, rate)
            return self._change(now, self.count - 1, "checking one fewer than the count carried over")
        if self._up:  # once one fewer is checked (or not to be): one more, in spite of the back-off
            self._up = False
            if self.count < self.max_producers and spare and (self.count == 0 or consumer_wait > self.starved):
                self.cap, self._upward = self.max_producers, True
                return self._try(now, rate, "checking one more than the count carried over")
        producer_wait = (sample.producer_wait_s - last.producer_wait_s) / span / max(1, self.count)
        if self.count > 1 and producer_wait > self.idle:
            return self._change(now, self.count - 1, f"producers waited {producer_wait:.0%} for room")
        if self.count < self.cap and spare:
            if self.count == 0:
                return self._try(now, rate, "trying a producer instead of inline")
            if consumer_wait > self.starved:
                return self._try(now, rate, f"consumer waited {consumer_wait:.0%}")
        return self.count

    def _cpu_spare(self, sample: TunerSample) -> bool:
        """Whether the last closed CPU window left CPU for one more thread (closing one if ``sample`` ends it)."""
        start = cast(TunerSample, self._cpu_from)
        window = sample.time - start.time
        if window * self.cores >= self.cpu_window:
            self._spare = (sample.cpu_s - start.cpu_s) / window / self.cores < self.saturated
            self._cpu_from = sample
        return self._spare

    def _try(self, now: float, rate: float, reason: str) -> int:
        self._trial = (self.count, rate)
        return self._change(now, self.count + 1, reason)

    def _judge(self, now: float, rate: float, consumer_wait: float, spare: bool) -> bool:
        """Keep the trial's count (``True``), or go back to the one before it (or on from inline to two)."""
        before, before_rate = self._trial  # type: ignore[misc]
        self._trial = None
        verdict = f"{rate:.0f}/s against {before_rate:.0f}/s"
        if before > self.count:  # a check of one fewer: kept unless clearly slower, then one fewer again
            if rate * self.gain >= before_rate:
                self._down = self.count > self._low  # done at the lowest count: trials may only climb again
                self._up = False  # the count carried over was too many: one more than it is not checked
                self.checks = (None, 0, 1)  # it paid: the next epochs check again, afresh
                self.history.append((now, self.count, f"kept one fewer: {verdict}"))
                self._back_off(now, self.count, double=False)  # the count above did not pay (one walk: no doubling)
                return True
            self._down = False
            wait = self.checks[2]  # the skips this failure earns; the next one earns twice as many
            self.checks = (before, wait, min(2 * wait, MAX_CHECK_SKIP))
            self._change(now, before, f"back up: {verdict}")
            if self.cap == before < self.max_producers:  # an earlier kept step's cap: its back-off goes on
                self._failed_at = before
            return False
        if rate >= before_rate * self.gain:
            self._failed_at = None
            if self._upward:  # it paid: the next epochs check again, afresh
                self._upward, self.ups = False, (None, 0, 1)
            self.history.append((now, self.count, f"kept: {verdict}"))
            return True
        if (before == 0 and self.count == 1 and rate >= before_rate * self.slower and consumer_wait > self.starved
                and self.cap >= 2 and spare):
            # One producer decodes about as fast as the consumer alone and the consumer waits for it:
            # two may decode in parallel. Judged against inline too.
            self._trial = (0, before_rate)
            self._change(now, 2, f"one producer: {verdict}, consumer waited {consumer_wait:.0%}: trying two")
            return False
        self._change(now, before, f"back: {verdict}")
        self._back_off(now, before)
        if self._upward:  # the skips this failure earns; the next one earns twice as many
            wait = self.ups[2]
            self._upward, self.ups = False, (before, wait, min(2 * wait, MAX_CHECK_SKIP))
        elif self.ups[0] != before or self.ups[1] == 0:
            # one more was just tried from here and did not pay: the next epoch need not check it
            # again at its start (its back-off carries over and says when to try)
            self.ups = (before, 1, self.ups[2] if self.ups[0] == before else 1)
        return False

    def _back_off(self, now: float, count: int, *, double: bool = True) -> None:
        """One more than ``count`` did not pay: stay at most at ``count`` for the back-off (then double it)."""
        self.cap, self._cap_until = count, now + self._retry
        if double:
            self._retry = min(2 * self._retry, self._max_retry)
        self._failed_at = count

    def settled(self) -> tuple[int, float | None, float | None] | None:
        """``(count, back-off, left)`` for :class:`TunerMemory`, or ``None`` if no interval was judged.

        The count is the one now (the one before a trial still being judged). When the count is where
        a failed trial went back to, the back-off is the one the next failed trial would double and
        ``left`` the seconds of the current one still to run at the last observation; else both ``None``.
        """
        if not self._judged or self._last is None:
            return None
        count = self._trial[0] if self._trial is not None else self.count
        if self._failed_at != count:
            return count, None, None
        return count, self._retry, max(0.0, self._cap_until - self._last.time)

    def _change(self, now: float, count: int, reason: str) -> int:
        self._failed_at = None
        self.count = count
        self.history.append((now, count, reason))
        return count


def default_tuner(max_producers: int, *, allow_inline: bool, memory: TunerMemory | None = None,
                  start: int | None = None) -> ProducerTuner:
    """The tuner a pool with ``num_producers="auto"`` gets (starting where ``memory`` says, else at
    ``start``, else small)."""
    return ProducerTuner(max_producers, start=start, allow_inline=allow_inline, memory=memory,
                         cores=usable_cores())


class PoolTuning:
    """The tuner of one pool, with its clock and its decisions in seconds since the pool started.

    Thread safety: one thread (the pool's consumer) calls :meth:`begin` and :meth:`check`;
    :attr:`history` may be read from any thread.

    Args:
        tuner: a :class:`ProducerTuner`, or any object with its ``count``, ``history``, ``due`` and
            ``observe`` (tests script one).
        name: the pool's name, for the log.
        counters: returns ``(items finished, consumer wait s, producer wait s)`` so far.
        work: returns the finished items' summed cost so far, where items differ in cost; ``None``:
            rates are of items.
        clock: a monotonic clock in seconds.
        cpu_clock: the CPU seconds the process has used (all its threads).
        memory: where :meth:`finish` leaves what the tuner settled on, for the next pool.
    """

    def __init__(self, tuner: Any, name: str, counters: Callable[[], tuple[int, float, float]], *,
                 clock: Callable[[], float] = time.monotonic, cpu_clock: Callable[[], float] = time.process_time,
                 memory: TunerMemory | None = None, work: Callable[[], float] | None = None) -> None:
        self.tuner = tuner
        self._work = work
        self._cpu_clock = cpu_clock
        self._memory = memory
        self._name = name
        self._counters = counters
        self._clock = clock
        self._start = 0.0
        self._logged = 0

    def begin(self) -> int:
        """The pool starts now: the first observation; returns the count to start with."""
        self._start = self._clock()
        return self._observe(self._start)

    def due(self) -> bool:
        """Whether an observation is due now (:meth:`check` would make one)."""
        return bool(self.tuner.due(self._clock()))

    def check(self) -> int | None:
        """The count wanted now if an observation was due, else ``None``. Cheap when none is."""
        now = self._clock()
        if not self.tuner.due(now):
            return None
        return self._observe(now)

    def _observe(self, now: float) -> int:
        items, consumer_wait, producer_wait = self._counters()
        work = self._work() if self._work is not None else None
        count: int = self.tuner.observe(TunerSample(now, items, consumer_wait, producer_wait, self._cpu_clock(),
                                                    work))
        history = self.tuner.history
        while self._logged < len(history):
            at, n, reason = history[self._logged]
            self._logged += 1
            logger.debug("%s: %s at %.3f s (%s)", self._name, _describe(n), at - self._start, reason)
        return count

    def finish(self) -> None:
        """The pool is closing: leave what the tuner settled on in the memory (if any)."""
        if self._memory is not None:
            self._memory.remember(self.tuner)

    def tick(self, current: int, apply: Callable[[int], None]) -> None:
        """:meth:`check`, then ``apply(count)`` if the count wanted is not ``current``.

        A thread that cannot be started (``RuntimeError`` from ``apply``) is logged: the pool goes on
        with the producers it has.
        """
        count = self.check()
        if count is None or count == current:
            return
        try:
            apply(count)
        except RuntimeError as exc:
            logger.warning("%s: could not start a producer thread (%s); going on with those there are",
                           self._name, exc)

    @property
    def history(self) -> list[tuple[float, int, str]]:
        """``(seconds since the pool started, count, reason)`` of every decision so far."""
        return [(at - self._start, n, reason) for at, n, reason in list(self.tuner.history)]


def _describe(count: int) -> str:
    return "decoding inline" if count == 0 else f"{count} producer{'s' if count > 1 else ''}"
