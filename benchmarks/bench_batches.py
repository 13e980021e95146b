"""Throughput of batches by duration against sample mode, on FSDD, in one run.

    python benchmarks/bench_batches.py            # print the table
    python benchmarks/bench_batches.py --write    # and rewrite its section of BENCHMARKS.md

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

from harness import FSDD, machine, table, write_section
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the batch-throughput section of BENCHMARKS.md")
    parser.add_argument("--runs", type=int, default=5, help="epochs per figure (default 5)")
    parser.add_argument("--budget", type=float, default=16.0, help="max_batch_seconds (default 16)")
    parser.add_argument("--producers", default="2,auto", help="num_producers values (default 2,auto)")
    args = parser.parse_args()
    if not FSDD.is_dir():
        print(f"FSDD not found at {FSDD}", file=sys.stderr)
        return 2
    decoder = AudioDecoder(RATE)
    rows, met = [], True
    for producers in args.producers.split(","):
        count: int | str = producers if producers == "auto" else int(producers)
        by_duration = BufferedDataset(FSDD, decoder, shuffle=True, seed=0, max_batch_seconds=args.budget,
                                      num_producers=count)
        size = max(1, round(len(by_duration.source) / len(by_duration)))
        by_sample = BufferedDataset(FSDD, decoder, shuffle=True, seed=0, num_producers=count)
        results = {}
        for name, ds, batch_size in (("samples", by_sample, size), ("by duration", by_duration, None)):
            runs = [epoch(ds, batch_size, n) for n in range(args.runs + 1)][1:]  # the first warms the cache
            results[name] = statistics.median(r[0] for r in runs)
            rows.append((name, producers, f"{args.budget:g}" if batch_size is None else f"batch_size={size}",
                         runs[0][2], f"{runs[0][3]:.0f}", f"{results[name]:.0f}",
                         f"{100 * statistics.median(r[1] for r in runs):.1f} %"))
        ratio = results["by duration"] / results["samples"]
        met &= ratio >= 0.95
        rows.append(("ratio", producers, "", "", "", f"{ratio:.2f}x", ""))
    header = ("mode", "num_producers", "batching", "batches", "audio s per epoch", "audio s per s (median)",
              "padding")
    body = "\n".join([
        "## Batch-by-duration throughput",
        "",
        f"`python benchmarks/bench_batches.py --write` ({args.runs} epochs per figure after one warm-up, FSDD, "
        f"8 kHz, uncropped). {machine()}",
        "",
        table(header, rows),
        "",
        "Goal (issue 13): audio seconds per second with batches by duration no lower than in sample mode "
        f"(counted as met within 5 %, the noise of this shared machine): {'met' if met else 'not met'}.",
    ])
    print(body)
    if args.write:
        write_section("batch-throughput", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
