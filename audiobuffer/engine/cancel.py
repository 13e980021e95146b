"""Cancel scopes: stop, from another thread, the waits a thread started while it read a loader.

NOTE [ Prefetch cancellation ]
==============================
Parties: a consumer thread iterating a :class:`~audiobuffer.DevicePrefetcher`, the prefetch thread
that reads the wrapped loader, and what the prefetch thread waits on inside the loader (a producer
pool's buffer, most often, under ``DataLoader(BufferedDataset)`` or ``BatchSlotLoader``).

The problem. When the consumer leaves its loop (``break``, an exception such as ``KeyboardInterrupt``,
``close()`` of the generator, garbage collection), the prefetch thread may be deep inside the loader,
blocked until a whole batch is decoded: 64 items at 0.4 s each is seconds. A generator cannot be
closed while another thread runs it, and the loader's dataset must not be closed either: the user
iterates it again next epoch.

The protocol. The prefetch thread reads the loader inside a :class:`CancelScope` (a context variable,
so it is seen only by that thread and by the generators it runs). Whatever blocks on the loader's
behalf registers a stop callback with the scope it was made in (:func:`on_cancel`):
:class:`~audiobuffer.engine.pool.ProducerPool` registers its ``stop()``, which ends the pool's
iteration and tells its producers to finish the item in hand and take no more; a prefetcher nested in
another's thread registers its own stop. Leaving the loop cancels the scope from the consumer's
thread: the callbacks run there at once and wait for nothing. The prefetch thread then wakes, the
loader's epoch ends early (a ``BufferedDataset`` epoch is marked not done), the pool is joined *in
the prefetch thread* by the epoch's own cleanup, and the thread asks the loader for nothing more.

The consumer waits for the prefetch thread at most ``LEAVE_TIMEOUT`` seconds (``loaders/device.py``).
A loader that registers nothing (``DataLoader`` workers in other processes, a user's generator) cannot
be stopped mid-item: the daemon thread then ends on its own as soon as its current item returns, and
the next ``iter()`` or ``close()`` of the prefetcher joins it first.

A callback registered with a scope already cancelled runs at once, so a pool made just after the
consumer left stops before it starts waiting. Callbacks must be quick, idempotent and safe from any
thread; their exceptions are logged, never raised into the consumer's cleanup.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator

__all__ = ["CancelScope", "cancel_scope", "on_cancel"]

logger = logging.getLogger(__name__)

_SCOPE: contextvars.ContextVar[CancelScope | None] = contextvars.ContextVar("audiobuffer_cancel_scope",
                                                                                  default=None)


class CancelScope:
    """Stop callbacks that one :meth:`cancel` runs; see NOTE [ Prefetch cancellation ].

    Thread safety: every method may be called from any thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: dict[object, Callable[[], None]] = {}
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancelled

    def add(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` on :meth:`cancel` (now, if cancelled already); return what unregisters it."""
        key = object()
        with self._lock:
            if not self._cancelled:
                self._callbacks[key] = callback
                return lambda: self._discard(key)
        _run(callback)
        return _nothing

    def cancel(self) -> None:
        """Run every registered callback once, in this thread. Idempotent."""
        with self._lock:
            self._cancelled = True
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for callback in callbacks:
            _run(callback)

    def _discard(self, key: object) -> None:
        with self._lock:
            self._callbacks.pop(key, None)

    def __repr__(self) -> str:
        return f"CancelScope(cancelled={self._cancelled}, callbacks={len(self._callbacks)})"


def _run(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # a stop that fails must not keep the consumer from leaving
        logger.warning("a stop callback of a cancelled prefetch failed", exc_info=True)


def _nothing() -> None:
    pass


@contextlib.contextmanager
def cancel_scope(scope: CancelScope) -> Iterator[CancelScope]:
    """Make ``scope`` the current thread's cancel scope inside the ``with`` block."""
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def on_cancel(callback: Callable[[], None]) -> Callable[[], None]:
    """Register ``callback`` with the current thread's cancel scope, if there is one.

    Returns:
        A function that unregisters it (it does nothing outside a scope).
    """
    scope = _SCOPE.get()
    return _nothing if scope is None else scope.add(callback)
