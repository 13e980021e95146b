"""What ``audiobuffer bench`` measures and how: CPU% over one window, an epoch's timings, and the peak
RSS of a whole process tree.

The clocks are read at the same two instants (:class:`Window`), so CPU% is at most 100 times the
usable cores. ``resource`` is Unix-only and psutil is optional (the ``bench`` extra): both are imported
where they are used, so this module imports on Windows and in a plain install.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["BUSY_PER_CORE", "SAMPLE_SECONDS", "Window", "cpu_percent", "machine_load", "measure_epoch",
           "run_with_peak_rss", "trust_line"]

SAMPLE_SECONDS = 0.02  # the RSS sampling period
#: Above this load per usable core (runnable threads, or the share of CPU time busy), other work
#: takes turns with the measured one: times and ratios move from run to run.
BUSY_PER_CORE = 0.5


def machine_load() -> tuple[float | None, str]:
    """How busy the machine is now: (load per usable core, or ``None`` where unknown; in words).

    The 1-minute load average where the system has one (not Windows); else psutil's share of CPU time
    busy over half a second, where psutil is installed; else unknown.
    """
    from ..options import usable_cores

    cores = usable_cores()
    getloadavg = getattr(os, "getloadavg", None)
    if getloadavg is not None:
        try:
            one = float(getloadavg()[0])
        except OSError:
            pass
        else:
            return one / cores, f"load average {one:.2f} on {cores} usable cores"
    try:
        import psutil
    except ImportError:
        return None, "load unknown (no load average here, and psutil is not installed)"
    busy = float(psutil.cpu_percent(interval=0.5))
    return busy / 100, f"CPU {busy:.0f}% busy"


def trust_line(before: tuple[float | None, str], after: tuple[float | None, str], *, smoke: bool = False) -> str:
    """One line: the machine's load before and after a measurement (:func:`machine_load`) and how far
    to trust the figures; ``smoke``: a ``--quick`` run, whose runs are too short to compare."""
    loads = [load for load, _ in (before, after) if load is not None]
    if not loads:
        verdict = "how far to trust the figures is unknown: rerun on a machine you know is quiet"
    elif max(loads) > BUSY_PER_CORE:
        verdict = "machine busy: times and ratios are noisy, rerun on a quiet machine before relying on them"
    else:
        verdict = "machine quiet: the figures hold within run-to-run noise"
    if smoke:
        verdict += "; a --quick smoke run checks that everything runs, its ratios are not measurements"
    return f"Machine: {before[1]} before, {after[1]} after; {verdict}."


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have been joined.

    ``resource`` is Unix-only, so it is imported here, not at module level: on Windows the
    process's own times come from psutil (joined worker processes are not counted there).
    """
    if sys.platform == "win32":  # a platform check mypy follows, so that --platform win32 checks this too
        import psutil

        times = psutil.Process().cpu_times()
        return times.user + times.system
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Window:
    """Wall time and CPU time over one window, both read at the same two instants.

    CPU% is only meaningful when both clocks cover the same window: CPU time read after workers are
    joined, over a wall time that stopped before, is how a bench reports 300% on 2 cores.

    Example:
        >>> window = Window()
        >>> _ = sum(range(100_000))
        >>> window.stop()
        >>> 0 <= window.cpu_percent
        True
    """

    def __init__(self) -> None:
        self.cpu0, self.wall0 = _cpu_seconds(), time.perf_counter()
        self.cpu1: float | None = None
        self.wall1: float | None = None

    def stop(self) -> None:
        """End the window: read both clocks again, CPU time last (it includes the wall read)."""
        self.wall1 = time.perf_counter()
        self.cpu1 = _cpu_seconds()

    @property
    def wall_s(self) -> float:
        if self.wall1 is None:
            raise RuntimeError("Window.stop() was not called")
        return self.wall1 - self.wall0

    @property
    def cpu_s(self) -> float:
        if self.cpu1 is None:
            raise RuntimeError("Window.stop() was not called")
        return self.cpu1 - self.cpu0

    @property
    def cpu_percent(self) -> float:
        return cpu_percent(self.cpu_s, self.wall_s)


def cpu_percent(cpu_s: float, wall_s: float) -> float:
    """``100 * cpu_s / wall_s``: CPU seconds and wall seconds measured over the same window."""
    return 100.0 * cpu_s / max(wall_s, 1e-9)


def measure_epoch(make_iterator: Any) -> dict[str, float]:
    """Drain ``make_iterator()`` (batches with ``path``, and ``seconds`` or ``lengths`` and ``sample_rate``)
    and measure it.

    The epoch time ends at the last batch; the CPU window runs from before ``make_iterator()`` to
    after the iterator is released and collected (DataLoader workers are joined there, so their CPU
    time counts), and its wall time is read at the same two instants. Seconds of audio come from a
    batch's ``seconds`` where a transform replaced the audio, else from ``lengths / sample_rate``.
    """
    gc.collect()
    window = Window()
    start = window.wall0
    first = None
    files = first_files = 0
    audio = 0.0
    batch = None
    iterator = make_iterator()
    for batch in iterator:
        if first is None:
            first = time.perf_counter() - start
            first_files = len(batch["path"])
        files += len(batch["path"])
        if "seconds" in batch:  # a transform replaced the audio
            audio += float(batch["seconds"].sum())
        else:
            audio += float(batch["lengths"].sum()) / float(batch["sample_rate"][0])
    total = time.perf_counter() - start
    del iterator, batch  # DataLoader workers are joined here, so their CPU time counts
    gc.collect()
    window.stop()
    return {"total_s": total, "first_batch_s": first or total, "files": files, "first_files": first_files,
            "audio_s": audio, "cpu_s": window.cpu_s, "window_s": window.wall_s}


class _TreeRss:
    """Samples the summed RSS of a process and its children.

    Finding the children scans all of /proc, so it is refreshed every few samples only: sampling
    must not take the CPU the measured process needs (the machine may have two cores).
    """

    REFRESH = 5  # samples between two scans for children

    def __init__(self, pid: int) -> None:
        import psutil

        self._psutil = psutil
        self._root = psutil.Process(pid)
        self._procs = [self._root]
        self._count = 0

    def sample(self) -> int:
        psutil = self._psutil
        if self._count % self.REFRESH == 0:
            try:
                self._procs = [self._root] + self._root.children(recursive=True)
            except psutil.Error:
                return 0
        self._count += 1
        total = 0
        for p in self._procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total


def run_with_peak_rss(cmd: Sequence[str], *, timeout: float, env: dict[str, str] | None = None
                      ) -> tuple[int, str, int]:
    """Run ``cmd`` to its end while sampling the RSS of its whole process tree.

    Returns:
        The exit status, the tail of its stderr, and the peak summed RSS in bytes (every
        :data:`SAMPLE_SECONDS`; the tree's children are found again every few samples).
    """
    proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak = 0
    done = threading.Event()
    tree = _TreeRss(proc.pid)

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree.sample())
            done.wait(SAMPLE_SECONDS)  # a sampling period, not synchronisation

    sampler = threading.Thread(target=sample, name="bench-rss", daemon=True)
    sampler.start()
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        done.set()
        sampler.join(5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err.decode(errors="replace")[-2000:], peak
