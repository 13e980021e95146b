"""``BufferedDataset``: an ``IterableDataset`` fed by producer threads through a bounded Buffer.

It holds a :class:`~audiobuffer.engine.pipeline.Pipeline` (source, decoder, options, durations) and an
:class:`~audiobuffer.loaders._state.EpochCursor` (epoch, resume); each ``iter()`` is one epoch of the
engine (``engine/epoch.py``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.sharedctypes  # noqa: F401 - RawValue's module: now, not in a constructor
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any, Generic, TypeVar, overload

from torch.utils.data import IterableDataset

from .._checks import batch_key
from ..collate import check_batch_size, stack_on_arrival
from ..engine.epoch import RunningEpochs, run_epoch
from ..engine.pipeline import DurationBatching, Pipeline
from ..engine.stats import MAX_LISTED_FAILURES, DatasetStats
from ..options import (
    DEFAULT_WARN_AFTER,
    BatchSeconds,
    ErrorPolicy,
    EvenShards,
    LoaderOptions,
    ProducerCount,
    ReadBlock,
)
from ..sources.source import LabelSpec, Source, SourceSpec, WorkItem
from ._state import EpochCursor, PipelineViews, StateKeys, dataloader_worker

__all__ = ["MAX_LISTED_FAILURES", "BufferedDataset", "DatasetStats", "ErrorPolicy", "EvenShards",
           "StackedBatches"]

T = TypeVar("T")


class _Option(Generic[T]):
    """A read-only attribute of a loader that reads its option of the same name (one copy: the pipeline's)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, loader: None, owner: type) -> _Option[T]: ...

    @overload
    def __get__(self, loader: object, owner: type) -> T: ...

    def __get__(self, loader: Any, owner: type) -> Any:
        return self if loader is None else getattr(loader.pipeline.options, self._name)

    def __set__(self, loader: object, value: T) -> None:
        raise AttributeError(f"{self._name} is read-only: it is one of the options the loader was built with")


class WorkerEpochs:
    """Counts epochs started in DataLoader worker processes, so the main process can tell that its own
    ``stats()`` and ``state_dict()`` do not describe them, and warn once.

    The count lives in shared memory that workers inherit (fork) or receive as they are spawned. A
    ``RawValue`` (no lock): a lock would be a semaphore, with a resource tracker process under spawn;
    two workers adding one at once still leave the count different from what the main process saw.
    """

    def __init__(self) -> None:
        self._count: Any = multiprocessing.RawValue("q", 0)
        self._seen = 0  # the count when this process last started an epoch
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        # Shared memory travels only to a process being started (a spawned DataLoader worker); any other
        # copy (pickle.dumps, deepcopy) gets a counter of its own.
        return {"count": self._count if get_spawning_popen() is not None else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._count = state["count"] if state["count"] is not None else multiprocessing.RawValue("q", 0)
        self._seen = 0
        self._warned = False

    def started(self, in_worker: bool) -> None:
        """An epoch starts here: in a DataLoader worker, or in this (main) process."""
        if in_worker:
            self._count.value += 1
        else:
            self._seen = self._count.value

    def warn_if_elsewhere(self, method: str) -> None:
        """Warn (once) when epochs ran in DataLoader workers since this process last started one."""
        if self._warned or self._count.value == self._seen:
            return
        self._warned = True
        warnings.warn(
            f"BufferedDataset.{method} in the main process: this dataset's epochs ran in DataLoader "
            f"worker processes (num_workers > 0), which keep their stats and progress; here stats() "
            f"is None (or an older epoch) and state_dict() marks the start of the epoch. Use "
            f"DataLoader(num_workers=0): the producer threads already decode in parallel.",
            UserWarning, stacklevel=4)


class BufferedDataset(PipelineViews, StateKeys, IterableDataset):
    """An ``IterableDataset`` whose samples are decoded ahead of time by a pool of producer threads.

    Each ``iter()`` is one epoch: producer threads decode this shard's work items into a
    bounded :class:`~audiobuffer.Buffer` while the consumer (a ``DataLoader`` with
    ``num_workers=0``, usually) takes samples out. Leaving the loop early, an exception in the
    training loop, garbage collection of the iterator or :meth:`close` stop the threads (see
    NOTE [ Producer shutdown protocol ] in ``audiobuffer/engine/pool.py``).

    Sharding: items are split by ``rank``/``world_size`` (given, or read from ``torch.distributed``
    when it is initialised) and again by DataLoader worker when ``num_workers > 0``, so each item is
    yielded exactly once per epoch across all shards. Every shard shuffles with the same seed
    (``seed + epoch``) before taking its part.

    The options are read-only attributes of the same names (``ds.shuffle``, ``ds.seed``, ...), as are
    ``source``, ``decoder`` and ``batching``: one copy of each, in :attr:`pipeline`.

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
            a list; streamed, NOTE [ Streamed shards ] in ``sources/stream.py``), a list of paths, or a ready
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
            (NOTE [ Batches by duration ] in ``engine/epoch.py``). Streamed tar shards are batched as they
            stream, by ``duration_column``: no ``len()``, and resume stays at shard boundaries.
            One budget per bucket: a list (shortest bucket first), or a mapping from each bucket's
            upper edge in seconds to its budget (fixed buckets; ``audiobuffer.probe_budgets`` finds
            them).
        buckets: duration buckets batches are cut from (default 10; 1: any mix of lengths).
        max_batch_size: also at most this many samples in a batch.
        duration_column: a manifest column holding each item's duration in seconds, read instead of
            the file headers; of streamed tar shards, the field of each sample's ``<key>.json`` sidecar
            that holds it (its manifest fields, as ``audiobuffer pack`` writes them).
        start_column: a manifest column holding where each item starts in its file, in seconds: each
            row is then a segment of its file (with ``duration_column``, that long; else to the end),
            which :class:`~audiobuffer.AudioDecoder` reads alone; many rows may name one long recording.
        quadratic_duration: for models whose cost grows with the square of the length (attention): a
            batch of ``n`` items, the longest ``L`` seconds, costs ``n x (L + L*L / quadratic_duration)``
            against ``max_batch_seconds`` instead of ``n x L``, so batches of long items hold fewer.
            Lhotse's option of the same name; ``None``: ``n x L``.
        sync_buckets: with more than one rank, every rank takes its batch of each step from the same
            duration bucket, so no rank waits at a step for another's much longer batch (DDP waits for
            the slowest rank at every step). Decided from the seed and epoch alone (no communication):
            the same batches as without, in an order where each step's batches are of like length
            (NOTE [ Ranks in step ] in ``engine/plan.py``); exactly once, equal counts and resume as
            ever. ``None`` (the default): on with more than one rank. Planned batches only (not
            streamed tar shards).
        storage_options: options for fsspec's filesystem of the URLs read (``{"endpoint_url": ...,
            "key": ..., "secret": ...}``), passed to every remote read.
        read_block: an ``index.json``'s members read a block at a time: the epoch's order shuffles
            blocks of this many consecutive members of a shard, then the members within a window of a
            few blocks, and the first producer to need a member of a block reads the whole block in
            one ranged request (NOTE [ Block order ] in ``engine/plan.py``). ``"auto"`` (the default):
            blocks of :data:`~audiobuffer.options.DEFAULT_READ_BLOCK` for an index read from a URL
            (not with ``max_batch_seconds``), one member a request for local data; ``None``: one member
            a request, in the plain order. Exactly once, ranks, workers and resume as ever.
        blas_threads: the threads numpy's and scipy's BLAS (OpenBLAS, MKL) may run a matrix product
            on while the producers run (a transform's filter bank): without a limit, each product
            starts threads of its own that fight the producers for the cores. The count is
            process-wide: set while any loader's producers run and restored when the last one
            stops (NOTE [ BLAS threads ] in ``engine/blas.py``); in an ``IsolatedLoader``'s helper
            process, for its whole life. Not held where the producers run no matrix product (a
            decoder with ``calls_blas = False``, ``ImageDecoder``, and no ``transform``). ``None``:
            leave BLAS as it is.
    """

    #: The options, read-only (one copy of each: ``pipeline.options``).
    num_producers: _Option[ProducerCount] = _Option()
    buffer_size: _Option[int] = _Option()
    max_bytes: _Option[int | None] = _Option()
    shuffle: _Option[bool] = _Option()
    seed: _Option[int] = _Option()
    ordered: _Option[bool] = _Option()
    on_error: _Option[ErrorPolicy] = _Option()
    transform: _Option[Callable[[Any], Any] | None] = _Option()
    even_shards: _Option[EvenShards] = _Option()
    warn_after: _Option[float | None] = _Option()
    timeout: _Option[float | None] = _Option()

    def __init__(self, source: SourceSpec | Source, decoder: Callable[[WorkItem], Any], *,
                 num_producers: ProducerCount | None = "auto", buffer_size: int = 64,
                 max_bytes: int | None = None, shuffle: bool = False, seed: int = 0,
                 ordered: bool = False, on_error: ErrorPolicy = "raise",
                 transform: Callable[[Any], Any] | None = None, labels: LabelSpec = None,
                 patterns: Sequence[str] | None = None, path_column: str = "path",
                 rank: int | None = None, world_size: int | None = None,
                 even_shards: EvenShards = "pad", warn_after: float | None = DEFAULT_WARN_AFTER,
                 timeout: float | None = None, max_batch_seconds: BatchSeconds | None = None,
                 buckets: int | None = None,
                 max_batch_size: int | None = None, duration_column: str | None = None,
                 start_column: str | None = None, quadratic_duration: float | None = None,
                 sync_buckets: bool | None = None,
                 storage_options: Mapping[str, Any] | None = None, read_block: ReadBlock = "auto",
                 blas_threads: int | None = 1) -> None:
        super().__init__()
        options = LoaderOptions(
            num_producers=num_producers, buffer_size=buffer_size, max_bytes=max_bytes, shuffle=shuffle, seed=seed,
            ordered=ordered, on_error=on_error, transform=transform, labels=labels, patterns=patterns,
            path_column=path_column, rank=rank, world_size=world_size, even_shards=even_shards,
            warn_after=warn_after, timeout=timeout, max_batch_seconds=max_batch_seconds, buckets=buckets,
            max_batch_size=max_batch_size, duration_column=duration_column, start_column=start_column,
            quadratic_duration=quadratic_duration,
            sync_buckets=sync_buckets, storage_options=storage_options, read_block=read_block,
            blas_threads=blas_threads)
        #: What the epochs run over: the source, decoder, options and durations (one copy of each).
        self.pipeline = Pipeline.build(source, decoder, options)
        self._cursor = EpochCursor(self.pipeline)
        self._epochs = RunningEpochs("BufferedDataset")
        self._worker_epochs = WorkerEpochs()

    # -- what it was built with (read-only) ------------------------------------------------------

    @property
    def decoder(self) -> Callable[[WorkItem], Any]:
        """The decoder the producers run."""
        return self.pipeline.decoder

    @property
    def options(self) -> LoaderOptions:
        """The validated options."""
        return self.pipeline.options

    @property
    def batching(self) -> DurationBatching | None:
        """Batches by duration: their setup and the items' durations; ``None`` one sample at a time, or for
        streamed shards (their batches are cut as they stream)."""
        return self.pipeline.batching

    # -- epochs --------------------------------------------------------------------------------

    def shard_info(self) -> tuple[int, int]:
        """This process's ``(rank, world_size)``: as given, else from ``torch.distributed``, else (0, 1)."""
        return self._cursor.shard_info()

    def __len__(self) -> int:
        """Items this rank yields per epoch (all its DataLoader workers together), failures included; with
        ``max_batch_seconds``, batches of the epoch :meth:`set_epoch` set (their count varies by epoch)."""
        return self._cursor.length()

    def __iter__(self) -> Generator[Any, None, None]:
        # A generator, so that the epoch starts at the first next(); NOTE [ Producer shutdown protocol ]
        # in engine/pool.py for how it stops.
        worker = dataloader_worker()
        self._worker_epochs.started(in_worker=worker is not None)
        shard, resume = self._cursor.begin(worker)
        layout = self._cursor.lay_out(shard, resume)
        yield from self._epochs.run(run_epoch(self.pipeline, shard, layout=layout), self.pipeline.options.on_error)

    def stacked_batches(self, batch_size: int, *, drop_last: bool = False,
                        key: str | None = None) -> StackedBatches:
        """This dataset's epochs in batches of ``batch_size`` samples, each sample's array written
        into its batch as the sample arrives rather than after the batch's last one (NOTE [ Batches
        stacked on arrival ] in ``collate.py``): the first batch of fixed-size images comes sooner
        than through ``DataLoader(batch_size=..., collate_fn=...)``. For
        ``DataLoader(ds.stacked_batches(64), batch_size=None)`` or a loop of its own;
        ``set_epoch``, ``state_dict`` and ``stats`` stay this dataset's (a state taken between
        batches holds every sample of those yielded).

        Args:
            batch_size: samples per batch.
            drop_last: drop an epoch's last, short batch.
            key: the sample key padded into each batch (the batches are
                :func:`~audiobuffer.pad_collate`'s, as :class:`~audiobuffer.IsolatedLoader`'s);
                ``None``: the decoder's ``sample_key`` (``"image"`` for
                :class:`~audiobuffer.ImageDecoder`), else ``"audio"``.

        Raises:
            TypeError, ValueError: an argument of the wrong type or value; batches by duration
                (``max_batch_seconds``, already batches); ``ImageDecoder(jpeg="device")`` (JPEGs,
                not arrays: ``DataLoader`` with ``image_collate``).
        """
        return StackedBatches(self, batch_size, drop_last=drop_last, key=key)

    # -- inspection and shutdown ---------------------------------------------------------------

    def stats(self) -> DatasetStats | None:
        """The current or last epoch's stats in this process, or ``None`` before the first epoch.

        With ``DataLoader(num_workers > 0)`` the epochs run in the worker processes, whose stats stay
        there: in the main process this is ``None`` (or an older epoch iterated here), and the first
        such call warns (``UserWarning``, once per dataset). Use ``num_workers=0``: the producer
        threads already decode in parallel.
        """
        if dataloader_worker() is None:
            self._worker_epochs.warn_if_elsewhere("stats()")
        run = self._epochs.last
        return None if run is None else run.snapshot()

    def close(self) -> None:
        """Stop every running epoch's producers and refuse new epochs. Idempotent, any thread.

        A consumer blocked waiting for a sample wakes up and its loop ends; a later ``iter()`` raises
        :class:`~audiobuffer.BufferClosed`.
        """
        self._epochs.close()

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
        if dataloader_worker() is None:
            self._worker_epochs.warn_if_elsewhere("state_dict()")
        last = self._epochs.last
        mine = last is not None and last.worker == 0 and last.num_workers == 1  # run here, not in workers
        return self._cursor.state_dict((last.number, bytes(last.consumed)) if last is not None and mine else None)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` runs the saved epoch's remaining items.

        The state is checked whole before anything changes: a refused state leaves the dataset as it was.

        Raises:
            ResumeError: the state is malformed or was saved under another setup.
        """
        self._cursor.load_state_dict(state)

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


class StackedBatches(IterableDataset):
    """:meth:`BufferedDataset.stacked_batches`: the dataset's epochs as
    :func:`~audiobuffer.pad_collate`'s batches, stacked as their samples arrive (NOTE [ Batches
    stacked on arrival ] in ``collate.py``)."""

    def __init__(self, dataset: BufferedDataset, batch_size: int, *, drop_last: bool = False,
                 key: str | None = None) -> None:
        check_batch_size(batch_size, drop_last)
        seconds = dataset.options.max_batch_seconds
        if seconds is not None:
            raise ValueError(f"stacked_batches() cannot batch a dataset that batches by duration "
                             f"(max_batch_seconds={seconds!r}): its elements are batches already "
                             f"(cap their size with max_batch_size)")
        if getattr(dataset.decoder, "jpeg", "host") == "device":
            raise ValueError("stacked_batches() stacks arrays, not the JPEGs "
                             "ImageDecoder(jpeg='device') leaves to the device: batch them with "
                             "DataLoader(dataset, batch_size=..., collate_fn=image_collate)")
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.key = batch_key(dataset.decoder, key)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.dataset!r}, batch_size={self.batch_size}, "
                f"drop_last={self.drop_last}, key={self.key!r})")

    def __len__(self) -> int:
        """Batches per epoch of ``len(dataset)`` items (in one process: each DataLoader worker
        batches its own)."""
        items = len(self.dataset)
        return items // self.batch_size if self.drop_last else -(-items // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return stack_on_arrival(iter(self.dataset), self.batch_size, key=self.key,
                               drop_last=self.drop_last)
