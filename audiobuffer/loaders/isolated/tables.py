"""The folders that carry an item table from a trainer to its helper, and their removal whatever happens.

An :class:`~audiobuffer.IsolatedLoader` writes its source's item table to a folder its helper
memory-maps (NOTE [ Shared item table ] in ``sources/table.py``). The folder is named after the
trainer's pid, and removed: by the loader on close, after its helper has exited (Windows deletes no
mapped file); by the helper when its trainer has gone without closing (killed; POSIX, where a mapped
file can be deleted); and, for what a killed trainer left on Windows, by the next loader made on that
machine, which removes the folders of trainers no longer running.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["PREFIX", "make_folder", "pid_running", "sweep"]

#: Every table folder's name starts with this, then the trainer's pid and a dash.
PREFIX = "audiobuffer-table-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-")


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` runs (``True`` where that cannot be told: nothing is removed then)."""
    if sys.platform == "win32":
        import ctypes

        kernel32 = ctypes.windll.kernel32
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return kernel32.GetLastError() == 5  # access denied: it runs, as another user
        try:
            code = ctypes.c_ulong()
            if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
                return True
            return code.value == 259  # STILL_ACTIVE
        finally:
            kernel32.CloseHandle(handle)
    try:
        os.kill(pid, 0)  # signal 0: no signal, only the check
    except ProcessLookupError:
        return False
    except OSError:  # it runs, as another user
        return True
    return True


def sweep(folder: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove the table folders of trainers that no longer run (under ``folder``, default the temp folder);
    return what was removed."""
    removed = []
    for path in Path(folder or tempfile.gettempdir()).glob(PREFIX + "*"):
        match = _NAME.match(path.name)
        if match is None or int(match.group(1)) == os.getpid() or pid_running(int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(str(path))
    return removed


def make_folder() -> str:
    """A new, empty table folder of this trainer (the leftovers of trainers gone are removed first)."""
    sweep()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
