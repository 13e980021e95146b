"""Segments of long recordings: decoding a 10 s segment of a one-hour file against decoding a 10 s file.

    python benchmarks/bench_segments.py              # print the table
    python benchmarks/bench_segments.py --write      # and rewrite its section of BENCHMARKS.md

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
from pathlib import Path

import numpy as np
import soundfile as sf
from harness import machine, table, write_section

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


def measure(folder: Path, fmt: str, hours: float, runs: int, decodes: int) -> dict[str, float]:
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
        assert decode(item)["num_frames"] == round(SEGMENT * RATE)
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
    return {"segment_ms": seg * 1e3, "file_ms": one * 1e3, "ratio": seg / one,
            "long_mb": long_path.stat().st_size / 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=1.0, help="length of the long recording (default 1)")
    parser.add_argument("--runs", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--decodes", type=int, default=20, help="decodes per round (default 20)")
    parser.add_argument("--formats", default="flac,wav", help="formats (default flac,wav)")
    parser.add_argument("--write", action="store_true", help="rewrite the segments section of BENCHMARKS.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-segments-") as tmp:
        for fmt in args.formats.split(","):
            result = measure(Path(tmp), fmt, args.hours, args.runs, args.decodes)
            rows.append([fmt.upper(), f"{args.hours:g} h ({result['long_mb']:.0f} MB)", f"{result['segment_ms']:.2f}",
                         f"{result['file_ms']:.2f}", f"{result['ratio']:.2f}x"])
            print(rows[-1], flush=True)
    body = "\n".join([
        "## Segments of long recordings (`benchmarks/bench_segments.py`)",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/bench_segments.py --hours {args.hours:g} --runs "
        f"{args.runs} --decodes {args.decodes}`. One decode of a {SEGMENT:g} s segment at a random place in a long "
        f"16 kHz mono recording (`WorkItem.segment`) against one decode of a {SEGMENT:g} s file, medians of "
        f"{args.runs} rounds of {args.decodes} decodes, the two in turn. Goal: a segment at most 2x the file.",
        "",
        table(["format", "recording", "segment ms", "10 s file ms", "segment / file"], rows),
    ])
    print(body)
    if args.write:
        write_section("segments", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
