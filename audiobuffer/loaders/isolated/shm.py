"""Shared-memory segments that only their owner unlinks, on every supported Python.

Segments are created and attached untracked, and their owner (the helper process) unlinks them
itself (NOTE [ Shared-memory ownership ]); :func:`check_room` refuses a segment that ``/dev/shm``
has no room for.

NOTE [ Shared-memory ownership ]
================================
``multiprocessing.shared_memory.SharedMemory`` registers every segment it creates or attaches with
multiprocessing's resource tracker on POSIX (before Python 3.13, attaching too; CPython gh-82300).
The tracker is a process of its own, started on first use, that unlinks what it tracks when its
process exits. Here that is wrong twice: the trainer attaching to the helper's segments would unlink
them when the trainer exits (or warn about "leaked" segments it does not own), and the tracker is a
child process that outlives every loader. So segments are created and attached untracked, and the
owner (the helper process) unlinks them itself, on a normal exit and on losing its trainer (see
NOTE [ Helper process lifecycle ] in ``loaders/isolated/helper.py``); the trainer unlinks what a dead
helper left behind. On Windows a segment lives as long as a handle to it is open, and unlinking does
nothing.

On Linux segments live in the tmpfs ``/dev/shm``, and a segment is given pages as they are first
written: one larger than the room left is made without complaint, and the process that writes past
the room dies of SIGBUS. :func:`check_room` refuses such a segment first, with a clear error.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import threading
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

from ...errors import HelperError

__all__ = ["SEGMENT_PREFIX", "SHM_DIR", "attach", "check_room", "create", "leftovers", "room", "unlink"]

#: Every segment's name starts with this (``/dev/shm/ab_...`` on Linux), so a test can look for leftovers.
SEGMENT_PREFIX = "ab_"
#: Where Linux keeps segments: a tmpfs, 64 MB in a Docker container unless ``--shm-size`` says more.
SHM_DIR = Path("/dev/shm")

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


def room() -> tuple[int, int] | None:
    """Free and total bytes of :data:`SHM_DIR`; ``None`` where there is no such folder (macOS, Windows)."""
    if not SHM_DIR.is_dir():
        return None
    usage = shutil.disk_usage(SHM_DIR)
    return usage.free, usage.total


def check_room(nbytes: int, what: str) -> None:
    """Refuse to make ``what`` (segments that will hold ``nbytes`` in all) where :data:`SHM_DIR` has less
    room left: writing past the room would kill the writer with SIGBUS. No check without the folder.

    Raises:
        HelperError: naming the room left and the ways out.
    """
    found = room()
    if found is None or nbytes <= found[0]:
        return
    free, total = found
    raise HelperError(f"no room in {SHM_DIR.as_posix()} for {what} of {_mib(nbytes)} ({_mib(free)} free of "
                      f"{_mib(total)}): give it more (docker run --shm-size=2g; a container gets 64 MB "
                      f"unless told otherwise), or use fewer slots (num_slots=) or smaller ones (a smaller "
                      f"batch_size or max_batch_seconds, shorter samples)")


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


def attach(name: str) -> shared_memory.SharedMemory:
    """The existing segment ``name``, not tracked (so this process never unlinks it by exiting)."""
    return _untracked(name, False, 0)


def leftovers(pid: int) -> list[str]:
    """The segments process ``pid`` made that are still on the system, where it lists them (Linux:
    :data:`SHM_DIR`); ``[]`` elsewhere (macOS lists none; on Windows a segment goes with its last handle)."""
    if os.name == "nt" or not SHM_DIR.is_dir():
        return []
    return sorted(path.name for path in SHM_DIR.glob(f"{SEGMENT_PREFIX}{pid}_*"))


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
