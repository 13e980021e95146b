"""``BufferedDataset``: an ``IterableDataset`` fed by producer threads through a bounded Buffer."""

from __future__ import annotations

import base64
import binascii
import logging
import multiprocessing
import os
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from multiprocessing.context import get_spawning_popen
from typing import Any, Callable, Iterator, Literal, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ._checks import check_int as _check_int
from ._checks import check_seconds
from ._producers import Failure, ProducerPool
from .buffer import Buffer, BufferStats
from .errors import DecodeError, ResumeError, SampleError
from .sources import AUDIO_PATTERNS, LabelSpec, Source, SourceSpec, WorkItem, epoch_order, even_out, shard

__all__ = ["BufferedDataset", "DatasetStats", "ErrorPolicy"]

logger = logging.getLogger(__name__)

ErrorPolicy = Literal["raise", "warn", "skip"]
EvenShards = Optional[Literal["pad", "drop"]]
_POLICIES = ("raise", "warn", "skip")
#: How many failed items :class:`DatasetStats` lists by name (all are counted).
MAX_LISTED_FAILURES = 100


def _default_producers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


@dataclass
class DatasetStats:
    """What one epoch of a :class:`BufferedDataset` did (one rank, one DataLoader worker).

    Attributes:
        epoch: the epoch number.
        rank: this process's rank; world_size: how many ranks share the epoch.
        worker: the DataLoader worker id (0 without workers); num_workers: how many workers share it.
        items: this shard's items in the epoch (those left to do, in a resumed epoch).
        resumed: items already consumed before a resume (0 in a fresh epoch).
        yielded: samples handed to the consumer.
        failed: items whose decoder or transform raised (skipped with "warn" or "skip").
        failures: ``(index, path, message)`` of the first 100 failed items.
        decode_s: seconds the producers spent decoding, summed over producers.
        wall_s: seconds from the epoch's start to its end (or to now, while it runs).
        done: whether the epoch ran to its end.
        buffer: the buffer's counters (waits on both sides, fill).
        transfer: an :class:`~audiobuffer.IsolatedLoader`'s hand-over between its processes: seconds the
            trainer waited for a batch (``trainer_wait_s``) and copied slots out (``trainer_copy_s``), and
            seconds the helper waited for a free slot (``helper_slot_wait_s``); ``None`` in process.
    """

    epoch: int
    rank: int
    world_size: int
    worker: int
    num_workers: int
    items: int
    num_producers: int
    resumed: int = 0
    yielded: int = 0
    failed: int = 0
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    decode_s: float = 0.0
    wall_s: float = 0.0
    done: bool = False
    buffer: Optional[BufferStats] = None
    transfer: Optional[dict[str, float]] = None

    def as_dict(self) -> dict[str, Any]:
        """The stats as plain builtins."""
        return asdict(self)


class _Epoch:
    """One running (or finished) epoch: its pool and buffer, and the consumer's counts."""

    def __init__(self, number: int, rank: int, world_size: int, worker: int, num_workers: int,
                 pool: ProducerPool, buffer: Buffer[Any], consumed: bytearray,
                 positions: Optional[np.ndarray]) -> None:
        self.number = number
        #: One byte per position of this shard's epoch order: 1 once yielded or failed.
        self.consumed = consumed
        #: The shard positions the pool's sequence numbers stand for (a resumed epoch skips some).
        self.positions = positions
        self.rank = rank
        self.world_size = world_size
        self.worker = worker
        self.num_workers = num_workers
        self.pool = pool
        self.buffer = buffer
        self.items = pool.count
        self.resumed = len(consumed) - pool.count  # consumed before a load_state_dict
        self.yielded = 0
        self.failed = 0
        self.failures: list[tuple[int, str, str]] = []
        self.done = False
        self.start = time.perf_counter()
        self.end: Optional[float] = None

    def snapshot(self) -> DatasetStats:
        end = self.end if self.end is not None else time.perf_counter()
        return DatasetStats(
            epoch=self.number, rank=self.rank, world_size=self.world_size, worker=self.worker,
            num_workers=self.num_workers, items=self.items, resumed=self.resumed, num_producers=len(self.pool.threads),
            yielded=self.yielded, failed=self.failed, failures=list(self.failures),
            decode_s=self.pool.decode_seconds, wall_s=end - self.start, done=self.done,
            buffer=self.buffer.stats)


class _Compose:
    """``transform(decoder(item))``, picklable when both are."""

    def __init__(self, decoder: Callable[[WorkItem], Any], transform: Callable[[Any], Any]) -> None:
        self.decoder = decoder
        self.transform = transform

    def __call__(self, item: WorkItem) -> Any:
        return self.transform(self.decoder(item))


class BufferedDataset(IterableDataset):
    """An ``IterableDataset`` whose samples are decoded ahead of time by a pool of producer threads.

    Each ``iter()`` is one epoch: it starts ``num_producers`` threads that decode this shard's work
    items into a bounded :class:`~audiobuffer.Buffer` while the consumer (a ``DataLoader`` with
    ``num_workers=0``, usually) takes samples out. Leaving the loop early, an exception in the
    training loop, garbage collection of the iterator or :meth:`close` stop the threads (see
    NOTE [ Producer shutdown protocol ] in ``audiobuffer/_producers.py``).

    Sharding: items are split by ``rank``/``world_size`` (given, or read from ``torch.distributed``
    when it is initialised) and again by DataLoader worker when ``num_workers > 0``, so each item is
    yielded exactly once per epoch across all shards. Every shard shuffles with the same seed
    (``seed + epoch``) before taking its part.

    Thread safety: :meth:`close`, :meth:`stats` and :meth:`set_epoch` may be called from any thread;
    one thread iterates a given epoch.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> ds = BufferedDataset("data/fsdd/recordings", AudioDecoder(sample_rate=8000),
        ...                      shuffle=True, labels=r"^(\\d+)_")  # doctest: +SKIP
        >>> loader = DataLoader(ds, batch_size=32, collate_fn=pad_collate)  # doctest: +SKIP
        >>> for epoch in range(3):  # doctest: +SKIP
        ...     ds.set_epoch(epoch)
        ...     for batch in loader:
        ...         ...

    Args:
        source: a directory, a CSV/TSV/JSONL manifest with a path column, or a list of paths.
        decoder: a callable from :class:`~audiobuffer.WorkItem` to sample (``AudioDecoder``,
            ``ImageDecoder`` or your own); it runs in the producer threads.
        num_producers: decoding threads per epoch; default: the usable cores, at most 8.
        buffer_size: the most samples decoded ahead (the buffer's capacity).
        max_bytes: also bound the buffer by payload bytes (``None``: no byte bound). A sample larger
            than the bound still passes, alone; samples a producer has finished and not yet put
            in the buffer are outside the bound.
        shuffle: shuffle the items each epoch (seeded by ``seed + epoch``).
        seed: the base seed for shuffling and random crops (an integer >= 0).
        ordered: yield in the epoch's order (after shuffling) rather than as decoded. With
            ``max_bytes``, the samples decoded ahead of their turn count against it too.
        on_error: what a failed item does: ``"raise"`` (a :class:`~audiobuffer.SampleError` in the
            consumer, chained to the cause), ``"warn"`` (a logged warning, then skip) or ``"skip"``
            (counted in :meth:`stats`, then skip).
        transform: a callable applied to each sample in the producer thread.
        labels: where labels come from (see :class:`~audiobuffer.Source`).
        patterns: glob patterns for a directory source; ``None``: the decoder's ``patterns`` attribute
            (:data:`~audiobuffer.IMAGE_PATTERNS` for an ``ImageDecoder``), else
            :data:`~audiobuffer.AUDIO_PATTERNS`.
        path_column: the path column of a manifest.
        rank: this process's rank; with ``world_size``, overrides ``torch.distributed``.
        world_size: the number of ranks.
        even_shards: with ``world_size > 1``, give every rank the same number of items per epoch:
            ``"pad"`` repeats items from the start of the epoch's order (as ``DistributedSampler``
            does), ``"drop"`` leaves out the remainder, ``None`` lets ranks differ by one. Unequal
            ranks make the last collective of an epoch wait forever.
        warn_after: log a "waiting for data" warning (logger ``audiobuffer``) when the consumer has
            waited this many seconds for a sample; at most one every 30 s. ``None`` or
            ``float("inf")``: never.
        timeout: raise :class:`~audiobuffer.StallError` when no sample arrives for this many seconds
            (a decoder stuck on a file); the error names each producer's file and how long it has
            been at it. ``None`` or ``float("inf")``: wait as long as it takes.
    """

    #: Keys of :meth:`state_dict`.
    STATE_VERSION = "version"
    STATE_EPOCH = "epoch"
    STATE_SEED = "seed"
    STATE_SHUFFLE = "shuffle"
    STATE_RANK = "rank"
    STATE_WORLD_SIZE = "world_size"
    STATE_EVEN_SHARDS = "even_shards"
    STATE_SOURCE = "source_fingerprint"
    STATE_ITEMS = "items"
    STATE_CONSUMED = "consumed"
    _FORMAT = 2  # 2: the consumed bitmap as a base64 str (JSON-serialisable); 1: as bytes

    def __init__(self, source: SourceSpec | Source, decoder: Callable[[WorkItem], Any], *,
                 num_producers: Optional[int] = None, buffer_size: int = 64,
                 max_bytes: Optional[int] = None, shuffle: bool = False, seed: int = 0,
                 ordered: bool = False, on_error: ErrorPolicy = "raise",
                 transform: Optional[Callable[[Any], Any]] = None, labels: LabelSpec = None,
                 patterns: Optional[Sequence[str]] = None, path_column: str = "path",
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 even_shards: EvenShards = "pad", warn_after: Optional[float] = None,
                 timeout: Optional[float] = None) -> None:
        super().__init__()
        if not callable(decoder):
            raise TypeError(f"decoder must be callable (WorkItem -> sample), got {decoder!r}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be None or callable, got {transform!r}")
        if num_producers is None:
            num_producers = _default_producers()
        _check_int("num_producers", num_producers, 1)
        _check_int("buffer_size", buffer_size, 1)
        _check_int("seed", seed, 0)  # numpy seeds are >= 0
        if max_bytes is not None:
            _check_int("max_bytes", max_bytes, 1)
        if on_error not in _POLICIES:
            raise ValueError(f"on_error must be one of {_POLICIES}, got {on_error!r}")
        check_seconds("warn_after", warn_after)
        check_seconds("timeout", timeout)
        if even_shards not in ("pad", "drop", None):
            raise ValueError(f"even_shards must be 'pad', 'drop' or None, got {even_shards!r}")
        if (rank is None) != (world_size is None):
            raise ValueError(f"give rank and world_size together, got rank={rank!r}, world_size={world_size!r}")
        if world_size is not None:
            _check_int("world_size", world_size, 1)
            _check_int("rank", rank, 0)
            if rank >= world_size:  # type: ignore[operator]
                raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
        if patterns is None:
            patterns = getattr(decoder, "patterns", AUDIO_PATTERNS)
        self.source = source if isinstance(source, Source) else Source(
            source, patterns=patterns, labels=labels, path_column=path_column)
        self.decoder = decoder
        self.transform = transform
        self.num_producers = num_producers
        self.buffer_size = buffer_size
        self.max_bytes = max_bytes
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.ordered = bool(ordered)
        self.on_error: ErrorPolicy = on_error
        self.warn_after = warn_after
        self.timeout = timeout
        self.even_shards: EvenShards = even_shards
        self._rank = rank
        self._world_size = world_size
        self._epoch = 0
        self._resume: Optional[tuple[int, bytearray]] = None  # (epoch, consumed) from load_state_dict
        self._chunk_items: Optional[int] = None  # producers' hand-over chunks; None: the pool decides
        self._on_pool_close: Optional[Callable[[], None]] = None  # wakes a decoder waiting for the consumer
        # Epochs started in DataLoader worker processes, counted in shared memory that the workers
        # inherit (fork) or receive as they are spawned, so the main process can tell that its own
        # stats() and state_dict() do not describe them (see _warn_if_run_in_workers).
        self._worker_epochs: Any = _shared_counter()
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._running: set[_Epoch] = set()
        self._last: Optional[_Epoch] = None
        self._closed = False
        self._worker_epochs_seen = 0  # _worker_epochs when this process last started an epoch
        self._warned_workers = False

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers get a copy without threads, locks or the parent's stats.
        state = self.__dict__.copy()
        for key in ("_lock", "_running", "_last", "_closed", "_worker_epochs_seen", "_warned_workers"):
            state.pop(key)
        if get_spawning_popen() is None:
            # Shared memory travels only to a process being started (a spawned DataLoader worker);
            # any other copy (pickle.dumps, deepcopy) gets a counter of its own.
            state["_worker_epochs"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.__dict__.get("_worker_epochs") is None:
            self._worker_epochs = _shared_counter()
        self._init_runtime()

    # -- epoch setup ---------------------------------------------------------------------------

    @property
    def classes(self) -> list[str]:
        """The sorted label names; a sample's ``label`` indexes this list."""
        return self.source.classes

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next ``iter()``: it seeds the shuffle and random crops.

        Call it at the start of every epoch, as with ``DistributedSampler``. With
        ``persistent_workers=True`` DataLoader workers keep the epoch they started with.
        """
        _check_int("epoch", epoch, 0)
        self._epoch = epoch
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None  # a loaded state applies to its own epoch only

    def shard_info(self) -> tuple[int, int]:
        """This process's ``(rank, world_size)``: as given, else from ``torch.distributed``, else (0, 1)."""
        if self._world_size is not None:
            return self._rank, self._world_size  # type: ignore[return-value]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def __len__(self) -> int:
        """Items this rank yields per epoch (all its DataLoader workers together), failures included."""
        rank, world_size = self.shard_info()
        n = len(self.source)
        if world_size > 1 and self.even_shards == "pad":
            return -(-n // world_size)
        if world_size > 1 and self.even_shards == "drop":
            return n // world_size
        return len(range(rank, n, world_size))

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        # A generator: its finally runs on exhaustion, on an exception, on close() and when the
        # generator is garbage-collected. NOTE [ Producer shutdown protocol ] in _producers.py.
        epoch = self._start_epoch()
        consumed, positions = epoch.consumed, epoch.positions
        try:
            epoch.pool.start()  # inside the try: threads started before a failed start are stopped
            for seq, out in epoch.pool:
                consumed[seq if positions is None else positions[seq]] = 1
                if out.__class__ is Failure:
                    self._on_failure(out, epoch)
                    continue
                epoch.yielded += 1
                yield out
            epoch.done = not epoch.pool.stopped
        finally:
            epoch.pool.close()
            epoch.end = time.perf_counter()
            with self._lock:
                self._running.discard(epoch)

    def _start_epoch(self) -> "_Epoch":
        rank, world_size = self.shard_info()
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            # Tell the main process that an epoch runs in a worker. Unlocked: two workers may add
            # one between them, and the counter still differs from what the main process saw.
            self._worker_epochs.value += 1
        else:
            self._worker_epochs_seen = self._worker_epochs.value
        number, source, seed = self._epoch, self.source, self.seed
        order = epoch_order(len(source), shuffle=self.shuffle, seed=seed, epoch=number)
        if world_size > 1 and self.even_shards is not None:
            order = even_out(order, world_size, self.even_shards)
        # By rank first, then by worker: every rank gets the same share whatever its workers do.
        indices = shard(shard(order, rank, world_size), worker, num_workers)
        consumed = bytearray(len(indices))
        positions: Optional[np.ndarray] = None
        with self._lock:
            resume = self._resume if self._resume is not None and self._resume[0] == number else None
            if resume is not None:
                self._resume = None  # a loaded state resumes one epoch, once
        if resume is not None:
            if len(resume[1]) != len(indices):
                raise ResumeError(f"the saved state covers {len(resume[1])} items, this epoch's shard has {len(indices)} "
                                  f"(DataLoader workers: {num_workers}); resume with the setup it was saved under")
            consumed[:] = resume[1]
            positions = np.flatnonzero(np.frombuffer(bytes(consumed), dtype=np.uint8) == 0)
            indices = indices[positions]

        def make_item(seq: int) -> WorkItem:
            # A resumed epoch's items keep the positions they had in the full epoch.
            return source.item(int(indices[seq]), epoch=number, seed=seed,
                               seq=seq if positions is None else int(positions[seq]))

        decode = self.decoder if self.transform is None else _Compose(self.decoder, self.transform)
        buffer: Buffer[Any] = Buffer(self.buffer_size, max_bytes=self.max_bytes)
        pool = ProducerPool(make_item, len(indices), decode, buffer,
                            num_producers=min(self.num_producers, max(1, len(indices))),
                            ordered=self.ordered, warn_after=self.warn_after, timeout=self.timeout,
                            chunk_items=self._chunk_items, on_close=self._on_pool_close)
        epoch = _Epoch(number, rank, world_size, worker, num_workers, pool, buffer, consumed, positions)
        with self._lock:
            if self._closed:
                raise RuntimeError("iter() on a closed BufferedDataset")
            self._running.add(epoch)
            self._last = epoch
        return epoch

    def _on_failure(self, failure: Failure, epoch: "_Epoch") -> None:
        item, exc = failure.item, failure.exc
        message = (f"item {item.index} ({item.path!r}) failed in {failure.producer}: "
                   f"{type(exc).__name__}: {exc}")
        if self.on_error == "raise":
            cls = DecodeError if isinstance(exc, DecodeError) else SampleError
            raise cls(message, path=item.path, index=item.index, producer=failure.producer) from exc
        epoch.failed += 1
        if len(epoch.failures) < MAX_LISTED_FAILURES:
            epoch.failures.append((item.index, item.path, f"{type(exc).__name__}: {exc}"))
        if self.on_error == "warn":
            logger.warning("skipping %s", message)

    # -- inspection and shutdown ---------------------------------------------------------------

    def stats(self) -> Optional[DatasetStats]:
        """The current or last epoch's stats in this process, or ``None`` before the first epoch.

        With ``DataLoader(num_workers > 0)`` the epochs run in the worker processes, whose stats stay
        there: in the main process this is ``None`` (or an older epoch iterated here), and the first
        such call warns (``UserWarning``, once per dataset). Use ``num_workers=0``: the producer
        threads already decode in parallel.
        """
        self._warn_if_run_in_workers("stats()")
        with self._lock:
            epoch = self._last
        return None if epoch is None else epoch.snapshot()

    def close(self) -> None:
        """Stop every running epoch's producers and refuse new epochs. Idempotent, any thread.

        A consumer blocked waiting for a sample wakes up and its loop ends.
        """
        with self._lock:
            self._closed = True
            running = list(self._running)
        for epoch in running:
            epoch.pool.close()

    # -- resume --------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in its epoch, as plain builtins: load it to resume exactly there.

        A resumed epoch yields each sample not yet yielded (or failed) exactly once, in unordered
        mode too; samples that were in the buffer or being decoded when the state was taken are
        decoded again, not lost. The state carries its setup (seed, shuffle, rank, world size, even
        shards, a fingerprint of the file list), and :meth:`load_state_dict` refuses another setup.

        The state is JSON-serialisable (``json.dumps`` works on it): ints, strs, bools and ``None``;
        the consumed positions are a base64 string of a bitmap. :meth:`load_state_dict` also takes
        the format 1 state of earlier versions, whose bitmap is ``bytes``.

        It counts the samples this dataset handed out: take it between batches with
        ``DataLoader(num_workers=0)``. A ``DevicePrefetcher`` reads ``queue_size`` batches ahead,
        and those count as handed out. ``DataLoader(num_workers > 0)`` workers keep their progress
        in their processes: in the main process the state then marks the start of the epoch (a
        resume would run the whole epoch again), and the first such call warns (``UserWarning``,
        once per dataset).
        """
        self._warn_if_run_in_workers("state_dict()")
        rank, world_size = self.shard_info()
        with self._lock:
            last, resume = self._last, self._resume
        if resume is not None:
            epoch, consumed = resume
        elif last is not None and last.number == self._epoch and last.worker == 0 and last.num_workers == 1:
            epoch, consumed = last.number, last.consumed
        else:
            epoch, consumed = self._epoch, None
        return {
            self.STATE_VERSION: self._FORMAT,
            self.STATE_EPOCH: epoch,
            self.STATE_SEED: self.seed,
            self.STATE_SHUFFLE: self.shuffle,
            self.STATE_RANK: rank,
            self.STATE_WORLD_SIZE: world_size,
            self.STATE_EVEN_SHARDS: self.even_shards,
            self.STATE_SOURCE: self.source.fingerprint(),
            self.STATE_ITEMS: len(consumed) if consumed is not None else None,
            self.STATE_CONSUMED: _pack_consumed(consumed) if consumed is not None else "",
        }

    def _warn_if_run_in_workers(self, method: str) -> None:
        """Warn (once) when epochs ran in DataLoader workers since this process last started one."""
        if self._warned_workers or get_worker_info() is not None:
            return
        if self._worker_epochs.value == self._worker_epochs_seen:
            return
        self._warned_workers = True
        warnings.warn(
            f"BufferedDataset.{method} in the main process: this dataset's epochs ran in DataLoader "
            f"worker processes (num_workers > 0), which keep their stats and progress; here stats() "
            f"is None (or an older epoch) and state_dict() marks the start of the epoch. Use "
            f"DataLoader(num_workers=0): the producer threads already decode in parallel.",
            UserWarning, stacklevel=3)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` runs the saved epoch's remaining items.

        Raises:
            ResumeError: the state is malformed or was saved under another setup.
        """
        if not isinstance(state, dict):
            raise ResumeError(f"a state dict is a dict, got {type(state).__name__}")
        missing = [k for k in (self.STATE_VERSION, self.STATE_EPOCH, self.STATE_SEED, self.STATE_SHUFFLE,
                               self.STATE_RANK, self.STATE_WORLD_SIZE, self.STATE_EVEN_SHARDS, self.STATE_SOURCE,
                               self.STATE_ITEMS, self.STATE_CONSUMED) if k not in state]
        if missing:
            raise ResumeError(f"the state dict lacks {missing}")
        if state[self.STATE_VERSION] not in (1, self._FORMAT):  # 1: the consumed bitmap as bytes
            raise ResumeError(f"state format {state[self.STATE_VERSION]!r} is not 1 or {self._FORMAT}")
        rank, world_size = self.shard_info()
        mine = {self.STATE_SEED: self.seed, self.STATE_SHUFFLE: self.shuffle, self.STATE_RANK: rank,
                self.STATE_WORLD_SIZE: world_size, self.STATE_EVEN_SHARDS: self.even_shards,
                self.STATE_SOURCE: self.source.fingerprint()}
        for key, value in mine.items():
            if state[key] != value:
                raise ResumeError(f"the state was saved with {key}={state[key]!r}, this dataset has {key}={value!r}; "
                                  f"resume with the setup it was saved under")
        epoch = state[self.STATE_EPOCH]
        _check_int("epoch", epoch, 0)
        items, packed = state[self.STATE_ITEMS], state[self.STATE_CONSUMED]
        with self._lock:
            self._epoch = epoch
            if items is None:
                self._resume = None
                return
            if isinstance(items, bool) or not isinstance(items, int) or items < 0:
                raise ResumeError(f"items must be None or an integer >= 0, got {items!r}")
            bits = np.unpackbits(np.frombuffer(_unpack_consumed(packed, items), dtype=np.uint8))[:items]
            self._resume = (epoch, bytearray(bits.tobytes()))

    def __enter__(self) -> "BufferedDataset":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A safety net only: epochs stop when their iterator goes away, and users call close().
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"BufferedDataset({self.source.description}, {self.decoder!r}, items={len(self.source)}, "
                f"num_producers={self.num_producers}, buffer_size={self.buffer_size}, "
                f"shuffle={self.shuffle}, ordered={self.ordered}, on_error={self.on_error!r})")


def _shared_counter() -> Any:
    """An integer in shared memory, seen by DataLoader workers forked or spawned after it is made.

    A ``RawValue`` (no lock): a lock would be a semaphore, with a resource tracker process under spawn.
    """
    return multiprocessing.RawValue("q", 0)


def _pack_consumed(consumed: bytearray) -> str:
    """One byte per position (0 or 1) -> a base64 string of the bitmap (8 positions a byte)."""
    return base64.b64encode(np.packbits(np.frombuffer(bytes(consumed), dtype=np.uint8)).tobytes()).decode("ascii")


def _unpack_consumed(packed: Any, items: int) -> bytes:
    """The bitmap of :func:`_pack_consumed` (a base64 str), or the ``bytes`` of format 1, checked."""
    size = (items + 7) // 8
    if isinstance(packed, str):
        try:
            raw = base64.b64decode(packed.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error) as exc:
            raise ResumeError(f"consumed must be a base64 string, got {packed[:40]!r}: {exc}") from None
    elif isinstance(packed, (bytes, bytearray)):
        raw = bytes(packed)
    else:
        raise ResumeError(f"consumed must be a base64 string (or bytes), got {type(packed).__name__}")
    if len(raw) != size:
        raise ResumeError(f"consumed must be a bitmap of {size} bytes for {items} items, got {len(raw)} bytes")
    return raw
