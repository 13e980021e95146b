"""Throughput of batches by duration against sample mode, on FSDD, in one run.

    python benchmarks/bench_batches.py            # print the section
    python benchmarks/bench_batches.py --write    # and save results/batches.json, render BENCHMARKS.md

Both modes decode the same files with the same decoder and producer count, and feed a
``DataLoader(num_workers=0, collate_fn=pad_collate)``: sample mode batches ``batch_size`` samples
(the duration batches' mean size, so both make about as many batches), batch mode takes
``max_batch_seconds`` and ``batch_size=None``. A figure is the median over ``--runs`` epochs of the
audio seconds delivered per wall second (every sample's own length, padding not counted), and the
padding of the batches the loop received. The goal: batch mode no lower than sample mode.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import render
from harness import FSDD, command_line, results
from torch.utils.data import DataLoader

from audiobuffer import AudioDecoder, BufferedDataset, pad_collate

RATE = 8000


def epoch(ds: BufferedDataset, batch_size: int | None, number: int) -> tuple[float, float, int, float]:
    """One epoch: (audio seconds per second, padding fraction, batches, audio seconds)."""
    ds.set_epoch(number)
    loader = DataLoader(ds, batch_size=batch_size, collate_fn=pad_collate, num_workers=0)
    frames = padded = batches = 0
    start = time.perf_counter()
    for batch in loader:
        lengths = batch["lengths"]
        frames += int(lengths.sum())
        padded += batch["audio"].shape[0] * batch["audio"].shape[-1]
        batches += 1
    wall = time.perf_counter() - start
    return frames / RATE / wall, 1 - frames / padded, batches, frames / RATE


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="save results/batches.json and render BENCHMARKS.md")
    parser.add_argument("--runs", type=int, default=5, help="epochs per figure (default 5)")
    parser.add_argument("--budget", type=float, default=16.0, help="max_batch_seconds (default 16)")
    parser.add_argument("--producers", default="2,auto", help="num_producers values (default 2,auto)")
    args = parser.parse_args(argv)
    if not FSDD.is_dir():
        print(f"FSDD not found at {FSDD}", file=sys.stderr)
        return 2
    decoder = AudioDecoder(RATE)
    rows: list[dict[str, object]] = []
    for producers in args.producers.split(","):
        count: int | str = producers if producers == "auto" else int(producers)
        by_duration = BufferedDataset(FSDD, decoder, shuffle=True, seed=0, max_batch_seconds=args.budget,
                                      num_producers=count)
        size = max(1, round(len(by_duration.source) / len(by_duration)))
        by_sample = BufferedDataset(FSDD, decoder, shuffle=True, seed=0, num_producers=count)
        rates = {}
        for name, ds, batch_size in (("samples", by_sample, size), ("by duration", by_duration, None)):
            runs = [epoch(ds, batch_size, n) for n in range(args.runs + 1)][1:]  # the first warms the cache
            rates[name] = statistics.median(r[0] for r in runs)
            rows.append({"producers": producers, "mode": name,
                         "batching": f"{args.budget:g}" if batch_size is None else f"batch_size={size}",
                         "batches": runs[0][2], "audio_s_per_epoch": runs[0][3], "audio_s_per_s": rates[name],
                         "padding": statistics.median(r[1] for r in runs)})
        rows[-1]["vs_samples"] = rates["by duration"] / rates["samples"]
    measured = results("batches", rows, command=command_line("bench_batches.py", argv),
                       settings={"runs": args.runs, "budget": args.budget})
    print(render.preview(measured))
    if args.write:
        render.publish(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
