"""Per-file read time of the native WAV reader against python-soundfile, on the FSDD recordings.

    python benchmarks/bench_wav.py                                  # ../shared/data/fsdd/recordings
    python benchmarks/bench_wav.py --root DIR --files 1000 --runs 7

Times one thread reading every file in turn (the GIL-held cost per file): ``soundfile.read``, the
native reader (``audiobuffer.decoders._wav.read_wav``), and the whole ``AudioDecoder`` (default
settings, and with a 16 kHz resample and a 1 s random crop) with the native path off (libsndfile) and
on. Prints the median over the runs of the mean microseconds per file. Writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import soundfile as sf
from harness import FSDD, median_time

from audiobuffer import AudioDecoder, WorkItem
from audiobuffer.decoders import _wav


def per_file_us(fn: Callable[[str], object], paths: list[str], runs: int) -> float:
    """Median over ``runs`` passes of the mean time per file, in microseconds."""
    fn(paths[0])  # warm imports and caches

    def every_file() -> None:
        for path in paths:
            fn(path)

    return median_time(every_file, runs)[0] / len(paths) * 1e6


def decoder_us(decoder: AudioDecoder, paths: list[str], runs: int) -> float:
    items = [WorkItem(index=i, path=p, seed=0) for i, p in enumerate(paths)]
    by_path = {item.path: item for item in items}
    return per_file_us(lambda p: decoder(by_path[p]), paths, runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=FSDD, help=f"the FSDD recordings (default {FSDD})")
    parser.add_argument("--files", type=int, default=3000, help="how many files (sorted by name)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    paths = [str(p) for p in sorted(args.root.glob("*.wav"))[:args.files]]
    if not paths:
        print(f"no .wav files under {args.root}", file=sys.stderr)
        return 1
    declined = sum(_wav.read_wav(p) is None for p in paths)
    rows = [
        ("soundfile.read(dtype=float32)", per_file_us(
            lambda p: sf.read(p, dtype="float32", always_2d=True), paths, args.runs)),
        ("native read_wav", per_file_us(_wav.read_wav, paths, args.runs)),
        ("native read_wav_info (header only)", per_file_us(_wav.read_wav_info, paths, args.runs)),
    ]
    settings: list[tuple[str, dict[str, Any]]] = [
        ("AudioDecoder()", {}),
        ("AudioDecoder(16 kHz, 1 s random crop)", {"sample_rate": 16000, "crop_seconds": 1.0})]
    for label, kwargs in settings:
        for native, how in ((False, "libsndfile"), (True, "native")):
            decoder = AudioDecoder(**kwargs, native_wav=native)
            rows.append((f"{label}, {how}", decoder_us(decoder, paths, args.runs)))
    print(f"{len(paths)} files from {args.root} ({declined} declined by the native reader), "
          f"median of {args.runs} runs, one thread")
    width = max(len(label) for label, _ in rows)
    print(f"| {'read':<{width}} | us per file |")
    print(f"|{'-' * (width + 2)}|------------:|")
    for label, us in rows:
        print(f"| {label:<{width}} | {us:11.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
