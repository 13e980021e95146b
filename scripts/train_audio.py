"""Train a small CNN on log-mel features, fed by audiobuffer from a YAML pipeline config.

Copy it and change the model. One process:

    python scripts/train_audio.py --config configs/fsdd.yaml

Two processes on one CPU machine (gloo; each rank decodes and trains on its own shard):

    torchrun --nproc_per_node=2 scripts/train_audio.py --config configs/fsdd.yaml

The config's ``train`` section sets the optimiser, the features, the model width, the test split
(``test_files``: a regex on the file name) and the checkpoint path. Features are computed on the whole
batch on the training device (``audiobuffer.features.LogMel``), not per sample in the producers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from audiobuffer.config import build_dataset, build_loader, build_source, load_config
from audiobuffer.device import DevicePrefetcher, resolve_device
from audiobuffer.errors import AudioBufferError
from audiobuffer.features import LogMel


class SpeechCNN(nn.Module):
    """Log-mel in, class scores out: four conv blocks, average and max pooling over time and frequency."""

    def __init__(self, classes: int, sample_rate: int, *, n_fft: int, hop_length: int, n_mels: int,
                 channels: int) -> None:
        super().__init__()
        self.features = LogMel(sample_rate, n_fft, hop_length=hop_length, n_mels=n_mels, top_db=80.0)
        self.norm = nn.BatchNorm2d(1)
        layers: list[nn.Module] = []
        c_in = 1
        for c_out in (channels, channels * 2, channels * 4, channels * 4):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
                       nn.MaxPool2d(2, ceil_mode=True)]
            c_in = c_out
        self.body = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(2 * c_in, classes))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        spec, _ = self.features(audio)
        x = self.body(self.norm(spec.unsqueeze(1)))
        return self.head(torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], dim=1))


def main() -> int:
    try:
        return train()
    finally:
        if dist.is_initialized():
            # No rank tears gloo down while another is still in a collective or writing the checkpoint.
            dist.barrier()
            dist.destroy_process_group()


def train() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="pipeline config (YAML)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable), e.g. --set epochs=3")
    parser.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many steps")
    parser.add_argument("--seen-log", type=Path, default=None,
                        help="write the files each rank trained on in epoch 0 to DIR/rank{N}.json")
    parser.add_argument("--json", type=Path, default=None, help="write the final metrics to this file")
    args = parser.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    config = load_config(args.config, args.overrides)
    device = resolve_device(config.device)
    if distributed:
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    torch.manual_seed(config.seed)

    # Split one source into train and test by file name; both keep the same classes.
    source = build_source(config)
    test_re = re.compile(config.train.test_files) if config.train.test_files else None
    is_test = [bool(test_re and test_re.search(os.path.basename(p))) for p in source.paths]
    train_source = source.subset([i for i, t in enumerate(is_test) if not t])
    test_source = source.subset([i for i, t in enumerate(is_test) if t]) if any(is_test) else None
    train_set = build_dataset(config, source=train_source)  # each rank its shard (torch.distributed)
    test_set = build_dataset(config, source=test_source, shuffle=False, ordered=True) if test_source else None
    train_loader = build_loader(config, train_set)
    test_loader = build_loader(config, test_set) if test_set is not None else None

    sample_rate = config.decode.sample_rate or 16000
    t = config.train
    model: nn.Module = SpeechCNN(len(source.classes), sample_rate, n_fft=t.n_fft, hop_length=t.hop_length,
                                 n_mels=t.n_mels, channels=t.channels).to(device)
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    # Every rank must take the same number of steps, or the last gradient all-reduce waits forever.
    steps = _agree_min(-(-len(train_set) // config.loader.batch_size), distributed)
    if args.max_steps is not None:
        steps = min(steps, args.max_steps)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=t.lr, epochs=config.epochs,
                                                   steps_per_epoch=max(1, steps))
    log = print if rank == 0 else (lambda *a, **k: None)
    log(f"{len(train_source)} train / {len(test_source) if test_source else 0} test files, "
        f"{len(source.classes)} classes, {world_size} rank(s), {steps} steps per epoch, device {device}")

    metrics: dict = {"world_size": world_size, "epochs": []}
    for epoch in range(config.epochs):
        start = time.perf_counter()
        train_set.set_epoch(epoch)
        model.train()
        seen: list[str] = []
        loss_sum = torch.zeros(2, dtype=torch.float64)
        for step, batch in enumerate(DevicePrefetcher(train_loader, device)):  # batches arrive on the device
            if step >= steps:
                break  # leaving the loop stops this epoch's producers
            seen.extend(batch["path"])
            loss = nn.functional.cross_entropy(model(batch["audio"]), batch["label"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            loss_sum += torch.tensor([loss.item() * len(batch["label"]), len(batch["label"])], dtype=torch.float64)
        if args.seen_log is not None and epoch == 0:
            args.seen_log.mkdir(parents=True, exist_ok=True)
            (args.seen_log / f"rank{rank}.json").write_text(json.dumps(seen))
        loss_sum = _sum(loss_sum, distributed)
        accuracy = evaluate(model, test_loader, device, distributed) if test_loader is not None else None
        entry = {"epoch": epoch, "loss": float(loss_sum[0] / max(1.0, float(loss_sum[1]))),
                 "test_accuracy": accuracy, "seconds": time.perf_counter() - start,
                 "train_stats": train_set.stats().as_dict()}
        metrics["epochs"].append(entry)
        acc = f", test accuracy {100 * accuracy:.2f}%" if accuracy is not None else ""
        log(f"epoch {epoch + 1}/{config.epochs}: loss {entry['loss']:.4f}{acc} ({entry['seconds']:.1f} s)")
        if rank == 0 and t.checkpoint:
            Path(t.checkpoint).parent.mkdir(parents=True, exist_ok=True)
            plain = model.module if isinstance(model, DistributedDataParallel) else model
            torch.save({"model": plain.state_dict(), "epoch": epoch, "classes": source.classes,
                        "test_accuracy": accuracy, "config": config.model_dump()}, t.checkpoint)
    if args.json is not None and rank == 0:
        args.json.write_text(json.dumps(metrics, indent=2, default=str))
    return 0


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, distributed: bool) -> float:
    """Accuracy over the test set, summed across ranks."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64)
    for batch in DevicePrefetcher(loader, device):
        predicted = model(batch["audio"]).argmax(dim=1)
        counts += torch.tensor([float((predicted == batch["label"]).sum()), len(batch["label"])], dtype=torch.float64)
    counts = _sum(counts, distributed)
    return float(counts[0] / max(1.0, float(counts[1])))


def _sum(values: torch.Tensor, distributed: bool) -> torch.Tensor:
    if distributed:
        dist.all_reduce(values)
    return values


def _agree_min(value: int, distributed: bool) -> int:
    if not distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AudioBufferError as exc:  # a bad config or an undecodable file under on_error: raise
        print(f"train_audio: error: {exc}", file=sys.stderr)
        sys.exit(2)
