"""Duration batches: padding and throughput (results ``padding`` and ``batches``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, num, percent, ratio, rows_of, table
from .plots import figure, finish, grouped_barh


def durations_table(results: Results) -> str:
    body = []
    throughput = rows_of(results, "batches")
    if throughput:
        budget = results["batches"]["settings"]["budget"]
        samples = next(r for r in throughput if r["mode"] == "samples")
        by_duration = [r for r in throughput if r["mode"] == "by duration"]
        ratios = ", ".join(f"{ratio(r['vs_samples'])} ({r['producers']} producers)".replace("(auto producers)",
                                                                                         "(`auto`)")
                           for r in by_duration)
        size = samples["batching"].split("=")[1]
        body.append(["FSDD, decoded", f"{budget:g}", size, percent(by_duration[0]["padding"]),
                     percent(samples["padding"]), ratios])
    for row in rows_of(results, "padding"):
        body.append([row["corpus"], f"{row['max_batch_seconds']:g}", num(row["mean_batch_size"], 1),
                     percent(row["padding_duration"]), percent(row["padding_random"]), "-"])
    return table(["corpus", "max_batch_seconds", "mean batch size", "padding, by duration",
                  "padding, random batches", "audio s/s, by duration / samples"], body)


def durations_plot(results: Results) -> Any:
    labels, by_duration, random = [], [], []
    throughput = rows_of(results, "batches")
    if throughput:
        budget = results["batches"]["settings"]["budget"]
        labels.append(f"FSDD, decoded, {budget:g} s")
        by_duration.append(100 * next(r for r in throughput if r["mode"] == "by duration")["padding"])
        random.append(100 * next(r for r in throughput if r["mode"] == "samples")["padding"])
    for row in rows_of(results, "padding"):
        labels.append(f"{row['corpus'].split(' (')[0]}, {row['max_batch_seconds']:g} s")
        by_duration.append(100 * row["padding_duration"])
        random.append(100 * row["padding_random"])
    fig, axes = figure(1, 1, width=8, height=3.2)
    grouped_barh(axes[0][0], labels, {"batches by duration": by_duration, "random batches, same size": random},
                 title="padding: padded frames / frames in the batches", xlabel="percent (lower is better)",
                 reference=None)
    return finish(fig)


DURATIONS = Section(
    name="duration-batches", title="Duration batches: padding and throughput",
    sources={"padding": None, "batches": None},
    about="With `max_batch_seconds`, batches come from duration buckets and count x longest stays within the budget. "
          "Padding: the share of padded frames (mean of 5 epochs), against random batches of the same mean size. The "
          "first row decodes FSDD and compares audio seconds per second, by duration and in sample mode.",
    table=durations_table, plot=durations_plot, alt="padding of batches by duration and of random batches")
