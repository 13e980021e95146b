"""The last step, host to device: ``DevicePrefetcher`` and ``DeviceTensorLoader``.

``DevicePrefetcher`` wraps any iterable of batches and yields them already on the device. A background
thread takes the next batches from the loader, pins them if they are not pinned, and copies them on a
side CUDA stream with ``non_blocking=True``. Before a batch is handed out, the consumer's stream waits
for that batch's copy (an event recorded right after it), and every tensor handed out is marked with
``record_stream`` on the consumer's stream, so the caching allocator never reuses its memory under a
kernel that still reads it (apex's ``data_prefetcher``). On the CPU the same code path runs with no
stream: the thread still reads ahead, so collation overlaps the training step.

``DeviceTensorLoader`` is for data that fits on the device: the tensors move there once, and each batch
is a slice or an index of them, with no per-batch host work at all.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterable, Iterator, Optional, Union

import torch

from .buffer import Buffer
from .errors import BufferClosed

__all__ = ["DevicePrefetcher", "DeviceTensorLoader", "map_tensors", "resolve_device", "to_device"]

logger = logging.getLogger(__name__)

#: Seconds ``DevicePrefetcher.close()`` waits for its thread.
JOIN_TIMEOUT = 10.0
_END = object()  # the prefetch thread's end-of-epoch marker


class _Raise:
    """An exception from the loader, queued behind the batches that came before it."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def resolve_device(device: Union[str, torch.device]) -> torch.device:
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


class DevicePrefetcher:
    """Iterate ``loader`` with each batch already on ``device``, copied ahead on a side stream.

    Drops in where the classic ``CudaDataLoader(loader, device, queue_size=2)`` was used: ``len()``,
    ``.dataset`` and ``.sampler`` pass through to the loader. Batches may be tensors or any nesting of
    dicts, lists, tuples and namedtuples; other values (paths, names) pass unchanged. Each ``iter()``
    is a new epoch with its own thread. Leaving the loop early, an exception, garbage collection of
    the iterator or :meth:`close` stop the thread; an exception from the loader reaches the consumer.

    Thread safety: one thread iterates; :meth:`close` may be called from any thread.

    Example:
        >>> loader = torch.utils.data.DataLoader(torch.arange(10.0), batch_size=4)
        >>> [b.tolist() for b in DevicePrefetcher(loader, "cpu")]
        [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]

    Args:
        loader: any iterable of batches (a ``DataLoader`` most often).
        device: where batches go (``"cuda"``, ``"cuda:1"``, ``"cpu"``, a ``torch.device``).
        queue_size: batches copied ahead (>= 1).
    """

    def __init__(self, loader: Iterable[Any], device: Union[str, torch.device], *, queue_size: int = 2) -> None:
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be an integer >= 1, got {queue_size!r}")
        self.loader = loader
        self.device = resolve_device(device)
        self.queue_size = queue_size
        self._lock = threading.Lock()
        self._running: set[tuple[Buffer, threading.Thread]] = set()

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    @property
    def dataset(self) -> Any:
        """The loader's dataset."""
        return getattr(self.loader, "dataset", None)

    @property
    def sampler(self) -> Any:
        """The loader's sampler."""
        return getattr(self.loader, "sampler", None)

    def __iter__(self) -> Iterator[Any]:
        cuda = self.device.type == "cuda"
        side = torch.cuda.Stream(device=self.device) if cuda else None
        buffer: Buffer[Any] = Buffer(self.queue_size)
        thread = threading.Thread(target=self._fill, args=(buffer, side), name="audiobuffer-prefetch", daemon=True)
        with self._lock:
            self._running.add((buffer, thread))
        thread.start()
        try:
            consumer = torch.cuda.current_stream(self.device) if cuda else None
            while True:
                try:
                    item = buffer.get()
                except BufferClosed:
                    return
                if item is _END:
                    return
                if item.__class__ is _Raise:
                    raise item.exc
                batch, event = item
                if consumer is not None:
                    consumer.wait_event(event)  # the copy of this batch, not those queued after it
                    batch = map_tensors(batch, lambda t: _record(t, consumer))
                yield batch
        finally:
            buffer.abort(BufferClosed("the prefetcher was closed"))
            thread.join(JOIN_TIMEOUT)
            if thread.is_alive():
                logger.warning("the prefetch thread is still waiting for the loader %.0f s after close()", JOIN_TIMEOUT)
            with self._lock:
                self._running.discard((buffer, thread))

    def _fill(self, buffer: Buffer[Any], side: Optional[torch.cuda.Stream]) -> None:
        """The prefetch thread: read the loader, copy each batch, hand it over; see the module docstring."""
        device = self.device
        iterator = None
        try:
            iterator = iter(self.loader)
            for host in iterator:
                if side is None:
                    buffer.put((to_device(host, device), None))
                    continue
                with torch.cuda.stream(side):
                    moved = map_tensors(host, lambda t: _pin(t).to(device, non_blocking=True))
                    event = torch.cuda.Event()
                    event.record(side)
                # Keep the host batch until its copy is done: its memory may be a recycled slot that
                # is handed out again as soon as nothing references it.
                event.synchronize()
                del host
                buffer.put((moved, event))
            buffer.put(_END)
        except BufferClosed:
            pass  # the consumer has gone
        except BaseException as exc:  # reaches the consumer after the batches before it
            try:
                buffer.put(_Raise(exc))
            except BufferClosed:
                pass
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()  # a generator (BufferedDataset's epoch) stops its producers now
            iterator = None

    def close(self) -> None:
        """Stop every running epoch's thread. Idempotent, any thread."""
        with self._lock:
            running = list(self._running)
        for buffer, _ in running:
            buffer.abort(BufferClosed("the prefetcher was closed"))
        for _, thread in running:
            if thread is not threading.current_thread():
                thread.join(JOIN_TIMEOUT)

    def __enter__(self) -> "DevicePrefetcher":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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
                 device: Union[str, torch.device] = "auto", seed: int = 0) -> None:
        if not tensors:
            raise ValueError("DeviceTensorLoader needs at least one tensor")
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError(f"DeviceTensorLoader takes tensors, got {[type(t).__name__ for t in tensors]}")
        sizes = {t.shape[0] if t.dim() else None for t in tensors}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(f"tensors must share their first dimension, got shapes {[tuple(t.shape) for t in tensors]}")
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
