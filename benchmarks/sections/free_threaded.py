"""Free-threaded Python: the producer pool with the GIL on and off (results ``free-threaded``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, in_order, num, rows_of, short_corpus, table
from .plots import figure, finish, grouped_barh


def free_threaded_table(results: Results) -> str:
    rows = rows_of(results, "free-threaded")
    corpora = in_order(r["corpus"] for r in rows)
    by = {(r["corpus"], r["approach"]): r for r in rows}
    header = ["approach"] + [f"{short_corpus(c)}: GIL {gil} s" for c in corpora for gil in ("on", "off")]
    body = []
    for approach in in_order(r["approach"] for r in rows):
        cells = []
        for corpus in corpora:
            row = by.get((corpus, approach))
            cells += [num(row["gil_on_s"], 3), num(row["gil_off_s"], 3)] if row else ["-", "-"]
        body.append([approach] + cells)
    return table(header, body)


def free_threaded_reading(results: Results) -> str:
    rows = rows_of(results, "free-threaded")
    on = sorted({str(v) for r in rows for v in r["gil_reported"]["on"]})
    off = sorted({str(v) for r in rows for v in r["gil_reported"]["off"]})
    return (f"In the children `sys._is_gil_enabled()` was {' and '.join(on)} with `PYTHON_GIL=1` and "
            f"{' and '.join(off)} with `PYTHON_GIL=0`; every epoch yielded each item once.")


def free_threaded_plot(results: Results) -> Any:
    rows = rows_of(results, "free-threaded")
    corpora = in_order(r["corpus"] for r in rows)
    fig, axes = figure(1, len(corpora), width=12, height=3.2)
    for ax, corpus in zip(axes.flat, corpora):
        mine = [r for r in rows if r["corpus"] == corpus]
        grouped_barh(ax, [r["approach"] for r in mine],
                     {"GIL on": [r["on_vs_soundfile_loop"] for r in mine],
                      "GIL off": [r["off_vs_soundfile_loop"] for r in mine]},
                     title=short_corpus(corpus), xlabel="speed against the soundfile loop (higher is faster)")
    return finish(fig)


FREE_THREADED = Section(
    name="free-threaded", title="Free-threaded Python: the producer pool with the GIL on and off",
    sources={"free-threaded": None},
    about="The producer pool on a free-threaded interpreter, GIL on (`PYTHON_GIL=1`) and off (`PYTHON_GIL=0`), without "
          "torch, as `IsolatedLoader`'s helper runs it (numpy collate, batches of 16). `soundfile-loop` and `loop` "
          "(audiobuffer's WAV reader) use one thread, `pool-N` N threads; each run is a fresh process.",
    table=free_threaded_table, reading=free_threaded_reading, plot=free_threaded_plot,
    alt="speed against the soundfile loop with the GIL on and off")
