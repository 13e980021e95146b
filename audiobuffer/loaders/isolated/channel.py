"""The trainer's end of the helper process's channel: what may cross it, the reader thread, the shutdown.

:class:`HelperChannel` owns the process; the reader thread and the shutdown are functions because
they must not keep the channel (or the loader) alive: the finalizer is what stops the helper. See
NOTE [ Helper process lifecycle ] in ``helper.py`` and NOTE [ Helper protocol ] in ``protocol.py``.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import weakref
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import torch

from ...buffer import WAIT_SLICE, Buffer
from ...engine.pool import JOIN_TIMEOUT
from ...errors import BufferClosed, HelperError
from . import shm as _shm
from .protocol import (
    PROTOCOL_VERSION,
    Batch,
    Close,
    Free,
    Log,
    Ready,
    Setup,
    SetupFailed,
    SlotArray,
    StopEpoch,
    Stopped,
    ToHelper,
    Warm,
    version_mismatch,
)

#: The helper process's module, run with ``python -m``.
HELPER_MODULE = "audiobuffer.loaders.isolated.helper"
#: Seconds to wait for the helper to say it is ready (it imports numpy and soundfile, not torch).
START_TIMEOUT = 60.0
#: Windows' process creation flag (``subprocess`` has the name only there): the helper runs in a process
#: group of its own, which the console's Ctrl-C does not reach (NOTE [ Helper process lifecycle ], Exit).
CREATE_NEW_PROCESS_GROUP = 0x00000200

__all__ = ["ByReference", "HelperChannel", "RemoteTraceback", "death_message", "not_the_owner", "pickle_by_reference",
           "read_messages", "shutdown_helper", "torch_dtype"]

#: What a use of the channel raises once it is being closed on purpose, whatever it was doing then.
CLOSED = "the IsolatedLoader was closed"


class RemoteTraceback(Exception):
    """The traceback of an exception raised in the helper process (as ``concurrent.futures`` does)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.text}\"\"\""


class ByReference(pickle.Pickler):
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


def pickle_by_reference(obj: Any, what: str) -> bytes:
    out = io.BytesIO()
    try:
        ByReference(out, what).dump(obj)
    except TypeError:
        raise
    except Exception as exc:
        raise TypeError(f"IsolatedLoader cannot send the {what} {obj!r} to its helper process: "
                        f"{type(exc).__name__}: {exc}") from exc
    return out.getvalue()


_TORCH_DTYPES: dict[str, torch.dtype] = {}


def torch_dtype(dtype: str) -> torch.dtype:
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype
    return found


def _acquire(lock: threading.Lock, timeout: float | None = None) -> bool:
    """Take ``lock``, waking every ``WAIT_SLICE`` seconds (NOTE [ Interruptible waits ] in buffer.py); ``False``
    once ``timeout`` seconds passed without it (``None``: no limit)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not lock.acquire(timeout=WAIT_SLICE):
        if deadline is not None and time.monotonic() >= deadline:
            return False
    return True


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """``proc``'s exit code once it exits within ``timeout`` seconds, else ``None``; waits in slices of
    ``WAIT_SLICE`` (NOTE [ Interruptible waits ] in buffer.py)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.wait(max(0.0, min(WAIT_SLICE, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return None


def _join(thread: threading.Thread, timeout: float) -> None:
    """``thread.join(timeout)`` in slices of ``WAIT_SLICE`` (NOTE [ Interruptible waits ] in buffer.py)."""
    deadline = time.monotonic() + timeout
    while thread.is_alive() and (remaining := deadline - time.monotonic()) > 0:
        thread.join(min(WAIT_SLICE, remaining))


def not_the_owner(owner: int) -> str | None:
    """Why this process may not use what process ``owner`` made (a child forked from it: NOTE [ A loader
    in a forked child ]), for a ``HelperError``; ``None`` in ``owner`` itself."""
    here = os.getpid()
    if here == owner:
        return None
    return (f"this IsolatedLoader belongs to process {owner}, which started its helper process; this is process "
            f"{here}, a child forked from it, which may not use or stop that helper: make a loader in this process "
            f"instead (in a DataLoader worker: in worker_init_fn)")


# NOTE [ A loader in a forked child ]
# ===================================
# A child forked from the trainer (a DataLoader worker, a multiprocessing child) holds a copy of the
# loader, of its channel and of their descriptors, but none of their threads: a wait for the reader
# thread would never end, and a close, a finalizer or an exit handler there would stop the trainer's
# helper, or write into the middle of a frame the trainer is sending. So the channel and the loader
# remember the process that made them: in any other, every use raises a ``HelperError`` that says so
# (:func:`not_the_owner`), and close(), the finalizer and the epoch's cleanup do nothing at all.
def shutdown_helper(owner: int, proc: subprocess.Popen[bytes], inbox: Buffer[Any], closing: threading.Event,
                    wanted: threading.Event, segments: dict[str, Any], passed: _shm.TrainerSocket | None,
                    reader: threading.Thread, send_lock: threading.Lock, slot_lock: threading.Lock) -> None:
    """Stop the helper and free what it held. Runs once: from close(), from GC or at interpreter exit,
    and only in process ``owner`` (NOTE [ A loader in a forked child ]).

    ``closing`` is set first: a consumer still unpacking a batch then raises ``BufferClosed``, and the
    segments are freed only once its copy out of a slot is done (``slot_lock``, bounded).
    """
    if os.getpid() != owner:
        return
    closing.set()
    inbox.abort(BufferClosed(CLOSED))
    wanted.set()  # the reader reads on, into the aborted inbox, and ends
    try:
        # Under the send lock, so the frame never lands in the middle of another thread's; a send that
        # holds it past JOIN_TIMEOUT (a helper that no longer reads) is cut short by the close instead.
        locked = _acquire(send_lock, JOIN_TIMEOUT)
        try:
            if proc.poll() is None and locked:
                try:
                    proc.stdin.write(pickle.dumps(Close(), protocol=pickle.HIGHEST_PROTOCOL))  # type: ignore[union-attr]
                    proc.stdin.flush()  # type: ignore[union-attr]
                except (OSError, ValueError):
                    pass
            try:
                proc.stdin.close()  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass
        finally:
            if locked:
                send_lock.release()
        if _wait_exit(proc, JOIN_TIMEOUT) is None:
            proc.kill()
            _wait_exit(proc, JOIN_TIMEOUT)
    finally:
        if reader is not threading.current_thread():
            _join(reader, JOIN_TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()
        locked = _acquire(slot_lock, JOIN_TIMEOUT)  # a copy out of a slot ends first
        try:
            for name, segment in list(segments.items()):
                if segment is not None:
                    try:
                        segment.close()
                    except BufferError:  # a batch view still points into it; the OS frees it with the mapping
                        pass
                _shm.unlink(name)  # a name the helper was killed before it unlinked, if any
            segments.clear()
            if passed is not None:
                passed.close()
        finally:
            if locked:
                slot_lock.release()
        if proc.poll() is not None:  # and a slot it grew for a batch the trainer never read, by its name prefix
            for name in _shm.leftovers(proc.pid):
                _shm.unlink(name)


#: Names of the Windows exit statuses (NTSTATUS) a crash ends a process with.
NTSTATUS_NAMES = {
    0xC0000005: "access violation",
    0xC000001D: "illegal instruction",
    0xC0000017: "out of memory",
    0xC0000094: "integer division by zero",
    0xC00000FD: "stack overflow",
    0xC000013A: "Ctrl-C",
    0xC0000374: "heap corruption",
    0xC0000409: "fail-fast exit: a buffer overrun or abort()",
}


def _how_it_ended(code: int | None) -> str:
    if code is None:
        return "closed its channel"
    if sys.platform == "win32":
        status = code & 0xFFFFFFFF
        if status >= 0xC0000000:  # an NTSTATUS error: a crash, written as Windows writes it
            name = NTSTATUS_NAMES.get(status)
            return f"ended with status 0x{status:08X}" + (f" ({name})" if name else "")
    elif code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def death_message(proc: subprocess.Popen[bytes] | None) -> str:
    """How the helper ended, for a :class:`HelperError`: its exit code, signal (POSIX) or status (Windows)."""
    code = proc.poll() if proc is not None else None
    pid = proc.pid if proc is not None else "?"
    how = _how_it_ended(code)
    if code == 1:  # the helper's own error: it printed its traceback
        if sys.platform == "win32":  # and the code of TerminateProcess too
            return (f"the helper process (pid {pid}) {how}: it failed, and its traceback is on stderr, above, "
                    f"or something ended it from outside (TerminateProcess, as the Task Manager and taskkill /F "
                    f"use, exits with code 1)")
        return f"the helper process (pid {pid}) {how}: it failed, and its traceback is on stderr, above"
    return (f"the helper process (pid {pid}) {how}; a crash in native decoder code or the system's "
            f"out-of-memory killer can do this (its stderr, above, may say more)")


# NOTE [ Reading the helper on demand ]
# =====================================
# The reader thread reads the helper's pipe only while the trainer waits for a message (HelperChannel.
# receive sets ``wanted`` when the inbox is empty; the reader clears it, then reads until a message that
# is not a log line and puts that one in the inbox). A reader that read ahead would wake, take the GIL
# and unpickle each batch's message while the training step runs, the very contention the helper process
# exists to avoid (a reader woken once per batch slows a Python-bound step). Read on demand, no
# thread of the loader runs in the trainer's process while it trains (a DevicePrefetcher's thread
# receives and copies the next batch meanwhile: that is its purpose), and each message costs one
# hand-over between two threads while the trainer waits.
# - What the helper sends meanwhile waits in the pipe and, behind it, in the helper's outgoing queue,
#   which its writer thread empties into the pipe: no other thread of the helper ever blocks on a full
#   pipe, so the helper always reads what the trainer sends (``Free``, ``StopEpoch``, ``Close``) and a
#   send of the trainer never waits for long (NOTE [ Helper process lifecycle ], Channel).
# - No lost wake-up: ``wanted`` is cleared before the read, so a request made after that is seen at the
#   reader's next turn: at worst it reads one message ahead, into the inbox, as it does when a request
#   ends without its message (a cancel, a timeout); the next request takes that one without reading.
# - The helper's death is seen at the next request, as an end of file. Its warnings (``Log`` messages)
#   are logged when the trainer next asks for a message, not as they happen.
# - Closing: close() sets ``closing``, aborts the inbox and sets ``wanted``; the reader then reads the
#   pipe to its end (discarding), so that a helper whose writer is blocked on a full pipe can finish and
#   exit. A consumer that meets the closed channel (the inbox, a send, a slot's segment) raises
#   ``BufferClosed``, never ``HelperError``: the segments are freed only once a copy out of a slot that
#   began before is done (``_slot_lock``), and ``closing`` says the helper ended because it was told to.
def read_messages(proc: subprocess.Popen[bytes], inbox: Buffer[Any], closing: threading.Event,
                  wanted: threading.Event) -> None:
    """The reader thread: a message from the helper into the inbox each time one is wanted (NOTE [ Reading
    the helper on demand ]); the helper's death into an error.

    A function, not a method: the thread must not keep the loader alive (its finalizer stops the helper).
    """
    stream = cast(BinaryIO, proc.stdout)
    try:
        while True:
            wanted.wait()
            wanted.clear()
            while isinstance(message := pickle.load(stream), Log):
                # under the helper's own logger name, so that the user's logging setup applies as in process
                logging.getLogger(message.logger).log(message.level, "helper process: %s", message.text)
            inbox.put(message)
    except BufferClosed:  # the trainer closed the loader: let the helper write what it still has, and end
        _drain(stream)
        return
    except Exception:  # EOFError (the helper exited), or a frame cut short by its death
        pass
    if closing.is_set():
        inbox.close()
        return
    _wait_exit(proc, JOIN_TIMEOUT)
    inbox.abort(HelperError(death_message(proc)))


def _drain(stream: BinaryIO) -> None:
    """Read ``stream`` to its end, discarding: the helper is being closed."""
    try:
        while stream.read(1 << 16):
            pass
    except (OSError, ValueError):  # closed under us, after the helper was killed
        pass


class HelperChannel:
    """One helper process and the trainer's end of its channel: start, send, receive, attach, stop.

    The reader thread and the finalizer hold the process, the inbox and the segments, never this
    object, so a channel nobody references is collected and its finalizer stops the helper.

    Args:
        inbox_size: room in the inbox, which holds what the reader read and cancels from other threads.
    """

    def __init__(self, inbox_size: int) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.owner = os.getpid()  # NOTE [ A loader in a forked child ]
        self.inbox: Buffer[Any] = Buffer(inbox_size)
        #: What the helper reported when it started: ``pid``, ``torch`` (whether it imported torch), ``gil``.
        self.info: dict[str, Any] = {}
        self._segments: dict[str, Any] = {}  # every segment the helper made: name -> its memory once attached
        #: Where the helper's segments arrive (POSIX; NOTE [ Segments without names ] in ``shm.py``).
        self._passed: _shm.TrainerSocket | None = None
        self._slot_names: dict[int, str] = {}
        self._send_lock = threading.Lock()
        # Held while the segments change or a slot is copied out; the shutdown frees them under it.
        self._slot_lock = threading.Lock()
        self._closing = threading.Event()  # set when the helper is being stopped on purpose
        self._wanted = threading.Event()  # set while a message is wanted (NOTE [ Reading the helper on demand ])
        self._finalizer: weakref.finalize | None = None
        #: Set when a frame to the helper was cut short (Ctrl-C in the middle of a send) or the start did
        #: not finish: the helper would read the next frame as the rest of that one, so this channel is
        #: never used again and the loader starts a new helper.
        self.broken = False
        self._setup_sent = False
        #: Set once the helper said its warm-up is over (:meth:`poll_warm`).
        self.warm = False
        self._launched = time.monotonic()

    @property
    def running(self) -> bool:
        """Whether the helper was started and has not exited."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def launched(self) -> bool:
        """Whether :meth:`launch` started the helper (ready or not)."""
        return self.proc is not None

    @property
    def ready(self) -> bool:
        """Whether the helper answered the setup and runs: the channel is in use."""
        return bool(self.info) and self.running and not self.broken

    def start(self, spec: bytes, *, descriptors: tuple[int, ...] = ()) -> None:
        """:meth:`launch`, then :meth:`finish_start`."""
        self.launch()
        self.finish_start(spec, descriptors=descriptors)

    def launch(self) -> None:
        """Start the helper (``python -m`` :data:`HELPER_MODULE`), which imports what it needs and then waits
        for :meth:`finish_start`: a loader launches it before it lists its source, so the two overlap."""
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parents[3])  # so the helper imports this very package
        env["PYTHONPATH"] = os.pathsep.join([here] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        # The trainer's pid: the helper also leaves when the trainer has gone (NOTE [ Helper process lifecycle ], Exit).
        args = [sys.executable, "-m", HELPER_MODULE, str(os.getpid())]
        theirs = None
        if sys.platform != "win32":  # the socket the slots' segments cross on (NOTE [ Segments without names ])
            ours, theirs = socket.socketpair()
            self._passed = _shm.TrainerSocket(ours, JOIN_TIMEOUT)
            args.append(str(theirs.fileno()))
            pass_fds: tuple[int, ...] = (theirs.fileno(),)
        else:
            pass_fds = ()
        try:
            proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, pass_fds=pass_fds,
                                    creationflags=CREATE_NEW_PROCESS_GROUP if sys.platform == "win32" else 0)
        except BaseException:
            if self._passed is not None:
                self._passed.close()
            raise
        finally:
            if theirs is not None:
                theirs.close()  # the helper's copy is its own
        self.proc = proc
        self._launched = time.monotonic()
        reader = threading.Thread(target=read_messages, args=(proc, self.inbox, self._closing, self._wanted),
                                  name="audiobuffer-helper-reader", daemon=True)
        self._finalizer = weakref.finalize(self, shutdown_helper, self.owner, proc, self.inbox, self._closing,
                                           self._wanted, self._segments, self._passed, reader, self._send_lock,
                                           self._slot_lock)
        reader.start()

    def finish_start(self, spec: bytes, *, descriptors: tuple[int, ...] = ()) -> None:
        """Send the launched helper the pickled pipeline ``spec`` and wait for it. ``descriptors``: what the
        helper maps by descriptor, sent over the segments' socket (POSIX: the region of the item table,
        NOTE [ Shared item table ] in ``sources/table.py``).

        Raises:
            HelperError: the helper died, did not answer within ``START_TIMEOUT`` or could not load the
                pipeline (its traceback chained); the channel is closed then.
        """
        try:
            if not self._setup_sent:
                self.send_setup(spec, descriptors=descriptors)
            message = self.receive(START_TIMEOUT)
        except TimeoutError:
            self.close()
            raise HelperError(f"the helper process did not start within {START_TIMEOUT:.0f} s") from None
        except HelperError:
            self.close()
            raise
        except BaseException:  # Ctrl-C: a helper that was not told or not heard in full is not used again
            self.broken = True
            self.close()
            raise
        self._take_answer(message)

    def _take_answer(self, message: Any) -> None:
        """The helper's answer to the setup: its info, and every slot attached; else a
        ``HelperError`` (the channel closed)."""
        if not isinstance(message, (Ready, SetupFailed)) or message.version != PROTOCOL_VERSION:
            self.close()  # a helper of another audiobuffer (NOTE [ Helper protocol ], Handshake)
            raise HelperError(version_mismatch(message))
        if isinstance(message, SetupFailed):
            self.close()
            raise HelperError(f"the helper process could not load the pipeline: {message.text}") \
                from RemoteTraceback(message.trace)
        self.info = message.info
        try:  # every slot now: on Windows a segment goes with its last handle, the helper's if it dies
            for slot, name in enumerate(self.info["segments"]):
                self.attach(slot, name)
        except HelperError:
            self.close()
            raise

    def poll_warm(self) -> bool:
        """Whether the helper has said that its warm-up is over (:class:`Warm`), without waiting:
        reads what already came, its answer to the setup first (NOTE [ Starting in the trainer ] in
        ``loader.py``). Call from the one consuming thread, between epochs' messages.

        Raises:
            HelperError: the helper died, could not load the pipeline, or did not answer the setup
                within ``START_TIMEOUT`` of its launch (the channel is closed then).
        """
        while not self.warm:
            try:
                message = self.receive(0)
            except TimeoutError:
                if not self.info and time.monotonic() - self._launched > START_TIMEOUT:
                    self.close()
                    raise HelperError(f"the helper process did not start within "
                                      f"{START_TIMEOUT:.0f} s") from None
                return False
            if not self.info:
                self._take_answer(message)
            # anything else is a Warm (seen by receive) or an abandoned epoch's
        return True

    def send_setup(self, spec: bytes, *, descriptors: tuple[int, ...] = ()) -> None:
        """Send the launched helper ``spec`` and ``descriptors`` (as :meth:`finish_start` does)
        without waiting for its answer, which :meth:`finish_start` reads: the helper then loads the
        pipeline and warms it up while the trainer sets up. A spec larger than the pipe holds waits
        for the helper's imports."""
        if self._passed is not None:
            for fd in descriptors:  # before the setup, which names them
                self._passed.send_descriptor(fd)
        self.send(Setup(PROTOCOL_VERSION, list(sys.path), spec))
        self._setup_sent = True

    def send(self, message: ToHelper) -> None:
        """Send one message to the helper (any thread).

        Raises:
            HelperError: the helper is not running or its channel broke.
            BufferClosed: the channel was closed (from another thread, maybe) before the message went.
        """
        self._check_owner()
        proc = self.proc
        if proc is None or proc.stdin is None:
            raise HelperError("the helper process is not running")
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        _acquire(self._send_lock)  # held by another thread's send on a full pipe, maybe: in slices
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except (OSError, ValueError) as exc:
            if self._closing.is_set():  # closed on purpose: the pipe is shut, the helper is not dead
                raise BufferClosed(CLOSED) from exc
            raise HelperError(death_message(proc)) from exc
        except BaseException:  # Ctrl-C in the middle of the frame, maybe: the helper would misread what follows
            self.broken = True
            raise
        finally:
            self._send_lock.release()

    def receive(self, timeout: float | None) -> Any:
        """The next message from the helper, read now (NOTE [ Reading the helper on demand ]), or one
        already in the inbox (a cancel from another thread). Call from the one consuming thread.

        Raises:
            TimeoutError: nothing came within ``timeout`` seconds (``None``: no limit).
            HelperError: the helper died. BufferClosed: the channel was closed.
        """
        self._check_owner()
        if not len(self.inbox):  # only this thread takes from the inbox, so a message seen stays there
            self._wanted.set()
        # in slices, so Ctrl-C breaks it (NOTE [ Interruptible waits ])
        message = self.inbox.get(timeout=timeout)
        if isinstance(message, Warm):  # whoever reads it (an epoch's consumer drops it: gen 0)
            self.warm = True
            self.info["warm_s"] = message.seconds
        return message

    def attach(self, slot: int, name: str) -> Any:
        """The shared memory of ``slot``, now segment ``name`` (attached once, re-attached when it grew).

        Raises:
            BufferClosed: the channel is being closed (from another thread, maybe): its segments are freed.
            HelperError: the segment is gone: the helper died (on Windows a segment goes with its last
                handle, so one the helper grew just before it died is gone before the trainer attaches).
        """
        self._check_owner()
        _acquire(self._slot_lock)  # held by a copy or the shutdown, for as long as either takes: in slices
        try:
            return self._attach(slot, name)
        finally:
            self._slot_lock.release()

    def _attach(self, slot: int, name: str) -> Any:
        """:meth:`attach`, with ``_slot_lock`` held."""
        if self._closing.is_set():  # the shutdown frees the segments, now or already
            raise BufferClosed(CLOSED)
        old = self._slot_names.get(slot)
        if old != name:  # the helper grew this slot into a new segment and let go of the old one
            segment = self._segments.pop(old, None) if old is not None else None
            if segment is not None:
                segment.close()
            self._slot_names[slot] = name
        segment = self._segments.get(name)
        if segment is None:
            self._segments[name] = None  # the shutdown unlinks it, whatever happens next
            try:
                segment = self._segments[name] = _shm.attach(name, inbox=self._passed, slot=slot)
            except FileNotFoundError as exc:
                if self._closing.is_set():  # the helper let go of its segments as it was told to leave
                    raise BufferClosed(CLOSED) from exc
                if self.proc is not None:
                    _wait_exit(self.proc, JOIN_TIMEOUT)  # for its exit code
                raise HelperError(f"the shared memory of slot {slot} ({name}) is gone: "
                                  f"{death_message(self.proc)}") from exc
        return segment

    def copy_out(self, batch: Batch, *, pin_memory: bool) -> dict[str, Any]:
        """Copy ``batch`` out of its slot into (pinned) tensors, then hand the slot back to the helper.

        Under ``_slot_lock``: a close from another thread frees the segments only once the copy is done,
        and a copy that begins after the close began raises ``BufferClosed``.

        Raises:
            BufferClosed: the channel is being closed (from another thread, maybe).
            HelperError: the slot's segment is gone with the helper, or the helper died.
        """
        self._check_owner()
        _acquire(self._slot_lock)  # held by the shutdown as it frees the segments: in slices
        try:
            buf = self._attach(batch.slot, batch.segment).buf
            out: dict[str, Any] = {}
            for field, value in batch.fields.items():
                if not isinstance(value, SlotArray):
                    out[field] = value
                    continue
                tensor = torch.empty(value.shape, dtype=torch_dtype(value.dtype), pin_memory=pin_memory)
                # numpy's copy: wakes no torch thread pool; the view into the slot ends with the statement
                np.copyto(tensor.numpy(), np.ndarray(value.shape, dtype=np.dtype(value.dtype), buffer=buf,
                                                     offset=value.offset))
                out[field] = tensor
            del buf  # no view into the slot outlives the hand-back
        finally:
            self._slot_lock.release()
        self.send(Free(batch.gen, batch.slot))
        return out

    def stop_epoch(self, gen: int) -> None:
        """Ask the helper to stop epoch ``gen`` and wait for its confirmation (bounded by ``JOIN_TIMEOUT``);
        nothing in another process than the owner's (NOTE [ A loader in a forked child ])."""
        if not_the_owner(self.owner) or not self.running:
            return
        try:
            self.send(StopEpoch(gen))
        except (HelperError, BufferClosed):
            return
        deadline = time.monotonic() + JOIN_TIMEOUT
        while True:
            try:
                message = self.receive(max(0.0, deadline - time.monotonic()))
            except (TimeoutError, BufferClosed, HelperError):
                return
            if isinstance(message, Stopped) and message.gen == gen:
                return

    def close(self) -> None:
        """Stop the helper and free its shared memory. Idempotent, any thread of the owner's process;
        nothing in another (NOTE [ A loader in a forked child ])."""
        if self._finalizer is not None:
            self._finalizer()

    def _check_owner(self) -> None:
        """Raises ``HelperError`` outside the owner's process (NOTE [ A loader in a forked child ])."""
        why = not_the_owner(self.owner)
        if why is not None:
            raise HelperError(why)
