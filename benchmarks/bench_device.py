"""The device path, measured: DevicePrefetcher, DeviceTensorLoader, recycled batch slots.

    python benchmarks/bench_device.py                      # full run, prints the section
    python benchmarks/bench_device.py --write              # ... and saves results/device-DEVICE.json, renders it
    python benchmarks/bench_device.py --quick              # a smoke run (what the tests run)

1. Prefetch: a model step of a few milliseconds on batches of a few MB, with the copy to the device
   made in the loop (``batch.to(device)``) or by ``DevicePrefetcher`` on a side stream.
2. ``DeviceTensorLoader`` against ``DataLoader(TensorDataset)`` over the same MNIST-sized tensors.
3. Recycled batch slots (``BatchSlotLoader``) against ``BufferedDataset`` + ``DataLoader(pin_memory,
   pad_collate)`` on the same audio corpus: throughput, CPU time per batch, batch buffers allocated.
Medians of ``--runs`` runs; ratios are within one run of this script.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import render
import soundfile as sf
import torch
from harness import command_line, machine_info, median_time, results
from torch.utils.data import DataLoader, TensorDataset

from audiobuffer import AudioDecoder, BufferedDataset, pad_collate
from audiobuffer.loaders.device import DevicePrefetcher, DeviceTensorLoader, resolve_device
from audiobuffer.loaders.slots import BatchSlotLoader


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(device: torch.device, width: int, layers: int) -> Callable[[torch.Tensor], None]:
    """A model step: one projection from ``width`` to 512, then ``layers`` square layers."""
    weight = torch.randn(width, 512, device=device) / width ** 0.5
    square = weight[:512]

    def step(x: torch.Tensor) -> None:
        y = x @ weight
        for _ in range(layers):
            y = torch.tanh(y @ square)
        y.sum().item() if device.type == "cpu" else None

    return step


def bench_prefetch(device: torch.device, batches: int, runs: int, step_ms: float
                   ) -> tuple[list[dict[str, object]], float, int]:
    """Rows of the prefetch part, the step's ms and its layers.

    The step is grown (layers doubled from 4) until it takes ``step_ms`` on ``device``: a fixed step
    is a few ms on a CPU and well under one on a GPU, where the loop would then measure the loader.
    """
    batch_size, width = 32, 32768  # 4 MiB of float32 per batch
    data = TensorDataset(torch.randn(batch_size * batches, width))
    pin = device.type == "cuda"
    x_on_device = data.tensors[0][:batch_size].to(device)

    def step_alone(step: Callable[[torch.Tensor], None]) -> None:
        for _ in range(batches):
            step(x_on_device)
        sync(device)

    def seconds_per_step(step: Callable[[torch.Tensor], None]) -> float:
        start = time.perf_counter()
        step_alone(step)
        return (time.perf_counter() - start) / batches

    layers = 4
    step = make_step(device, width, layers)
    step_alone(step)  # warm up
    while seconds_per_step(step) < step_ms / 1000 and layers < 4096:
        layers *= 2
        step = make_step(device, width, layers)

    def plain() -> None:
        for (x,) in DataLoader(data, batch_size=batch_size, pin_memory=pin):
            step(x.to(device, non_blocking=True))
        sync(device)

    def prefetched() -> None:
        for (x,) in DevicePrefetcher(DataLoader(data, batch_size=batch_size, pin_memory=pin), device):
            step(x)
        sync(device)

    plain(), prefetched()  # warm up
    times = {name: median_time(fn, runs)[0] for name, fn in
               (("step alone (data already there)", lambda: step_alone(step)), ("loop copies each batch", plain),
                ("DevicePrefetcher", prefetched))}
    rows: list[dict[str, object]] = [
        {"part": "prefetch", "label": name, "intra_op_threads": torch.get_num_threads(),
         "ms_per_step": 1000 * seconds / batches, "ratio": times["loop copies each batch"] / seconds}
        for name, seconds in times.items()]
    return rows, 1000 * times["step alone (data already there)"] / batches, layers


def bench_tensor_loader(device: torch.device, samples: int, runs: int) -> list[dict[str, object]]:
    x = torch.randn(samples, 784)
    y = torch.randint(0, 10, (samples,))
    loader = DeviceTensorLoader(x, y, batch_size=128, shuffle=True, device=device)

    def touch(batches) -> None:
        total = torch.zeros((), device=device)
        for bx, by in batches:
            total += bx[:, 0].sum() + by.sum()
        total.item()

    def with_dataloader() -> None:
        pin = device.type == "cuda"
        touch((bx.to(device, non_blocking=True), by.to(device, non_blocking=True))
              for bx, by in DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True, pin_memory=pin))

    def with_device_loader() -> None:
        touch(loader)

    with_dataloader(), with_device_loader()
    base, _ = median_time(with_dataloader, runs)
    fast, _ = median_time(with_device_loader, runs)
    return [{"part": "tensors", "label": "DataLoader(TensorDataset, shuffle)", "epoch_s": base, "ratio": 1.0},
            {"part": "tensors", "label": "DeviceTensorLoader(shuffle)", "epoch_s": fast, "ratio": base / fast}]


def make_corpus(root: Path, files: int) -> Path:
    rng = np.random.default_rng(0)
    for i in range(files):
        n = int(16000 * rng.uniform(1.0, 2.0))
        sf.write(root / f"{i % 10}_{i}.flac", (0.1 * rng.standard_normal(n)).astype(np.float32), 16000)
    return root


def bench_slots(corpus: Path, device: torch.device, runs: int) -> list[dict[str, object]]:
    decoder = AudioDecoder(16000, crop_seconds=1.0, crop="start")
    pin = device.type == "cuda"
    batch_size = 32

    def collate_path() -> tuple:
        ds = BufferedDataset(corpus, decoder, num_producers=2, buffer_size=64)
        ptrs, n, cpu = set(), 0, time.process_time()
        for batch in DataLoader(ds, batch_size=batch_size, collate_fn=pad_collate, pin_memory=pin):
            ptrs.add(batch["audio"].data_ptr())
            n += 1
        return n, time.process_time() - cpu

    slot_loader = BatchSlotLoader(corpus, decoder, batch_size=batch_size, num_producers=2, num_slots=4)

    def slot_path() -> tuple:
        n, cpu = 0, time.process_time()
        for _batch in slot_loader:
            n += 1
        return n, time.process_time() - cpu

    measured = {}
    for name, fn in (("BufferedDataset + DataLoader(pad_collate, pin_memory)", collate_path),
                     ("BatchSlotLoader (recycled slots)", slot_path)):
        fn()  # warm up (page cache, slots)
        times, cpus = [], []
        for _ in range(runs):
            start = time.perf_counter()
            batches, cpu = fn()
            times.append(time.perf_counter() - start)
            cpus.append(cpu / batches)
        measured[name] = (float(np.median(times)), float(np.median(cpus)), batches)
    files = len(list(corpus.glob("*.flac")))
    base = measured["BufferedDataset + DataLoader(pad_collate, pin_memory)"][0]
    epochs = runs + 1
    allocations = {
        "BufferedDataset + DataLoader(pad_collate, pin_memory)":
            f"{2 if pin else 1} per batch (collate{' + pinned copy' if pin else ''})",
        "BatchSlotLoader (recycled slots)":
            f"{slot_loader.slot_stats.allocated} in {epochs} epochs ({slot_loader.slot_stats.reused} reuses)",
    }
    copies = {
        "BufferedDataset + DataLoader(pad_collate, pin_memory)":
            f"{batch_size} rows into the batch{' + 1 batch to pinned memory' if pin else ''}",
        "BatchSlotLoader (recycled slots)": f"{batch_size} rows into the slot",
    }
    return [{"part": "slots", "label": name, "files_per_s": files / seconds, "ratio": base / seconds,
             "cpu_ms_per_batch": 1000 * cpu, "copies": copies[name], "allocated": allocations[name]}
            for name, (seconds, cpu, _) in measured.items()]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (median)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one run: a smoke test")
    parser.add_argument("--step-ms", type=float, default=4.0,
                        help="the prefetch table's step is grown until it takes at least this long")
    parser.add_argument("--write", action="store_true",
                        help="save results/device-DEVICE.json (cpu or cuda) and render BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.write and args.quick:
        parser.error("--write takes a full run; --quick is a smoke test whose numbers mean little")
    device = resolve_device(args.device)
    runs = 1 if args.quick else args.runs
    batches, samples, files = (4, 2048, 40) if args.quick else (40, 60000, 640)
    machine = machine_info()  # at the default intra-op threads, before the one-thread run changes them

    rows, step_ms, layers = bench_prefetch(device, batches, runs, args.step_ms)
    steps, all_layers = [step_ms], [layers]
    if device.type == "cpu":
        # On the CPU the step and the prefetch thread share the cores: measure with a free core too.
        default_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        one_thread, step_ms, layers = bench_prefetch(device, batches, runs, args.step_ms)
        rows += one_thread
        steps.append(step_ms)
        all_layers.append(layers)
        torch.set_num_threads(default_threads)
    rows += bench_tensor_loader(device, samples, runs)
    with tempfile.TemporaryDirectory() as tmp:
        rows += bench_slots(make_corpus(Path(tmp), files), device, runs)
    measured = results(f"device-{device.type}", rows, command=command_line("bench_device.py", argv), machine=machine,
                       settings={"runs": runs, "device": device.type, "batches": batches, "samples": samples,
                                 "files": files, "step_ms": steps, "layers": all_layers})
    print(render.preview(measured))
    if args.write:
        render.publish(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
