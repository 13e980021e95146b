"""The device path: prefetch, tensors on the device, batch slots (results ``device-cpu``, ``device-cuda``)."""

from __future__ import annotations

import textwrap
from typing import Any

from .base import Results, Section, in_order, listing, num, ratio, rows_of, table
from .plots import figure, finish, grouped_barh

DEVICE_SOURCES: dict[str, str | None] = {"device-cpu": "CPU", "device-cuda": "H100"}
DEVICE_PARTS = {"prefetch": ("ms per step", "ms_per_step", 2), "tensors": ("epoch s", "epoch_s", 3),
                "slots": ("files/s", "files_per_s", 0)}


def _device_rows(results: Results, name: str) -> list[dict[str, Any]]:
    """The rows of one device run; of the prefetch rows, those at the machine's own intra-op threads."""
    rows = rows_of(results, name)
    threads = max((r["intra_op_threads"] for r in rows if r["part"] == "prefetch"), default=None)
    return [r for r in rows if r["part"] != "prefetch" or r["intra_op_threads"] == threads]


def device_table(results: Results) -> str:
    present = [(name, label) for name, label in DEVICE_SOURCES.items() if name in results]
    by = {(name, r["part"], r["label"]): r for name, _ in present for r in _device_rows(results, name)}
    header = ["figure", "loop or loader"] + [h for _, label in present for h in (str(label), "speed-up")]
    body = []
    for part, (unit, key, decimals) in DEVICE_PARTS.items():
        labels = in_order(r["label"] for name, _ in present for r in _device_rows(results, name) if r["part"] == part)
        for i, label in enumerate(labels):
            cells: list[str] = []
            for name, _ in present:
                row = by.get((name, part, label))
                cells += [num(row[key], decimals), ratio(row["ratio"])] if row else ["-", "-"]
            body.append([unit if i == 0 else "", label] + cells)
    return table(header, body)


def device_plot(results: Results) -> Any:
    present = [(name, label) for name, label in DEVICE_SOURCES.items() if name in results]
    fig, axes = figure(1, len(DEVICE_PARTS), width=12, height=3.4)
    titles = {"prefetch": "prefetch (speed-up over copying in the loop)",
              "tensors": "tensors on the device (over DataLoader)", "slots": "batch slots (over the collate path)"}
    for ax, part in zip(axes.flat, DEVICE_PARTS):
        labels = in_order(r["label"] for name, _ in present for r in _device_rows(results, name) if r["part"] == part)
        by = {(name, r["label"]): r["ratio"] for name, _ in present for r in _device_rows(results, name)
              if r["part"] == part}
        grouped_barh(ax, [textwrap.fill(label, 24, break_long_words=False) for label in labels],
                     {str(label): [by.get((name, lab)) for lab in labels] for name, label in present},
                     title=titles[part], xlabel="speed-up (higher is faster)")
    return finish(fig)


def device_reading(results: Results) -> str:
    steps = []
    for name, label in DEVICE_SOURCES.items():
        if name in results:
            settings = results[name]["settings"]
            steps.append(f"{num(settings['step_ms'][0], 1)} ms ({settings['layers'][0]} layers) on the {label}")
    return f"The prefetch step took {listing(steps)}." if steps else ""


DEVICE = Section(
    name="device", title="Device path: prefetch, tensors on the device, batch slots", sources=DEVICE_SOURCES,
    about="`DevicePrefetcher` copies the next batch (4 MiB) on a side stream during the step (a few ms on the device "
          "at hand), against a loop that copies each batch itself; `DeviceTensorLoader` keeps whole tensors on the "
          "device (60000 x 784 float32, batches of 128, a shuffled epoch), against `DataLoader(TensorDataset)`; "
          "`BatchSlotLoader` writes rows into recycled pinned batches, against `BufferedDataset` + "
          "`DataLoader(pad_collate, pin_memory)` (640 FLAC files of 1-2 s, 1 s crops, batches of 32, 2 producers).",
    table=device_table, reading=device_reading, plot=device_plot,
    alt="speed-ups of the prefetcher, DeviceTensorLoader and the batch slots")
