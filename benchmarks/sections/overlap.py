"""Overlap: loading beside training (results ``overlap``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, in_order, listing, num, ratio, rows_of, table
from .plots import figure, finish, grouped_barh


def overlap_table(results: Results) -> str:
    rows = rows_of(results, "overlap")
    by = {(r["work"], r["t1_ms"], r["t2_ms"]): r for r in rows}
    body = []
    for t1, t2 in in_order((r["t1_ms"], r["t2_ms"]) for r in rows):
        real, sleep = by.get(("real", t1, t2)), by.get(("sleep", t1, t2))
        body.append([t1, t2] + ([num(real["sequential_s"], 3), num(real["audiobuffer_s"], 3), num(real["ideal_s"], 3),
                                 ratio(real["over_ideal"])] if real else ["-"] * 4)
                    + [ratio(sleep["over_ideal"]) if sleep else "-"])
    return table(["T1 ms", "T2 ms", "real: sequential s", "real: audiobuffer s", "real: ideal s",
                  "real: audiobuffer / ideal", "sleep: audiobuffer / ideal"], body)


def overlap_reading(results: Results) -> str:
    rows = rows_of(results, "overlap")
    spans = []
    for work, doing in (("real", "with real work"), ("sleep", "sleeping")):
        values = [r["over_ideal"] for r in rows if r["work"] == work]
        if values:
            spans.append(f"{ratio(min(values))}-{ratio(max(values))} of the ideal {doing}")
    return f"audiobuffer took {listing(spans)}." if spans else ""


def overlap_plot(results: Results) -> Any:
    rows = rows_of(results, "overlap")
    cells = in_order((r["t1_ms"], r["t2_ms"]) for r in rows)
    by = {(r["work"], r["t1_ms"], r["t2_ms"]): r for r in rows}

    def series(work: str, key: str) -> list[float | None]:
        return [by[(work, *c)][key] / by[(work, *c)]["ideal_s"] if (work, *c) in by else None for c in cells]

    fig, axes = figure(1, 1, width=8, height=4)
    grouped_barh(axes[0][0], [f"T1 {a} ms, T2 {b} ms" for a, b in cells],
                 {"sequential, real work": series("real", "sequential_s"),
                  "audiobuffer, real work": series("real", "audiobuffer_s"),
                  "audiobuffer, sleep": series("sleep", "audiobuffer_s")},
                 title="epoch time over the ideal n * max(T1, T2)", xlabel="time / ideal (1.0: fully overlapped)")
    return finish(fig)


OVERLAP = Section(
    name="overlap", title="Overlap: loading beside training", sources={"overlap": None},
    about="T1 ms of loading and T2 ms of training, 100 steps: in sequence in one thread, and through `BufferedDataset` "
          "(1 producer, a buffer of 2). The ideal (1.00x): 100 x max(T1, T2), timed in the same run. Real work: soxr "
          "resampling and torch matmuls on one intra-op thread, both releasing the GIL; sleep: the control.",
    table=overlap_table, reading=overlap_reading, plot=overlap_plot,
    alt="epoch time over the ideal, sequential and through audiobuffer")
