"""The wait for the first batch: an ``IsolatedLoader`` and a ``BufferedDataset`` over a Lhotse cuts manifest.

A cuts manifest of ``--cuts`` cuts (1000), one per FSDD recording, over recordings of 10 minutes made of
them (``bench_formats.write_lhotse``). Each run is a fresh process with ``torch`` and ``audiobuffer``
imported before the clock; it times the build (the constructor), then ``next(iter(loader))`` (the wait at
the first ``iter()``: for ``IsolatedLoader`` the helper's start, its imports and the first decode), and
both together. ``--between S`` sleeps S seconds between the two, standing for what a training script
does there (building its model): an ``IsolatedLoader``'s helper starts in that time. The loaders take
turns, ``--runs`` (5) each; each figure is the median, printed with the load average before and after.

    python benchmarks/bench_first_batch.py
    python benchmarks/bench_first_batch.py --between 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOADERS = ("isolated", "dataset")


def measure(loader_name: str, manifest: str, between: float) -> dict[str, float]:
    """One run in this (fresh) process."""
    import torch  # noqa: F401 - imported before the clock, as a training script has it

    from audiobuffer import AudioDecoder, BufferedDataset, IsolatedLoader, pad_collate

    decoder = AudioDecoder(crop_seconds=1.0)
    start = time.perf_counter()
    if loader_name == "isolated":
        loader: object = IsolatedLoader(manifest, decoder, batch_size=32, shuffle=True, num_producers=2)
        built = time.perf_counter()
        time.sleep(between)  # the script's own set-up
        built += between
        batches = iter(loader)  # type: ignore[call-overload]
    else:
        from torch.utils.data import DataLoader

        loader = BufferedDataset(manifest, decoder, shuffle=True, num_producers=2)
        built = time.perf_counter()
        time.sleep(between)
        built += between
        batches = iter(DataLoader(loader, batch_size=32, collate_fn=pad_collate))  # type: ignore[arg-type]
    next(batches)
    done = time.perf_counter()
    del batches
    loader.close()  # type: ignore[attr-defined]
    return {"build_s": built - between - start, "first_batch_s": done - built, "total_s": done - start - between}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuts", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--between", type=float, default=0.0, help="seconds between the build and iter()")
    parser.add_argument("--one", nargs=2, metavar=("LOADER", "MANIFEST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.between)), flush=True)
        return
    from bench_formats import write_lhotse
    from harness import fsdd_files

    with tempfile.TemporaryDirectory(prefix="bench-first-batch-") as work:
        manifest = write_lhotse(fsdd_files()[:args.cuts], Path(work) / "lhotse")
        load_before = os.getloadavg()[0]
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in LOADERS}
        for _ in range(args.runs):
            for name in LOADERS:
                done = subprocess.run([sys.executable, __file__, "--one", name, str(manifest), "--between",
                                       str(args.between)], capture_output=True, text=True, encoding="utf-8",
                                      timeout=600, check=True)
                runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
        load_after = os.getloadavg()[0]
    for name, rows in runs.items():
        figures = {key: round(statistics.median(row[key] for row in rows), 3) for key in rows[0]}
        print(json.dumps({"loader": name, "cuts": args.cuts, "runs": args.runs, "between_s": args.between, **figures,
                          "load_before": round(load_before, 1), "load_after": round(load_after, 1)}))


if __name__ == "__main__":
    main()
