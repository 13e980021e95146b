"""Drives a :class:`~audiobuffer.engine.tuner.ProducerTuner` for one producer pool: the clock, the log, the history.

The pool's consumer thread calls :meth:`PoolTuning.check` each time it takes a chunk of items from
the buffer (an ordered pool: each item); decoding inline unordered, it asks :meth:`PoolTuning.due`
after each item and calls ``check`` only when an observation is due. Nothing else polls. An
observation reads the pool's counters only when the tuner says one is due (every ``interval``
seconds at most), and every decision is logged at debug level on this module's logger
(``audiobuffer.engine.tuning``). See NOTE [ Producer tuning ] in ``audiobuffer/_tuner.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..options import usable_cores
from .tuner import ProducerTuner, TunerMemory, TunerSample

__all__ = ["PoolTuning", "default_tuner"]

logger = logging.getLogger(__name__)


def default_tuner(max_producers: int, *, allow_inline: bool, memory: TunerMemory | None = None) -> ProducerTuner:
    """The tuner a pool with ``num_producers="auto"`` gets (starting where ``memory`` says)."""
    return ProducerTuner(max_producers, allow_inline=allow_inline, memory=memory, cores=usable_cores())


class PoolTuning:
    """The tuner of one pool, with its clock and its decisions in seconds since the pool started.

    Thread safety: one thread (the pool's consumer) calls :meth:`begin` and :meth:`check`;
    :attr:`history` may be read from any thread.

    Args:
        tuner: a :class:`ProducerTuner`, or any object with its ``count``, ``history``, ``due`` and
            ``observe`` (tests script one).
        name: the pool's name, for the log.
        counters: returns ``(items finished, consumer wait s, producer wait s)`` so far.
        clock: a monotonic clock in seconds.
        cpu_clock: the CPU seconds the process has used (all its threads).
        memory: where :meth:`finish` leaves what the tuner settled on, for the next pool.
    """

    def __init__(self, tuner: Any, name: str, counters: Callable[[], tuple[int, float, float]], *,
                 clock: Callable[[], float] = time.monotonic, cpu_clock: Callable[[], float] = time.process_time,
                 memory: TunerMemory | None = None) -> None:
        self.tuner = tuner
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
        count: int = self.tuner.observe(TunerSample(now, items, consumer_wait, producer_wait, self._cpu_clock()))
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
