"""Run under torchrun: every rank reads its batches by duration, all-gathers the counts, then rank 0
writes them all (see loaders/test_distributed.py)."""

import json
import sys

import torch
import torch.distributed as dist
from helpers import IndexDecoder
from torch.utils.data import DataLoader

from audiobuffer import BufferedDataset, pad_collate


def main(manifest: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report = {}
    for mode in ("pad", "drop"):
        for workers in (0, 2):
            ds = BufferedDataset(manifest, IndexDecoder(), duration_column="seconds", max_batch_seconds=8.0,
                                 buckets=4, even_shards=mode, shuffle=True, seed=1, num_producers=2)
            ds.set_epoch(1)
            loader = DataLoader(ds, batch_size=None, collate_fn=pad_collate, num_workers=workers)
            batches = [batch["index"].tolist() for batch in loader]
            counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
            dist.all_gather(counts, torch.tensor([len(batches)]))  # what a training loop would compare
            planned = len(ds.batching.plan(shuffle=True, seed=1, epoch=1))  # all ranks' batches before evening out
            gathered = [None] * world
            dist.all_gather_object(gathered, {"rank": rank, "batches": batches, "len": len(ds), "planned": planned,
                                              "counts": [int(c) for c in counts]})
            report[f"{mode}-{workers}"] = gathered
    if rank == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
