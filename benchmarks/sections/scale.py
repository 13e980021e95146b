"""Millions of items: building a loader over a manifest of N rows, its memory and first batch (results ``scale``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, num, rows_of, table
from .plots import figure, finish, grouped_barh

#: Each case's label, as the table and plot name it.
CASES = {"dataset": "`BufferedDataset`", "duration": "`max_batch_seconds` (durations from a column)",
         "isolated": "`IsolatedLoader`", "index": "`BufferedDataset` over an `index.json`"}
#: The sizes the table shows (the smaller ones are in the saved results).
SHOWN = (1_000_000, 10_000_000)


def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def _running(row: dict[str, Any]) -> float:
    """MiB in use once the first batch is out: the trainer's, and its helper's own."""
    return float(row["trainer_after_first_batch_mib"]) + float(row.get("helper_uss_mib") or 0.0)


def scale_table(results: Results) -> str:
    body = []
    for row in rows_of(results, "scale"):
        if row["items"] not in SHOWN or "error" in row:
            continue
        helper = row.get("helper_uss_mib")
        running = num(_running(row), 0) if helper is None else \
            f"{num(row['trainer_after_first_batch_mib'], 0)} + {num(helper, 0)} = {num(_running(row), 0)}"
        body.append([_size(row["items"]), CASES.get(row["case"], row["case"]), num(row["build_s"]),
                     num(row["added_mib"], 0), num(row["bytes_per_item"], 0), num(row["first_batch_s"]), running])
    return table(["rows", "loader", "built in s", "memory added MiB", "bytes per item", "first batch s",
                  "memory at the first batch MiB (trainer + helper)"], body)


def scale_reading(results: Results) -> str:
    rows = [r for r in rows_of(results, "scale") if "error" not in r]
    found = {(r["case"], r["items"]): r for r in rows}
    parts = []
    for n in SHOWN:
        isolated, dataset = found.get(("isolated", n)), found.get(("dataset", n))
        if isolated is None or dataset is None:
            continue
        ratio = _running(isolated) / _running(dataset)
        floor = isolated.get("bare_helper_uss_mib")
        beyond = None if floor is None else (_running(isolated) - floor) / _running(dataset)
        less = "" if beyond is None else f", {beyond:.2f}x less the {num(floor, 0)} MiB of a helper over 10 rows"
        parts.append(f"{_size(n)} rows {ratio:.2f}x{less}")
    if not parts:
        return ""
    return ("`IsolatedLoader` against `BufferedDataset`, each at its first batch: " + "; ".join(parts) +
            ". The item table is in memory once: the trainer and its helper map the same pages, and a helper's "
            "own floor (Python, numpy, soundfile) is the same whatever the number of items.")


def scale_plot(results: Results) -> Any:
    rows = [r for r in rows_of(results, "scale") if "error" not in r]
    sizes = sorted({r["items"] for r in rows})
    fig, axes = figure(1, 1, width=8, height=3.0)
    series = {CASES.get(case, case).replace("`", ""): [next((r["build_s"] for r in rows if r["items"] == n
                                                              and r["case"] == case), None) for n in sizes]
              for case in CASES}
    grouped_barh(axes[0][0], [f"{_size(n)} rows" for n in sizes], series, title="build time over a CSV manifest",
                 xlabel="seconds (lower is faster)", reference=None)
    return finish(fig)


SCALE = Section(
    name="scale", title="Millions of items: build time, memory and the first batch",
    sources={"scale": None},
    about="A CSV manifest of N rows (path, speaker, seconds), and an index of as many packed members, each case "
          "in a fresh process, the imports before the clock; 10k and 100k rows are in the saved results.",
    table=scale_table, reading=scale_reading, plot=scale_plot, alt="build time of each loader over 10k to 10M rows")
