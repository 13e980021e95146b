"""Run under torchrun on one launcher or several (see loaders/test_nodes.py): every rank reads an
index of shards from S3, one batch a step, in step with an ``all_reduce`` as DDP keeps the ranks,
and saves its state and what it delivered every few steps.

``train OUT URL ENDPOINT``: epoch 0 whole, then epoch 1 up to a step after which every rank says it
is ready (``OUT/ready-r{rank}.json``) and waits for ``OUT/go``, to be killed meanwhile or to run on
into a lost peer. ``resume OUT URL ENDPOINT``: the states of the last step every old rank saved,
merged, finish their epoch, then the next epoch runs; each rank writes ``OUT/resume-r{rank}.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from storage_helpers import KEY, REGION, SECRET
from torch.utils.data import DataLoader

from audiobuffer import AudioDecoder, BufferedDataset, merge_states, pad_collate

BATCH = 5
#: Steps between checkpoints.
EVERY = 3
#: The step of epoch 1 after which the ranks of ``train`` wait (one step past a checkpoint).
STOP_AT = 7
#: Seconds a rank waits for ``OUT/go`` at most, and a collective for its peers.
WAIT = 120.0
SEED = 11


def dataset(url: str, endpoint: str) -> BufferedDataset:
    options = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET,
               "client_kwargs": {"region_name": REGION}}
    return BufferedDataset(url, AudioDecoder(sample_rate=8000), shuffle=True, seed=SEED,
                           num_producers=2, storage_options=options)


def write_json(path: Path, value: object) -> None:
    """Write ``value`` to ``path`` whole or not at all (a rank may be killed while it writes)."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(value), encoding="utf-8", newline="\n")
    os.replace(part, path)


def run_epoch(ds: BufferedDataset, out: Path, ckpt: Path, *,
              stop_at: int | None = None) -> tuple[list[str], int]:
    """One epoch of ``ds`` (its epoch as set): the paths it delivered and its steps."""
    rank, epoch = dist.get_rank(), ds.epoch
    ds.set_epoch(epoch)  # the same epoch: a loaded state is kept
    seen: list[str] = []
    steps = 0
    flag = torch.zeros(1)
    for batch in DataLoader(ds, batch_size=BATCH, collate_fn=pad_collate):
        seen += batch["path"]
        steps += 1
        dist.all_reduce(flag)  # as DDP's gradient sync: a rank with a step more would hang here
        if steps % EVERY == 0:
            write_json(ckpt / f"e{epoch}-s{steps:04d}-r{rank}.json",
                       {"state": ds.state_dict(), "seen": seen})
        if steps == stop_at:
            write_json(out / f"ready-r{rank}.json", {"pid": os.getpid(), "seen": seen})
            deadline = time.monotonic() + WAIT
            while not (out / "go").exists():
                if time.monotonic() > deadline:
                    raise SystemExit(f"rank {rank}: {out / 'go'} did not appear in {WAIT} s")
                time.sleep(0.05)
    return seen, steps


def last_complete(ckpt: Path) -> list[dict]:
    """The checkpoints of the last (epoch, step) that every rank of the old world saved."""
    found: dict[tuple[int, int], dict[int, dict]] = {}
    for path in ckpt.glob("e*-s*-r*.json"):
        epoch, step, rank = (int(part[1:]) for part in path.stem.split("-"))
        found.setdefault((epoch, step), {})[rank] = json.loads(path.read_text(encoding="utf-8"))
    for key in sorted(found, reverse=True):
        saved = found[key]
        world = next(iter(saved.values()))["state"]["world_size"]
        if sorted(saved) == list(range(world)):
            return [saved[r] for r in range(world)]
    raise SystemExit(f"no step that every rank saved in {ckpt}")


def main(phase: str, out_dir: str, url: str, endpoint: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=WAIT))
    rank, out = dist.get_rank(), Path(out_dir)
    ds = dataset(url, endpoint)
    try:
        if phase == "train":
            ckpt = out / "ckpt-train"
            ckpt.mkdir(parents=True, exist_ok=True)
            seen, steps = run_epoch(ds, out, ckpt)
            write_json(out / f"train-r{rank}.json", {"seen": seen, "steps": steps})
            ds.set_epoch(1)
            run_epoch(ds, out, ckpt, stop_at=STOP_AT)
            raise SystemExit(f"rank {rank}: epoch 1 ended; its launcher was to be killed first")
        saved = last_complete(out / "ckpt-train")
        ds.load_state_dict(merge_states([s["state"] for s in saved]))
        ckpt = out / "ckpt-resume"
        ckpt.mkdir(parents=True, exist_ok=True)
        rest, rest_steps = run_epoch(ds, out, ckpt)
        ds.set_epoch(ds.epoch + 1)
        following, steps = run_epoch(ds, out, ckpt)
        write_json(out / f"resume-r{rank}.json",
                   {"before": [s["seen"] for s in saved], "epoch": saved[0]["state"]["epoch"],
                    "rest": rest, "rest_steps": rest_steps, "following": following,
                    "steps": steps, "pid": os.getpid()})
    finally:
        ds.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
