"""Shared-memory segments that nothing outlives: the batch slots of the isolated loader.

On POSIX a segment's name is removed as soon as it is made, and its descriptor crosses to the trainer
over a socket (NOTE [ Segments without names ]); on Windows a segment goes with its last handle.
:func:`check_room` refuses a segment that ``/dev/shm`` has no room for.

NOTE [ Segments without names ]
===============================
A POSIX shared-memory name lives until someone unlinks it: a helper and a trainer killed together
(SIGTERM or SIGHUP to the process group from ``timeout``, Slurm or a closed terminal; SIGKILL from a
scheduler after its grace period) would leave every slot in ``/dev/shm`` for good, and a container's
64 MB fills after a few such kills. So the helper unlinks each segment's name right after
``shm_open`` made it, keeps its map, and sends its descriptor to the trainer over a socket the trainer
gave it (``SCM_RIGHTS``, :class:`HelperSocket`), tagged with the slot and the name, before the message that
names it; the trainer maps the descriptor it receives (:class:`TrainerSocket`). The pages go when the last
map of them goes, in whatever way each process ends, as the item table's region does
(``loaders/isolated/tables.py``). A name exists only between ``shm_open`` and ``shm_unlink``, two
calls apart; the trainer and the helper still unlink every name of the helper's on the way out
(:func:`leftovers`), for a process killed between the two.

Segments are never registered with multiprocessing's resource tracker: on POSIX it is a process of
its own that unlinks what it tracks when its process exits (attaching registers too before Python
3.13, CPython gh-82300), which would unlink the helper's segments when a trainer attached by name
exits. On Windows a named section lives as long as a handle to it: the helper creates each slot
by name, the trainer opens it by that name (:func:`attach`) and holds it from the start, and unlinking
does nothing.

On Linux segments live in the tmpfs ``/dev/shm``, and a segment is given pages as they are first
written: one larger than the room left is made without complaint, and the process that writes past
the room dies of SIGBUS. :func:`check_room` refuses such a segment first, with a clear error.
"""

from __future__ import annotations

import mmap
import os
import secrets
import shutil
import socket
import sys
import threading
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

from ...errors import HelperError

__all__ = ["SEGMENT_PREFIX", "SHM_DIR", "HelperSocket", "Segment", "SlotMemory", "TrainerSocket", "attach",
           "check_room", "create", "leftovers", "room", "unlink"]

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


class Segment:
    """A segment mapped from its descriptor, with no name left on the system (POSIX; NOTE [ Segments
    without names ]): what ``SharedMemory`` offers, ``name``, ``size``, ``buf``, :meth:`close`."""

    def __init__(self, name: str, fd: int, size: int) -> None:
        self.name = name
        self.size = size
        self._fd = fd
        self._map: mmap.mmap | None = mmap.mmap(fd, size)
        self._buf: memoryview | None = memoryview(self._map)

    @property
    def buf(self) -> memoryview:
        if self._buf is None:
            raise ValueError(f"segment {self.name} is closed")
        return self._buf

    @property
    def fd(self) -> int:
        """The descriptor, until :meth:`close_fd` (``-1`` after): the map does not need it."""
        return self._fd

    def close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        """Unmap (``BufferError`` while a view into :attr:`buf` is alive, as ``SharedMemory.close``)."""
        if self._buf is not None:
            self._buf.release()
            self._buf = None
        if self._map is not None:
            self._map.close()
            self._map = None
        self.close_fd()


#: A batch slot's memory: a :class:`Segment` (POSIX) or a named ``SharedMemory`` (Windows).
SlotMemory = Segment | shared_memory.SharedMemory


def create(size: int) -> SlotMemory:
    """A new segment of at least ``size`` bytes, named ``ab_<pid>_<random>``: on POSIX a
    :class:`Segment` whose name is already gone (NOTE [ Segments without names ]), its descriptor open
    for :meth:`HelperSocket.send`; on Windows a ``SharedMemory`` the trainer opens by name."""
    name = f"{SEGMENT_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
    size = max(1, size)
    if sys.platform == "win32":
        return _untracked(name, True, size)
    import _posixshmem  # POSIX only; SharedMemory would name the segment until someone unlinks it

    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        _posixshmem.shm_unlink("/" + name)  # nameless from here: the pages go with the last map
        os.ftruncate(fd, size)
        return Segment(name, fd, size)
    except BaseException:
        os.close(fd)
        raise


class HelperSocket:
    """The helper's end of the socket its segments' descriptors cross on (POSIX; NOTE [ Segments without
    names ]). Thread safety: :meth:`send` from any thread."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)
        self._sock.set_inheritable(False)  # no child process of a decoder holds it
        self._lock = threading.Lock()

    def send(self, slot: int, segment: SlotMemory) -> None:
        """Send ``segment``, ``slot``'s memory from now on, and let go of its descriptor."""
        if sys.platform == "win32" or not isinstance(segment, Segment):
            return
        with self._lock:
            socket.send_fds(self._sock, [f"{slot} {segment.name}".encode("ascii")], [segment.fd])
        segment.close_fd()

    def receive_descriptors(self) -> dict[int, int]:
        """The descriptors the trainer sent before its setup (:meth:`TrainerSocket.send_descriptor`), each
        under the trainer's number for it: ``{trainer's: this process's}``. Reads what is there, without
        waiting: the trainer sends them before the setup, which this process has read."""
        found: dict[int, int] = {}
        if sys.platform == "win32":
            return found
        self._sock.setblocking(False)
        try:
            while True:
                try:
                    message, fds, _, _ = socket.recv_fds(self._sock, 256, 1)
                except BlockingIOError:
                    return found
                if not fds:  # the trainer's end is closed
                    return found
                os.set_inheritable(fds[0], False)
                found[int(message.decode("ascii").split()[1])] = fds[0]
        finally:
            self._sock.setblocking(True)


class TrainerSocket:
    """The trainer's end of the socket the helper's segments cross on (POSIX; NOTE [ Segments without
    names ]): each slot's newest segment received and not yet taken waits here.

    Args:
        sock: the trainer's end of the socket pair.
        timeout: seconds :meth:`take` waits for a descriptor the helper sent before its message.

    Thread safety: :meth:`take` and :meth:`close` under the caller's lock.
    """

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self._sock = sock
        self._sock.settimeout(timeout)
        self._waiting: dict[int, Segment] = {}

    def send_descriptor(self, fd: int) -> None:
        """Send descriptor ``fd`` to the helper, which finds it under this number
        (:meth:`HelperSocket.receive_descriptors`)."""
        if sys.platform == "win32":
            raise OSError("descriptors do not cross sockets on Windows")
        socket.send_fds(self._sock, [f"fd {fd}".encode("ascii")], [fd])

    def take(self, slot: int, name: str) -> Segment:
        """The segment ``name`` of ``slot``, received now or before.

        Raises:
            FileNotFoundError: the helper's end closed, or sent nothing in time, before ``name`` came.
        """
        while True:
            found = self._waiting.pop(slot, None)
            if found is not None:
                if found.name == name:
                    return found
                found.close()  # a segment the slot outgrew before the trainer read a batch of it
            if sys.platform == "win32":
                raise FileNotFoundError(f"segment {name} is not sent on Windows")
            try:
                message, fds, _, _ = socket.recv_fds(self._sock, 256, 1)
            except (OSError, ValueError) as exc:  # a timeout, a closed socket
                raise FileNotFoundError(f"segment {name} never came: {exc}") from exc
            if not fds:
                raise FileNotFoundError(f"segment {name} never came: the helper's end is closed")
            got_slot, got_name = message.decode("ascii").split(" ", 1)
            try:
                segment = Segment(got_name, fds[0], os.fstat(fds[0]).st_size)
            except BaseException:
                os.close(fds[0])
                raise
            segment.close_fd()  # the map does not need it
            old = self._waiting.pop(int(got_slot), None)
            if old is not None:
                old.close()
            self._waiting[int(got_slot)] = segment

    def close(self) -> None:
        """Close the socket and every segment received and not taken. Idempotent."""
        for segment in self._waiting.values():
            segment.close()
        self._waiting.clear()
        self._sock.close()


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


def attach(name: str, *, inbox: TrainerSocket | None = None, slot: int = 0) -> SlotMemory:
    """The segment ``name``: taken from ``inbox`` as ``slot``'s where segments cross as descriptors
    (POSIX), else opened by name, not tracked (so this process never unlinks it by exiting).

    Raises:
        FileNotFoundError: there is no such segment (the helper that made it is gone).
    """
    if inbox is not None:
        return inbox.take(slot, name)
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
