"""What users already have, read as it is: the same audio as files, as a Hugging Face Parquet dataset, as
WebDataset shards (streamed and by ``audiobuffer index``), and as a Lhotse cuts manifest of long recordings.

    python benchmarks/bench_formats.py              # print the table
    python benchmarks/bench_formats.py --write      # save the results and render BENCHMARKS.md

One corpus of ``--files`` FLAC utterances of 1-4 s at 16 kHz (the corpus of ``bench_decode.py``) is written
in each form: the files themselves; a Parquet file of ``datasets``' layout (an ``audio`` column of
``{bytes, path}``, row groups of 100 rows, written with pyarrow); tar shards with their index; and, for
Lhotse, the utterances joined into recordings of 10 minutes with a cut per utterance. Each form is one
epoch of ``BufferedDataset(..., AudioDecoder(), shuffle=True)`` with ``num_producers=2``, drained in the
loop; a figure is the median of ``--runs`` epochs, the forms taking turns in each round. The goal: Parquet
within 1.2x the time of the files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import render
import soundfile as sf
from harness import add_write_options, command_line, interleaved, results, write_results

from audiobuffer import AudioDecoder, BufferedDataset
from audiobuffer.cli._bench_approaches import make_corpus
from audiobuffer.sources import index_shards, pack

RATE = 16000
ROW_GROUP = 100
RECORDING_SECONDS = 600.0


def write_parquet(paths: list[str], out: Path) -> Path:
    """The files as a Parquet file in ``datasets``' layout for audio (bytes and path), with a label column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    audio = pa.array([{"bytes": Path(p).read_bytes(), "path": Path(p).name} for p in paths],
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    labels = pa.array([i % 10 for i in range(len(paths))], pa.int64())
    pq.write_table(pa.table({"audio": audio, "label": labels}), out, row_group_size=ROW_GROUP)
    return out


def write_lhotse(paths: list[str], folder: Path) -> Path:
    """The files joined into recordings of about ``RECORDING_SECONDS``, and a cuts manifest of one cut per file."""
    folder.mkdir(parents=True, exist_ok=True)
    cuts: list[dict[str, object]] = []
    group: list[str] = []
    number = 0

    def flush() -> None:
        nonlocal group, number
        if not group:
            return
        audio = np.concatenate([sf.read(p, dtype="float32")[0] for p in group])
        name = f"recording{number:03d}.flac"
        sf.write(folder / name, audio, RATE, subtype="PCM_16")
        start = 0
        for p in group:
            frames = sf.info(p).frames
            cuts.append({"id": Path(p).stem, "start": start / RATE, "duration": frames / RATE, "channel": 0,
                         "supervisions": [], "type": "MonoCut",
                         "recording": {"id": name, "sources": [{"type": "file", "channels": [0], "source": name}],
                                       "sampling_rate": RATE, "num_samples": len(audio),
                                       "duration": len(audio) / RATE, "channel_ids": [0]}})
            start += frames
        group, number = [], number + 1

    seconds = 0.0
    for p in paths:
        group.append(p)
        seconds += sf.info(p).duration
        if seconds >= RECORDING_SECONDS:
            flush()
            seconds = 0.0
    flush()
    manifest = folder / "cuts.jsonl"
    manifest.write_text("".join(json.dumps(c) + "\n" for c in cuts), encoding="utf-8", newline="\n")
    return manifest


def epoch(spec: str | list[str], producers: int) -> Callable[[], None]:
    ds = BufferedDataset(spec, AudioDecoder(), shuffle=True, num_producers=producers)
    count = [0]

    def run() -> None:
        ds.set_epoch(count[0])
        count[0] += 1
        n = sum(1 for _ in ds)
        if n != len(ds):
            raise RuntimeError(f"{spec}: an epoch yielded {n} of {len(ds)} items")
    return run


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000, help="utterances (default 1000)")
    parser.add_argument("--runs", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--producers", type=int, default=2, help="num_producers (default 2)")
    add_write_options(parser, "formats")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-formats-") as tmp:
        root = Path(tmp)
        paths = make_corpus(root / "files", args.files, "flac")
        parquet = write_parquet(paths, root / "train.parquet")
        pack(root / "files", root / "shards", shard_size=32 * 10**6, progress=False)
        shards = sorted(str(p) for p in (root / "shards").glob("shard-*.tar"))
        index_shards(shards, root / "shards" / "index.json", overwrite=True, progress=False)
        cuts = write_lhotse(paths, root / "lhotse")
        forms = {"files": epoch(paths, args.producers),
                 "Hugging Face Parquet (`audio` bytes)": epoch(str(parquet), args.producers),
                 "tar shards, streamed": epoch(shards, args.producers),
                 "tar shards, by index": epoch(str(root / "shards" / "index.json"), args.producers),
                 f"Lhotse cuts of {RECORDING_SECONDS / 60:g}-minute recordings": epoch(str(cuts), args.producers)}
        for run in forms.values():
            run()  # warm the page cache
        start = time.perf_counter()
        times = interleaved(forms, args.runs)
        print(f"measured in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    base = statistics.median(times["files"])
    rows = [{"form": name, "median_s": statistics.median(t), "epochs_s": t, "vs_files": statistics.median(t) / base}
            for name, t in times.items()]
    measured = results("formats", rows, command=command_line("bench_formats.py", argv),
                       settings={"runs": args.runs, "files": args.files, "producers": args.producers,
                                 "row_group": ROW_GROUP, "recording_s": RECORDING_SECONDS, "sample_rate": RATE})
    print(render.preview(measured, args.results or render.RESULTS))
    write_results(measured, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
