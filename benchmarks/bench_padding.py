"""Padding of batches by duration against fixed-size random batches of the same mean size.

    python benchmarks/bench_padding.py            # print the section
    python benchmarks/bench_padding.py --write    # and save results/padding.json, render BENCHMARKS.md

A batch is padded to its longest item: padding = (sum of count x longest - audio) / (sum of count x
longest). Two corpora: FSDD (../shared/data/fsdd/recordings, uncropped, durations from the file
headers) and a generated speech-like corpus (log-normal lengths clipped to 1-20 s; durations only,
no audio). Each figure is the mean over several epochs of the plan (seed 0); the random batches have
the mean size of the duration batches (items / batches) and are drawn from the same epochs' orders.
No timing here: the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

import numpy as np
import render
from harness import FSDD, command_line, results

from audiobuffer.engine.plan import padding_fraction, plan_batches
from audiobuffer.prepare.durations import read_durations
from audiobuffer.sources import Source

#: The goal: at most this share of padding.
GOAL = 0.10


def speech_like(n: int, seed: int = 0) -> np.ndarray:
    """``n`` log-normal durations (median 5 s, sigma 0.6) clipped to 1-20 s."""
    return np.clip(np.random.default_rng(seed).lognormal(math.log(5.0), 0.6, n), 1.0, 20.0)


def measure(durations: np.ndarray, max_batch_seconds: float, buckets: int, epochs: int) -> dict:
    duration_pads, random_pads, sizes, over, largest = [], [], [], 0, 0.0
    for epoch in range(epochs):
        plan = plan_batches(durations, max_batch_seconds=max_batch_seconds, buckets=buckets, shuffle=True,
                            seed=0, epoch=epoch)
        duration_pads.append(plan.padding_fraction(durations))
        size = len(durations) / len(plan)
        sizes.append(size)
        for batch in plan.batches:
            padded = len(batch) * float(durations[batch].max())
            largest = max(largest, padded)
            over += padded > max_batch_seconds and len(batch) > 1
        order = np.random.default_rng([0, epoch]).permutation(len(durations))
        step = max(1, round(size))
        random_pads.append(padding_fraction([order[i:i + step] for i in range(0, len(order), step)], durations))
    return {"duration": float(np.mean(duration_pads)), "random": float(np.mean(random_pads)),
            "size": float(np.mean(sizes)), "batches": len(plan), "largest": largest, "over": over}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="save results/padding.json and render BENCHMARKS.md")
    parser.add_argument("--epochs", type=int, default=5, help="epochs averaged per figure (default 5)")
    parser.add_argument("--budgets", default="60,120", help="max_batch_seconds values (default 60,120)")
    parser.add_argument("--buckets", default="10", help="bucket counts (default 10)")
    parser.add_argument("--items", type=int, default=20000, help="items of the generated corpus (default 20000)")
    args = parser.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",")]
    bucket_counts = [int(b) for b in args.buckets.split(",")]

    corpora = []
    if FSDD.is_dir():
        durations, failures = read_durations(Source(FSDD), cache_dir=False, on_error="warn")
        corpora.append((f"FSDD ({len(durations) - len(failures)} files, headers)", durations))
    else:
        print(f"FSDD not found at {FSDD}: its rows are left out", file=sys.stderr)
    corpora.append((f"speech-like ({args.items}, log-normal 1-20 s)", speech_like(args.items)))

    rows, met = [], True
    for name, durations in corpora:
        valid = durations[~np.isnan(durations)]
        for budget in budgets:
            for buckets in bucket_counts:
                m = measure(durations, budget, buckets, args.epochs)
                met &= m["duration"] <= GOAL
                rows.append({"corpus": name, "min_s": float(valid.min()), "median_s": float(np.median(valid)),
                             "max_s": float(valid.max()), "max_batch_seconds": budget, "buckets": buckets,
                             "batches": m["batches"], "mean_batch_size": m["size"], "largest_padded_s": m["largest"],
                             "over_budget": int(m["over"]), "padding_duration": m["duration"],
                             "padding_random": m["random"]})
    measured = results("padding", rows, command=command_line("bench_padding.py", argv),
                       settings={"epochs": args.epochs, "seed": 0})
    print(render.preview(measured))
    print(f"\nAt most {100 * GOAL:g}% padding with batches by duration on every corpus: {'yes' if met else 'no'}.")
    if args.write:
        render.publish(measured)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
