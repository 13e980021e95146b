"""``audiobuffer bench``: one epoch of audio decoding through each loader, side by side.

Every approach runs in a fresh subprocess (so its memory, start-up and CPU time are its own) over the
same files with the same decoder (:class:`AudioDecoder`), per-sample transform (the ``flac+mel``
corpus: a librosa log-mel spectrogram, which holds the GIL) and collate (:func:`pad_collate`, numpy):

- ``loop``: decode and collate in the training thread;
- ``dataloader-N``: ``DataLoader(num_workers=N)`` (fork), ``-spawn`` with the ``spawn`` start method
  (what Windows and macOS users get), ``-pin`` with ``pin_memory=True``;
- ``audiobuffer-N``: ``BufferedDataset(num_producers=N)`` into ``DataLoader(num_workers=0)``;
  ``audiobuffer-auto``: the same with ``num_producers`` left to its default;
- ``isolated-2``: ``IsolatedLoader(num_producers=2)``, the producers in one helper process;
- ``torchdata-2``: torchdata's ``ParallelMapper(method="thread")``, where torchdata is installed;
- ``prefetch_generator``: the loop in a ``BackgroundGenerator``, where prefetch_generator is installed;
- ``spdl-pipeline-N``: SPDL's ``PipelineBuilder``, a thread stage of concurrency N that decodes and
  collates batches (settings in ``audiobuffer/_bench_approaches.py``), where spdl is installed;
- ``spdl-load_wav``: a loop over ``spdl.io.load_wav`` (SPDL's native WAV parser) on WAV corpora.

For each: total epoch time, time to the first batch (worker start included), steady throughput after
it (files/s and seconds of audio/s), peak RSS of the whole process tree (sampled every 20 ms; forked
workers' shared pages count in each process), and CPU% (user + system of the tree over wall time).
The output's first line says whether the GIL was enabled in the runs.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

# PathDataset and mel_transform are imported from here by scripts and tests.
from ._bench_approaches import (APPROACHES, BATCH_SIZE, QUICK_APPROACHES, TRANSFORMS, PathDataset,  # noqa: F401
                                applies, available, available_transform, get_transform, loader, mel_transform,
                                warm_up)

__all__ = ["APPROACHES", "make_corpus", "run_bench", "run_with_peak_rss"]

SAMPLE_SECONDS = 0.02  # the RSS sampling period


def _cpu_seconds() -> float:
    import resource  # Unix only: imported here, so that importing this module works everywhere

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _child(approach: str, paths: List[str], transform_name: Optional[str] = None) -> Dict[str, Any]:
    """Run one epoch in this process and measure it (the body of the subprocess)."""
    import torch  # everything is imported before the clock starts, as in a training script
    import torch.utils.data  # noqa: F401

    from . import collate, dataset, decoders  # noqa: F401

    transform = get_transform(transform_name)
    warm_up(approach, transform)
    torch.zeros(1)
    gc.collect()
    cpu0, start = _cpu_seconds(), time.perf_counter()
    first = None
    files = first_files = 0
    audio = 0.0
    iterator = loader(approach, paths, transform)
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
    del iterator  # DataLoader workers are joined here, so their CPU time counts
    gc.collect()
    cpu = _cpu_seconds() - cpu0
    return {"total_s": total, "first_batch_s": first or total, "files": files, "first_files": first_files,
            "audio_s": audio, "cpu_s": cpu, "gil_enabled": gil_enabled()}


def gil_enabled() -> bool:
    """Whether the GIL is enabled in this process (always, before Python 3.13's free-threaded build)."""
    return bool(getattr(sys, "_is_gil_enabled", lambda: True)())


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
    gil_enabled: bool


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


def _measure(approach: str, file_list: Path, timeout: float, transform: Optional[str] = None) -> Run:
    out = file_list.with_suffix(f".{approach}.json")
    cmd = [sys.executable, "-m", "audiobuffer.bench", "--child", approach, "--file-list", str(file_list),
           "--child-out", str(out)] + (["--transform", transform] if transform else [])
    status, err, peak = run_with_peak_rss(cmd, timeout=timeout)
    if status != 0:
        raise RuntimeError(f"{approach} failed (exit {status}): {err}")
    r = json.loads(out.read_text())
    steady_time = max(1e-9, r["total_s"] - r["first_batch_s"])
    steady_files = r["files"] - r["first_files"]
    return Run(approach, r["total_s"], r["first_batch_s"], r["files"], r["audio_s"], 100 * r["cpu_s"] / r["total_s"],
               peak / 2**20, steady_files / steady_time, r["audio_s"] * steady_files / max(1, r["files"]) / steady_time,
               r["gil_enabled"])


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
              timeout: float = 600.0, progress: bool = True, transforms: Optional[Dict[str, str]] = None
              ) -> Dict[str, List[Dict[str, Any]]]:
    """Measure every approach on every corpus ``runs`` times; return the medians per corpus.

    ``transforms`` maps a corpus name to the per-sample transform its samples get (one of
    ``TRANSFORMS``). Approaches whose package is missing, or that do not apply to a corpus
    (``spdl-load_wav`` off WAV), are left out with a note.
    """
    results: Dict[str, List[Dict[str, Any]]] = {}
    for number, (corpus, paths) in enumerate(corpora.items()):
        transform = (transforms or {}).get(corpus)
        file_list = workdir / f"corpus-{number}.txt"
        file_list.write_text("\n".join(paths))
        rows = []
        for approach in approaches:
            why = ("not installed" if not available(approach) else
                   "not for this corpus" if not applies(approach, paths, transform) else None)
            if why:
                if progress:
                    print(f"  {corpus}: {approach}: {why}, left out", file=sys.stderr)
                continue
            measured = [_measure(approach, file_list, timeout, transform) for _ in range(runs)]
            median = {k: statistics.median(getattr(m, k) for m in measured) for k in asdict(measured[0])
                      if k not in ("approach", "gil_enabled")}
            median["gil_enabled"] = any(m.gil_enabled for m in measured)
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


def gil_line(results: Dict[str, List[Dict[str, Any]]]) -> str:
    """The header line: the interpreter, whether the GIL was enabled in the measured processes, the peers' versions."""
    build = "free-threaded build" if sysconfig.get_config_var("Py_GIL_DISABLED") else "default build"
    states = {r["approach"]: bool(r.get("gil_enabled", True)) for rows in results.values() for r in rows}
    if all(states.values()):
        gil = "GIL enabled"
    elif not any(states.values()):
        gil = "GIL disabled"
    else:
        gil = f"GIL disabled, but enabled by an import in: {', '.join(a for a, on in states.items() if on)}"
    peers = []
    for name in ("torchdata", "prefetch_generator", "spdl", "librosa"):
        try:
            peers.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return f"Python {platform.python_version()} ({build}): {gil}. Peers: {', '.join(peers) or 'none installed'}."


def markdown(results: Dict[str, List[Dict[str, Any]]]) -> str:
    """The results as Markdown tables, one per corpus, after the :func:`gil_line`."""
    out = [gil_line(results), ""]
    for corpus, rows in results.items():
        out.append(f"#### {corpus}\n")
        out.append("| approach | epoch s | vs loop | vs best DataLoader | first batch ms | files/s (steady) | "
                   "audio s/s (steady) | peak RSS MiB (tree) | CPU % |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            loop, best = (f"{r[k]:.2f}x" if r[k] is not None else "-" for k in ("vs_loop", "vs_best_dataloader"))
            out.append(f"| {r['approach']} | {r['total_s']:.2f} | {loop} | {best} | "
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
        colors = ["tab:green" if n.startswith(("audiobuffer", "isolated")) else "tab:gray" if n == "loop" else
                  "tab:orange" if n.startswith("spdl") else "tab:blue" for n in names]
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``audiobuffer bench``; also the subprocess entry point (``--child``)."""
    parser = argparse.ArgumentParser(prog="audiobuffer bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="files per generated corpus (default 1000)")
    parser.add_argument("--formats", default="flac,wav,flac+mel",
                        help="generated corpora; FORMAT+mel adds a librosa log-mel transform per sample, which "
                             "holds the GIL (default flac,wav,flac+mel)")
    parser.add_argument("--fsdd", type=Path, default=None, help="also the real FSDD recordings in this folder")
    parser.add_argument("--runs", type=int, default=3, help="runs per approach; the median is reported (default 3)")
    parser.add_argument("--approaches", default=None, help=f"comma-separated subset of {','.join(APPROACHES)}")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 40 files, 1 run, a few approaches")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where corpora are made (default: a temp folder)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout)")
    parser.add_argument("--markdown", metavar="PATH", help="write the tables to PATH")
    parser.add_argument("--plot", metavar="PNG", help="draw the results to PNG")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--file-list", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--transform", choices=TRANSFORMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        paths = args.file_list.read_text().split("\n")
        args.child_out.write_text(json.dumps(_child(args.child, paths, args.transform)))
        return 0
    if args.runs < 1 or args.files < 1:
        parser.error("--runs and --files must be >= 1")
    approaches = QUICK_APPROACHES if args.quick else APPROACHES
    if args.approaches:
        approaches = [a.strip() for a in args.approaches.split(",") if a.strip()]
        unknown = [a for a in approaches if a not in APPROACHES]
        if unknown:
            parser.error(f"unknown approaches {unknown}; known: {APPROACHES}")
    files, runs = (40, 1) if args.quick else (args.files, args.runs)
    formats = [f.strip().lower().partition("+") for f in args.formats.split(",") if f.strip()]
    bad = [base + plus + name for base, plus, name in formats if not base or (plus and name not in TRANSFORMS)]
    if bad:
        parser.error(f"--formats takes FORMAT or FORMAT+TRANSFORM (transforms: {', '.join(TRANSFORMS)}), got {bad}")
    with tempfile.TemporaryDirectory(prefix="audiobuffer-bench-") as tmp:
        cache = args.cache_dir or Path(tmp)
        corpora, transforms = {}, {}
        for base, _, name in formats:
            if name and not available_transform(name):
                print(f"  {base}+{name}: librosa is not installed, corpus left out", file=sys.stderr)
                continue
            corpus = f"{base.upper()}{' + librosa log-mel per sample' if name else ''}, {files} generated files " \
                     "of 1-4 s at 16 kHz"
            corpora[corpus] = make_corpus(cache / f"{base}-{files}", files, base)
            if name:
                transforms[corpus] = name
        if args.fsdd is not None:
            fsdd = sorted(str(p) for p in args.fsdd.glob("*.wav"))
            if not fsdd:
                parser.error(f"--fsdd {args.fsdd}: no .wav files there")
            corpora[f"FSDD, {len(fsdd)} real recordings (WAV, 8 kHz)"] = fsdd[:files] if args.quick else fsdd
        results = run_bench(corpora, approaches, runs, workdir=Path(tmp), transforms=transforms)
    text = markdown(results)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.plot:
        plot(results, Path(args.plot))
    if args.json:
        data = json.dumps(results, indent=2)
        if args.json == "-":
            print(data)
        else:
            Path(args.json).write_text(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
