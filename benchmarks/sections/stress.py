"""The buffer stress test and soak (results ``stress`` and ``soak``: ``audiobuffer stress``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, num, ratio, rows_of, table
from .plots import figure, finish, grouped_barh


def stress_table(results: Results) -> str:
    stress, soak = rows_of(results, "stress"), rows_of(results, "soak")
    soaked = {(r["producers"], r["consumers"], r["capacity"]): r for r in soak}
    header = ["producers x consumers x capacity", "queue.Queue get, items/s", "Buffer get, items/s", "vs Queue",
              "Buffer get_many, items/s", "vs Queue"]
    minutes = results["soak"]["settings"].get("minutes") if soak else None
    if soak:
        header += [f"{minutes:g}-minute soak: get vs Queue", "soak: get_many vs Queue"]
    body = []
    for row in stress or soak:
        shape = (row["producers"], row["consumers"], row["capacity"])
        cells = [" x ".join(map(str, shape)), num(row["queue_items_per_s"], 0), num(row["buffer_items_per_s"], 0),
                 ratio(row["ratio"]), num(row["buffer_many_items_per_s"], 0), ratio(row["ratio_many"])]
        if soak:
            s = soaked.get(shape)
            cells += [ratio(s["ratio"]), ratio(s["ratio_many"])] if s else ["-", "-"]
        body.append(cells)
    return table(header, body)


def stress_reading(results: Results) -> str:
    parts = []
    for name in ("stress", "soak"):
        if name in results:
            s = results[name]["settings"]
            files = ("open files not counted" if s["fds_start"] is None else
                     f"open files {s['fds_start']} / {s['fds_peak']} / {s['fds_end']}")
            parts.append(f"the {'soak' if name == 'soak' else 'stress test'} moved {s['items_moved']:,} items in "
                         f"{s['rounds']:,} rounds: {s['lost']} lost, {s['duplicated']} duplicated, "
                         f"{s['bound_violations']} rounds over the bound; threads {s['threads_start']} / "
                         f"{s['threads_peak']} / {s['threads_end']} and {files} (at the start / at most / at the end)")
    return ("Checks: " + "; ".join(parts) + ".") if parts else ""


def stress_plot(results: Results) -> Any:
    series: dict[str, list[float | None]] = {}
    shapes: list[str] = []
    for name, label in (("stress", "stress"), ("soak", "soak")):
        rows = rows_of(results, name)
        shapes = shapes or [f"{r['producers']} x {r['consumers']} x {r['capacity']}" for r in rows]
        if rows:
            series[f"get, {label}"] = [r["ratio"] for r in rows]
            series[f"get_many, {label}"] = [r["ratio_many"] for r in rows]
    fig, axes = figure(1, 1, width=8, height=3.4)
    grouped_barh(axes[0][0], shapes, series, title="Buffer against queue.Queue (producers x consumers x capacity)",
                 xlabel="items/s over queue.Queue's (higher is faster)")
    return finish(fig)


STRESS = Section(
    name="stress", title="Buffer stress test and soak", sources={"stress": None, "soak": None},
    about="P producer threads move numbered items to C consumer threads through a `Buffer`, against `queue.Queue` "
          "of the same shape in the same run: items per second, 100,000 items a round with no delays. `get` takes "
          "one item per call, as `queue.Queue.get` does; `get_many` every ready item at once, as "
          "`BufferedDataset`'s consumer does. Every round (jittered ones too) checks that each item arrives "
          "exactly once and the buffer never holds more than its capacity; the soak also checks that threads and "
          "open files stay flat.",
    table=stress_table, reading=stress_reading, plot=stress_plot, alt="Buffer's items/s over queue.Queue's per shape")
