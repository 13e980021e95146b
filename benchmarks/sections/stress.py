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
    runs = [(("soak" if name == "soak" else "stress test"), results[name]["settings"])
            for name in ("stress", "soak") if name in results]
    if not runs:
        return ""

    def flat(what: str, key: str) -> str:
        """``threads 1 / 2 / 1``, once where every run counted the same, else per run."""
        counts = [f"{s[key + '_start']} / {s[key + '_peak']} / {s[key + '_end']}" for _, s in runs]
        if len(set(counts)) == 1:
            return f"{what} {counts[0]}"
        return f"{what} " + ", ".join(f"{c} ({label})" for (label, _), c in zip(runs, counts))

    moved = "; ".join(f"the {label} moved {s['items_moved']:,} items in {s['rounds']:,} rounds: {s['lost']} lost, "
                      f"{s['duplicated']} duplicated, {s['bound_violations']} rounds over the bound"
                      for label, s in runs)
    files = ("open files not counted" if any(s["fds_start"] is None for _, s in runs) else flat("open files", "fds"))
    return (f"Checks of every round, jittered ones too: {moved}; {flat('threads', 'threads')} and {files} (at the "
            "start / at most / at the end).")


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
    about="P producer threads move numbered items to C consumer threads through a `Buffer` and, in the same run, a "
          "`queue.Queue`: items per second, 100,000 items a round. `get` takes one item a call, as `Queue.get` does; "
          "`get_many` every ready item, as `BufferedDataset`'s consumer does.",
    table=stress_table, reading=stress_reading, plot=stress_plot, alt="Buffer's items/s over queue.Queue's per shape")
