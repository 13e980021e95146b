"""Segments of long recordings: decoding a 10 s segment of a one-hour file against decoding a 10 s file.

    python benchmarks/bench_segments.py              # print the figures and the section
    python benchmarks/bench_segments.py --write      # and save results/segments.json, render BENCHMARKS.md

A corpus of utterances cut from long recordings (a Lhotse cut, a manifest's start and duration columns) is
read as ``WorkItem.segment``: ``AudioDecoder`` seeks to the segment and reads only it. This measures what
that costs against the same audio kept as short files: one 16 kHz mono recording of ``--hours`` (speech-like
noise bursts), and a 10 s file, in FLAC and WAV; each figure is the median time of one decode over
``--runs`` rounds of ``--decodes`` decodes, the segments at seeded random places in the recording, the
two taking turns within a round. The goal: a segment costs at most 2x the short file.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import render
import soundfile as sf
from harness import add_write_options, command_line, results, table, write_results

from audiobuffer import AudioDecoder, WorkItem

RATE = 16000
SEGMENT = 10.0


def _speechlike(seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Noise bursts of 0.2-2 s with pauses: FLAC compresses it about as it does speech."""
    out = np.zeros(int(seconds * RATE), dtype=np.float32)
    pos = 0
    while pos < len(out):
        n = int(rng.uniform(0.2, 2.0) * RATE)
        out[pos:pos + n] = (rng.uniform(0.02, 0.3) * rng.standard_normal(min(n, len(out) - pos))).astype(np.float32)
        pos += n + int(rng.uniform(0.1, 0.6) * RATE)
    return out


def _write_long(path: Path, seconds: float, fmt: str, rng: np.random.Generator) -> None:
    """Write ``seconds`` of audio in blocks of a minute (an hour does not have to sit in memory)."""
    with sf.SoundFile(path, "w", RATE, 1, format=fmt.upper(), subtype="PCM_16") as f:
        left = seconds
        while left > 0:
            block = min(60.0, left)
            f.write(_speechlike(block, rng))
            left -= block


def measure(folder: Path, fmt: str, hours: float, runs: int, decodes: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    long_path, short_path = folder / f"long.{fmt}", folder / f"short.{fmt}"
    _write_long(long_path, hours * 3600, fmt, rng)
    sf.write(short_path, _speechlike(SEGMENT, rng), RATE, format=fmt.upper(), subtype="PCM_16")
    decode = AudioDecoder()
    total = sf.info(str(long_path)).duration
    starts = np.random.default_rng(1).uniform(0, total - SEGMENT, size=decodes)
    segment_items = [WorkItem(i, str(long_path), segment=(float(s), SEGMENT)) for i, s in enumerate(starts)]
    file_item = WorkItem(0, str(short_path))
    for item in segment_items[:2]:  # warm the page cache and the decoder
        frames = decode(item)["num_frames"]
        if frames != round(SEGMENT * RATE):
            raise RuntimeError(f"{long_path}: a {SEGMENT:g} s segment at {item.segment} decoded {frames} frames")
    decode(file_item)
    seg_times, file_times = [], []
    for _ in range(runs):
        start = time.perf_counter()
        for item in segment_items:
            decode(item)
        seg_times.append((time.perf_counter() - start) / decodes)
        start = time.perf_counter()
        for _ in range(decodes):
            decode(file_item)
        file_times.append((time.perf_counter() - start) / decodes)
    seg, one = statistics.median(seg_times), statistics.median(file_times)
    return {"format": fmt.upper(), "hours": hours, "long_mb": long_path.stat().st_size / 1e6,
            "segment_ms": seg * 1e3, "file_ms": one * 1e3, "ratio": seg / one,
            "segment_runs_ms": [t * 1e3 for t in seg_times], "file_runs_ms": [t * 1e3 for t in file_times]}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=1.0, help="length of the long recording (default 1)")
    parser.add_argument("--runs", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--decodes", type=int, default=20, help="decodes per round (default 20)")
    parser.add_argument("--formats", default="flac,wav", help="formats (default flac,wav)")
    add_write_options(parser, "segments")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-segments-") as tmp:
        for fmt in args.formats.split(","):
            rows.append(measure(Path(tmp), fmt, args.hours, args.runs, args.decodes))
            print(f"{fmt}: measured", file=sys.stderr, flush=True)
    print(table(["format", "recording", "segment ms", f"{SEGMENT:g} s file ms", "segment / file"],
                [[r["format"], f"{r['hours']:g} h ({r['long_mb']:.0f} MB)", f"{r['segment_ms']:.2f}",
                  f"{r['file_ms']:.2f}", f"{r['ratio']:.2f}x"] for r in rows]) + "\n")
    measured = results("segments", rows, command=command_line("bench_segments.py", argv),
                       settings={"runs": args.runs, "decodes": args.decodes, "hours": args.hours,
                                 "segment_s": SEGMENT, "sample_rate": RATE})
    print(render.preview(measured, args.results or render.RESULTS))
    write_results(measured, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
