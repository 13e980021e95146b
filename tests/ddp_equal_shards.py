"""Run under torchrun: every rank reads its shard, then rank 0 checks them all (see loaders/test_distributed.py)."""

import json
import sys

import torch.distributed as dist
from helpers import IndexDecoder, fake_paths
from torch.utils.data import DataLoader

from audiobuffer import BufferedDataset, pad_collate

N = 11


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report = {}
    for mode in ("pad", "drop"):
        for workers in (0, 2):
            ds = BufferedDataset(fake_paths(N), IndexDecoder(), even_shards=mode, shuffle=True, seed=1, num_producers=2)
            loader = DataLoader(ds, batch_size=2, collate_fn=pad_collate, num_workers=workers)
            seen = [i for batch in loader for i in batch["index"].tolist()]
            gathered = [None] * world
            dist.all_gather_object(gathered, {"rank": rank, "seen": seen, "len": len(ds)})
            report[f"{mode}-{workers}"] = gathered
    if rank == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
