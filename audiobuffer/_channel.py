"""The trainer's end of the helper process's channel: what may cross it, the reader thread, the shutdown.

These are functions rather than :class:`~audiobuffer.IsolatedLoader` methods because the reader thread
and the finalizer must not keep the loader alive (the finalizer is what stops the helper). See
NOTE [ Helper process lifecycle ] in ``audiobuffer/_helper.py``.
"""

from __future__ import annotations

import io
import logging
import pickle
import signal
import subprocess
import threading
import types
from typing import Any

import numpy as np
import torch

from . import _shm
from ._producers import JOIN_TIMEOUT
from .buffer import Buffer
from .errors import BufferClosed, HelperError

__all__ = ["ByReference", "RemoteTraceback", "death_message", "pickle_by_reference", "read_messages",
           "shutdown_helper", "torch_dtype"]


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


def shutdown_helper(proc: subprocess.Popen[bytes], inbox: Buffer[Any], closing: threading.Event,
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


def death_message(proc: subprocess.Popen[bytes] | None) -> str:
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


def read_messages(proc: subprocess.Popen[bytes], inbox: Buffer[Any], closing: threading.Event) -> None:
    """The reader thread: every message from the helper into the inbox; the helper's death into an error.

    A function, not a method: the thread must not keep the loader alive (its finalizer stops the helper).
    """
    try:
        while True:
            message = pickle.load(proc.stdout)  # type: ignore[arg-type]
            if message[0] == "log":
                # under the helper's own logger name, so that the user's logging setup applies as in process
                logging.getLogger(message[2]).log(message[1], "helper process: %s", message[3])
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
    inbox.abort(HelperError(death_message(proc)))
