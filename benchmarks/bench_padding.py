"""Padding of batches by duration against fixed-size random batches of the same mean size.

    python benchmarks/bench_padding.py            # print the table
    python benchmarks/bench_padding.py --write    # and rewrite its section of BENCHMARKS.md

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

import numpy as np
from harness import FSDD, table, write_section

from audiobuffer.engine.plan import padding_fraction, plan_batches
from audiobuffer.sources import Source
from audiobuffer.sources.durations import read_durations

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the duration-batches section of BENCHMARKS.md")
    parser.add_argument("--epochs", type=int, default=5, help="epochs averaged per figure (default 5)")
    parser.add_argument("--budgets", default="60,120", help="max_batch_seconds values (default 60,120)")
    parser.add_argument("--buckets", default="10", help="bucket counts (default 10)")
    parser.add_argument("--items", type=int, default=20000, help="items of the generated corpus (default 20000)")
    args = parser.parse_args()
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
        spread = f"{valid.min():.2f} / {np.median(valid):.2f} / {valid.max():.2f}"
        for budget in budgets:
            for buckets in bucket_counts:
                m = measure(durations, budget, buckets, args.epochs)
                met &= m["duration"] <= GOAL
                rows.append((name, spread, f"{budget:g}", buckets, m["batches"], f"{m['size']:.1f}",
                             f"{m['largest']:.1f}", m["over"], f"{100 * m['duration']:.1f} %",
                             f"{100 * m['random']:.1f} %"))
    header = ("corpus", "duration s (min / median / max)", "max_batch_seconds", "buckets", "batches",
              "mean batch size", "largest padded batch s", "batches over budget", "padding, duration batches",
              "padding, random batches")
    body = "\n".join([
        "## Duration batches",
        "",
        "`python benchmarks/bench_padding.py --write`. Padding = padded frames / frames in batches (each batch "
        "padded to its longest item), the mean over "
        f"{args.epochs} epochs (seed 0). Random batches: fixed size = the duration batches' mean size, from a "
        "random permutation. Goal (issue 13): at most 10 % padding with duration batches on both corpora.",
        "",
        table(header, rows),
        "",
        f"Goal met: {'yes' if met else 'no'}.",
    ])
    print(body)
    if args.write:
        write_section("duration-batches", body)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
