"""``IsolatedLoader``: the producer threads run in one helper process; batches cross in shared memory.

Producer threads decode in parallel wherever a decode releases the GIL, but the Python part of every
decode (python-soundfile's wrappers, a per-sample transform) holds it, and a training thread that is
itself Python-bound (a GPU step launching many small kernels) then waits for it. The isolated loader
keeps the whole pipeline of :class:`~audiobuffer.BufferedDataset` (source, plan, producers, buffer,
error policy) in one helper process and collates each batch there, straight into a shared-memory
slot; the trainer's side copies a slot into (pinned) tensors once and hands the slot back. The
trainer does a fixed amount of Python per batch, whatever the batch holds.

See NOTE [ Helper process lifecycle ] in ``audiobuffer/_helper.py`` for the protocol and the shutdown.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import _shm
from ._cancel import on_cancel
from ._epoch import record_skip
from ._plan import (
    STATE_EVEN_SHARDS,
    STATE_RANK,
    STATE_SEED,
    STATE_SHUFFLE,
    STATE_SOURCE,
    STATE_WORLD_SIZE,
    decode_state,
    encode_state,
    plan_epoch,
)
from ._producers import JOIN_TIMEOUT
from .buffer import Buffer, BufferStats
from .dataset import BufferedDataset, DatasetStats
from .errors import BufferClosed, DecodeError, HelperError, SampleError, StallError
from .sources import Source, SourceSpec, WorkItem

__all__ = ["IsolatedLoader"]

logger = logging.getLogger(__name__)

#: Bytes each slot starts with; a batch that does not fit grows its slot.
DEFAULT_SLOT_BYTES = 4 << 20
#: Seconds to wait for the helper to say it is ready (it imports numpy and soundfile, not torch).
START_TIMEOUT = 60.0
#: Extra seconds the trainer waits past ``timeout`` before it gives up on a helper that sends nothing.
SILENCE_GRACE = 5.0


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in the helper process (as ``concurrent.futures`` does)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.text}\"\"\""


class _ByReference(pickle.Pickler):
    """A pickler that refuses what the helper process could not import: lambdas, locals, ``__main__``."""

    def __init__(self, file: io.BytesIO, what: str) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._what = what

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (types.FunctionType, type)):
            module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "?")
            if "<lambda>" in qualname or "<locals>" in qualname:
                self._refuse(f"{qualname!r} is a lambda or a function defined inside another function")
            if module == "__main__":
                self._refuse(f"{qualname!r} is defined in the script being run (__main__)")
        elif type(obj).__module__ == "__main__":
            self._refuse(f"it is an instance of {type(obj).__qualname__!r}, a class defined in the script being run "
                         f"(__main__)")
        return NotImplemented

    def _refuse(self, why: str) -> None:
        raise TypeError(
            f"IsolatedLoader sends the {self._what} to its helper process by reference, and {why}, which the "
            f"helper cannot import: move it to a module of its own (a .py file beside your script) and import it "
            f"from there")


def _pickle_by_reference(obj: Any, what: str) -> bytes:
    out = io.BytesIO()
    try:
        _ByReference(out, what).dump(obj)
    except TypeError:
        raise
    except Exception as exc:
        raise TypeError(f"IsolatedLoader cannot send the {what} {obj!r} to its helper process: "
                        f"{type(exc).__name__}: {exc}") from exc
    return out.getvalue()


_TORCH_DTYPES: dict[str, torch.dtype] = {}


def _torch_dtype(dtype: str) -> torch.dtype:
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype
    return found


def _shutdown(proc: subprocess.Popen[bytes], inbox: Buffer[Any], closing: threading.Event,
              segments: dict[str, Any], reader: threading.Thread) -> None:
    """Stop the helper and free what it held. Runs once: from close(), from GC or at interpreter exit."""
    closing.set()
    inbox.abort(BufferClosed("the IsolatedLoader was closed"))
    try:
        if proc.poll() is None:
            try:
                proc.stdin.write(pickle.dumps(("close",)))  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass
        try:
            proc.stdin.close()  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass
        try:
            proc.wait(JOIN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(JOIN_TIMEOUT)
    finally:
        if reader is not threading.current_thread():
            reader.join(JOIN_TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()
        for name, segment in list(segments.items()):
            if segment is not None:
                try:
                    segment.close()
                except BufferError:  # a batch view still points into it; the OS frees it with the mapping
                    pass
            _shm.unlink(name)  # the helper unlinks its own; this covers a helper that died
        segments.clear()


def _death_message(proc: subprocess.Popen[bytes] | None) -> str:
    code = proc.poll() if proc is not None else None
    pid = proc.pid if proc is not None else "?"
    if code is None:
        how = "closed its channel"
    elif code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return (f"the helper process (pid {pid}) {how}; a crash in native decoder code or the system's "
            f"out-of-memory killer can do this (its stderr, above, may say more)")


def _read(proc: subprocess.Popen[bytes], inbox: Buffer[Any], closing: threading.Event) -> None:
    """The reader thread: every message from the helper into the inbox; the helper's death into an error.

    A function, not a method: the thread must not keep the loader alive (its finalizer stops the helper).
    """
    try:
        while True:
            message = pickle.load(proc.stdout)  # type: ignore[arg-type]
            if message[0] == "log":
                logger.log(message[1], "helper process: %s", message[3])
                continue
            inbox.put(message)
    except BufferClosed:
        return  # the trainer closed the loader
    except Exception:  # EOFError (the helper exited), or a frame cut short by its death
        pass
    if closing.is_set():
        inbox.close()
        return
    try:
        proc.wait(JOIN_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    inbox.abort(HelperError(_death_message(proc)))


class _Run:
    """One epoch as the trainer sees it: its generation, consumed mask and counters."""

    def __init__(self, gen: int, epoch: int, rank: int, world_size: int, consumed: bytearray, items: int,
                 num_producers: int) -> None:
        self.gen = gen
        self.epoch = epoch
        self.rank = rank
        self.world_size = world_size
        self.consumed = consumed
        self.items = items
        self.resumed = len(consumed) - items
        self.num_producers = num_producers
        self.yielded = 0
        self.failed = 0
        self.failures: list[tuple[int, str, str]] = []
        self.decode_s = 0.0
        self.wait_s = 0.0  # the trainer waiting for a full slot
        self.copy_s = 0.0  # the trainer copying slots out
        self.helper: dict[str, Any] = {}
        self.done = False
        self.cancelled = False
        self.start = time.perf_counter()
        self.end: float | None = None

    def snapshot(self) -> DatasetStats:
        end = self.end if self.end is not None else time.perf_counter()
        helper = self.helper  # the helper's own counts, from the epoch's end
        return DatasetStats(
            epoch=self.epoch, rank=self.rank, world_size=self.world_size, worker=0, num_workers=1, items=self.items,
            num_producers=helper.get("num_producers", self.num_producers), resumed=self.resumed, yielded=self.yielded,
            failed=self.failed, failures=list(self.failures), decode_s=self.decode_s, wall_s=end - self.start,
            done=self.done, buffer=BufferStats(**helper["buffer"]) if helper.get("buffer") else None,
            transfer={"trainer_wait_s": self.wait_s, "trainer_copy_s": self.copy_s,
                      "helper_slot_wait_s": helper.get("slot_wait_s", 0.0)},
            producer_history=helper.get("producer_history", []), gil_enabled=helper.get("gil_enabled", True))


class IsolatedLoader:
    """Batches from producer threads that run in one helper process, so the trainer's GIL stays free.

    Takes :class:`~audiobuffer.BufferedDataset`'s keywords plus the batching ones, and yields
    :func:`~audiobuffer.pad_collate`'s batches (``audio`` ``(B, T)`` padded, ``lengths``, numbers as
    tensors, strings as lists). The helper is a fresh ``python -m audiobuffer._helper`` started on the
    first ``iter()`` and kept across epochs: it does not import torch or your script, so it is ready in
    a fraction of a second and needs no ``if __name__ == "__main__":`` guard. What crosses to it: the
    source, the options, and the decoder and transform, pickled by reference (the built-in decoders, or
    any importable module-level function or class instance). Batches cross in shared-memory slots
    and are copied once into (pinned) tensors.

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
        source, decoder: as for :class:`~audiobuffer.BufferedDataset`.
        batch_size: samples per batch.
        drop_last: drop the last, short batch of an epoch.
        num_slots: shared-memory slots (batches decoded ahead of the trainer; at least 2).
        pin_memory: copy batches into pinned memory; ``"auto"``: when CUDA is available.
        key: the sample key padded into the batch (as ``pad_collate``'s ``key``).
        slot_bytes: the bytes each slot starts with (a larger batch grows its slot).
        background: run the helper at a lower scheduling priority (``nice 10``; below normal on
            Windows), so that it decodes on the cores the trainer leaves idle.
        Other keywords: as for :class:`~audiobuffer.BufferedDataset` (``num_producers``, ``buffer_size``,
            ``max_bytes``, ``shuffle``, ``seed``, ``ordered``, ``on_error``, ``transform``, ``labels``,
            ``patterns``, ``path_column``, ``rank``, ``world_size``, ``even_shards``, ``warn_after``,
            ``timeout``); they apply in the helper process.

    Raises:
        TypeError: the decoder or transform cannot be sent by reference (a lambda, a local function,
            something defined in ``__main__``): the message says how to fix it.
    """

    def __init__(self, source: SourceSpec | Source, decoder: Callable[[WorkItem], Any], *, batch_size: int,
                 drop_last: bool = False, num_slots: int = 4, pin_memory: bool | str = "auto", key: str = "audio",
                 slot_bytes: int = DEFAULT_SLOT_BYTES, background: bool = True, **options: Any) -> None:
        for name, value, least in (("batch_size", batch_size, 1), ("num_slots", num_slots, 2),
                                   ("slot_bytes", slot_bytes, 1)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an integer >= {least}, got {value!r}")
            if value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if pin_memory not in ("auto", True, False):
            raise ValueError(f"pin_memory must be 'auto', True or False, got {pin_memory!r}")
        if not isinstance(key, str):
            raise TypeError(f"key must be a string, got {key!r}")
        # The dataset validates every shared option and lists the source, here in the trainer; it
        # never runs an epoch in this process.
        self.dataset = BufferedDataset(source, decoder, **options)
        ds = self.dataset
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.num_slots = num_slots
        self.pin_memory = torch.cuda.is_available() if pin_memory == "auto" else bool(pin_memory)
        self.key = key
        spec = {
            "source": ds.source, "decoder": ds.decoder, "transform": ds.transform,
            "num_producers": ds.num_producers, "buffer_size": ds.buffer_size, "max_bytes": ds.max_bytes,
            "shuffle": ds.shuffle, "seed": ds.seed, "ordered": ds.ordered, "on_error": ds.on_error,
            "even_shards": ds.even_shards, "warn_after": ds.warn_after, "timeout": ds.timeout,
            "batch_size": batch_size, "drop_last": self.drop_last, "num_slots": num_slots,
            "slot_bytes": slot_bytes, "key": key, "background": bool(background),
        }
        _pickle_by_reference(ds.decoder, "decoder")
        if ds.transform is not None:
            _pickle_by_reference(ds.transform, "transform")
        self._spec = _pickle_by_reference(spec, "pipeline")
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._inbox: Buffer[Any] | None = None
        self._segments: dict[str, Any] = {}  # every segment the helper made: name -> SharedMemory once attached
        self._slot_names: dict[int, str] = {}
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._gen = 0
        self._run: _Run | None = None
        self._resume: tuple[int, bytes] | None = None
        self._closed = False
        self._closing = threading.Event()  # set when the helper is being stopped on purpose
        self._finalizer: weakref.finalize | None = None
        #: What the helper reported when it started: ``pid``, ``torch`` (whether it imported torch), ``gil``.
        self.helper_info: dict[str, Any] = {}

    # -- the dataset's view --------------------------------------------------------------------

    @property
    def classes(self) -> list[str]:
        """The sorted label names; a batch's ``label`` indexes this list."""
        return self.dataset.classes

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs."""
        return self.dataset.epoch

    def set_epoch(self, epoch: int) -> None:
        """As :meth:`BufferedDataset.set_epoch`: seeds the next epoch's shuffle and random crops."""
        self.dataset.set_epoch(epoch)
        with self._lock:
            if self._resume is not None and self._resume[0] != epoch:
                self._resume = None

    def __len__(self) -> int:
        """Batches per epoch on this rank (failed samples make some batches, or the last one, smaller)."""
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    # -- the helper process --------------------------------------------------------------------

    def _start(self) -> None:
        if self._closed:
            raise BufferClosed("iter() on a closed IsolatedLoader")
        if self._proc is not None:
            if self._proc.poll() is None:
                return
            raise HelperError(_death_message(self._proc))
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parent.parent)  # so the helper imports this very package
        env["PYTHONPATH"] = os.pathsep.join([here] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        proc = subprocess.Popen([sys.executable, "-m", "audiobuffer._helper"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env)
        self._proc = proc
        self._inbox = Buffer(self.num_slots + 64)
        self._reader = threading.Thread(target=_read, args=(proc, self._inbox, self._closing),
                                        name="audiobuffer-helper-reader", daemon=True)
        self._finalizer = weakref.finalize(self, _shutdown, proc, self._inbox, self._closing, self._segments,
                                           self._reader)
        self._reader.start()
        self._send(("setup", list(sys.path), self._spec))
        try:
            message = self._inbox.get(timeout=START_TIMEOUT)
        except TimeoutError:
            self.close()
            raise HelperError(f"the helper process did not start within {START_TIMEOUT:.0f} s") from None
        except HelperError:
            self.close()
            raise
        if message[0] != "ready":
            self.close()
            raise HelperError(f"the helper process could not load the pipeline: {message[2]}") \
                from _RemoteTraceback(message[3])
        self.helper_info = message[1]
        self._segments.update((name, None) for name in self.helper_info["segments"])
        self._slot_names.update(enumerate(self.helper_info["segments"]))

    def _send(self, message: tuple[Any, ...]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise HelperError("the helper process is not running")
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._send_lock:
                proc.stdin.write(data)
                proc.stdin.flush()
        except (OSError, ValueError) as exc:
            raise HelperError(_death_message(proc)) from exc

    def _attach(self, slot: int, name: str) -> Any:
        old = self._slot_names.get(slot)
        if old != name:  # the helper grew this slot into a new segment and unlinked the old one
            segment = self._segments.pop(old, None) if old is not None else None
            if segment is not None:
                segment.close()
            self._slot_names[slot] = name
        if self._segments.get(name) is None:
            self._segments[name] = _shm.attach(name)
        return self._segments[name]

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._start()
        ds = self.dataset
        rank, world_size = ds.shard_info()
        epoch = ds.epoch
        with self._lock:
            resume = self._resume[1] if self._resume is not None and self._resume[0] == epoch else None
            self._resume = None
            self._gen += 1
            gen = self._gen
        plan = plan_epoch(len(ds.source), shuffle=ds.shuffle, seed=ds.seed, epoch=epoch, rank=rank,
                          world_size=world_size, even_shards=ds.even_shards, consumed=resume)
        pinned = 0 if ds.num_producers == "auto" else min(ds.num_producers, max(1, len(plan)))  # auto: at the end
        run = _Run(gen, epoch, rank, world_size, bytearray(plan.consumed), len(plan), pinned)
        with self._lock:
            self._run = run
        self._send(("epoch", gen, {"epoch": epoch, "rank": rank, "world_size": world_size, "consumed": resume}))
        return self._epoch(run)

    def _epoch(self, run: _Run) -> Iterator[dict[str, Any]]:
        # A generator: its finally runs on exhaustion, break, an exception and garbage collection.
        # Under a DevicePrefetcher, leaving its loop cancels this epoch from the consumer's thread
        # (NOTE [ Prefetch cancellation ] in _cancel.py).
        unregister = on_cancel(lambda: self._cancel(run))
        try:
            while not run.cancelled:
                message = self._next(run)
                kind = message[0]
                if kind == "cancel":
                    return
                if kind == "batch":
                    batch = self._unpack(run, message)
                    yield batch
                elif kind == "failure":
                    self._on_failure(run, message)
                elif kind == "end":
                    run.helper = message[2]
                    for position in message[3]:
                        run.consumed[position] = 1
                    run.decode_s = message[2]["decode_s"]
                    run.done = True
                    return
                elif kind == "stall":
                    raise StallError(f"{message[2]} (in the helper process)")
                elif kind == "error":
                    raise HelperError(f"the helper process failed: {message[2]}") from _RemoteTraceback(message[3])
        finally:
            unregister()
            run.end = time.perf_counter()
            if not run.done:
                self._stop(run.gen)

    def _cancel(self, run: _Run) -> None:
        """Wake the consumer of ``run`` and end its epoch early; returns at once, any thread."""
        run.cancelled = True
        inbox = self._inbox
        if inbox is not None:
            try:
                inbox.put(("cancel", run.gen), timeout=0)
            except (TimeoutError, BufferClosed):
                pass  # a full inbox: the consumer is not waiting, and sees the flag next

    def _next(self, run: _Run) -> Any:
        """The next message of ``run``'s epoch (stale ones of an abandoned epoch are dropped)."""
        inbox = self._inbox
        assert inbox is not None  # started
        timeout = None if self.dataset.timeout is None else self.dataset.timeout + SILENCE_GRACE
        while True:
            start = time.perf_counter()
            try:
                message = inbox.get(timeout=timeout)
            except TimeoutError:
                raise StallError(f"the helper process sent nothing for {timeout:.1f} s (timeout "
                                 f"{self.dataset.timeout} s plus {SILENCE_GRACE:.0f} s)") from None
            except BufferClosed:
                raise BufferClosed("the IsolatedLoader was closed") from None
            finally:
                run.wait_s += time.perf_counter() - start
            if message[1] == run.gen:
                return message

    def _unpack(self, run: _Run, message: tuple[Any, ...]) -> dict[str, Any]:
        _, gen, slot, name, fields, positions, rows, decode_s = message
        start = time.perf_counter()
        buf = self._attach(slot, name).buf
        batch: dict[str, Any] = {}
        for field, spec in fields:
            if spec[0] == "v":
                batch[field] = spec[1]
                continue
            _, offset, shape, dtype = spec
            source = np.ndarray(shape, dtype=np.dtype(dtype), buffer=buf, offset=offset)
            tensor = torch.empty(shape, dtype=_torch_dtype(dtype), pin_memory=self.pin_memory)
            np.copyto(tensor.numpy(), source)  # numpy's copy: wakes no torch thread pool
            batch[field] = tensor
        source = None  # type: ignore[assignment]  # no view into the slot outlives the hand-back
        self._send(("free", gen, slot))
        run.copy_s += time.perf_counter() - start
        for position in positions:
            run.consumed[position] = 1
        run.yielded += rows
        run.decode_s = decode_s
        return batch

    def _on_failure(self, run: _Run, message: tuple[Any, ...]) -> None:
        _, _, fatal, index, path, producer, type_name, text, payload, trace = message
        summary = f"item {index} ({path!r}) failed in {producer} (helper process): {type_name}: {text}"
        if fatal:
            cause: BaseException = _RemoteTraceback(trace)
            if payload is not None:
                try:
                    original = pickle.loads(payload)
                    original.__cause__ = cause
                    cause = original
                except Exception:
                    pass
            cls = DecodeError if type_name == "DecodeError" or isinstance(cause, DecodeError) else SampleError
            raise cls(summary, path=path, index=index, producer=producer) from cause
        record_skip(run, index, path, f"{type_name}: {text}", summary, self.dataset.on_error)

    def _stop(self, gen: int) -> None:
        """Leave epoch ``gen`` early: the helper stops it and confirms (bounded by ``JOIN_TIMEOUT``)."""
        inbox = self._inbox
        if inbox is None or self._proc is None or self._proc.poll() is not None:
            return
        try:
            self._send(("stop", gen))
        except HelperError:
            return
        deadline = time.monotonic() + JOIN_TIMEOUT
        while True:
            try:
                message = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except (TimeoutError, BufferClosed, HelperError):
                return
            if message[0] == "stopped" and message[1] == gen:
                return

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
            run, resume = self._run, self._resume
        epoch = self.dataset.epoch
        if resume is not None:
            consumed: bytes | None = resume[1]
            epoch = resume[0]
        elif run is not None and run.epoch == epoch:
            consumed = bytes(run.consumed)
        else:
            consumed = None
        return encode_state(self._setup(), epoch, consumed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (of an IsolatedLoader or a BufferedDataset of the same setup).

        Raises:
            ResumeError: the state is malformed or was saved under another setup.
        """
        epoch, consumed = decode_state(self._setup(), state)
        self.dataset.set_epoch(epoch)
        with self._lock:
            self._resume = None if consumed is None else (epoch, consumed)

    def _setup(self) -> dict[str, Any]:
        ds = self.dataset
        rank, world_size = ds.shard_info()
        return {STATE_SEED: ds.seed, STATE_SHUFFLE: ds.shuffle, STATE_RANK: rank, STATE_WORLD_SIZE: world_size,
                STATE_EVEN_SHARDS: ds.even_shards, STATE_SOURCE: ds.source.fingerprint()}

    def close(self) -> None:
        """Stop the helper process and free its shared memory. Idempotent, any thread."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __enter__(self) -> IsolatedLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        proc = self._proc
        state = "closed" if self._closed else ("running" if proc is not None and proc.poll() is None else "idle")
        return (f"IsolatedLoader({self.dataset.source.description}, {self.dataset.decoder!r}, "
                f"batch_size={self.batch_size}, num_slots={self.num_slots}, "
                f"num_producers={self.dataset.num_producers!r}, helper={state})")


