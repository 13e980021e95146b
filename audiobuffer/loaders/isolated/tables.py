"""The memory an item table crosses to the helper in: mapped by both processes, freed by the system.

An :class:`~audiobuffer.IsolatedLoader` writes its source's item table into a :class:`TableRegion`
that the trainer and its helper both map (NOTE [ Shared item table ] in ``sources/table.py``), so the
table's pages are in memory once. The region has no name left on disk: on POSIX it is a temporary
file unlinked as soon as it is made, whose descriptor crosses to the helper over a socket
(:func:`adopt`); on Windows a section of the paging file, named by a random tag the helper opens.
Either way the system frees it when the last process that maps it (or holds its descriptor) is
gone, whether it closed, crashed or was killed: nothing is left behind to sweep.
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
import sys
import tempfile
import weakref
from dataclasses import dataclass

from ...errors import HelperError

__all__ = ["PREFIX", "RegionHandle", "TableRegion", "adopt", "give_back_heap"]

#: How every region's name starts: its temporary file's, made and then unlinked (Linux shows it in
#: ``/proc/<pid>/fd`` as ``<tmp>/audiobuffer-table-... (deleted)`` while a descriptor is open), or its
#: section's tag on Windows.
PREFIX = "audiobuffer-table-"


#: Descriptors this process received from the trainer (POSIX), under the trainer's numbers for them.
_ADOPTED: dict[int, int] = {}


def adopt(descriptors: dict[int, int]) -> None:
    """In the helper: the trainer's descriptors, received under other numbers (``{trainer's: ours}``), which
    :meth:`RegionHandle.map` then maps in their place."""
    _ADOPTED.update(descriptors)


@dataclass(frozen=True)
class RegionHandle:
    """What opens a region in another process: the inherited descriptor (POSIX) or the tag (Windows)."""

    size: int
    fd: int = -1
    tag: str = ""

    def map(self) -> mmap.mmap:
        """The region, mapped read-only (on Windows writable: the table makes its arrays read-only).

        Raises:
            OSError: the region cannot be mapped (POSIX: this process did not inherit the descriptor;
                Windows: no memory for the map). Where the trainer has gone, an inherited descriptor
                still maps its region, and a tag opens a new, empty section, which the table refuses.
        """
        try:
            if sys.platform == "win32":  # the tag opens the trainer's section (or makes an empty one, which
                return mmap.mmap(-1, self.size, tagname=self.tag)  # the table's token check refuses)
            fd = _ADOPTED.get(self.fd, self.fd)
            if sys.version_info >= (3, 13):  # no copy of the descriptor kept by the map
                return mmap.mmap(fd, self.size, access=mmap.ACCESS_READ, trackfd=False)
            return mmap.mmap(fd, self.size, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            what = f"tag {self.tag!r}" if self.tag else f"descriptor {self.fd}"
            raise OSError(f"cannot map the item table shared by {what} ({self.size} bytes): {exc}") \
                from exc


class TableRegion:
    """``size`` bytes that this process writes once and that a helper it starts maps.

    Args:
        size: the region's size in bytes (at least 1).

    Thread safety: made, written and closed by the thread that builds the loader.
    """

    def __init__(self, size: int) -> None:
        size = max(1, size)
        self._view: mmap.mmap | None = None
        self._fd = -1
        self._closer: weakref.finalize | None = None
        try:
            if sys.platform == "win32":
                tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
                self._view = mmap.mmap(-1, size, tagname=tag)  # held until close(): the section lives as
                self.handle = RegionHandle(size, tag=tag)      # long as one handle to it does
            else:
                fd, path = tempfile.mkstemp(prefix=PREFIX)
                self._fd = fd
                self._closer = weakref.finalize(self, os.close, fd)  # a loader that failed to build: gc closes it
                os.unlink(path)  # no name on disk from here: the file goes with its last descriptor and map
                os.ftruncate(fd, size)
                self.handle = RegionHandle(size, fd=fd)
        except OSError as exc:
            self.close()
            raise _no_room(size, exc) from exc

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The descriptors a helper must be given to map the region (none on Windows)."""
        return (self._fd,) if self._fd >= 0 else ()

    def write(self, offset: int, data: memoryview) -> None:
        """Write ``data`` at ``offset``."""
        if sys.platform == "win32":
            assert self._view is not None
            self._view[offset:offset + len(data)] = data
            return
        try:
            while len(data):
                done = os.pwrite(self._fd, data, offset)
                data, offset = data[done:], offset + done
        except OSError as exc:  # no room left in the temp folder: the file is sparse until written
            raise _no_room(self.handle.size, exc) from exc

    def map(self) -> mmap.mmap:
        """The region as this process reads it from now on (what :meth:`RegionHandle.map` gives the helper)."""
        if self._view is not None:
            return self._view
        return self.handle.map()

    def close(self) -> None:
        """Let go of the descriptor (POSIX): the maps made stay, and a helper started from now on could
        not map the region. On Windows the section stays as long as a map of it does. Idempotent."""
        if self._closer is not None:
            self._closer()
        self._fd = -1
        self._view = None


def _no_room(size: int, exc: OSError) -> HelperError:
    mib = f"{size / (1 << 20):.1f} MiB"
    if sys.platform == "win32":
        return HelperError(f"cannot make the {mib} of memory the item table is shared in ({exc}): free some "
                           f"memory, or let Windows grow the paging file")
    full = exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    way_out = "free room there, or point TMPDIR at a folder with room" if full else \
        "point TMPDIR at a folder this process can write"
    return HelperError(f"cannot write the {mib} item table to the temp folder {tempfile.gettempdir()!r} ({exc}): "
                       f"{way_out}")


def give_back_heap() -> None:
    """Return the heap's free pages to the system, where the C library keeps them (glibc's
    ``malloc_trim``), after a table built in memory was given up for the shared one: its arrays lie in
    the heap among live objects, and glibc would keep their pages for the process's life. Elsewhere
    (Windows, macOS, musl) large blocks go back when freed and this does nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError):  # not glibc
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)

