"""The Ray path's cost on one machine: the same epoch through ``audiobuffer.ray.read(...)
.iter_torch_batches`` on a local Ray cluster and through ``BufferedDataset`` + ``DataLoader``.

    python benchmarks/bench_ray.py             # print the figures and the section
    python benchmarks/bench_ray.py --write     # and save results/ray.json, render BENCHMARKS.md

Both decode the same files with the same decoder into padded batches of 32 (``pad_collate``;
``audiobuffer.ray.PadCollate``), shuffled, and count every item (each run checks that every item
came once). The Ray cluster is started once with as many CPUs as the machine has (its start is not
in the epochs; Ray Data's progress bars are off); each Ray epoch is a new dataset (``epoch=n``), as
in training. The contestants take turns within a round; the figures are medians over the rounds.
Corpora: the FSDD recordings (3000 WAV files, 8 kHz) and 1000 generated FLAC files (16 kHz, 1-4 s).

A third contestant measures the floor under the Ray path: Ray Data alone, the same blocks and one
row per item as ``read`` makes, iterated the same way, with nothing to decode (``floor_epoch``). A
fourth is the same epoch in Ray Data without audiobuffer, as its users write it (``plain_epoch``):
the shuffled paths as rows, the same number of blocks, each decoded by one ``map_batches`` task
reading its files with soundfile, the same batches: what Ray Data itself allows on this machine.
Each epoch's CPU seconds are counted over the whole process tree (Ray's processes included): the
Ray path does the floor's work and the decoding, so on C cores it takes at least (CPU of the floor
+ CPU of ``BufferedDataset``'s epoch) / C, the bound the section shows beside the goal.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import render
from harness import (
    add_write_options,
    command_line,
    fsdd_files,
    load_average,
    machine_info,
    results,
    table,
    timed,
    write_results,
)

#: The goal: the Ray path's epoch within this many times BufferedDataset's.
GOAL = 1.5
BATCH_SIZE = 32
LOADERS = {"buffered": "`BufferedDataset` + `DataLoader`",
           "ray": "`audiobuffer.ray.read` + `iter_torch_batches`",
           "floor": "Ray Data alone: the same blocks and rows, nothing decoded",
           "plain": "Ray Data decoding with soundfile, no audiobuffer"}


def buffered_epoch(paths: list[str], sample_rate: int, epoch: int) -> list[int]:
    """One epoch through BufferedDataset and a DataLoader; the item indices it gave."""
    from torch.utils.data import DataLoader

    from audiobuffer import AudioDecoder, BufferedDataset, pad_collate

    seen: list[int] = []
    with BufferedDataset(paths, AudioDecoder(sample_rate=sample_rate), shuffle=True) as dataset:
        dataset.set_epoch(epoch)
        for batch in DataLoader(dataset, batch_size=BATCH_SIZE, collate_fn=pad_collate):
            seen.extend(batch["index"].tolist())
    return seen


def ray_epoch(paths: list[str], sample_rate: int, epoch: int) -> list[int]:
    """One epoch through audiobuffer.ray.read and iter_torch_batches; the item indices it gave."""
    import audiobuffer.ray
    from audiobuffer import AudioDecoder

    return _padded_indices(audiobuffer.ray.read(
        paths, AudioDecoder(sample_rate=sample_rate), shuffle=True, epoch=epoch))


def _padded_indices(dataset: Any) -> list[int]:
    """The item indices of ``dataset``'s rows, iterated in padded batches of 32 as in training."""
    import audiobuffer.ray

    seen: list[int] = []
    collate = audiobuffer.ray.PadCollate()
    for batch in dataset.iter_torch_batches(batch_size=BATCH_SIZE, collate_fn=collate):
        seen.extend(batch["index"].tolist())
    return seen


def _index_rows(batch: dict[str, Any]) -> dict[str, Any]:
    """The ``map_batches`` function of :func:`floor_epoch`: a block's rows, each its index."""
    import numpy as np

    return {"index": np.concatenate([np.arange(first, last) for first, last
                                     in zip(batch["first"].tolist(), batch["last"].tolist())])}


def floor_epoch(paths: list[str], sample_rate: int, epoch: int) -> list[int]:
    """Ray Data's own cost of the Ray path's epoch: as many blocks as ``audiobuffer.ray.read``
    makes of ``paths`` on this cluster, each a task that makes its rows, one per item, holding
    its index only, iterated in batches of 32 by ``iter_torch_batches``; the indices it gave.
    Nothing is listed, planned or decoded: what is left when the work is none."""
    import ray.data

    import audiobuffer.ray

    per_block = audiobuffer.ray.default_rows_per_block(len(paths))
    blocks = [{"first": first, "last": min(first + per_block, len(paths))}
              for first in range(0, len(paths), per_block)]
    dataset = ray.data.from_items(blocks, override_num_blocks=max(1, len(blocks)))
    dataset.context.op_resource_reservation_enabled = False  # as read() sets it
    rows = dataset.map_batches(_index_rows, batch_size=1, batch_format="numpy",
                               zero_copy_batch=True)
    seen: list[int] = []
    for batch in rows.iter_torch_batches(batch_size=BATCH_SIZE):
        seen.extend(batch["index"].tolist())
    return seen


def _soundfile_rows(batch: dict[str, Any]) -> dict[str, Any]:
    """The ``map_batches`` function of :func:`plain_epoch`: each row's file read with soundfile."""
    import numpy as np
    import soundfile

    audio = [soundfile.read(path, dtype="float32")[0] for path in batch["path"].tolist()]
    return {"audio": audio, "index": np.asarray(batch["index"])}


def plain_epoch(paths: list[str], sample_rate: int, epoch: int) -> list[int]:
    """The epoch in Ray Data without audiobuffer, as its users write it: the paths in a shuffled
    order as rows, as many blocks as ``audiobuffer.ray.read`` makes, each block's files read with
    soundfile in one ``map_batches`` task, padded batches of 32; the indices it gave. The files are
    at ``sample_rate`` already: nothing to resample."""
    import numpy as np
    import ray.data

    import audiobuffer.ray

    order = np.random.default_rng(epoch).permutation(len(paths)).tolist()
    per_block = audiobuffer.ray.default_rows_per_block(len(paths))
    dataset = ray.data.from_items([{"index": i, "path": paths[i]} for i in order],
                                  override_num_blocks=-(-len(paths) // per_block))
    dataset.context.op_resource_reservation_enabled = False  # as read() sets it
    return _padded_indices(dataset.map_batches(_soundfile_rows, batch_size=None,
                                               batch_format="numpy", zero_copy_batch=True))


def corpora(args: argparse.Namespace, work: Path) -> dict[str, tuple[list[str], int]]:
    """Each corpus's description: its files and their sample rate."""
    from audiobuffer.cli.bench import make_corpus

    found: dict[str, tuple[list[str], int]] = {}
    fsdd = fsdd_files()
    if fsdd:
        found[f"FSDD: {len(fsdd)} WAV files, 8 kHz"] = (fsdd, 8000)
    if args.flac:
        flac = make_corpus(work / f"flac-{args.flac}", args.flac, "flac")
        found[f"FLAC: {args.flac} generated files, 16 kHz, 1-4 s"] = (flac, 16000)
    return found


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and every process under it: the Ray cluster this
    process started (its raylet, object store and workers) with it."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        total += times.user + times.system
    return total


def measure(paths: list[str], sample_rate: int, runs: int) -> list[dict[str, Any]]:
    """A row per loader: each run's epoch seconds (turns taken), the median, the median CPU seconds
    of the process tree during the epoch, whether every item came once."""
    loaders: dict[str, Callable[[list[str], int, int], list[int]]] = {
        "buffered": buffered_epoch, "ray": ray_epoch, "floor": floor_epoch, "plain": plain_epoch}
    times: dict[str, list[float]] = {name: [] for name in loaders}
    cpu: dict[str, list[float]] = {name: [] for name in loaders}
    every = dict.fromkeys(loaders, True)
    ray_epoch(paths[:64], sample_rate, 0)  # the workers start and import: not an epoch's cost
    floor_epoch(paths[:64], sample_rate, 0)
    plain_epoch(paths[:64], sample_rate, 0)
    for run in range(runs):
        for name, epoch in loaders.items():
            seen: list[int] = []
            before = tree_cpu_s()
            took = timed(lambda: seen.extend(epoch(paths, sample_rate, run)))  # noqa: B023
            cpu[name].append(tree_cpu_s() - before)
            times[name].append(took)
            every[name] &= sorted(seen) == list(range(len(paths)))
    medians = {name: statistics.median(t) for name, t in times.items()}
    return [{"loader": name, "epoch_s": medians[name], "runs_s": times[name],
             "cpu_s": statistics.median(cpu[name]), "every_item": every[name],
             "vs_buffered": medians[name] / medians["buffered"]}
            for name in loaders]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5,
                        help="rounds, the loaders taking turns (default 5)")
    parser.add_argument("--flac", type=int, default=1000,
                        help="generated FLAC files (default 1000; 0: none)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1,
                        help="CPUs of the local Ray cluster (default: the machine's)")
    parser.add_argument("--cache", type=Path,
                        default=Path(tempfile.gettempdir()) / "audiobuffer-bench-ray",
                        help="where the generated corpus is kept between runs")
    add_write_options(parser, "ray")
    args = parser.parse_args(argv)
    import ray

    found = corpora(args, args.cache)
    if not found:
        print("no corpus: the FSDD recordings are missing and --flac is 0", file=sys.stderr)
        return 1
    load_before = load_average()
    start = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level=logging.WARNING)
    ray_start = time.perf_counter() - start
    ray.data.DataContext.get_current().enable_progress_bars = False
    rows = []
    try:
        for corpus, (paths, sample_rate) in found.items():
            for row in measure(paths, sample_rate, args.runs):
                rows.append({"corpus": corpus, **row})
                print(f"{corpus}: {row['loader']}: {row['epoch_s']:.2f} s "
                      f"({row['vs_buffered']:.2f}x)", file=sys.stderr)
    finally:
        ray.shutdown()
    settings = {"runs": args.runs, "batch_size": BATCH_SIZE, "ray_cpus": args.cpus,
                "ray_start_s": ray_start, "load_before": load_before, "load_after": load_average(),
                "goal": GOAL}
    versions = f"{machine_info()['versions']}; ray {ray.__version__}"
    measured = results("ray", rows, command=command_line("bench_ray.py", argv), settings=settings,
                       versions=versions)
    print(table(["corpus", "loader", "epoch s (median)", "runs s", "vs BufferedDataset",
                 "CPU s (median)", "every item once"],
                [[r["corpus"], LOADERS[r["loader"]], f"{r['epoch_s']:.2f}",
                  " / ".join(f"{t:.2f}" for t in r["runs_s"]), f"{r['vs_buffered']:.2f}x",
                  f"{r['cpu_s']:.2f}", "yes" if r["every_item"] else "no"] for r in rows]))
    met = all(r["vs_buffered"] <= GOAL and r["every_item"] for r in rows if r["loader"] == "ray")
    plain = {r["corpus"]: r["vs_buffered"] for r in rows if r["loader"] == "plain"}
    print(f"\nGoal (the Ray path within {GOAL}x of BufferedDataset's epoch, every item once) met: "
          f"{'yes' if met else 'no'}; Ray Data without audiobuffer: "
          f"{', '.join(f'{v:.2f}x ({c})' for c, v in plain.items())}; load average "
          f"{load_before} before, {settings['load_after']} after.\n")
    print(render.preview(measured, args.results or render.RESULTS))
    write_results(measured, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
