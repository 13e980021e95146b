"""Overlap: a load step of T1 ms and a train step of T2 ms, in sequence and through audiobuffer.

    python benchmarks/bench_overlap.py --write     # the grid; saves results/overlap.json, renders its section
    python benchmarks/bench_overlap.py --quick     # a smoke run (prints the section, saves nothing)

Loading in the training thread costs n * (T1 + T2); loading in the background should come to the
ideal n * max(T1, T2). Two kinds of work:
- real: the load resamples audio with soxr and the step multiplies matrices with torch (1 intra-op
  thread), both of which release the GIL, as decoding and a GPU step do;
- sleep: both sides sleep, the control (no CPU contention at all).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np
import render
import soxr
import torch
from harness import command_line, results, timed

from audiobuffer import BufferedDataset


def calibrate(work, target_ms: float) -> int:
    """How many units of ``work`` take ``target_ms``."""
    units = 1
    while True:
        start = time.perf_counter()
        work(units)
        took = (time.perf_counter() - start) * 1000
        if took > 20 or units > 1 << 20:
            return max(1, round(units * target_ms / took))
        units *= 2


AUDIO = np.random.default_rng(0).standard_normal(16000).astype(np.float32)
MATRIX = torch.randn(128, 128)


def load_units(units: int) -> None:
    for _ in range(units):
        soxr.resample(AUDIO[:1600], 16000, 44100)


def train_units(units: int) -> None:
    x = MATRIX
    for _ in range(units):
        x = torch.tanh(x @ MATRIX)


def cell(kind: str, t1: float, t2: float, steps: int, runs: int) -> dict[str, object]:
    """One cell of the grid: the times asked and measured, the epoch in sequence and through audiobuffer,
    and the ideal (the larger of the loads alone and the train steps alone)."""
    if kind == "sleep":
        def load(_item):
            time.sleep(t1 / 1000)
            return {"x": 1}

        def train() -> None:
            time.sleep(t2 / 1000)
    else:
        lu, tu = calibrate(load_units, t1), calibrate(train_units, t2)

        def load(_item):
            load_units(lu)
            return {"x": 1}

        def train() -> None:
            train_units(tu)

    def sequential() -> None:
        for i in range(steps):
            load(i)
            train()

    def buffered() -> None:
        ds = BufferedDataset([f"item{i}" for i in range(steps)], load, num_producers=1, buffer_size=2)
        for _ in ds:
            train()

    def loads_only() -> None:
        for i in range(steps):
            load(i)

    def trains_only() -> None:
        for _ in range(steps):
            train()

    # The ideal from this run's own step times, not the nominal ones: calibration is approximate.
    load_s = statistics.median(timed(loads_only) for _ in range(runs))
    train_s = statistics.median(timed(trains_only) for _ in range(runs))
    seq = statistics.median(timed(sequential) for _ in range(runs))
    buf = statistics.median(timed(buffered) for _ in range(runs))
    ideal = max(load_s, train_s)
    return {"work": kind, "t1_ms": t1, "t2_ms": t2, "t1_measured_ms": 1000 * load_s / steps,
            "t2_measured_ms": 1000 * train_s / steps, "sequential_s": seq, "audiobuffer_s": buf, "ideal_s": ideal,
            "over_ideal": buf / ideal, "speedup": seq / buf}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="save results/overlap.json and render BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.write and args.quick:
        parser.error("--write takes a full run; --quick is a smoke test whose numbers mean little")
    torch.set_num_threads(1)  # the step leaves the other core to the producer, as a GPU step would
    grid = ([(5, 5), (10, 5), (5, 10)] if args.quick
            else [(2, 2), (5, 5), (10, 5), (5, 10), (20, 10), (10, 20), (20, 20)])
    steps, runs = (10, 1) if args.quick else (args.steps, args.runs)
    rows = [cell(kind, t1, t2, steps, runs) for kind in ("real", "sleep") for t1, t2 in grid]
    measured = results("overlap", rows, command=command_line("bench_overlap.py", argv),
                       settings={"steps": steps, "runs": runs})
    print(render.preview(measured))
    if args.write:
        render.publish(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
