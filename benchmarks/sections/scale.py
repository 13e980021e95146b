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
            f"{num(row['trainer_after_first_batch_mib'], 0)} + {num(helper, 0)} = {num(_running(row), 0)}" + \
            _against(row, next((r for r in rows_of(results, "scale") if r["case"] == "dataset"
                                and r["items"] == row["items"] and "error" not in r), None))
        body.append([_size(row["items"]), CASES.get(row["case"], row["case"]), num(row["build_s"]),
                     num(row["added_mib"], 0), "-" if helper is not None else num(row["bytes_per_item"], 0),
                     num(row["first_batch_s"]), running])  # the isolated table is mapped: counted once touched
    return table(["rows", "loader", "built in s", "memory added MiB", "bytes per item", "first batch s",
                  "memory at the first batch MiB (trainer + helper; against `BufferedDataset`)"], body)


def _against(isolated: dict[str, Any], dataset: dict[str, Any] | None) -> str:
    """`` (1.53x; 1.21x less a bare helper's 23)``: trainer and helper against the in-process dataset."""
    if dataset is None:
        return ""
    ratio = f"{_running(isolated) / _running(dataset):.2f}x"
    floor = isolated.get("bare_helper_uss_mib")
    if floor is None:
        return f" ({ratio})"
    return f" ({ratio}; {(_running(isolated) - floor) / _running(dataset):.2f}x less a bare helper's {num(floor, 0)})"


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
    about="A CSV manifest of N rows (path, speaker, seconds), or an index of N packed members; each case in "
          "fresh processes, the imports before the clock; 10k and 100k rows are in the saved results.",
    table=scale_table, plot=scale_plot, alt="build time of each loader over 10k to 10M rows")
