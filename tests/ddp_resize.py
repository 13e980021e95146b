"""Run under torchrun, in two phases (see test_distributed.py): ``stop`` reads part of epoch 0 on
each rank and saves every rank's state and what it yielded; ``resume`` loads their merged state on
each rank of a world of any size, finishes epoch 0 and runs epoch 1; rank 0 writes the report."""

import json
import sys

import torch.distributed as dist
from helpers import IndexDecoder, fake_paths

from audiobuffer import BufferedDataset, merge_states

N = 41


def dataset() -> BufferedDataset:
    return BufferedDataset(fake_paths(N), IndexDecoder(), shuffle=True, seed=7, num_producers=2)


def gather(value: object) -> list:
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def main(phase: str, path: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = dataset()
    if phase == "stop":
        it = iter(ds)
        seen = [next(it)["index"] for _ in range(3 + 2 * rank)]
        report: dict = {"seen": gather(seen), "states": gather(ds.state_dict()),
                        "len": gather(len(ds))}
        it.close()
    else:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        ds.load_state_dict(merge_states(saved["states"]))
        rest = [sample["index"] for sample in ds]
        ds.set_epoch(1)
        following = [sample["index"] for sample in ds]
        report = {**saved, "rest": gather(rest), "following": gather(following),
                  "len": gather(len(ds))}
    ds.close()
    if rank == 0:
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
