"""``IsolatedLoader``: the producer threads run in one helper process; batches cross in shared memory.

Producer threads decode in parallel wherever a decode releases the GIL, but the Python part of every
decode (python-soundfile's wrappers, a per-sample transform) holds it, and a training thread that is
itself Python-bound (a GPU step launching many small kernels) then waits for it. The isolated loader
keeps the whole pipeline of :class:`~audiobuffer.BufferedDataset` (source, plan, producers, buffer,
error policy) in one helper process and collates each batch there, straight into a shared-memory
slot; the trainer's side copies a slot into (pinned) tensors once and hands the slot back. The
trainer does a fixed amount of Python per batch, whatever the batch holds.

See NOTE [ Helper protocol ] in ``protocol.py`` for the messages, and NOTE [ Helper process lifecycle ] in
``helper.py`` for the process and its shutdown.

NOTE [ Starting in the trainer ]
================================
A helper process pays its interpreter, its imports and the first call of the decoder and transform
(librosa's loads scipy and numba: seconds) before its first batch. It does so while the script sets
up (NOTE [ Helper process lifecycle ], Start); a script that iterates at once would wait for all of
it. So while the helper has not said :class:`~.protocol.Warm`, the trainer decodes the epoch itself,
as :class:`~audiobuffer.BufferedDataset` would (the same pipeline, plan, producers and consumer,
``engine/epoch.feed``), into :class:`LocalEpoch`, whose sink sends the helper's own messages (a
:class:`~.protocol.Batch` with slot -1 holds its tensors): the loader's one consumer reads both.

The hand-over. Before each message it reads, the loader looks (without waiting) whether the helper
is warm. Once it is, and the last message read was a batch (so every failure the trainer counted is
in the consumed mask, and no position is half taken), the loader stops the local epoch, drops what
it decoded beyond the batches handed out, and starts the helper's epoch resumed after the consumed
mask, as a loaded state resumes an epoch: the helper decodes the rest, the same batches in the
same order as if it had made them all. Every draw is a function of (seed, epoch, item), so the
samples are the ones the helper would have made. An epoch that ends before the helper is warm ends
here; the next one starts in the trainer again if the helper is still not warm. A resume on another
world size (a dealt epoch) starts in the helper.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import pickle
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from ..._checks import batch_key
from ...buffer import Buffer, BufferStats
from ...collate import pad_collate
from ...engine.cancel import on_cancel
from ...engine.epoch import EpochCounts, EpochRun, closed_at_exit, feed_epoch, mixture_counts
from ...engine.pipeline import EpochLayout, Pipeline
from ...engine.plan import EpochShard
from ...engine.pool import ProducerPool
from ...engine.resize import Dealt
from ...engine.stats import DatasetStats
from ...errors import BufferClosed, DecodeError, HelperError, SampleError, StallError
from ...options import LoaderOptions, ProducerCount, check_keywords
from ...sources.source import Source, SourceSpec, WorkItem
from .._state import EpochCursor, PipelineViews, StateKeys
from . import tables
from .channel import (
    CLOSED,
    HelperChannel,
    RemoteTraceback,
    death_message,
    not_the_owner,
    pickle_by_reference,
)
from .protocol import (
    Batch,
    EpochEnd,
    EpochError,
    HelperSpec,
    SampleFailed,
    Skipped,
    Stalled,
    StartEpoch,
)
from .sink import MessageSink

__all__ = ["IsolatedLoader", "TrainerRun"]

logger = logging.getLogger(__name__)


class TrainerRun(EpochCounts):
    """One epoch as the trainer sees it: its generation, and the counts of :class:`EpochCounts`."""

    def __init__(self, gen: int, shard: EpochShard, layout: EpochLayout, num_producers: int, *,
                 sources: dict[str, int] | None = None) -> None:
        super().__init__(shard, layout, batched=layout.sizes is not None, sources=sources)
        self.shard = shard
        self.gen = gen
        self.num_producers = num_producers
        self.decode_s = 0.0
        self.wait_s = 0.0  # the trainer waiting for a full slot
        self.copy_s = 0.0  # the trainer copying slots out
        self.helper: dict[str, Any] = {}
        self.cancelled = False
        #: Decoded in the trainer while the helper warmed up (NOTE [ Starting in the trainer ]):
        #: batches, and the seconds decoding and augmenting took there.
        self.local_batches = 0
        self.local_decode_s = 0.0
        self.local_augment_s = 0.0

    def snapshot(self) -> DatasetStats:
        buffer = self.helper.get("buffer")
        return self.stats(
            num_producers=self.helper.get("num_producers", self.num_producers),
            decode_s=self.local_decode_s + self.decode_s,
            augment_s=self.local_augment_s + self.helper.get("augment_s", 0.0),
            buffer=BufferStats(**buffer) if buffer else None,
            transfer={"trainer_wait_s": self.wait_s, "trainer_copy_s": self.copy_s,
                      "helper_slot_wait_s": self.helper.get("slot_wait_s", 0.0),
                      "trainer_batches": self.local_batches},
            producer_history=self.helper.get("producer_history", []), gil_enabled=self.helper.get("gil_enabled", True))

    def on_failure(self, failed: SampleFailed) -> None:
        """A sample that failed in the helper, whose consumer applied the error policy: raise it
        (``fatal``) with the helper's traceback chained, or count it."""
        reason = f"{failed.type_name}: {failed.text}"
        if not failed.fatal:
            self.count_failure(failed.item_index, failed.path, reason)
            return
        cause: BaseException = RemoteTraceback(failed.trace)
        if failed.payload is not None:
            try:
                original = pickle.loads(failed.payload)
                original.__cause__ = cause
                cause = original
            except Exception:
                pass
        decode = failed.type_name == "DecodeError" or isinstance(cause, DecodeError)
        cls = DecodeError if decode else SampleError
        raise cls(f"item {failed.item_index} ({failed.path!r}) failed in {failed.producer} (helper "
                  f"process): {reason}", path=failed.path, index=failed.item_index,
                  producer=failed.producer) from cause


#: Seconds a stopped local epoch's thread is given to end (a producer stuck in a decode ends on
#: its own).
STOP_GRACE = 1.0


class _TensorSink(MessageSink):
    """Batches collated into (pinned) tensors in the trainer's process."""

    def __init__(self, run: EpochRun, gen: int, key: str, inbox: Buffer[Any],
                 pin_memory: bool) -> None:
        super().__init__(run, gen, key, inbox.put)
        self.pin_memory = pin_memory

    def collate(self, slot: int, samples: list[Any]) -> tuple[str, dict[str, Any]]:
        batch = pad_collate(samples, key=self.key)
        rest = {name: value for name, value in batch.items() if not isinstance(value, torch.Tensor)}
        # what does not pickle fails as it does in the helper
        pickle.dumps(rest, protocol=pickle.HIGHEST_PROTOCOL)
        if self.pin_memory:
            batch = {name: value.pin_memory() if isinstance(value, torch.Tensor) else value
                     for name, value in batch.items()}
        return "", batch


class LocalEpoch:
    """Epoch ``start`` of ``pipeline`` decoded in a thread of the trainer, as the helper's messages.

    Args:
        pipeline: the trainer's pipeline.
        start: what the helper would be sent: the generation, shard, resume mask and layout.
        batch_size, drop_last, key: as the helper's spec has them.
        pin_memory: pin the batches' tensors.
        ahead: batches decoded ahead of the trainer (as the helper's slots).
    """

    def __init__(self, pipeline: Pipeline, start: StartEpoch, *, batch_size: int | None,
                 drop_last: bool, key: str, pin_memory: bool, ahead: int) -> None:
        self.inbox: Buffer[Any] = Buffer(ahead)  # and a _Cancel from another thread
        self._pool: ProducerPool | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self.decode_s = 0.0
        self.augment_s = 0.0
        self._thread = threading.Thread(
            target=self._body, args=(pipeline, start, batch_size, drop_last, key, pin_memory),
            name="audiobuffer-local-epoch", daemon=True)
        self._thread.start()

    def _body(self, pipeline: Pipeline, start: StartEpoch, batch_size: int | None, drop_last: bool,
              key: str, pin_memory: bool) -> None:
        runs: list[EpochRun] = []

        def sink(run: EpochRun) -> MessageSink:
            runs.append(run)
            return _TensorSink(run, start.gen, key, self.inbox, pin_memory)

        def started(pool: ProducerPool) -> bool:
            with self._lock:
                self._pool = pool
                return not self._stopped

        def stalled(exc: StallError) -> None:
            self.inbox.put(Stalled(start.gen, str(exc)))

        try:
            feed_epoch(pipeline, start.shard, resume=start.consumed, layout=start.layout, sink=sink,
                       started=started, stalled=stalled, batch_size=batch_size, drop_last=drop_last)
        except BufferClosed:
            pass  # stopped: the helper takes the rest
        except BaseException as exc:  # a bug of ours: the trainer raises it, never hangs
            try:
                self.inbox.put(EpochError(start.gen, f"{type(exc).__name__}: {exc}",
                                          traceback.format_exc()))
            except BufferClosed:
                pass
        finally:
            if runs:
                self.decode_s = runs[0].pool.decode_seconds
                self.augment_s = runs[0].augment_s()

    def next(self) -> Any:
        """The next message (waits in slices, so Ctrl-C breaks it)."""
        return self.inbox.get()

    def stop(self) -> None:
        """Stop the epoch and wait (bounded) for its thread; what it decoded ahead is dropped."""
        with self._lock:
            self._stopped = True
            pool = self._pool
        self.inbox.close()  # a put, waiting or next, raises BufferClosed: the consumer ends
        while True:  # drop the batches decoded ahead: their (pinned) tensors go now
            try:
                self.inbox.get(timeout=0)
            except (TimeoutError, BufferClosed):
                break
        if pool is not None:
            pool.close(STOP_GRACE)
        self._thread.join(STOP_GRACE)


class _Cancel(NamedTuple):
    """Put in the inbox by a cancel from another thread, to wake the consumer of epoch ``gen``; never
    crosses the pipe."""

    gen: int


#: Bytes each slot starts with; a batch that does not fit grows its slot.
DEFAULT_SLOT_BYTES = 4 << 20
#: Extra seconds the trainer waits past ``timeout`` before it gives up on a helper that sends nothing.
SILENCE_GRACE = 5.0


class IsolatedLoader(PipelineViews, StateKeys):
    """Batches from producer threads that run in one helper process, so the trainer's GIL stays free.

    Takes :class:`~audiobuffer.BufferedDataset`'s keywords plus the batching ones, and yields
    :func:`~audiobuffer.pad_collate`'s batches (``audio`` ``(B, T)`` padded, ``lengths``, numbers as
    tensors, strings as lists). The helper is a fresh ``python -m audiobuffer.loaders.isolated.helper``
    started by the constructor once the source is listed and given the pipeline at once; while the
    script sets up, it imports what it needs and runs the decoder and transform once on the first
    item (result and errors dropped: the epoch reports them). It is kept across epochs (one that died
    is replaced at the next ``iter()``), does not import torch or your script, and needs no
    ``if __name__ == "__main__":`` guard. What crosses to it: the source, the options, and the
    decoder and transform, pickled by reference (the built-in decoders, or any importable
    module-level function or class instance). Batches cross in shared-memory slots and are copied once into
    (pinned) tensors.

    Use it when the training step is Python-bound (a GPU step launching many small kernels) or the
    per-sample work holds the GIL (Python transforms, tiny files); in-process producers are simpler
    where decoding releases the GIL and the step leaves the CPU alone.

    Thread safety: one thread iterates; :meth:`close` and :meth:`stats` may be called from any thread.

    Example:
        >>> loader = IsolatedLoader("data/fsdd/recordings", AudioDecoder(8000, crop_seconds=1.0),
        ...                         batch_size=32, shuffle=True, labels=r"^(\\d+)_")  # doctest: +SKIP
        >>> for epoch in range(3):  # doctest: +SKIP
        ...     loader.set_epoch(epoch)
        ...     for batch in loader:
        ...         batch["audio"], batch["lengths"], batch["label"]

    Args:
        source: as for :class:`~audiobuffer.BufferedDataset`.
        decoder: as for :class:`~audiobuffer.BufferedDataset`.
        batch_size: samples per batch; leave it out with ``max_batch_seconds`` (batches by duration,
            planned here in the trainer and decoded and collated whole in the helper).
        drop_last: drop the last, short batch of an epoch (not with ``max_batch_seconds``).
        num_slots: shared-memory slots (batches decoded ahead of the trainer; at least 2).
        pin_memory: copy batches into pinned memory; ``"auto"``: when CUDA is available.
        key: the sample key padded into the batch (as ``pad_collate``'s ``key``); ``None``: the
            decoder's ``sample_key`` (``"image"`` for :class:`~audiobuffer.ImageDecoder`), else
            ``"audio"``.
        slot_bytes: the bytes each slot starts with (a larger batch grows its slot).
        background: run the helper at a lower scheduling priority (``nice 10``; below normal on
            Windows), so that it decodes on the cores the trainer leaves idle. Off by default: the
            priority is lower against every process, so where other jobs share the cores (where
            training jobs run) they take the helper's share, and its epochs, the first above all,
            run slower (as ``benchmarks/bench_transform.py`` measures, ``isolated-bg`` against
            ``isolated-fg``).
            Turn it on where the machine is the trainer's alone and its step is Python-bound.
        start_in_trainer: while the helper starts and warms up, decode an epoch's first batches in
            the trainer (as :class:`~audiobuffer.BufferedDataset` would: the same batches, samples
            and order), then hand the rest of the epoch to the helper: for a script that iterates
            at once, whose first epoch would otherwise wait seconds for the helper's imports and
            first calls (``benchmarks/bench_transform.py`` measures it). Off by default: every
            batch is decoded in the helper, and the first ``iter()`` waits for it to start, which
            costs nothing where the script builds its model meanwhile.
        **options: every option of :class:`~audiobuffer.BufferedDataset`, listed there (and in
            :data:`audiobuffer.options.OPTIONS`, with their bounds); they apply in the helper process.

    Raises:
        TypeError: the decoder or transform cannot be sent by reference (a lambda, a local function,
            something defined in ``__main__``): the message says how to fix it.
    """

    def __init__(self, source: SourceSpec | Source, decoder: Callable[[WorkItem], Any], *,
                 batch_size: int | None = None, drop_last: bool = False, num_slots: int = 4,
                 pin_memory: bool | str = "auto", key: str | None = None,
                 slot_bytes: int = DEFAULT_SLOT_BYTES, background: bool = False,
                 start_in_trainer: bool = False, **options: Any) -> None:
        own = [name for name, parameter in inspect.signature(IsolatedLoader.__init__).parameters.items()
               if parameter.kind is parameter.KEYWORD_ONLY]
        check_keywords("IsolatedLoader", options, own)
        by_duration = options.get("max_batch_seconds") is not None
        if by_duration and (batch_size is not None or drop_last):
            pairs = (("batch_size", batch_size), ("drop_last", drop_last))
            given = ", ".join(f"{name}={value!r}" for name, value in pairs if value is not None and value is not False)
            raise ValueError(f"max_batch_seconds makes batches by duration: leave out {given}")
        if batch_size is None and not by_duration:
            raise TypeError("IsolatedLoader needs batch_size (samples per batch) or max_batch_seconds (batches by "
                            "duration), got neither")
        for name, value, least in (("batch_size", 1 if by_duration else batch_size, 1), ("num_slots", num_slots, 2),
                                   ("slot_bytes", slot_bytes, 1)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an integer >= {least}, got {value!r}")
            if value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if pin_memory not in ("auto", True, False):
            raise ValueError(f"pin_memory must be 'auto', True or False, got {pin_memory!r}")
        if getattr(decoder, "jpeg", None) == "device":
            raise ValueError("IsolatedLoader cannot take ImageDecoder(jpeg='device'): its "
                             "batches cross from the helper process in shared memory, arrays "
                             "only, not encoded JPEGs; give jpeg='host', or use BufferedDataset "
                             "with image_collate and DevicePrefetcher(transform=DecodeJpeg(...))")
        key = batch_key(decoder, key)
        for name, flag in (("background", background), ("start_in_trainer", start_in_trainer)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        loader_options = LoaderOptions(**options)
        self._closed = False
        self._owner = os.getpid()  # NOTE [ A loader in a forked child ] in channel.py
        self.start_in_trainer = start_in_trainer
        self._build(source, decoder, loader_options, batch_size=batch_size, drop_last=drop_last,
                    num_slots=num_slots, pin_memory=pin_memory, key=key, slot_bytes=slot_bytes,
                    background=background)
        tables.give_back_heap()  # the table built in memory is gone
        # The helper starts now: its interpreter and imports overlap what the trainer does until its
        # first iter(), which hands it the pipeline. Not before the source is listed: on a machine with
        # few cores its imports would slow the listing by as much as they take.
        self._channel: HelperChannel | None = HelperChannel(num_slots + 64)
        try:
            self._channel.launch()
        except BaseException:
            self._region.close()
            raise
        # The pipeline goes now too: the helper loads it and warms the decoder and transform up
        # (NOTE [ Helper process lifecycle ], Start); the first iter() reads its answer.
        try:
            self._channel.send_setup(self._spec, descriptors=self._region.pass_fds)
        except HelperError:  # it died as it started: the first iter() says so
            pass
        except BaseException:  # Ctrl-C in the middle of the frame: this loader is not made
            self._channel.close()
            self._region.close()
            raise

    def _build(self, source: SourceSpec | Source, decoder: Callable[[WorkItem], Any], options: LoaderOptions, *,
               batch_size: int | None, drop_last: bool, num_slots: int, pin_memory: bool | str, key: str,
               slot_bytes: int, background: bool) -> None:
        """The rest of ``__init__``, checked arguments in hand: list the source, share its table, make the spec."""
        # Listed, checked and (by duration) timed here in the trainer; the epochs run in the helper.
        #: What the epochs run over: the source, decoder, options and durations (one copy of each).
        self.pipeline = pipeline = Pipeline.build(source, decoder, options)
        if not isinstance(pipeline.source, Source):  # a ShardStream: its epochs are not plans of items
            raise ValueError(f"IsolatedLoader reads files or an index, not {pipeline.source.description}: "
                             f"{pipeline.source.random_access_hint}")
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.num_slots = num_slots
        self.pin_memory = torch.cuda.is_available() if pin_memory == "auto" else bool(pin_memory)
        self.key = key
        pickle_by_reference(pipeline.decoder, "decoder")
        if pipeline.options.transform is not None:
            pickle_by_reference(pipeline.options.transform, "transform")
        # The helper's copy: the source is listed (no listing options, whose labels may be a lambda) and
        # the trainer plans batches by duration (no durations: each epoch's message carries its batches).
        listed = dataclasses.replace(pipeline.options, labels=None, patterns=None, path_column="path",
                                     storage_options=None)
        # The items go in memory both processes map (NOTE [ Shared item table ] in sources/table.py): the
        # table built here is given up for the one over the region.
        regions: list[tables.TableRegion] = []

        def make_region(size: int) -> tables.TableRegion:
            regions.append(tables.TableRegion(size))
            return regions[-1]

        try:
            here, there = pipeline.source.shared(make_region)
        except BaseException:  # the region made, not written: its descriptor goes now
            for region in regions:
                region.close()
            raise
        self._region = regions[0]  # its descriptor closes with it, or on close()
        self.pipeline = pipeline = dataclasses.replace(pipeline, source=here)
        helper_pipeline = dataclasses.replace(pipeline, source=there, options=listed, batching=None)
        spec = HelperSpec(helper_pipeline, batch_size=batch_size, drop_last=self.drop_last,
                          num_slots=num_slots, slot_bytes=slot_bytes, key=key,
                          background=bool(background))
        self._spec = pickle_by_reference(spec, "pipeline")
        self._cursor = EpochCursor(pipeline)
        self._lock = threading.Lock()
        self._gen = 0
        self._run: TrainerRun | None = None

    # -- what it was built with ----------------------------------------------------------------

    @property
    def source(self) -> Source:
        """The listed source."""
        return self.pipeline.source  # type: ignore[return-value]  # checked in __init__

    def __len__(self) -> int:
        """Batches per epoch on this rank (failed samples make some batches, or the last one, smaller);
        with ``max_batch_seconds``, those of the epoch :meth:`set_epoch` set."""
        n = self._cursor.length()
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    # -- the helper process --------------------------------------------------------------------

    @property
    def helper_info(self) -> dict[str, Any]:
        """What the helper reported when it started: ``pid``, ``torch`` (whether it imported torch), ``gil``."""
        return self._channel.info if self._channel is not None else {}

    def _start(self, *, wait: bool) -> HelperChannel:
        """The helper's channel, started; with ``wait`` False, one launched by the constructor may
        still be starting (NOTE [ Starting in the trainer ])."""
        foreign = not_the_owner(self._owner)
        if foreign is not None:
            raise HelperError(foreign)
        if self._closed:
            raise BufferClosed("iter() on a closed IsolatedLoader")
        channel = self._channel
        if channel is not None:
            if channel.ready:
                return channel
            if not channel.info and channel.running and not channel.broken:  # launched by __init__
                if wait:
                    channel.finish_start(self._spec, descriptors=self._region.pass_fds)
                return channel
            if channel.info and not channel.broken:  # the epoch that saw it die raised its death; this
                logger.warning("starting a new helper process: %s", death_message(channel.proc))  # one: a new helper
            channel.close()  # reaps the dead one (or stops one cut off by Ctrl-C) and unlinks its segments
        channel = self._channel = HelperChannel(self.num_slots + 64)
        channel.start(self._spec, descriptors=self._region.pass_fds)
        return channel

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        shard, resume = self._cursor.begin()
        dealt = isinstance(resume, Dealt)  # laid out here, as batches by duration are
        here = self.start_in_trainer and not dealt  # NOTE [ Starting in the trainer ]
        channel = self._start(wait=not here)
        with self._lock:
            self._gen += 1
            gen = self._gen
        pipeline = self.pipeline
        layout = self._cursor.lay_out(shard, resume)
        planned = pipeline.batching  # batches by duration: planned here, decoded in the helper
        producers = cast(ProducerCount, pipeline.options.num_producers)  # LoaderOptions stores None as "auto"
        pinned = 0 if producers == "auto" else min(producers, max(1, len(layout)))  # auto: known at the end
        run = TrainerRun(gen, shard, layout, pinned, sources=mixture_counts(self.pipeline, shard, layout))
        if planned is not None:
            run.count_header_failures(planned)
        with self._lock:
            self._run = run
        start = StartEpoch(gen, shard, None if dealt else cast("bytes | None", resume),
                           layout if planned is not None or dealt else None)
        local = None
        if here and not channel.poll_warm():
            local = LocalEpoch(pipeline, start._replace(layout=layout), batch_size=self.batch_size,
                               drop_last=self.drop_last, key=self.key, pin_memory=self.pin_memory,
                               ahead=self.num_slots)
        else:
            channel.send(start)
        return closed_at_exit(self._epoch(run, channel, local))

    def _hand_over(self, run: TrainerRun, channel: HelperChannel, local: LocalEpoch) -> None:
        """Stop the epoch started here and give the helper the rest of it (NOTE [ Starting in the
        trainer ])."""
        local.stop()
        run.local_decode_s, run.local_augment_s = local.decode_s, local.augment_s
        run.decode_s = 0.0  # the helper's, from its first batch on
        consumed = bytes(run.consumed)
        planned = self.pipeline.batching is not None
        layout = self.pipeline.lay_out(run.shard, consumed) if planned else None
        channel.send(StartEpoch(run.gen, run.shard, consumed, layout))

    def _epoch(self, run: TrainerRun, channel: HelperChannel,
               local: LocalEpoch | None) -> Iterator[dict[str, Any]]:
        # A generator: its finally runs on exhaustion, break, an exception and garbage collection.
        # Under a DevicePrefetcher, leaving its loop cancels this epoch from the consumer's thread
        # (NOTE [ Prefetch cancellation ] in engine/cancel.py).
        unregister = on_cancel(lambda: self._cancel(run, channel, local))
        settled = True  # every failure counted is in the consumed mask: the helper may take over
        try:
            while not run.cancelled:
                if local is not None and settled and channel.poll_warm():
                    self._hand_over(run, channel, local)
                    local = None
                message = local.next() if local is not None else self._next(run, channel)
                settled = isinstance(message, (Batch, Skipped))
                match message:
                    case _Cancel():
                        return
                    case Batch():
                        yield self._unpack(run, channel, message)
                    case SampleFailed():
                        run.on_failure(message)
                    case Skipped():  # a batch by duration whose samples all failed
                        run.consumed[message.position] = 1
                        run.empty_batches += 1
                    case EpochEnd():
                        if local is not None:  # the whole epoch ran here
                            run.local_decode_s, run.local_augment_s = 0.0, 0.0
                        run.helper = message.stats
                        for position in message.positions:
                            run.consumed[position] = 1
                        run.decode_s = message.stats["decode_s"]
                        run.done = True
                        return
                    case Stalled():
                        raise StallError(f"{message.text} (in the helper process)")
                    case EpochError():
                        raise HelperError(f"the helper process failed: {message.text}") \
                            from RemoteTraceback(message.trace)
        finally:
            unregister()
            if local is not None:
                local.stop()
                if not run.done:
                    run.local_decode_s, run.local_augment_s = local.decode_s, local.augment_s
            run.end = time.perf_counter()
            with self._lock:
                latest = run.gen == self._gen
            # Leave the epoch early: the helper stops it and confirms. An epoch that a newer one replaced
            # (its iterator collected late) was stopped by the helper when the newer one began, and
            # waiting for its confirmation here would drop the newer epoch's messages.
            if not run.done and latest and local is None:
                channel.stop_epoch(run.gen)

    @staticmethod
    def _cancel(run: TrainerRun, channel: HelperChannel, local: LocalEpoch | None) -> None:
        """Wake the consumer of ``run`` and end its epoch early; returns at once, any thread."""
        run.cancelled = True
        for inbox in (channel.inbox, None if local is None else local.inbox):
            try:
                if inbox is not None:
                    inbox.put(_Cancel(run.gen), timeout=0)
            except (TimeoutError, BufferClosed):
                pass  # a full inbox: the consumer is not waiting, and sees the flag next

    def _next(self, run: TrainerRun, channel: HelperChannel) -> Any:
        """The next message of ``run``'s epoch (stale ones of an abandoned epoch are dropped)."""
        stall = self.pipeline.options.timeout
        timeout = None if stall is None else stall + SILENCE_GRACE
        while True:
            start = time.perf_counter()
            try:
                message = channel.receive(timeout)
            except TimeoutError:
                raise StallError(f"the helper process sent nothing for {timeout:.1f} s (timeout "
                                 f"{stall} s plus {SILENCE_GRACE:.0f} s)") from None
            except BufferClosed:
                raise BufferClosed(CLOSED) from None
            finally:
                run.wait_s += time.perf_counter() - start
            if message.gen == run.gen:
                return message

    def _unpack(self, run: TrainerRun, channel: HelperChannel, message: Batch) -> dict[str, Any]:
        if message.slot < 0:  # made in the trainer: its tensors
            batch = message.fields
            run.local_batches += 1
        else:
            start = time.perf_counter()
            batch = channel.copy_out(message, pin_memory=self.pin_memory)
            run.copy_s += time.perf_counter() - start
        for position in message.positions:
            run.consumed[position] = 1
        run.yielded += message.rows
        run.decode_s = message.decode_s
        batching = self.pipeline.batching
        if message.indices is not None and batching is not None:  # a batch by duration: its source indices
            run.batches = (run.batches or 0) + 1
            if not run.padding.add_collated(batch):  # rows without frames: their durations
                batching.add_padding(run.padding, np.asarray(message.indices), seed=self.pipeline.options.seed,
                                     epoch=run.number)
        return batch

    # -- inspection, resume, shutdown ----------------------------------------------------------

    def stats(self) -> DatasetStats | None:
        """The current or last epoch's stats, with ``transfer`` (seconds the trainer waited for and copied
        slots, and the helper waited for a free slot); ``None`` before the first epoch."""
        with self._lock:
            run = self._run
        return None if run is None else run.snapshot()

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in its epoch, as JSON-ready builtins (the format of
        :meth:`BufferedDataset.state_dict`): batches still in slots count as not consumed."""
        with self._lock:
            run = self._run
        return self._cursor.state_dict(None if run is None else (run.number, bytes(run.consumed)))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (of an IsolatedLoader or a BufferedDataset of the same setup).

        Raises:
            ResumeError: the state is malformed or was saved under another setup.
        """
        self._cursor.load_state_dict(state)

    def close(self) -> None:
        """Stop the helper process and free its shared memory. Idempotent, any thread. In a child forked
        from the process that made the loader, the loader is only marked closed there (NOTE [ A loader
        in a forked child ] in ``channel.py``)."""
        self._closed = True
        if not_the_owner(self._owner) is not None:
            return
        if self._channel is not None:
            self._channel.close()
        self._region.close()  # the maps made stay: the trainer's table is one of them

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> IsolatedLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        channel = self._channel
        state = "closed" if self._closed else ("running" if channel is not None and channel.ready else "idle")
        return (f"IsolatedLoader({self.pipeline.source.description}, {self.pipeline.decoder!r}, "
                f"batch_size={self.batch_size}, num_slots={self.num_slots}, "
                f"num_producers={self.pipeline.options.num_producers!r}, helper={state})")
