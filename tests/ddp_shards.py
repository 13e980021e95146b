"""Run under torchrun: every rank reads its shard of N items, and its batches by duration of a
manifest, each with even_shards "pad" and "drop", in the process and in DataLoader workers; the
counts are all-gathered and rank 0 writes both reports (see loaders/test_distributed.py). One
launch serves both tests: a start of torchrun is three starts of torch."""

import json
import sys

import torch
import torch.distributed as dist
from helpers import IndexDecoder, fake_paths
from torch.utils.data import DataLoader

from audiobuffer import BufferedDataset, pad_collate

N = 11


def equal_shards(rank: int, world: int) -> dict:
    """Each (mode, workers): what every rank read of N items in batches of 2, and its len()."""
    report = {}
    for mode in ("pad", "drop"):
        for workers in (0, 2):
            ds = BufferedDataset(fake_paths(N), IndexDecoder(), even_shards=mode, shuffle=True,
                                 seed=1, num_producers=2)
            loader = DataLoader(ds, batch_size=2, collate_fn=pad_collate, num_workers=workers)
            seen = [i for batch in loader for i in batch["index"].tolist()]
            gathered = [None] * world
            dist.all_gather_object(gathered, {"rank": rank, "seen": seen, "len": len(ds)})
            report[f"{mode}-{workers}"] = gathered
    return report


def duration_batches(rank: int, world: int, manifest: str) -> dict:
    """Each (mode, workers): every rank's batches by duration of ``manifest``, its len(), the
    batches planned before evening out, and the batch counts all-gathered as a loop would."""
    report = {}
    for mode in ("pad", "drop"):
        for workers in (0, 2):
            ds = BufferedDataset(manifest, IndexDecoder(), duration_column="seconds",
                                 max_batch_seconds=8.0, buckets=4, even_shards=mode, shuffle=True,
                                 seed=1, num_producers=2)
            ds.set_epoch(1)
            loader = DataLoader(ds, batch_size=None, collate_fn=pad_collate, num_workers=workers)
            batches = [batch["index"].tolist() for batch in loader]
            counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
            # What a training loop would compare:
            dist.all_gather(counts, torch.tensor([len(batches)]))
            # All ranks' batches before evening out:
            planned = len(ds.batching.plan(shuffle=True, seed=1, epoch=1))
            gathered = [None] * world
            dist.all_gather_object(gathered, {"rank": rank, "batches": batches, "len": len(ds),
                                              "planned": planned,
                                              "counts": [int(c) for c in counts]})
            report[f"{mode}-{workers}"] = gathered
    return report


def main(manifest: str, equal_out: str, duration_out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    reports = {equal_out: equal_shards(rank, world),
               duration_out: duration_batches(rank, world, manifest)}
    if rank == 0:
        for out, report in reports.items():
            with open(out, "w", encoding="utf-8", newline="\n") as f:
                json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
