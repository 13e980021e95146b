"""``audiobuffer bench``: one epoch of audio decoding through each loader, side by side.

Every approach runs in a fresh subprocess (so its memory, start-up and CPU time are its own) over the
same files with the same decoder (:class:`AudioDecoder`), per-sample transform (the ``flac+mel``
corpus: a librosa log-mel spectrogram, which holds the GIL) and collate (:func:`pad_collate`, numpy):

- ``loop``: decode and collate in the training thread (``loop-libsndfile``: WAV through libsndfile too);
- ``dataloader-N``: ``DataLoader(num_workers=N)`` (fork), ``-spawn`` with the ``spawn`` start method
  (what Windows and macOS users get), ``-pin`` with ``pin_memory=True``;
- ``audiobuffer-N``: ``BufferedDataset(num_producers=N)`` into ``DataLoader(num_workers=0)``;
  ``audiobuffer-auto``: the same with ``num_producers`` left to its default;
- ``isolated-2``: ``IsolatedLoader(num_producers=2)``, the producers in one helper process.

Other libraries' loaders (torchdata, prefetch_generator, SPDL) are measured beside these by
``benchmarks/bench_decode.py`` in the source repository, which runs this command with a
:class:`Lineup` of its own (the same options, more approaches).

For each: total epoch time, time to the first batch (worker start included), steady throughput after
it (files/s and seconds of audio/s), peak RSS of the whole process tree (sampled every 20 ms; forked
workers' shared pages count in each process), and CPU% (user + system time of the process and its
joined workers over one window, from just before the loader is made to just after its workers are
joined: CPU time and wall time are read at the same two instants, so CPU% is at most 100 times the
usable cores). On Windows, where there is no ``resource`` module, CPU% counts the measuring process only.
The output's first line says whether the GIL was enabled in the runs (:func:`gil_line`).

It needs psutil (the ``bench`` extra: ``pip install "audiobuffer[bench]"``); ``--plot`` also needs
matplotlib. The extra also holds librosa (the ``flac+mel`` corpus); without it, that corpus is left out
with a note.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..options import usable_cores

# The approaches, corpora, tables and plot live in _bench_approaches; benchmarks and tests import them from here.
from ._bench_approaches import (  # noqa: F401
    APPROACHES,
    BATCH_SIZE,
    BUFFER_SIZE,
    LINEUP,
    N_MELS,
    QUICK_APPROACHES,
    TRANSFORMS,
    Lineup,
    PathDataset,
    Peer,
    Transform,
    batches_of,
    decoding,
    generated_corpora,
    get_transform,
    gil_enabled,
    gil_line,
    loader,
    make_corpus,
    markdown,
    mel_transform,
    missing_modules,
    parse_formats,
    plot,
)
from ._measure import (
    Window,
    cpu_percent,
    machine_load,
    measure_epoch,
    run_with_peak_rss,
    trust_line,
)
from .report import write_json

__all__ = ["APPROACHES", "LINEUP", "Lineup", "Peer", "Window", "build_parser", "cpu_percent", "gil_line", "main",
           "make_corpus", "measure_epoch", "mel_transform", "run_bench", "run_with_peak_rss", "usable_cores"]

INSTALL_HINT = 'pip install "audiobuffer[bench]"'
#: How long ``--quick`` may measure: no measurement starts after this many minutes.
QUICK_MINUTES = 3.0

#: ``audiobuffer bench --help``: plain text (the module docstring is reST for the API docs).
DESCRIPTION = ("Time one epoch of audio decoding through each loader, side by side: the plain loop, "
               "DataLoader with worker processes (fork, spawn, pinned), BufferedDataset with producer "
               "threads, and IsolatedLoader with its producers in a helper process. Each approach runs "
               "in a fresh process over the same files, decoder, per-sample transform and collate. Other "
               "libraries' loaders (torchdata, prefetch_generator, SPDL) are compared by "
               "benchmarks/bench_decode.py in audiobuffer's source repository.")
#: The hint for an approach ``audiobuffer bench`` does not know.
PEERS_HINT = ("other libraries' loaders (torchdata, prefetch_generator, SPDL) are compared by "
              "benchmarks/bench_decode.py in audiobuffer's source repository")
EPILOG = ("Corpora: generated FLAC and WAV files, FLAC with a librosa log-mel spectrogram per sample "
          "(flac+mel, which holds the GIL), and FSDD with --fsdd. Reported per approach: epoch time, time "
          "to the first batch, steady files/s and seconds of audio/s, peak RSS of the process tree (MiB), "
          "and CPU % (user + system time over the same window as the wall time; at most 100 % per usable "
          "core); the first line says whether the GIL was enabled. Needs psutil, and matplotlib for --plot: "
          f"{INSTALL_HINT}")


def _child(approach: str, paths: list[str], transform_name: str | None = None, lineup: Lineup = LINEUP
           ) -> dict[str, Any]:
    """Run one epoch in this process and measure it (the body of the subprocess)."""
    import torch  # everything is imported before the clock starts, as in a training script
    import torch.utils.data  # noqa: F401

    from .. import collate, decoders  # noqa: F401
    from ..loaders import dataset  # noqa: F401

    transform = get_transform(transform_name)
    lineup.warm_up(approach, transform)
    torch.zeros(1)
    measured: dict[str, Any] = dict(measure_epoch(lambda: lineup.loader(approach, paths, transform)))
    measured["gil_enabled"] = gil_enabled()
    return measured


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


def _measure(approach: str, file_list: Path, timeout: float, transform: str | None = None,
             lineup: Lineup = LINEUP) -> Run:
    out = file_list.with_suffix(f".{approach}.json")
    cmd = [sys.executable, *lineup.child, "--child", approach, "--file-list", str(file_list),
           "--child-out", str(out)] + (["--transform", transform] if transform else [])
    status, err, peak = run_with_peak_rss(cmd, timeout=timeout)
    if status != 0:
        raise RuntimeError(f"{approach} failed (exit {status}): {err}")
    r = json.loads(out.read_text(encoding="utf-8"))
    steady_time = max(1e-9, r["total_s"] - r["first_batch_s"])
    steady_files = r["files"] - r["first_files"]
    return Run(approach, r["total_s"], r["first_batch_s"], r["files"], r["audio_s"],
               cpu_percent(r["cpu_s"], r["window_s"]),
               peak / 2**20, steady_files / steady_time, r["audio_s"] * steady_files / max(1, r["files"]) / steady_time,
               r["gil_enabled"])


def run_bench(corpora: dict[str, list[str]], approaches: Sequence[str], runs: int, *, workdir: Path,
              timeout: float = 600.0, progress: bool = True, transforms: dict[str, str] | None = None,
              lineup: Lineup = LINEUP, deadline: float | None = None,
              left_out: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Measure every approach on every corpus ``runs`` times, taking turns; return the medians per corpus.

    ``approaches`` are names of ``lineup``. ``transforms`` maps a corpus name to the per-sample
    transform its samples get (one of ``TRANSFORMS``). Approaches whose package is missing, or that do
    not apply to a corpus (a WAV-only peer off WAV), are left out with a note. Past ``deadline`` (a
    ``time.monotonic()`` instant) no measurement starts: each one not made is added to ``left_out`` as
    ``"corpus: approach"``.
    """
    results: dict[str, list[dict[str, Any]]] = {}
    for number, (corpus, paths) in enumerate(corpora.items()):
        transform = (transforms or {}).get(corpus)
        file_list = workdir / f"corpus-{number}.txt"
        file_list.write_text("\n".join(paths), encoding="utf-8", newline="\n")  # any file name, any locale
        usable = []
        for approach in approaches:
            why = ("not installed" if not lineup.available(approach) else
                   "not for this corpus" if not lineup.applies(approach, paths, transform) else None)
            if why:
                if progress:
                    print(f"  {corpus}: {approach}: {why}, left out", file=sys.stderr)
            else:
                usable.append(approach)
        # The approaches take turns within each round, so that a busy spell of a shared machine
        # slows them alike instead of one approach's runs.
        measured: dict[str, list[Any]] = {approach: [] for approach in usable}
        for _ in range(runs):
            for approach in usable:
                if deadline is not None and time.monotonic() >= deadline:
                    if left_out is not None:
                        left_out.append(f"{corpus}: {approach}")
                    continue
                measured[approach].append(_measure(approach, file_list, timeout, transform, lineup=lineup))
        rows = []
        for approach, runs_of in measured.items():
            if not runs_of:
                continue
            median = {k: statistics.median(getattr(m, k) for m in runs_of) for k in asdict(runs_of[0])
                      if k not in ("approach", "gil_enabled")}
            median["gil_enabled"] = any(m.gil_enabled for m in runs_of)
            median["approach"] = approach
            median["runs"] = runs
            rows.append(median)
            if progress:
                print(f"  {corpus}: {approach}: {median['total_s']:.2f} s, "
                      f"first batch {1000 * median['first_batch_s']:.0f} ms, "
                      f"peak RSS {median['peak_rss_mb']:.0f} MiB", file=sys.stderr)
        _add_ratios(rows)
        results[corpus] = rows
    return results


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    loop = next((r["total_s"] for r in rows if r["approach"] == "loop"), None)
    loaders = [r["total_s"] for r in rows if r["approach"].startswith("dataloader-")]
    best = min(loaders) if loaders else None
    for r in rows:
        r["vs_loop"] = loop / r["total_s"] if loop else None
        r["vs_best_dataloader"] = best / r["total_s"] if best else None


def build_parser(*, lineup: Lineup = LINEUP, prog: str = "audiobuffer bench",
                 description: str = DESCRIPTION) -> argparse.ArgumentParser:
    """The parser of ``audiobuffer bench`` (for ``lineup``, ``prog`` and ``description``; see :func:`main`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=EPILOG)
    parser.add_argument("--files", type=int, default=1000, help="files per generated corpus (default 1000)")
    parser.add_argument("--formats", default=None,
                        help="generated corpora; FORMAT+mel adds a librosa log-mel transform per sample, which "
                             "holds the GIL (default flac,wav,flac+mel; --quick: flac)")
    parser.add_argument("--fsdd", type=Path, default=None, help="also the real FSDD recordings in this folder")
    parser.add_argument("--runs", type=int, default=3, help="runs per approach; the median is reported (default 3)")
    parser.add_argument("--approaches", default=None, help=f"comma-separated subset of: {', '.join(lineup.names)}")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: 40 FLAC files, 1 run, a few approaches, at most {QUICK_MINUTES:g} minutes")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="start no measurement after this many minutes; those left are named "
                             f"(default: none; --quick: {QUICK_MINUTES:g})")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where corpora are made (default: a temp folder)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout)")
    parser.add_argument("--markdown", metavar="PATH", help="write the tables to PATH")
    parser.add_argument("--plot", metavar="PNG", help="draw the results to PNG")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--file-list", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--transform", choices=TRANSFORMS, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None, *, lineup: Lineup = LINEUP, prog: str = "audiobuffer bench",
         description: str = DESCRIPTION) -> int:
    """``audiobuffer bench``; also the subprocess entry point (``--child``).

    A script that measures peers beside audiobuffer's loaders calls this with its own ``lineup`` (whose
    ``child`` runs that script), ``prog`` and ``description``: the options stay the same.
    """
    parser = build_parser(lineup=lineup, prog=prog, description=description)
    args = parser.parse_args(argv)
    if args.child:
        paths = args.file_list.read_text(encoding="utf-8").split("\n")
        args.child_out.write_text(json.dumps(_child(args.child, paths, args.transform, lineup)), encoding="utf-8",
                                  newline="\n")
        return 0
    if args.runs < 1 or args.files < 1:
        parser.error("--runs and --files must be >= 1")
    approaches = list(lineup.quick if args.quick else lineup.names)
    if args.approaches:
        approaches = [a.strip() for a in args.approaches.split(",") if a.strip()]
        unknown = [a for a in approaches if a not in lineup.names]
        if unknown:
            hint = f"; {PEERS_HINT}" if lineup is LINEUP else ""
            parser.error(f"unknown approaches {unknown}; known: {list(lineup.names)}{hint}")
    files, runs = (40, 1) if args.quick else (args.files, args.runs)
    minutes = args.max_minutes if args.max_minutes is not None else QUICK_MINUTES if args.quick else None
    if minutes is not None and minutes <= 0:
        parser.error("--max-minutes must be > 0")
    try:
        formats = parse_formats(args.formats or ("flac" if args.quick else "flac,wav,flac+mel"))
    except ValueError as exc:
        parser.error(str(exc))
    missing = missing_modules(["psutil"] + (["matplotlib"] if args.plot else []))
    if missing:
        print(f"{prog}: error: needs {' and '.join(missing)}, which the bench extra installs: "
              f"{INSTALL_HINT}", file=sys.stderr)
        return 2
    load_before, left_out = machine_load(), list[str]()
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    with tempfile.TemporaryDirectory(prefix="audiobuffer-bench-") as tmp:
        corpora, transforms = generated_corpora(formats, files, args.cache_dir or Path(tmp))
        if args.fsdd is not None:
            fsdd = sorted(str(p) for p in args.fsdd.glob("*.wav"))
            if not fsdd:
                parser.error(f"--fsdd {args.fsdd}: no .wav files there")
            fsdd = fsdd[:files] if args.quick else fsdd  # named by the files measured, not the files there
            corpora[f"FSDD, {len(fsdd)} real recordings (WAV, 8 kHz)"] = fsdd
        results = run_bench(corpora, approaches, runs, workdir=Path(tmp), transforms=transforms, lineup=lineup,
                            deadline=deadline, left_out=left_out)
    text = markdown(results, lineup)
    if left_out:
        text += (f"\n\nNot measured: the {minutes:g} minutes of --max-minutes were spent before "
                 f"{', '.join(left_out)}.")
    text += "\n\n" + trust_line(load_before, machine_load(), smoke=args.quick)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8", newline="\n")
    if args.plot:
        plot(results, Path(args.plot), lineup)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
