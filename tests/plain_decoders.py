"""Decoders for the isolated loader's tests: importable by its helper process, and torch-free.

The helper process imports whatever the decoder's module imports; these import numpy only, so the
tests also check that the helper runs without torch.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np


class IndexDecoder:
    """A sample holding the item's index, path and a short array of its index; no file is read.

    Args:
        fail: indices whose decode raises ``ValueError``.
        delay: seconds every decode takes.
        slow_from: items from this index on take ``slow`` seconds instead (a decode stuck on a file).
        length: frames of the ``audio`` array (``index % 7 + 1`` when ``None``: unequal lengths).
    """

    def __init__(self, fail: tuple[int, ...] = (), delay: float = 0.0, length: int | None = None,
                 slow_from: int | None = None, slow: float = 0.0) -> None:
        self.fail = frozenset(fail)
        self.delay = delay
        self.slow_from = slow_from
        self.slow = slow
        self.length = length

    def __call__(self, item: Any) -> dict[str, Any]:
        delay = self.slow if self.slow_from is not None and item.index >= self.slow_from else self.delay
        if delay:
            time.sleep(delay)  # stands for the decode time of a slow file
        if item.index in self.fail:
            raise ValueError(f"injected failure on item {item.index}")
        n = self.length if self.length is not None else item.index % 7 + 1
        return {"audio": np.full(n, item.index, dtype=np.float32), "num_frames": n, "index": item.index,
                "path": item.path}


class Exit:
    """Kills the helper process hard on item ``index`` (a crash in native code, as far as anyone can tell)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __call__(self, item: Any) -> dict[str, Any]:
        if item.index == self.index:
            os._exit(3)
        return {"audio": np.zeros(2, dtype=np.float32), "index": item.index}


class Flood:
    """Fails every item from ``first_failure`` on with a long message (more failures than a pipe holds);
    item ``stuck`` first creates the file ``marker`` (when given), then sleeps ``stuck_s`` seconds (a
    decode stuck on a file)."""

    def __init__(self, first_failure: int, stuck: int, stuck_s: float, message_bytes: int = 4096,
                 marker: str | None = None) -> None:
        self.first_failure = first_failure
        self.stuck = stuck
        self.stuck_s = stuck_s
        self.message_bytes = message_bytes
        self.marker = marker

    def __call__(self, item: Any) -> dict[str, Any]:
        if item.index == self.stuck:
            if self.marker is not None:
                open(self.marker, "x").close()
            time.sleep(self.stuck_s)
        if item.index >= self.first_failure:
            raise ValueError(f"injected failure on item {item.index}: " + "x" * self.message_bytes)
        return {"audio": np.zeros(2, dtype=np.float32), "index": item.index}


def add_one(sample: dict[str, Any]) -> dict[str, Any]:
    """A module-level transform."""
    sample["audio"] = sample["audio"] + 1
    return sample


def where_audio_came_from(sample: dict[str, Any]) -> dict[str, Any]:
    """A transform noting whether ``audio`` is a numpy array and whether torch is loaded here."""
    sample["audio_is_numpy"] = isinstance(sample["audio"], np.ndarray)
    sample["torch_loaded"] = "torch" in sys.modules
    return sample


class Misfit:
    """1-D float32 ``audio`` for every item but those in ``at`` (``None``: every item), whose sample cannot
    go into a batch with the others: ``"none"`` (``None``), ``"str"`` (a string), ``"rank"`` (a 2-D
    ``audio``), ``"unpicklable"`` (a lock as its ``path``), ``"object"`` (an object-dtype ``audio``)."""

    def __init__(self, kind: str, at: tuple[int, ...] | None = (3,)) -> None:
        self.kind = kind
        self.at = at

    def __call__(self, item: Any) -> Any:
        sample: dict[str, Any] = {"audio": np.full(4, item.index, dtype=np.float32), "index": item.index,
                                  "path": item.path}
        if self.at is not None and item.index not in self.at:
            return sample
        if self.kind == "none":
            return None
        if self.kind == "str":
            return item.path
        if self.kind == "rank":
            sample["audio"] = np.zeros((2, 4), dtype=np.float32)
        elif self.kind == "unpicklable":
            sample["path"] = threading.Lock()
        elif self.kind == "object":
            sample["audio"] = sample["audio"].astype(object)
        return sample


class ExitOnce:
    """Kills the helper process hard on item ``index`` the first time only: it creates the file ``marker``
    first, and a later helper that finds it decodes the item (a crash that a restart gets past)."""

    def __init__(self, index: int, marker: str) -> None:
        self.index = index
        self.marker = marker

    def __call__(self, item: Any) -> dict[str, Any]:
        if item.index == self.index and not os.path.exists(self.marker):
            open(self.marker, "x").close()
            os._exit(3)
        return {"audio": np.zeros(2, dtype=np.float32), "index": item.index}


class TightShm(IndexDecoder):
    """:class:`IndexDecoder` in a helper whose shared-memory folder says it has ``free`` bytes of ``total``
    left: each decode points audiobuffer's free-space probe at those numbers (a small ``/dev/shm``)."""

    def __init__(self, free: int, total: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.free = free
        self.total = total

    def __call__(self, item: Any) -> dict[str, Any]:
        from audiobuffer.loaders.isolated import shm as _shm

        _shm.room = lambda: (self.free, self.total)
        return super().__call__(item)


class ChildWrites:
    """On item ``index``, runs a child process that writes to its stdout, file descriptor 1 inherited
    from the helper (a decoder calling a command-line tool); every sample says whether the helper's
    descriptor 0 is a pipe (``stdin_pipe``, 0 or 1) and whether its descriptor 1 is its stderr
    (``stdout_is_stderr``)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __call__(self, item: Any) -> dict[str, Any]:
        if item.index == self.index:
            code = "import os; os.write(1, b'a child process writes to its stdout\\n' * 64)"
            subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        return {"audio": np.zeros(2, dtype=np.float32), "index": item.index,
                "stdin_pipe": int(stat.S_ISFIFO(os.fstat(0).st_mode)),
                "stdout_is_stderr": int(os.path.sameopenfile(1, 2))}


class FramesDecoder:
    """Samples of ``frames[index]`` real frames (``num_frames``) at 1000 Hz, zero-padded to ``width``,
    whatever the source's durations say."""

    def __init__(self, frames: list[int], width: int) -> None:
        self.frames, self.width = frames, width

    def __call__(self, item: Any) -> dict[str, Any]:
        return {"audio": np.zeros(self.width, dtype=np.float32), "num_frames": self.frames[item.index],
                "sample_rate": 1000, "index": item.index}


def blas_threads() -> int:
    """The fewest threads any BLAS library loaded here runs on now (threadpoolctl)."""
    from threadpoolctl import threadpool_info

    return min(info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas")


class BlasProbe(IndexDecoder):
    """:class:`IndexDecoder` whose samples also hold ``blas_threads``: :func:`blas_threads` in the decode."""

    def __call__(self, item: Any) -> dict[str, Any]:
        sample = super().__call__(item)
        sample["blas_threads"] = blas_threads()
        return sample


class Logged(IndexDecoder):
    """:class:`IndexDecoder` that appends ``decode INDEX`` to the file ``log`` at each call (made in the
    helper process too), and fails on the indices of ``fail``."""

    def __init__(self, log: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log = log

    def __call__(self, item: Any) -> dict[str, Any]:
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(f"decode {item.index}\n")
        return super().__call__(item)


class LoggedTransform:
    """A transform that appends ``transform INDEX`` to the file ``log`` at each call."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(f"transform {sample['index']}\n")
        return sample


class SlowWarmUp(IndexDecoder):
    """:class:`IndexDecoder` whose first call in any process but ``home`` (the trainer's pid) takes
    ``warm_up`` seconds (a cold import), whose every call in ``home`` takes ``home_delay`` seconds
    (so the trainer is still in its epoch when a helper on a busy machine is warm), and whose
    samples say which process made them (``pid``)."""

    def __init__(self, home: int, warm_up: float, home_delay: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.home = home
        self.warm_up = warm_up
        self.home_delay = home_delay
        self._warm = False

    def __call__(self, item: Any) -> dict[str, Any]:
        if os.getpid() == self.home:
            time.sleep(self.home_delay)
        elif not self._warm:
            self._warm = True
            time.sleep(self.warm_up)
        sample = super().__call__(item)
        sample["pid"] = os.getpid()
        return sample
