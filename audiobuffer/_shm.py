"""Shared-memory segments that only their owner unlinks, on every supported Python.

``multiprocessing.shared_memory.SharedMemory`` registers every segment it creates or attaches with
multiprocessing's resource tracker on POSIX (before Python 3.13, attaching too; CPython issue 82300).
The tracker is a process of its own, started on first use, that unlinks what it tracks when its
process exits. Here that is wrong twice: the trainer attaching to the helper's segments would unlink
them when the trainer exits (or warn about "leaked" segments it does not own), and the tracker is a
child process that outlives every loader. So segments are created and attached untracked, and the
owner (the helper process) unlinks them itself, on a normal exit and on losing its trainer (see
NOTE [ Helper process lifecycle ] in ``audiobuffer/_helper.py``); the trainer unlinks what a dead helper
left behind. On Windows a segment lives as long as a handle to it is open, and unlinking does nothing.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
from multiprocessing import resource_tracker, shared_memory

__all__ = ["SEGMENT_PREFIX", "attach", "create", "unlink"]

#: Every segment's name starts with this (``/dev/shm/ab_...`` on Linux), so a test can look for leftovers.
SEGMENT_PREFIX = "ab_"

_TRACK_PARAMETER = sys.version_info >= (3, 13)
_patch_lock = threading.Lock()


def _untracked(name: str | None, create: bool, size: int) -> shared_memory.SharedMemory:
    if _TRACK_PARAMETER:
        return shared_memory.SharedMemory(name, create=create, size=size, track=False)  # type: ignore[call-arg]
    # Before 3.13 the constructor calls resource_tracker.register, looked up at call time.
    with _patch_lock:
        register = resource_tracker.register
        resource_tracker.register = lambda *args, **kwargs: None
        try:
            return shared_memory.SharedMemory(name, create=create, size=size)
        finally:
            resource_tracker.register = register


def create(size: int) -> shared_memory.SharedMemory:
    """A new segment of at least ``size`` bytes, named ``ab_<pid>_<random>``, not tracked."""
    name = f"{SEGMENT_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
    return _untracked(name, True, max(1, size))


def attach(name: str) -> shared_memory.SharedMemory:
    """The existing segment ``name``, not tracked (so this process never unlinks it by exiting)."""
    return _untracked(name, False, 0)


def unlink(name: str) -> bool:
    """Remove segment ``name`` from the system; ``False`` if it was already gone. Windows: no-op."""
    if os.name == "nt":
        return True
    import _posixshmem  # POSIX only; SharedMemory.unlink() would start the tracker

    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return False
    return True
