"""The last step, host to device: :class:`DevicePrefetcher` and :class:`DeviceTensorLoader`.

``DevicePrefetcher`` wraps any iterable of batches and yields them already on the device, copied ahead
by a background thread on a side CUDA stream (NOTE [ Side-stream copies ]). ``DeviceTensorLoader`` is
for data that fits on the device: the tensors move there once, and each batch is a slice or an index
of them, with no per-batch host work at all.

NOTE [ Side-stream copies ]
===========================
A background thread takes the next batches from the loader, pins them if they are not pinned, and
copies them on a side CUDA stream with ``non_blocking=True``. Before a batch is handed out, the
consumer's stream waits for that batch's copy (an event recorded right after it), and every tensor
handed out is marked with ``record_stream`` on the consumer's stream, so the caching allocator never
reuses its memory under a kernel that still reads it (apex's ``data_prefetcher``). On the CPU the same
code path runs with no stream: the thread still reads ahead, so collation overlaps the training step.
A ``transform`` (``DecodeJpeg``, say) runs on the copied batch in the same thread, on the side stream,
before the event is recorded, so its kernels are covered by the same wait.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ..buffer import Buffer
from ..engine.cancel import CancelScope, cancel_scope, on_cancel
from ..engine.pool import Failure
from ..errors import BufferClosed

__all__ = ["DevicePrefetcher", "DeviceTensorLoader", "map_tensors", "resolve_device", "to_device"]

logger = logging.getLogger(__name__)

#: Seconds ``DevicePrefetcher.close()`` (and the next ``iter()``) waits for a stopped epoch's thread.
JOIN_TIMEOUT = 10.0
#: Seconds leaving a loop waits for the prefetch thread before leaving it to end on its own.
LEAVE_TIMEOUT = 1.0


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` is CUDA when available, else the CPU; anything else goes to ``torch.device``.

    Raises:
        ValueError: a CUDA device is asked for and none is available.
    """
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was asked for, but CUDA is not available here; use 'cpu' or 'auto'")
    return resolved


def map_tensors(batch: Any, fn: Any) -> Any:
    """``batch`` with ``fn`` applied to every tensor in it (dict, list, tuple, namedtuple); the rest kept."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return type(batch)((k, map_tensors(v, fn)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(v, fn) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(v, fn) for v in batch)
    return batch


def to_device(batch: Any, device: torch.device, *, non_blocking: bool = True) -> Any:
    """``batch`` with every tensor in it copied to ``device`` (tensors already there stay as they are)."""
    return map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


def _pin(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.device.type != "cpu" or tensor.is_pinned() else tensor.pin_memory()


class _Run:
    """One epoch of a :class:`DevicePrefetcher`: its hand-over buffer, its thread, its cancel scope."""

    __slots__ = ("buffer", "scope", "thread")

    def __init__(self, queue_size: int) -> None:
        self.buffer: Buffer[Any] = Buffer(queue_size)
        self.scope = CancelScope()
        self.thread: threading.Thread | None = None

    @property
    def stopped(self) -> bool:
        return self.scope.cancelled

    def stop(self) -> None:
        """Wake the consumer and stop what the thread waits on (NOTE [ Prefetch cancellation ]); no wait."""
        self.buffer.abort(BufferClosed("the prefetcher was closed"))
        self.scope.cancel()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread; whether it has ended."""
        thread = self.thread
        if thread is None or thread.ident is None:
            return True
        if thread is not threading.current_thread():  # a collected generator may be finalised in its own thread
            thread.join(timeout)
        return not thread.is_alive()


class DevicePrefetcher:
    """Iterate ``loader`` with each batch already on ``device``, copied ahead on a side stream.

    Drops in where the classic ``CudaDataLoader(loader, device, queue_size=2)`` was used: ``len()``,
    ``.dataset`` and ``.sampler`` pass through to the loader. Batches may be tensors or any nesting of
    dicts, lists, tuples and namedtuples; other values (paths, names) pass unchanged. A batch is handed
    out once its copy has finished. Each ``iter()`` is a new epoch with its own thread; an exception
    from the loader reaches the consumer after the batches before it.

    Leaving the loop early (``break``, an exception such as ``KeyboardInterrupt``, closing or
    collecting the iterator) or :meth:`close` stops the thread and what it waits on: a
    ``BufferedDataset`` or ``BatchSlotLoader`` epoch it reads (through a ``DataLoader`` with
    ``num_workers=0`` too) stops its producers, which finish the item in hand, and the loop returns
    within about a second, even mid-decode. The dataset is not closed: the next epoch runs as usual.
    A loader that cannot be stopped (``DataLoader`` workers, a plain generator) is waited for at most
    ``LEAVE_TIMEOUT`` seconds; its thread ends as soon as its current batch arrives, and the next
    ``iter()`` waits for it first. See NOTE [ Prefetch cancellation ] in ``engine/cancel.py``.

    Thread safety: one thread iterates an epoch; :meth:`close` may be called from any thread.

    Example:
        >>> loader = torch.utils.data.DataLoader(torch.arange(10.0), batch_size=4)
        >>> [b.tolist() for b in DevicePrefetcher(loader, "cpu")]
        [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]

    Args:
        loader: any iterable of batches (a ``DataLoader`` most often).
        device: where batches go (``"cuda"``, ``"cuda:1"``, ``"cpu"``, a ``torch.device``).
        queue_size: batches copied ahead (>= 1).
        transform: called on each batch once it is on the device, in the prefetch thread and on its
            side stream; what it returns is handed out (``DecodeJpeg`` decodes JPEGs there, during
            the previous step). Its errors reach the consumer in the batch's place.
    """

    def __init__(self, loader: Iterable[Any], device: str | torch.device, *, queue_size: int = 2,
                 transform: Callable[[Any], Any] | None = None) -> None:
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be an integer >= 1, got {queue_size!r}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be a callable on a batch, got {transform!r}")
        self.transform = transform
        self.loader = loader
        self.device = resolve_device(device)
        self.queue_size = queue_size
        self._lock = threading.Lock()
        self._running: set[_Run] = set()  # epochs whose thread has not ended, left ones included

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        with self._lock:
            running = len(self._running)
        return (f"DevicePrefetcher({type(self.loader).__name__}, device={str(self.device)!r}, "
                f"queue_size={self.queue_size}, running={running})")

    @property
    def dataset(self) -> Any:
        """The loader's dataset."""
        return getattr(self.loader, "dataset", None)

    @property
    def sampler(self) -> Any:
        """The loader's sampler."""
        return getattr(self.loader, "sampler", None)

    def __iter__(self) -> Iterator[Any]:
        # A generator: its finally runs on exhaustion, on an exception (KeyboardInterrupt included), on
        # close() and when it is collected. NOTE [ Prefetch cancellation ] in engine/cancel.py.
        self._join_left(JOIN_TIMEOUT)  # a left epoch's thread may still be in the loader: one at a time
        cuda = self.device.type == "cuda"
        side = torch.cuda.Stream(device=self.device) if cuda else None
        run = _Run(self.queue_size)
        run.thread = threading.Thread(target=self._fill, args=(run, side), name="audiobuffer-prefetch", daemon=True)
        unregister = on_cancel(run.stop)  # this loop may itself run in another prefetcher's thread
        with self._lock:
            self._running.add(run)
        try:
            run.thread.start()
            consumer = torch.cuda.current_stream(self.device) if cuda else None
            while True:
                try:
                    item = run.buffer.get()
                except BufferClosed:
                    return  # the loader's epoch is over (the prefetch thread closed the buffer) or stopped
                if item.__class__ is Failure:
                    raise item.exc
                batch, event = item
                if consumer is not None:
                    consumer.wait_event(event)  # the copy of this batch, not those queued after it
                    batch = map_tensors(batch, lambda t: _record(t, consumer))
                yield batch
        finally:
            unregister()
            run.stop()
            if run.join(LEAVE_TIMEOUT):
                with self._lock:
                    self._running.discard(run)
            else:
                logger.debug("the prefetch thread ends once the loader's current batch arrives")

    def _fill(self, run: _Run, side: torch.cuda.Stream | None) -> None:
        """The prefetch thread: read the loader, copy each batch, hand it over (NOTE [ Side-stream copies ])."""
        device, buffer = self.device, run.buffer
        copy = (lambda t: _pin(t).to(device, non_blocking=True)) if side is not None else (
            lambda t: t.to(device, non_blocking=True))
        iterator = None
        try:
            with cancel_scope(run.scope):
                iterator = iter(self.loader)
                for host in iterator:
                    if run.stopped:
                        break  # the consumer has gone: ask the loader for nothing more
                    with _on_stream(side):  # the CPU runs the same path with no stream
                        moved = map_tensors(host, copy)
                        if self.transform is not None:
                            moved = self.transform(moved)
                        event = _copy_done(side)
                    if event is not None:
                        # Keep the host batch until its copy is done: its memory may be a recycled slot
                        # that is handed out again as soon as nothing references it.
                        event.synchronize()
                    del host
                    buffer.put((moved, event))
                else:
                    buffer.close()  # the end: the consumer drains what is left, then stops
        except BaseException as exc:
            # Our buffer closes only when the consumer has gone (run.stop()); anything else, the loader's
            # own BufferClosed included (closed from another thread), reaches the consumer after the
            # batches before it.
            if not run.stopped:
                with contextlib.suppress(BufferClosed):
                    buffer.put(Failure(exc))
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()  # a generator (BufferedDataset's epoch) stops its producers now
            iterator = None  # a DataLoader iterator ends its dataset's epoch when it is collected
            with self._lock:
                self._running.discard(run)

    def _join_left(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the threads of epochs already left or closed."""
        with self._lock:
            left = [run for run in self._running if run.stopped]
        deadline = time.monotonic() + timeout
        alive = [run for run in left if not run.join(max(0.0, deadline - time.monotonic()))]
        if alive:
            logger.warning("%d prefetch thread(s) still waiting for the loader %.0f s after the loop was left",
                           len(alive), timeout)

    def close(self) -> None:
        """Stop every running epoch and wait (up to ``JOIN_TIMEOUT``) for its thread. Idempotent, any thread.

        A consumer blocked waiting for a batch wakes up and its loop ends.
        """
        with self._lock:
            running = list(self._running)
        for run in running:
            run.stop()
        self._join_left(JOIN_TIMEOUT)

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _on_stream(stream: torch.cuda.Stream | None) -> Any:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _copy_done(stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
    """An event recorded on ``stream`` after the copies just queued there (``None`` on the CPU)."""
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _record(tensor: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    tensor.record_stream(stream)
    return tensor


class DeviceTensorLoader:
    """Batches of tensors that live on the device: moved once, then sliced or indexed there.

    For data that fits in device memory (MNIST-sized), this removes all per-batch host work: no
    collate, no pinning, no copy. Unshuffled batches are contiguous slices (views); shuffled ones
    index with a permutation made on the device by a generator seeded with ``seed + epoch``.

    Each ``iter()`` is an epoch: it uses the epoch number set by :meth:`set_epoch` (0 at first) and
    then moves it on by one, so the order changes every epoch, as with ``DataLoader(shuffle=True)``,
    and is reproducible for a given seed and epoch.

    Example:
        >>> x, y = torch.randn(10, 3), torch.arange(10)
        >>> loader = DeviceTensorLoader(x, y, batch_size=4, shuffle=False, device="cpu")
        >>> len(loader), [b[1].tolist() for b in loader]
        (3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])

    Args:
        tensors: tensors with the same first dimension.
        batch_size: rows per batch.
        shuffle: a new permutation every epoch.
        drop_last: drop a last batch shorter than ``batch_size``.
        device: where the tensors live (``"auto"``: CUDA when available).
        seed: the base seed of the permutations.
    """

    def __init__(self, *tensors: torch.Tensor, batch_size: int, shuffle: bool = True, drop_last: bool = False,
                 device: str | torch.device = "auto", seed: int = 0) -> None:
        if not tensors:
            raise ValueError("DeviceTensorLoader needs at least one tensor")
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError(f"DeviceTensorLoader takes tensors, got {[type(t).__name__ for t in tensors]}")
        sizes = {t.shape[0] if t.dim() else None for t in tensors}
        if len(sizes) != 1 or None in sizes:
            shapes = [tuple(t.shape) for t in tensors]
            raise ValueError(f"tensors must share their first dimension, got shapes {shapes}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.device = resolve_device(device)
        self.tensors = tuple(t.to(self.device) for t in tensors)
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.seed = seed
        self._n = tensors[0].shape[0]
        self._epoch = 0

    def __len__(self) -> int:
        return self._n // self.batch_size if self.drop_last else -(-self._n // self.batch_size)

    def __repr__(self) -> str:
        tensors = ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in self.tensors)
        return (f"DeviceTensorLoader(tensors=[{tensors}], batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"drop_last={self.drop_last}, device={str(self.device)!r}, seed={self.seed}, epoch={self._epoch})")

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` uses (it seeds the permutation)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        self._epoch = epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch = self._epoch
        self._epoch += 1
        n, size = self._n, self.batch_size
        stop = n - n % size if self.drop_last else n
        if not self.shuffle:
            for start in range(0, stop, size):
                yield tuple(t[start:start + size] for t in self.tensors)
            return
        generator = torch.Generator(device=self.device)
        generator.manual_seed(self.seed + epoch)
        order = torch.randperm(n, generator=generator, device=self.device)
        for start in range(0, stop, size):
            index = order[start:start + size]
            yield tuple(t.index_select(0, index) for t in self.tensors)
