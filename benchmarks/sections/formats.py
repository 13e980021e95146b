"""Reading what users have: Parquet, shards, Lhotse cuts and segments of long recordings (results ``formats``
and ``segments``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, listing, num, ratio, rows_of, table
from .plots import barh, figure, finish


def formats_table(results: Results) -> str:
    return table(["form", "epoch s", "vs files"],
                 [[r["form"], num(r["median_s"], 3), ratio(r["vs_files"])] for r in rows_of(results, "formats")])


def formats_reading(results: Results) -> str:
    rows = rows_of(results, "segments")
    if not rows:
        return ""
    settings = results["segments"]["settings"]
    parts = [f"{r['format']} {num(r['segment_ms'])} ms against {num(r['file_ms'])} ms ({ratio(r['ratio'])})"
             for r in rows]
    return (f"Decoding a {settings['segment_s']:g} s segment of a {settings['hours']:g}-hour recording "
            f"(`WorkItem.segment`, as a cut or a `start_column` gives it) against a {settings['segment_s']:g} s file "
            f"of its own: {listing(parts)}.")


def formats_plot(results: Results) -> Any:
    forms, segments = rows_of(results, "formats"), rows_of(results, "segments")
    panels = [p for p in (forms, segments) if p]
    fig, axes = figure(1, len(panels), width=12 if len(panels) == 2 else 7, height=3.0)
    column = iter(axes.flat)
    if forms:
        barh(next(column), [r["form"].replace("`", "") for r in forms], [r["vs_files"] for r in forms],
             title="one epoch, against the same audio as files", xlabel="time against the files (lower is faster)",
             colors=["tab:blue"] * len(forms))
    if segments:
        seconds, hours = (results["segments"]["settings"][key] for key in ("segment_s", "hours"))
        barh(next(column), [r["format"] for r in segments], [r["ratio"] for r in segments],
             title=f"a {seconds:g} s segment of a {hours:g}-hour recording, against a {seconds:g} s file",
             xlabel="decode time against the file's (lower is faster)", colors=["tab:blue"] * len(segments))
    return finish(fig)


FORMATS = Section(
    name="formats", title="Reading what users have: Parquet, shards, Lhotse, segments",
    sources={"formats": None, "segments": None},
    about="The decode section's FLAC corpus as users keep it: files; a Parquet file of Hugging Face `datasets` "
          "(`audio` bytes, row groups of 100); tar shards, streamed and by index; Lhotse cuts of 10-minute recordings "
          "made of the files. An epoch of `BufferedDataset(..., AudioDecoder(), shuffle=True, num_producers=2)` each, "
          "in turns.",
    table=formats_table, reading=formats_reading, plot=formats_plot,
    alt="each form's epoch time against the files, and a segment's decode against a file's")
