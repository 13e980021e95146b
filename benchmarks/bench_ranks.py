"""Ranks in step: the padded lengths of the ranks' batches at the same step, with and without
``sync_buckets``, beside Lhotse's ``DynamicBucketingSampler`` (when lhotse is installed).

    python benchmarks/bench_ranks.py             # print the figures and the section
    python benchmarks/bench_ranks.py --write     # and save results/ranks.json, render BENCHMARKS.md

Under DDP every step waits for the slowest rank, so what counts is how far apart the ranks' batches of
one step are: a step's gap is (longest - shortest) / longest of the ranks' padded lengths (each batch's
longest item), and the figure is its mean over the steps of several epochs. The corpus is speech-like and
generated (log-normal lengths, median 6.2 s, clipped to 1.1-22.4 s; durations only, as a duration column
gives them: no audio is decoded). Each loader plans the same epochs of the same corpus with the same
budget and bucket count; the table also gives the padding (padded seconds / seconds in batches), the
batches per rank and epoch (their spread across ranks), the batches over the budget, whether every item
came, the items repeated per epoch to even out the ranks (audiobuffer repeats whole batches, Lhotse
copies of cuts), and the milliseconds one rank spends planning an epoch.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import render
from harness import add_write_options, command_line, machine_info, results, table, write_results

from audiobuffer.engine.plan import plan_batches

#: The goals: mean per-step gap and padding, at most.
GAP_GOAL = 0.10
PADDING_GOAL = 0.10


def speech_corpus(n: int, seed: int = 0) -> np.ndarray:
    """``n`` log-normal durations (median 6.2 s, sigma 0.55) clipped to 1.1-22.4 s, rounded to 10 ms."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(math.log(6.2), 0.55, n), 1.1, 22.4).round(2)


def audiobuffer_epochs(durations: np.ndarray, *, world_size: int, budget: float, buckets: int, sync: bool,
                       epochs: int) -> list[list[list[np.ndarray]]]:
    """Each epoch's batches of each rank (arrays of item indices), and the seconds planning took."""
    out = []
    for epoch in range(epochs):
        out.append([plan_batches(durations, max_batch_seconds=budget, buckets=buckets, shuffle=True, seed=0,
                                 epoch=epoch, rank=rank, world_size=world_size, sync_buckets=sync).batches
                    for rank in range(world_size)])
    return out


def lhotse_epochs(durations: np.ndarray, *, world_size: int, budget: float, buckets: int, sync: bool,
                  epochs: int) -> list[list[list[np.ndarray]]]:
    """The same with Lhotse's DynamicBucketingSampler (dummy cuts of the same durations)."""
    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_cut

    cuts = CutSet.from_cuts(dummy_cut(i, duration=float(d), recording_duration=float(d))
                            for i, d in enumerate(durations))
    ids = {cut.id: i for i, cut in enumerate(cuts)}
    warnings.filterwarnings("ignore", "You are using DynamicBucketingSampler with an eagerly read CutSet")
    samplers = [DynamicBucketingSampler(cuts, max_duration=budget, num_buckets=buckets, shuffle=True, seed=0,
                                        world_size=world_size, rank=rank, sync_buckets=sync, drop_last=False)
                for rank in range(world_size)]
    out = []
    for epoch in range(epochs):
        ranks = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            # Lhotse evens the ranks out with copies of cuts, named <id>_dup<k>.
            ranks.append([np.array([ids[c.id.split("_dup")[0]] for c in batch], dtype=np.int64) for batch in sampler])
        out.append(ranks)
    return out


def measure(durations: np.ndarray, epochs_of: list[list[list[np.ndarray]]], budget: float,
            seconds: float) -> dict[str, Any]:
    """The figures of one loader's epochs (``seconds``: planning time of all ranks, all epochs)."""
    gaps, padded, real, over, counts, every, repeats = [], 0.0, 0.0, 0, [], True, []
    for ranks in epochs_of:
        counts.append([len(batches) for batches in ranks])
        for step in zip(*ranks):
            lengths = [float(durations[b].max()) for b in step if len(b)]
            gaps.append((max(lengths) - min(lengths)) / max(lengths))
        items = [i for batches in ranks for b in batches for i in b.tolist()]
        every &= set(items) == set(range(len(durations)))
        repeats.append(len(items) - len(set(items)))  # what evens the ranks out
        for batches in ranks:
            for b in batches:
                longest = float(durations[b].max())
                padded += len(b) * longest
                real += float(durations[b].sum())
                over += len(b) > 1 and len(b) * longest > budget
    world_size = len(epochs_of[0])
    spread = max(max(c) - min(c) for c in counts)
    return {"gap": float(np.mean(gaps)), "padding": (padded - real) / padded, "batches": float(np.mean(counts)),
            "spread": int(spread), "over_budget": int(over), "every_item": bool(every),
            "repeated_items": float(np.mean(repeats)),
            "plan_s_per_epoch": seconds / (len(epochs_of) * world_size)}


def run(args: argparse.Namespace) -> tuple[np.ndarray, list[dict[str, Any]], str | None]:
    """The corpus, a row per (ranks, budget, sync_buckets, loader), and Lhotse's version (None: left out)."""
    durations = speech_corpus(args.items)
    loaders = {"audiobuffer": audiobuffer_epochs}
    try:
        import lhotse
    except ImportError:
        print("lhotse is not installed: audiobuffer alone (pip install lhotse for the peer)", file=sys.stderr)
        version = None
    else:
        loaders["lhotse"] = lhotse_epochs
        version = lhotse.__version__
    rows = []
    for world_size in args.ranks:
        for budget in args.budgets:
            for sync in (False, True):
                for name, plan in loaders.items():
                    start = time.perf_counter()
                    epochs = plan(durations, world_size=world_size, budget=budget, buckets=args.buckets,
                                  sync=sync, epochs=args.epochs)
                    seconds = time.perf_counter() - start
                    rows.append({"loader": name, "ranks": world_size, "max_batch_seconds": budget,
                                 "buckets": args.buckets, "sync_buckets": sync,
                                 **measure(durations, epochs, budget, seconds)})
    return durations, rows, version


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=800, help="utterances in the corpus (default 800)")
    parser.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4],
                        help="world sizes (default 2,4)")
    parser.add_argument("--budgets", type=lambda s: [float(x) for x in s.split(",")], default=[120.0, 60.0],
                        help="max_batch_seconds values (default 120,60)")
    parser.add_argument("--buckets", type=int, default=10, help="duration buckets (default 10)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs per figure (default 5)")
    add_write_options(parser, "ranks")
    args = parser.parse_args(argv)
    durations, rows, lhotse_version = run(args)
    corpus = {"items": args.items, "median_s": float(np.median(durations)), "min_s": float(durations.min()),
              "max_s": float(durations.max())}
    versions = machine_info()["versions"] + (f". Peer: lhotse {lhotse_version}" if lhotse_version else "")
    measured = results("ranks", rows, command=command_line("bench_ranks.py", argv), versions=versions,
                       settings={"corpus": corpus, "epochs": args.epochs, "buckets": args.buckets, "seed": 0})
    print(f"{corpus['items']} utterances, {corpus['min_s']:.1f}-{corpus['max_s']:.1f} s (median "
          f"{corpus['median_s']:.1f} s), {args.buckets} buckets, {args.epochs} epochs\n")
    print(table(["loader", "ranks", "budget s", "sync", "mean step gap", "padding", "batches/rank", "spread",
                 "over budget", "every item", "repeated items", "plan ms/epoch"],
                [[r["loader"], r["ranks"], f"{r['max_batch_seconds']:g}", "yes" if r["sync_buckets"] else "no",
                  f"{r['gap']:.1%}", f"{r['padding']:.1%}", f"{r['batches']:.1f}", r["spread"], r["over_budget"],
                  "yes" if r["every_item"] else "no", f"{r['repeated_items']:.1f}",
                  f"{1000 * r['plan_s_per_epoch']:.1f}"]
                 for r in rows]))
    synced = [r for r in rows if r["loader"] == "audiobuffer" and r["sync_buckets"]]
    met = all(r["gap"] <= GAP_GOAL and r["padding"] <= PADDING_GOAL and r["every_item"] and r["spread"] == 0
              and r["over_budget"] == 0 for r in synced)
    print(f"\nGoal (audiobuffer in step: mean step gap <= {GAP_GOAL:.0%}, padding <= {PADDING_GOAL:.0%}, exactly "
          f"once, equal batch counts, never over the budget) met: {'yes' if met else 'no'}.\n")
    print(render.preview(measured, args.results or render.RESULTS))
    write_results(measured, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
