"""``BufferedDataset``: an ``IterableDataset`` fed by producer threads through a bounded Buffer.

It validates (:class:`~audiobuffer.options.LoaderOptions`), plans each epoch (:func:`plan_epoch`, a
pure function), runs it (:class:`ProducerPool` into a :class:`Buffer`, the error policy of
:class:`EpochRun`) and reports (``stats()``, ``state_dict()``). Batches by duration run in
``_batched.py`` (NOTE [ Batches by duration ]).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .._checks import check_decoder, check_int
from ..engine import batches as _batched
from ..engine import epoch as _epoch
from ..engine import plan as _plan
from ..engine.epoch import MAX_LISTED_FAILURES, Compose, DatasetStats, EpochRun, WorkerEpochs, start_epoch
from ..engine.tuner import TunerMemory
from ..errors import BufferClosed
from ..options import DEFAULT_WARN_AFTER, ErrorPolicy, EvenShards, LoaderOptions, ProducerCount
from ..sources.source import AUDIO_PATTERNS, LabelSpec, Source, SourceSpec, WorkItem
from ..sources.stream import ShardStream, as_source

__all__ = ["MAX_LISTED_FAILURES", "BufferedDataset", "DatasetStats", "ErrorPolicy", "EvenShards"]


class BufferedDataset(IterableDataset):
    """An ``IterableDataset`` whose samples are decoded ahead of time by a pool of producer threads.

    Each ``iter()`` is one epoch: producer threads decode this shard's work items into a
    bounded :class:`~audiobuffer.Buffer` while the consumer (a ``DataLoader`` with
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

    Raises:
        TypeError, ValueError: an option of the wrong type or value (the message names it).
        SourceError: the source cannot be listed.

    Args:
        source: a directory, a CSV/TSV/JSONL manifest with a path column, the ``index.json`` of packed
            shards (random access), tar shards (a brace pattern ``shard-{000000..000011}.tar``, a glob or
            a list; streamed, NOTE [ Streamed shards ] in ``_stream.py``), a list of paths, or a ready
            ``Source``; each may be a URL (``s3://``, ``gs://``, ``https://``) read through fsspec.
        decoder: a callable from :class:`~audiobuffer.WorkItem` to sample (``AudioDecoder``,
            ``ImageDecoder`` or your own); it runs in the producer threads.
        num_producers: decoding threads per epoch, or ``"auto"`` (the default; ``None`` too): tuned as the
            epoch runs, from decoding in the consumer's thread up to the usable cores (see ``stats()``).
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
        labels: where labels come from (see :class:`~audiobuffer.Source`); ``labels``, ``patterns``
            and ``path_column`` describe how to list a source, so they cannot go with a ready ``Source``.
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
            waited this many seconds for a sample (default 5); at most one every 30 s. ``None`` or
            ``float("inf")``: never.
        timeout: raise :class:`~audiobuffer.StallError` when no sample arrives for this many seconds
            (a decoder stuck on a file); the error names each producer's file and how long it has
            been at it. ``None`` or ``float("inf")``: wait as long as it takes.
        max_batch_seconds: batch by duration: each element yielded is one batch (a list of samples,
            for ``DataLoader(batch_size=None, collate_fn=pad_collate)``) whose padded length (count x
            longest) stays within this many seconds; ``len()``, ``state_dict()`` and the shards
            count batches, and the buffer holds at least two of the largest. Durations come from the
            file headers (cached on disk) at construction, capped by the decoder's ``crop_seconds``
            (NOTE [ Batches by duration ] in ``_batched.py``). Streamed tar shards are batched as they
            stream, by ``duration_column``: no ``len()``, and resume stays at shard boundaries.
        buckets: duration buckets batches are cut from (default 10; 1: any mix of lengths).
        max_batch_size: also at most this many samples in a batch.
        duration_column: a manifest column holding each item's duration in seconds, read instead of
            the file headers; of streamed tar shards, the field of each sample's ``<key>.json`` sidecar
            that holds it (its manifest fields, as ``audiobuffer pack`` writes them).
        storage_options: options for fsspec's filesystem of the URLs read (``{"endpoint_url": ...,
            "key": ..., "secret": ...}``), passed to every remote read.
    """

    #: Keys of :meth:`state_dict` (the strings of ``audiobuffer/_plan.py``).
    STATE_VERSION, STATE_EPOCH, STATE_ITEMS, STATE_CONSUMED, STATE_BATCHING = (
        _plan.STATE_VERSION, _plan.STATE_EPOCH, _plan.STATE_ITEMS, _plan.STATE_CONSUMED, _plan.STATE_BATCHING)
    STATE_SEED, STATE_SHUFFLE, STATE_RANK, STATE_WORLD_SIZE, STATE_EVEN_SHARDS, STATE_SOURCE = _plan.SETUP_KEYS

    def __init__(self, source: SourceSpec | Source, decoder: Callable[[WorkItem], Any], *,
                 num_producers: ProducerCount | None = "auto", buffer_size: int = 64,
                 max_bytes: int | None = None, shuffle: bool = False, seed: int = 0,
                 ordered: bool = False, on_error: ErrorPolicy = "raise",
                 transform: Callable[[Any], Any] | None = None, labels: LabelSpec = None,
                 patterns: Sequence[str] | None = None, path_column: str = "path",
                 rank: int | None = None, world_size: int | None = None,
                 even_shards: EvenShards = "pad", warn_after: float | None = DEFAULT_WARN_AFTER,
                 timeout: float | None = None, max_batch_seconds: float | None = None, buckets: int | None = None,
                 max_batch_size: int | None = None, duration_column: str | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        check_decoder(decoder)
        options = LoaderOptions(
            num_producers=num_producers, buffer_size=buffer_size, max_bytes=max_bytes, shuffle=shuffle, seed=seed,
            ordered=ordered, on_error=on_error, transform=transform, labels=labels, patterns=patterns,
            path_column=path_column, rank=rank, world_size=world_size, even_shards=even_shards,
            warn_after=warn_after, timeout=timeout, max_batch_seconds=max_batch_seconds, buckets=buckets,
            max_batch_size=max_batch_size, duration_column=duration_column, storage_options=storage_options)
        self.source = as_source(source, patterns=patterns if patterns is not None else getattr(
            decoder, "patterns", AUDIO_PATTERNS), labels=labels, path_column=path_column, explicit_patterns=patterns,
            storage_options=storage_options)
        _epoch.check_combination(self.source, decoder, options)
        #: The validated options (shared with BatchSlotLoader and IsolatedLoader).
        self.options = options
        self.decoder = decoder
        self.transform = transform
        self.num_producers: ProducerCount = "auto" if num_producers is None else num_producers
        self.buffer_size = buffer_size
        self.max_bytes = max_bytes
        self.shuffle = shuffle
        self.seed = seed
        self.ordered = ordered
        self.on_error: ErrorPolicy = on_error
        self.warn_after = warn_after
        self.timeout = timeout
        self.even_shards: EvenShards = even_shards
        self._rank = rank
        self._world_size = world_size
        self._epoch = 0
        self._resume: tuple[int, bytes] | None = None  # (epoch, consumed) from load_state_dict
        self._worker_epochs = WorkerEpochs()
        self._tuned = TunerMemory()  # NOTE [ Producer tuning ]: where the last epoch's tuner settled
        #: Batches by duration: their setup and the items' durations, or ``None`` (one sample at a time, or
        #: streamed shards, whose batches are cut as they stream: ``_batched.start_streamed_epoch``).
        streamed = isinstance(self.source, ShardStream)
        self.batching = None if max_batch_seconds is None or streamed else _batched.DurationBatching.read(
            self.source, decoder, max_batch_seconds=max_batch_seconds, buckets=buckets, max_batch_size=max_batch_size,
            duration_column=duration_column, on_error=on_error, num_threads=max(8, options.most_producers()))
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._running: set[EpochRun] = set()
        self._last: EpochRun | None = None
        self._closed = False

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers get a copy without threads, locks or the parent's stats.
        state = self.__dict__.copy()
        for key in ("_lock", "_running", "_last", "_closed"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
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
        check_int("epoch", epoch, 0)
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
        """Items this rank yields per epoch (all its DataLoader workers together), failures included; with
        ``max_batch_seconds``, batches of the epoch :meth:`set_epoch` set (their count varies by epoch)."""
        rank, world_size = self.shard_info()
        return _epoch.epoch_length(self, rank, world_size)

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Generator[Any, None, None]:
        # A generator: its finally runs on exhaustion, on an exception, on close() and when the
        # generator is garbage-collected. NOTE [ Producer shutdown protocol ] in _producers.py.
        epoch = self._start_epoch()
        try:
            epoch.pool.start()  # inside the try: threads started before a failed start are stopped
            yield from epoch.consume(self.on_error)  # samples, or whole batches (_batched.BatchEpochRun)
            epoch.done = not epoch.pool.stopped
        finally:
            epoch.pool.close()
            epoch.end = time.perf_counter()
            with self._lock:
                self._running.discard(epoch)

    def _start_epoch(self) -> EpochRun:
        rank, world_size = self.shard_info()
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._worker_epochs.started(in_worker=info is not None)
        number = self._epoch
        with self._lock:
            resume = self._resume[1] if self._resume is not None and self._resume[0] == number else None
            self._resume = None  # a loaded state resumes one epoch, once
        decode = self.decoder if self.transform is None else Compose(self.decoder, self.transform)
        start: Callable[..., EpochRun]
        if self.batching is not None:
            start = _batched.start_epoch
        elif self.options.max_batch_seconds is not None:  # streamed shards
            start = _batched.start_streamed_epoch
        else:
            start = start_epoch
        epoch = start(self, decode, number=number, rank=rank, world_size=world_size, worker=worker,
                      num_workers=num_workers, resume=resume, memory=self._tuned)
        with self._lock:
            if self._closed:
                epoch.pool.close()
                raise BufferClosed("iter() on a closed BufferedDataset")
            self._running.add(epoch)
            self._last = epoch
        return epoch

    # -- inspection and shutdown ---------------------------------------------------------------

    def stats(self) -> DatasetStats | None:
        """The current or last epoch's stats in this process, or ``None`` before the first epoch.

        With ``DataLoader(num_workers > 0)`` the epochs run in the worker processes, whose stats stay
        there: in the main process this is ``None`` (or an older epoch iterated here), and the first
        such call warns (``UserWarning``, once per dataset). Use ``num_workers=0``: the producer
        threads already decode in parallel.
        """
        if get_worker_info() is None:
            self._worker_epochs.warn_if_elsewhere("stats()")
        with self._lock:
            epoch = self._last
        return None if epoch is None else epoch.snapshot()

    def close(self) -> None:
        """Stop every running epoch's producers and refuse new epochs. Idempotent, any thread.

        A consumer blocked waiting for a sample wakes up and its loop ends; a later ``iter()`` raises
        :class:`~audiobuffer.BufferClosed`.
        """
        with self._lock:
            self._closed = True
            running = list(self._running)
        for epoch in running:
            epoch.pool.close()

    # -- resume --------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in its epoch, as JSON-ready builtins: load it to resume exactly there.

        A resumed epoch yields each sample (with ``max_batch_seconds``: each batch) not yet yielded (or
        failed) exactly once, unordered too; samples in the buffer or being decoded when the state was
        taken are decoded again, not lost. The state carries its setup (seed, shuffle, rank, world size,
        even shards, a fingerprint of the file list, the batch setup and durations) and
        :meth:`load_state_dict` refuses another; it also loads formats 1 and 2.
        Take it between batches with ``DataLoader(num_workers=0)`` (a ``DevicePrefetcher``'s read-ahead
        counts as handed out). With ``num_workers > 0`` the workers keep their progress: here the state
        marks the start of the epoch, and the first such call warns (``UserWarning``, once).
        """
        if get_worker_info() is None:
            self._worker_epochs.warn_if_elsewhere("state_dict()")
        with self._lock:
            last, resume = self._last, self._resume
        consumed: bytes | None
        if resume is not None:
            epoch, consumed = resume
        elif last is not None and last.number == self._epoch and last.worker == 0 and last.num_workers == 1:
            epoch, consumed = last.number, bytes(last.consumed)
        else:
            epoch, consumed = self._epoch, None
        return _plan.encode_state(self._setup(), epoch, consumed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` runs the saved epoch's remaining items.

        The state is checked whole before anything changes: a refused state leaves the dataset as it was.

        Raises:
            ResumeError: the state is malformed or was saved under another setup.
        """
        epoch, consumed = _plan.decode_state(self._setup(), state)
        with self._lock:
            self._epoch = epoch
            self._resume = None if consumed is None else (epoch, consumed)

    def _setup(self) -> dict[str, Any]:
        """What a state dict must have been saved under (the keys of ``_plan.SETUP_KEYS``, and the batching)."""
        rank, world_size = self.shard_info()
        return {self.STATE_SEED: self.seed, self.STATE_SHUFFLE: self.shuffle, self.STATE_RANK: rank,
                self.STATE_WORLD_SIZE: world_size, self.STATE_EVEN_SHARDS: self.even_shards,
                self.STATE_SOURCE: self.source.fingerprint(),
                self.STATE_BATCHING: None if self.batching is None else self.batching.state()}

    def __enter__(self) -> BufferedDataset:
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
        try:
            items: int | str = len(self.source)
        except TypeError:  # streamed shards with no listing: unknown until streamed
            items = "unknown"
        return (f"BufferedDataset({self.source.description}, {self.decoder!r}, items={items}, "
                f"num_producers={self.num_producers!r}, buffer_size={self.buffer_size}, "
                f"shuffle={self.shuffle}, ordered={self.ordered}, on_error={self.on_error!r})")
