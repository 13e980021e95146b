"""The memory an item table crosses to the helper in: mapped by both processes, freed by the system.

An :class:`~audiobuffer.IsolatedLoader` writes its source's item table into a :class:`TableRegion`
that the trainer and its helper both map (NOTE [ Shared item table ] in ``sources/table.py``), so the
table's pages are in memory once. The region has no name left on disk: on POSIX it is a temporary
file unlinked as soon as it is made, whose descriptor the helper inherits (``pass_fds``); on Windows a
section of the paging file, named by a random tag the helper opens. Either way the system frees it
when the last process that maps it (or holds its descriptor) is gone, whether it closed, crashed or
was killed: nothing is left behind to sweep.
"""

from __future__ import annotations

import mmap
import os
import secrets
import sys
import tempfile
from dataclasses import dataclass

__all__ = ["PREFIX", "RegionHandle", "TableRegion", "give_back_heap"]

#: Every region's temporary file is made under this name (then unlinked; Linux shows it in
#: ``/proc/<pid>/fd`` as ``<tmp>/audiobuffer-table-... (deleted)`` while a descriptor is open).
PREFIX = "audiobuffer-table-"


@dataclass(frozen=True)
class RegionHandle:
    """What opens a region in another process: the inherited descriptor (POSIX) or the tag (Windows)."""

    size: int
    fd: int = -1
    tag: str = ""

    def map(self) -> mmap.mmap:
        """The region, mapped read-only (on Windows writable: the table makes its arrays read-only).

        Raises:
            OSError: the region cannot be mapped (this process did not inherit it; its trainer has gone).
        """
        try:
            if sys.platform == "win32":  # the tag opens the trainer's section (or makes an empty one, which
                return mmap.mmap(-1, self.size, tagname=self.tag)  # the table's token check refuses)
            return mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ)
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
        if sys.platform == "win32":
            tag = f"audiobuffer-table-{os.getpid()}-{secrets.token_hex(8)}"
            try:
                self._view = mmap.mmap(-1, size, tagname=tag)  # held until close(): the section lives as
            except OSError as exc:                             # long as one handle to it does
                raise OSError(exc.errno, f"cannot make the item table's shared memory ({size} bytes): "
                                         f"{exc.strerror or exc}") from exc
            self.handle = RegionHandle(size, tag=tag)
            self._fd = -1
        else:
            try:
                fd, path = tempfile.mkstemp(prefix=PREFIX)
            except OSError as exc:
                raise _no_room(size, exc) from exc
            os.unlink(path)  # no name on disk from here: the file goes with its last descriptor and map
            try:
                os.ftruncate(fd, size)
            except BaseException as exc:
                os.close(fd)
                if isinstance(exc, OSError):
                    raise _no_room(size, exc) from exc
                raise
            self._fd = fd
            self.handle = RegionHandle(size, fd=fd)

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The descriptors a helper must inherit to map the region (none on Windows)."""
        return (self._fd,) if self._fd >= 0 else ()

    def write(self, offset: int, data: memoryview) -> None:
        """Write ``data`` at ``offset``."""
        if sys.platform == "win32":
            assert self._view is not None
            self._view[offset:offset + len(data)] = data
            return
        while len(data):
            try:
                done = os.pwrite(self._fd, data, offset)
            except OSError as exc:  # the temporary folder is full (or its file system caps a file's size)
                raise _no_room(self.handle.size, exc) from exc
            data, offset = data[done:], offset + done

    def map(self) -> mmap.mmap:
        """The region as this process reads it from now on (what :meth:`RegionHandle.map` gives the helper)."""
        if self._view is not None:
            return self._view
        return self.handle.map()

    def close(self) -> None:
        """Let go of the descriptor (POSIX): the maps made stay, and a helper started from now on could
        not map the region. On Windows the section stays as long as a map of it does. Idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._view = None


def _no_room(size: int, exc: OSError) -> OSError:
    """``exc``, raised making or writing a region of ``size`` bytes on POSIX, as an error that says where."""
    return OSError(exc.errno, f"cannot write the item table ({size} bytes) to a temporary file in "
                              f"{tempfile.gettempdir()}: {exc.strerror or exc}; set TMPDIR to a folder with room")


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

