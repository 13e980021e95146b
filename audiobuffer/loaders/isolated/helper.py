"""The helper process of :class:`~audiobuffer.IsolatedLoader`: producers and collate, away from the trainer's GIL.

Run as ``python -m audiobuffer.loaders.isolated.helper`` by the trainer, never through ``multiprocessing``: the user's
``__main__`` is not re-imported, so a script without an ``if __name__ == "__main__":`` guard works on
every OS. Nothing here imports torch; decoders hand numpy arrays over (``decoders/_common.py``).

NOTE [ Helper process lifecycle ]
=================================
Channel. Frames are pickled messages (NOTE [ Helper protocol ] in ``protocol.py``), only ever from
the trainer that started this process: trainer -> helper on the helper's stdin, helper -> trainer on
its original stdout. Both pipes move first to descriptors of their own, which no child process
inherits, and descriptors 0 and 1 then point at the null device and at stderr (``sys.stdout`` too):
neither a ``print`` in a user's decoder nor a child process it runs (a command-line tool writing to
its stdout) can write into the channel or read the trainer's frames, and a child that outlives the
helper does not keep the channel open. The trainer reads only while it waits for a message
(NOTE [ Reading the helper on demand ] in ``channel.py``), so the pipe is often full: every thread here
sends into a queue that one writer thread empties into the pipe, and only that thread ever waits on
it. The main thread is then always free to read :class:`Free`, :class:`StopEpoch` and :class:`Close`, and the
epoch thread collates into every free slot whatever the pipe holds. The epoch's data frames (batches,
failures) wait for room once ``Channel.DATA_FRAMES`` of them are queued, so that a corpus failing file
after file while the trainer trains holds back as it did behind a full pipe; control frames and log
lines never wait.

Start. The trainer sends :class:`Setup`; the helper checks the trainer's protocol version
(NOTE [ Helper protocol ] in ``protocol.py``; a helper of another version answers :class:`SetupFailed`
and exits),
puts the trainer's ``sys.path`` in place (so the user's modules import as they do in the trainer),
unpickles the spec and answers :class:`Ready` or :class:`SetupFailed`. With ``background`` it lowers
its own scheduling priority (``nice 10``, or below-normal on Windows): its producers use the cores
the trainer leaves idle, and a Python-bound training step is not slowed by decoding on a machine
with few cores. It limits BLAS (and OpenMP) threads for its whole life (``blas_threads``;
NOTE [ BLAS threads ] in ``engine/blas.py``). The trainer sends the setup as soon as it has
launched the helper, and the helper, once ready, warms up in a thread of its own: it decodes and
transforms the source's first item once, with the seed of epoch 0, and drops the result and any
error (the epoch decodes that item again and reports its error in its place), so that the decoder's
and transform's imports and first calls (librosa's loads scipy and numba) are paid while the
trainer sets up, not in its first epoch. The epochs do not wait for it: an epoch that starts first
takes the import locks after it. Nothing of the epochs' seeds, order or counts changes; a decoder
that keeps state of its own sees one more call.

Epochs. :class:`StartEpoch` starts an epoch in a thread of its own (generation ``gen`` tags every
message of it, so nothing of an abandoned epoch is mistaken for the next one's). The epoch thread runs
the epoch that ``engine/epoch.set_up_epoch`` sets up from the spec's pipeline, as every loader's
epochs are (a :class:`ProducerPool` into a :class:`Buffer`), with the consumer every loader runs,
its counts and its error policy (``engine/epoch.feed``). That hands each ``batch_size`` samples to
:class:`_SlotSink`, which collates them straight into a free shared-memory slot and sends
:class:`Batch`; the trainer copies the slot out and answers :class:`Free`. Each failure is sent as
:class:`SampleFailed` (``fatal`` once the policy raised it); the trainer counts or raises it. With
batches by duration the trainer plans the batches and sends their layout with the epoch; the helper
decodes a batch's samples in parallel, collates each batch once it is complete and sends
:class:`Skipped` for one whose samples all failed. A sample that cannot go into a batch with the
batch's first one (not a dict, another rank, an array of objects, a value that does not pickle)
fails as its item, under the error policy, and the batch goes on without it (a batch of
``batch_size`` fills up from the next samples). A slot grows only
where ``/dev/shm`` has room for the batch, else the epoch ends with a ``HelperError`` that says how to
make room (``_shm.check_room``; writing past the room would kill the helper with SIGBUS). A stall
(``timeout``: :class:`Stalled`) is sent before the pool is closed: the close waits for the producer
stuck in a decode. The free and full slot lists are caffe's ``prefetch_free_`` and ``prefetch_full_``; the helper waits
for a free slot on a condition that :class:`Free` and :class:`StopEpoch` notify. An epoch ends with
:class:`EpochEnd`, or, when the trainer leaves it early, with :class:`StopEpoch` -> the pool is closed and
:class:`Stopped` confirms it. Every slot is free again at the start of the next epoch. The pools
of successive epochs share the pipeline's ``TunerMemory`` (NOTE [ Producer tuning ] in ``engine/tuner.py``).

Exit. :class:`Close` or end of file on stdin ends the helper: the trainer closed it, exited or was
killed (a killed trainer's pipe closes with it). A child process the trainer forked (a persistent
DataLoader worker, a ``multiprocessing`` child) holds a copy of the trainer's end of the pipe, though,
and keeps it open after the trainer died; so on POSIX the helper also looks every ``TRAINER_CHECK``
seconds whether its parent is still the trainer whose pid it was given (Windows has no fork, and the
trainer's end of the pipe is not inheritable there). Either way the epoch's pool is stopped, every
segment this process created is closed (none has a name left: NOTE [ Segments without names ] in
``shm.py``), what is queued for the trainer is written (for at most ``EXIT_GRACE`` seconds: a
trainer that closed the loader reads the pipe to its end), and the process
exits with ``os._exit``, without waiting for a producer stuck in a decode beyond ``EXIT_GRACE``.
An error of the helper's own (a frame it cannot read, a bug) is printed on stderr with its
traceback and the exit code is 1. SIGINT is ignored, from the first line run, before the slow imports:
Ctrl-C in a terminal reaches the whole process group, and the trainer decides when its helper stops.
On Windows the helper runs in a process group of its own (``CREATE_NEW_PROCESS_GROUP``), which the
console's Ctrl-C does not reach.
"""

# ruff: noqa: E402  (the imports come after SIGINT is ignored)
from __future__ import annotations

import signal

if __name__ == "__main__":  # before the imports below take their time (NOTE [ Helper process lifecycle ], Exit)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

import logging
import os
import pickle
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO

from ..._numpy_collate import SlotArena, collate_numpy
from ...engine import blas
from ...engine.epoch import EpochRun, feed_epoch
from ...engine.pipeline import Pipeline
from ...engine.pool import ProducerPool
from ...errors import BufferClosed
from ...sources.source import Source
from . import shm as _shm
from .protocol import (
    PROTOCOL_VERSION,
    Close,
    EpochEnd,
    EpochError,
    Free,
    FromHelper,
    HelperSpec,
    Log,
    Ready,
    Setup,
    SetupFailed,
    SlotArray,
    Stalled,
    StartEpoch,
    StopEpoch,
    Stopped,
    Warm,
    package_description,
)
from .sink import MessageSink

#: Seconds the helper gives its producers to stop before it exits anyway.
EXIT_GRACE = 1.0
#: Seconds between two looks at whether the trainer still runs (POSIX; NOTE [ Helper process lifecycle ], Exit).
TRAINER_CHECK = 0.5

class Channel:
    """Pickled frames over a pair of binary streams (NOTE [ Helper process lifecycle ], Channel).

    Frames queue up for one writer thread, which alone waits on the pipe when the trainer is not reading;
    a sender of data frames waits only for room in the queue (:data:`DATA_FRAMES`). Only the main thread
    calls :meth:`receive`.
    """

    #: Frames of an epoch's data (batches, failures) that may wait for the writer at once; the sender
    #: of one more waits for room, so that a flood of failures while the trainer trains stays bounded.
    DATA_FRAMES = 64

    def __init__(self, incoming: BinaryIO, outgoing: BinaryIO) -> None:
        self._in = incoming
        self._out = outgoing
        self._queue: queue.SimpleQueue[tuple[bytes, bool] | None] = queue.SimpleQueue()
        self._room = threading.Semaphore(self.DATA_FRAMES)
        self._broken = False  # the trainer's end has gone: frames are for nobody
        self._writer = threading.Thread(target=self._write, name="audiobuffer-helper-writer", daemon=True)
        self._writer.start()

    def send(self, message: FromHelper, *, data: bool = False) -> None:
        """Queue ``message`` for the trainer (any thread). Control frames and log lines never wait; a
        ``data`` frame (a batch, a failure) waits while :data:`DATA_FRAMES` of them are queued."""
        if self._broken:
            return
        frame = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if data:
            self._room.acquire()
        self._queue.put((frame, data))

    def receive(self) -> Any:
        """The next message; ``EOFError`` when the other side has gone, in the middle of a frame too (a trainer
        interrupted as it wrote one closes the channel then)."""
        try:
            return pickle.load(self._in)
        except pickle.UnpicklingError as exc:
            if "truncated" not in str(exc):  # a frame that is not ours
                raise
            raise EOFError("the trainer's end closed in the middle of a frame") from exc

    def close(self, timeout: float) -> None:
        """Let the writer write what was sent, then stop it; give up after ``timeout`` seconds."""
        self._queue.put(None)
        self._writer.join(timeout)

    def _write(self) -> None:
        while (entry := self._queue.get()) is not None:
            frame, data = entry
            try:
                self._out.write(frame)
                self._out.flush()
            except (OSError, ValueError):  # the trainer has gone
                self._broken = True
                self._room.release(self.DATA_FRAMES)  # no sender waits for room that never comes
                return
            if data:
                self._room.release()


class _ChannelLog(logging.Handler):
    """Forwards the helper's warnings to the trainer, which logs them under its own configuration."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(logging.WARNING)
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._channel.send(Log(record.levelno, record.name, record.getMessage()))
        except Exception:  # a message that cannot be formatted or pickled: logging must not raise
            pass


class _Slots:
    """The shared-memory ring: ``num_slots`` segments, free or full, grown when a batch does not fit."""

    def __init__(self, num_slots: int, slot_bytes: int, outbox: _shm.HelperSocket | None) -> None:
        self._cond = threading.Condition()
        self._outbox = outbox
        _shm.check_room(num_slots * slot_bytes, f"{num_slots} batch slots")
        self._segments: list[_shm.SlotMemory] = []
        for slot in range(num_slots):
            self._segments.append(_shm.create(slot_bytes))
            self._share(slot)
        self._free = list(range(num_slots))
        self._gen = -1
        self._stopped = False
        self.wait_s = 0.0

    def reset(self, gen: int) -> None:
        """Epoch ``gen`` starts: every slot is free (the trainer copied out what it took)."""
        with self._cond:
            self._gen = gen
            self._free = list(range(len(self._segments)))
            self._stopped = False
            self.wait_s = 0.0
            self._cond.notify_all()

    def release(self, slot: int) -> None:
        with self._cond:
            if slot not in self._free:
                self._free.append(slot)
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def take(self, gen: int) -> int:
        """A free slot for epoch ``gen``; waits for the trainer to return one.

        ``BufferClosed`` once the epoch is stopped, or when ``gen`` is an earlier epoch's (a thread of
        an abandoned epoch never takes a slot of the next one).
        """
        start = time.perf_counter()
        with self._cond:
            while not self._free and not self._stopped and gen == self._gen:
                self._cond.wait()
            if self._stopped or gen != self._gen:
                raise BufferClosed("the epoch was stopped")
            self.wait_s += time.perf_counter() - start
            return self._free.pop(0)

    def buffer(self, slot: int) -> memoryview:
        return self._segments[slot].buf  # type: ignore[return-value]

    def name(self, slot: int) -> str:
        return self._segments[slot].name

    def grow(self, slot: int, nbytes: int) -> None:
        """Replace ``slot``'s segment with one of at least ``nbytes`` (1.5x, so growth is rare).

        Raises:
            HelperError: ``/dev/shm`` has not ``nbytes`` left (the batch's pages are taken as it is
                written: the extra half costs nothing until a larger batch writes it).
        """
        _shm.check_room(nbytes, "a batch slot")
        old = self._segments[slot]
        self._segments[slot] = _shm.create(max(nbytes, int(old.size * 1.5)))
        self._share(slot)  # before the batch that names it is sent
        old.close()  # nameless (POSIX) or gone with its last handle (Windows): nothing to unlink

    def _share(self, slot: int) -> None:
        """Send ``slot``'s segment to the trainer (POSIX; NOTE [ Segments without names ] in ``shm.py``)."""
        if self._outbox is not None:
            self._outbox.send(slot, self._segments[slot])

    def unlink_all(self) -> None:
        for segment in self._segments:
            try:
                segment.close()
            except BufferError:  # a view is still alive in a stuck thread; the name goes anyway
                pass
            _shm.unlink(segment.name)


class Helper:
    """The helper's state: the spec from the trainer (its pipeline, the batching and slot setup), the slots,
    the running epoch."""

    def __init__(self, channel: Channel, spec: HelperSpec,
                 outbox: _shm.HelperSocket | None) -> None:
        self.channel = channel
        self.spec = spec
        self.pipeline: Pipeline = spec.pipeline
        self.slots = _Slots(spec.num_slots, spec.slot_bytes, outbox)
        self._epoch: threading.Thread | None = None
        self._gen = -1
        self._pool: ProducerPool | None = None
        self._lock = threading.Lock()

    # -- commands (main thread) ----------------------------------------------------------------

    def start_epoch(self, start: StartEpoch) -> None:
        gen = start.gen
        self.stop_epoch(self._gen, confirm=False)
        self.slots.reset(gen)
        with self._lock:
            self._gen = gen
        self._epoch = threading.Thread(target=self._run_epoch, args=(start,), name="audiobuffer-helper-epoch",
                                       daemon=True)
        self._epoch.start()

    def stop_epoch(self, gen: int, *, confirm: bool = True) -> None:
        with self._lock:
            current = gen == self._gen
            pool = self._pool if current else None
        if current:
            self.slots.stop()
            if pool is not None:
                pool.close(EXIT_GRACE)  # a producer stuck in a decode finishes on its own, into nothing
            if self._epoch is not None:
                self._epoch.join(EXIT_GRACE)
        if confirm:
            self.channel.send(Stopped(gen))

    # -- one epoch (epoch thread) --------------------------------------------------------------

    def _run_epoch(self, start: StartEpoch) -> None:
        try:
            self._epoch_body(start)
        except BufferClosed:
            pass  # stopped by the trainer
        except BaseException as exc:  # a bug of ours: the trainer raises it, never hangs
            self.channel.send(EpochError(start.gen, f"{type(exc).__name__}: {exc}", traceback.format_exc()))

    def _epoch_body(self, start: StartEpoch) -> None:
        def started(pool: ProducerPool) -> bool:
            with self._lock:
                if start.gen != self._gen:
                    return False
                self._pool = pool
            return True

        feed_epoch(self.pipeline, start.shard, resume=start.consumed, layout=start.layout,
                   sink=lambda run: _SlotSink(self, start.gen, run), started=started,
                   stalled=lambda exc: self.channel.send(Stalled(start.gen, str(exc))),
                   batch_size=self.spec.batch_size, drop_last=self.spec.drop_last)

    def free(self, free: Free) -> None:
        if free.gen == self._gen:
            self.slots.release(free.slot)

    def shutdown(self) -> None:
        with self._lock:
            pool = self._pool
        self.slots.stop()
        if pool is not None:
            pool.close(EXIT_GRACE)
        self.slots.unlink_all()


class _SlotSink(MessageSink):
    """One epoch's batches into free shared-memory slots, and what the trainer counts by, as
    messages (NOTE [ Helper process lifecycle ], Epochs)."""

    def __init__(self, helper: Helper, gen: int, run: EpochRun) -> None:
        channel = helper.channel

        def send(message: FromHelper) -> None:  # batches and failures are data frames
            channel.send(message, data=not isinstance(message, (EpochEnd, Stalled)))

        super().__init__(run, gen, helper.spec.key, send)
        self.slots = helper.slots

    def take(self) -> int:
        return self.slots.take(self.gen)

    def give_back(self, slot: int) -> None:
        self.slots.release(slot)

    def collate(self, slot: int, samples: list[Any]) -> tuple[str, dict[str, Any]]:
        """Collate ``samples`` into ``slot``, grown once if the batch does not fit: its segment's
        name, and :attr:`Batch.fields`: where each array went in the slot (a :class:`SlotArray`),
        or the values themselves."""
        slots, key = self.slots, self.key
        arena = SlotArena(slots.buffer(slot))
        batch = collate_numpy(samples, key=key, allocate=arena)
        if arena.overflow:  # a batch larger than the slot: grow it once, collate again
            needed = arena.needed
            del batch  # no view into the old segment outlives it
            slots.grow(slot, needed)
            arena = SlotArena(slots.buffer(slot))
            batch = collate_numpy(samples, key=key, allocate=arena)
        fields: dict[str, Any] = {}
        for name, value in batch.items():
            offset = arena.placed.get(id(value)) if hasattr(value, "dtype") else None
            fields[name] = value if offset is None else SlotArray(offset, value.shape, value.dtype.str)
        return slots.name(slot), fields  # no view into the slot outlives the hand-over

    def end_stats(self) -> dict[str, Any]:
        return {"slot_wait_s": self.slots.wait_s}


def _lower_priority() -> None:
    """Run below the trainer's priority: on a machine with few cores, the scheduler then gives a busy
    training thread its core first and the producers the rest (NOTE [ Helper process lifecycle ], Start)."""
    try:
        if sys.platform == "win32":  # a check mypy follows: each platform's branch is checked on its own
            import ctypes

            kernel32 = ctypes.windll.kernel32
            kernel32.SetPriorityClass(kernel32.GetCurrentProcess(), 0x4000)  # BELOW_NORMAL_PRIORITY_CLASS
        else:
            os.nice(10)
    except (OSError, AttributeError):  # not allowed, or not on this platform: run as the trainer runs
        pass


def _warm_up(pipeline: Pipeline, channel: Channel) -> None:
    """Thread: decode and transform the source's first item once, the result and any error dropped,
    so that the imports and first calls are paid before the first epoch asks (NOTE [ Helper process
    lifecycle ], Start); then limit the BLAS threads of the libraries that loaded, and say so."""
    start = time.perf_counter()
    source, decode = pipeline.source, pipeline.decode
    if isinstance(source, Source) and len(source):
        try:
            decode(source.item(0, epoch=0, seed=pipeline.options.seed))
        except Exception:  # the epoch decodes the item again and reports its error in its place
            pass
    blas.refresh()
    channel.send(Warm(0, time.perf_counter() - start))


def _take_channel() -> tuple[BinaryIO, BinaryIO]:
    """The trainer's pipes on descriptors of their own, which no child process inherits (PEP 446);
    descriptors 0 and 1 then point at the null device and at stderr (NOTE [ Helper process lifecycle ],
    Channel)."""
    incoming, outgoing = os.dup(0), os.dup(1)
    if sys.platform == "win32":
        import msvcrt

        for fd in (incoming, outgoing):
            msvcrt.setmode(fd, os.O_BINARY)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    try:
        os.dup2(2, 1)
    except OSError:  # no stderr (a trainer without a console): what a child writes goes nowhere
        os.dup2(null, 1)
    os.close(null)
    sys.stdout = sys.stderr  # a print() in a decoder goes to stderr too
    return os.fdopen(incoming, "rb"), os.fdopen(outgoing, "wb")


def _watch_trainer(trainer: int, leave: Callable[[int], None]) -> None:
    """Thread: ``leave(0)`` once the trainer has gone, this process then being another's child (POSIX).

    Nothing wakes a process when its parent dies, so this looks (NOTE [ Helper process lifecycle ], Exit).
    """
    parent = os.getppid()  # the trainer, or a launcher between the two (then its end is watched)
    if parent != trainer:
        try:
            os.kill(trainer, 0)
        except ProcessLookupError:  # the trainer died before this thread began
            leave(0)
        except OSError:  # it runs, as another user
            pass
    while os.getppid() == parent:
        time.sleep(TRAINER_CHECK)
    leave(0)


def main() -> None:
    channel = Channel(*_take_channel())
    logging.getLogger("audiobuffer").addHandler(_ChannelLog(channel))
    helper: Helper | None = None
    leaving = threading.Lock()

    def leave(code: int) -> None:
        """Stop, unlink, write what is queued and exit: once, from the main thread or the trainer's watch."""
        leaving.acquire()  # whoever comes second waits here for the exit
        try:
            if helper is not None:
                helper.shutdown()
            for name in _shm.leftovers(os.getpid()):  # made as the watch began the exit, if any
                _shm.unlink(name)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            # A setup error reaches the trainer; anything else is written so that the writer can end (a
            # closing trainer reads the pipe to its end and discards it).
            channel.close(EXIT_GRACE)
            sys.stderr.flush()
            os._exit(code)  # do not wait for a producer stuck in a decode (daemon threads)

    # The socket the segments cross on (POSIX), given by HelperChannel.start beside the trainer's pid.
    outbox = _shm.HelperSocket(int(sys.argv[2])) if len(sys.argv) > 2 and sys.platform != "win32" else None
    if len(sys.argv) > 1 and sys.platform != "win32":  # the trainer's pid, given by HelperChannel.start
        threading.Thread(target=_watch_trainer, args=(int(sys.argv[1]), leave),
                         name="audiobuffer-helper-watch", daemon=True).start()
    code = 0
    try:
        setup = channel.receive()
        if not isinstance(setup, Setup):
            raise RuntimeError(f"expected a Setup of protocol version {PROTOCOL_VERSION}, got {type(setup).__name__} "
                               f"{str(setup)[:60]!r}: the trainer runs another audiobuffer")
        if setup.version != PROTOCOL_VERSION:  # the spec may not even unpickle here: say who this is, and leave
            channel.send(SetupFailed(PROTOCOL_VERSION, f"the helper runs {package_description()}", ""))
            return
        sys.path[:] = [p for p in setup.sys_path if p] + [p for p in sys.path if p not in setup.sys_path]
        try:
            from ...decoders._common import numpy_output
            from . import tables

            if outbox is not None:  # the item table's region, sent before the setup
                tables.adopt(outbox.receive_descriptors())
            spec: HelperSpec = pickle.loads(setup.spec)
            if spec.background:
                _lower_priority()
            # for the helper's whole life: nothing but producers runs here (NOTE [ BLAS threads ])
            blas.hold(spec.pipeline.options.blas_threads, apis=("blas", "openmp"))
            helper = Helper(channel, spec, outbox)
            numpy_output(helper.pipeline.decoder)  # no torch here: the decoder keeps numpy arrays
        except Exception as exc:
            channel.send(SetupFailed(PROTOCOL_VERSION, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            return
        segments = [helper.slots.name(i) for i in range(spec.num_slots)]
        channel.send(Ready(PROTOCOL_VERSION, {"pid": os.getpid(), "torch": "torch" in sys.modules,
                                              "gil": getattr(sys, "_is_gil_enabled", lambda: True)(),
                                              "segments": segments}))
        threading.Thread(target=_warm_up, args=(helper.pipeline, channel),
                         name="audiobuffer-helper-warm-up", daemon=True).start()
        while True:
            message = channel.receive()
            if isinstance(message, Free):
                helper.free(message)
            elif isinstance(message, StartEpoch):
                helper.start_epoch(message)
            elif isinstance(message, StopEpoch):
                helper.stop_epoch(message.gen)
            elif isinstance(message, Close):
                break
    except (EOFError, OSError):  # the trainer closed the pipe without a Close: it exited or was killed
        pass
    except BaseException:  # a bug of ours, or a frame that is not ours: say so on stderr and exit non-zero
        traceback.print_exc()
        code = 1
    finally:
        leave(code)


if __name__ == "__main__":
    main()
