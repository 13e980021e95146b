"""``audiobuffer bench``: one epoch of audio decoding through each loader, side by side.

Every approach runs in a fresh subprocess (so its memory, start-up and CPU time are its own) over the
same files with the same decoder (:class:`AudioDecoder`) and collate (:func:`pad_collate`, numpy):

- ``loop``: decode and collate in the training thread;
- ``dataloader-N``: ``DataLoader(num_workers=N)`` (fork), ``-spawn`` with the ``spawn`` start method
  (what Windows and macOS users get), ``-pin`` with ``pin_memory=True``;
- ``audiobuffer-N``: ``BufferedDataset(num_producers=N)`` into ``DataLoader(num_workers=0)``;
- ``torchdata-2``: torchdata's ``ParallelMapper(method="thread")``, where torchdata is installed;
- ``prefetch_generator``: the loop in a ``BackgroundGenerator``, where prefetch_generator is installed.

For each: total epoch time, time to the first batch (worker start included), steady throughput after
it (files/s and seconds of audio/s), peak RSS of the whole process tree (sampled every 20 ms; forked
workers' shared pages count in each process), and CPU% (user + system time of the process and its
joined workers over one window, from just before the loader is made to just after its workers are
joined: CPU time and wall time are read at the same two instants, so CPU% is at most 100 times the
usable cores). On Windows, where there is no ``resource`` module, CPU% counts the measuring process only.

It needs psutil (the ``bench`` extra: ``pip install "audiobuffer[bench]"``); ``--plot`` also needs matplotlib.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

from .._options import usable_cores
from .report import write_json

__all__ = ["APPROACHES", "Window", "cpu_percent", "make_corpus", "measure_epoch", "run_bench", "run_with_peak_rss",
           "usable_cores"]

APPROACHES = [
    "loop", "dataloader-0", "dataloader-1", "dataloader-2", "dataloader-4", "dataloader-2-pin",
    "dataloader-2-spawn", "audiobuffer-1", "audiobuffer-2", "audiobuffer-4", "audiobuffer-8",
    "torchdata-2", "prefetch_generator",
]
SAMPLE_SECONDS = 0.02  # the RSS sampling period
QUICK_APPROACHES = ["loop", "dataloader-2", "dataloader-2-spawn", "audiobuffer-2", "torchdata-2", "prefetch_generator"]
BATCH_SIZE = 16
INSTALL_HINT = 'pip install "audiobuffer[bench]"'

#: ``audiobuffer bench --help``: plain text (the module docstring is reST for the API docs).
DESCRIPTION = ("Time one epoch of audio decoding through each loader, side by side: the plain loop, "
               "DataLoader with worker processes (fork, spawn, pinned), BufferedDataset with producer "
               "threads, and torchdata and prefetch_generator where installed. Each approach runs in a "
               "fresh process over the same files, decoder and collate.")
EPILOG = ("Reported per approach: epoch time, time to the first batch, steady files/s and seconds of "
          "audio/s, peak RSS of the process tree (MiB), and CPU % (user + system time over the same "
          "window as the wall time; at most 100 % per usable core). Needs psutil, and matplotlib for "
          f"--plot: {INSTALL_HINT}")


class PathDataset:
    """A map-style dataset of paths, decoded in ``__getitem__`` (importable, so ``spawn`` can pickle it)."""

    def __init__(self, paths: Sequence[str]) -> None:
        from ..decoders import AudioDecoder

        self.paths = list(paths)
        self.decoder = AudioDecoder()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return self.decoder(self.paths[i])


def _batches_of(samples: Iterator[Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
    from ..collate import pad_collate

    batch: List[Dict[str, Any]] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == BATCH_SIZE:
            yield pad_collate(batch)
            batch = []
    if batch:
        yield pad_collate(batch)


def _loader(approach: str, paths: List[str]) -> Iterator[Dict[str, Any]]:
    from torch.utils.data import DataLoader

    from ..collate import pad_collate
    from ..dataset import BufferedDataset
    from ..decoders import AudioDecoder

    decoder = AudioDecoder()
    if approach == "loop":
        return _batches_of(decoder(p) for p in paths)
    if approach.startswith("dataloader-"):
        parts = approach.split("-")
        workers = int(parts[1])
        extra: Dict[str, Any] = {}
        if "spawn" in parts:
            extra["multiprocessing_context"] = "spawn"
        return iter(DataLoader(PathDataset(paths), batch_size=BATCH_SIZE, num_workers=workers, collate_fn=pad_collate,
                               pin_memory="pin" in parts, **extra))
    if approach.startswith("audiobuffer-"):
        ds = BufferedDataset(paths, decoder, num_producers=int(approach.split("-")[1]), buffer_size=64)
        return iter(DataLoader(ds, batch_size=BATCH_SIZE, collate_fn=pad_collate))
    if approach == "torchdata-2":
        from torchdata.nodes import (
            Batcher,
            IterableWrapper,
            Loader,
            Mapper,
            ParallelMapper,
        )

        node = ParallelMapper(IterableWrapper(paths), map_fn=decoder, num_workers=2, method="thread", in_order=False)
        return iter(Loader(Mapper(Batcher(node, batch_size=BATCH_SIZE, drop_last=False), pad_collate)))
    if approach == "prefetch_generator":
        from prefetch_generator import BackgroundGenerator

        return iter(BackgroundGenerator(_batches_of(decoder(p) for p in paths), max_prefetch=4))
    raise ValueError(f"unknown approach {approach!r}; known: {APPROACHES}")


def available(approach: str) -> bool:
    """Whether the approach's package is installed."""
    module = {"torchdata-2": "torchdata.nodes", "prefetch_generator": "prefetch_generator"}.get(approach)
    if module is None:
        return True
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have been joined.

    ``resource`` is Unix-only, so it is imported here, not at module level: on Windows the
    process's own times come from psutil (joined worker processes are not counted there).
    """
    try:
        import resource
    except ImportError:
        import psutil

        times = psutil.Process().cpu_times()
        return times.user + times.system
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
        self.cpu1: Optional[float] = None
        self.wall1: Optional[float] = None

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


def measure_epoch(make_iterator: Any) -> Dict[str, float]:
    """Drain ``make_iterator()`` (batches with ``path``, ``lengths`` and ``sample_rate``) and measure it.

    The epoch time ends at the last batch; the CPU window runs from before ``make_iterator()`` to
    after the iterator is released and collected (DataLoader workers are joined there, so their CPU
    time counts), and its wall time is read at the same two instants.
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
        audio += float(batch["lengths"].sum()) / float(batch["sample_rate"][0])
    total = time.perf_counter() - start
    del iterator, batch  # DataLoader workers are joined here, so their CPU time counts
    gc.collect()
    window.stop()
    return {"total_s": total, "first_batch_s": first or total, "files": files, "first_files": first_files,
            "audio_s": audio, "cpu_s": window.cpu_s, "window_s": window.wall_s}


def _child(approach: str, paths: List[str]) -> Dict[str, float]:
    """Run one epoch in this process and measure it (the body of the subprocess)."""
    import torch  # everything is imported before the clock starts, as in a training script
    import torch.utils.data  # noqa: F401

    from .. import collate, dataset, decoders  # noqa: F401

    if approach == "torchdata-2":
        import torchdata.nodes  # noqa: F401
    if approach == "prefetch_generator":
        import prefetch_generator  # noqa: F401
    torch.zeros(1)
    return measure_epoch(lambda: _loader(approach, paths))


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


@dataclass
class Run:
    """One measured epoch."""

    approach: str
    total_s: float
    first_batch_s: float
    files: int
    audio_s: float
    cpu_percent: float
    peak_rss_mb: float
    steady_files_per_s: float
    steady_audio_per_s: float


def run_with_peak_rss(cmd: Sequence[str], *, timeout: float, env: Optional[Dict[str, str]] = None
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


def _measure(approach: str, file_list: Path, timeout: float) -> Run:
    out = file_list.with_suffix(f".{approach}.json")
    cmd = [sys.executable, "-m", "audiobuffer.tools.bench", "--child", approach, "--file-list", str(file_list),
           "--child-out", str(out)]
    status, err, peak = run_with_peak_rss(cmd, timeout=timeout)
    if status != 0:
        raise RuntimeError(f"{approach} failed (exit {status}): {err}")
    r = json.loads(out.read_text())
    steady_time = max(1e-9, r["total_s"] - r["first_batch_s"])
    steady_files = r["files"] - r["first_files"]
    return Run(approach, r["total_s"], r["first_batch_s"], r["files"], r["audio_s"], cpu_percent(r["cpu_s"], r["window_s"]),
               peak / 2**20, steady_files / steady_time, r["audio_s"] * steady_files / max(1, r["files"]) / steady_time)


def make_corpus(root: Path, files: int, fmt: str, *, seed: int = 0) -> List[str]:
    """``files`` mono 16 kHz noise-and-tone files of 1-4 s (made once per folder)."""
    import soundfile as sf

    root.mkdir(parents=True, exist_ok=True)
    marker = root / f"COMPLETE-{files}-{fmt}"
    paths = [str(root / f"{i:05d}.{fmt}") for i in range(files)]
    if not marker.exists():
        rng = np.random.default_rng(seed)
        for i, path in enumerate(paths):
            n = int(16000 * rng.uniform(1.0, 4.0))
            t = np.arange(n) / 16000
            audio = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 2000) * t) + 0.05 * rng.standard_normal(n)
            sf.write(path, audio.astype(np.float32), 16000, subtype="PCM_16")
        marker.write_text("ok")
    return paths


def run_bench(corpora: Dict[str, List[str]], approaches: Sequence[str], runs: int, *, workdir: Path,
              timeout: float = 600.0, progress: bool = True) -> Dict[str, List[Dict[str, Any]]]:
    """Measure every approach on every corpus ``runs`` times; return the medians per corpus."""
    results: Dict[str, List[Dict[str, Any]]] = {}
    for corpus, paths in corpora.items():
        file_list = workdir / f"{corpus}.txt"
        file_list.write_text("\n".join(paths))
        rows = []
        for approach in approaches:
            if not available(approach):
                if progress:
                    print(f"  {corpus}: {approach}: not installed, left out", file=sys.stderr)
                continue
            measured = [_measure(approach, file_list, timeout) for _ in range(runs)]
            median = {k: statistics.median(getattr(m, k) for m in measured) for k in asdict(measured[0]) if k != "approach"}
            median["approach"] = approach
            median["runs"] = runs
            rows.append(median)
            if progress:
                print(f"  {corpus}: {approach}: {median['total_s']:.2f} s, first batch {1000 * median['first_batch_s']:.0f} ms, "
                      f"peak RSS {median['peak_rss_mb']:.0f} MiB", file=sys.stderr)
        _add_ratios(rows)
        results[corpus] = rows
    return results


def _add_ratios(rows: List[Dict[str, Any]]) -> None:
    loop = next((r["total_s"] for r in rows if r["approach"] == "loop"), None)
    loaders = [r["total_s"] for r in rows if r["approach"].startswith("dataloader-")]
    best = min(loaders) if loaders else None
    for r in rows:
        r["vs_loop"] = loop / r["total_s"] if loop else None
        r["vs_best_dataloader"] = best / r["total_s"] if best else None


def markdown(results: Dict[str, List[Dict[str, Any]]]) -> str:
    """The results as Markdown tables, one per corpus."""
    out = []
    for corpus, rows in results.items():
        out.append(f"#### {corpus}\n")
        out.append("| approach | epoch s | vs loop | vs best DataLoader | first batch ms | files/s (steady) | "
                   "audio s/s (steady) | peak RSS MiB (tree) | CPU % |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            out.append(f"| {r['approach']} | {r['total_s']:.2f} | {r['vs_loop']:.2f}x | {r['vs_best_dataloader']:.2f}x | "
                       f"{1000 * r['first_batch_s']:.0f} | {r['steady_files_per_s']:.0f} | {r['steady_audio_per_s']:.0f} | "
                       f"{r['peak_rss_mb']:.0f} | {r['cpu_percent']:.0f} |")
        out.append("")
    return "\n".join(out)


def plot(results: Dict[str, List[Dict[str, Any]]], path: Path) -> None:
    """A PNG: epoch throughput and time to first batch per approach, per corpus."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(13, 3.2 * len(results)), squeeze=False)
    for row, (corpus, rows) in zip(axes, results.items()):
        names = [r["approach"] for r in rows]
        colors = ["tab:green" if n.startswith("audiobuffer") else "tab:gray" if n == "loop" else "tab:blue" for n in names]
        row[0].barh(names, [r["files"] / r["total_s"] for r in rows], color=colors)
        row[0].set_xlabel("files per second (whole epoch)")
        row[0].set_title(corpus)
        row[0].invert_yaxis()
        row[1].barh(names, [1000 * r["first_batch_s"] for r in rows], color=colors)
        row[1].set_xscale("log")
        row[1].set_xlabel("time to first batch, ms (log)")
        row[1].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _missing_modules(names: Sequence[str]) -> List[str]:
    """The modules of ``names`` that cannot be imported."""
    missing = []
    for name in names:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``audiobuffer bench``; also the subprocess entry point (``--child``)."""
    parser = argparse.ArgumentParser(prog="audiobuffer bench", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--files", type=int, default=1000, help="files per generated corpus (default 1000)")
    parser.add_argument("--formats", default="flac,wav", help="generated corpora (default flac,wav)")
    parser.add_argument("--fsdd", type=Path, default=None, help="also the real FSDD recordings in this folder")
    parser.add_argument("--runs", type=int, default=3, help="runs per approach; the median is reported (default 3)")
    parser.add_argument("--approaches", default=None, help=f"comma-separated subset of: {', '.join(APPROACHES)}")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 40 files, 1 run, a few approaches")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where corpora are made (default: a temp folder)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout)")
    parser.add_argument("--markdown", metavar="PATH", help="write the tables to PATH")
    parser.add_argument("--plot", metavar="PNG", help="draw the results to PNG")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--file-list", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        paths = args.file_list.read_text().split("\n")
        args.child_out.write_text(json.dumps(_child(args.child, paths)))
        return 0
    if args.runs < 1 or args.files < 1:
        parser.error("--runs and --files must be >= 1")
    missing = _missing_modules(["psutil"] + (["matplotlib"] if args.plot else []))
    if missing:
        print(f"audiobuffer bench: error: needs {' and '.join(missing)}, which the bench extra installs: "
              f"{INSTALL_HINT}", file=sys.stderr)
        return 2
    approaches = QUICK_APPROACHES if args.quick else APPROACHES
    if args.approaches:
        approaches = [a.strip() for a in args.approaches.split(",") if a.strip()]
        unknown = [a for a in approaches if a not in APPROACHES]
        if unknown:
            parser.error(f"unknown approaches {unknown}; known: {APPROACHES}")
    files, runs = (40, 1) if args.quick else (args.files, args.runs)
    with tempfile.TemporaryDirectory(prefix="audiobuffer-bench-") as tmp:
        cache = args.cache_dir or Path(tmp)
        corpora = {f"{fmt.upper()}, {files} generated files of 1-4 s at 16 kHz":
                   make_corpus(cache / f"{fmt}-{files}", files, fmt) for fmt in args.formats.split(",") if fmt}
        if args.fsdd is not None:
            fsdd = sorted(str(p) for p in args.fsdd.glob("*.wav"))
            if not fsdd:
                parser.error(f"--fsdd {args.fsdd}: no .wav files there")
            corpora[f"FSDD, {len(fsdd)} real recordings (WAV, 8 kHz)"] = fsdd[:files] if args.quick else fsdd
        results = run_bench(corpora, approaches, runs, workdir=Path(tmp))
    text = markdown(results)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.plot:
        plot(results, Path(args.plot))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
