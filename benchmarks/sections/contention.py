"""Contention: a Python-bound step fed by each loader (results ``contention`` and ``contention-cuda``)."""

from __future__ import annotations

from typing import Any

from .base import CORPUS_NAMES, Results, Section, in_order, listing, num, ratio, rows_of, table
from .plots import figure, finish, grouped_barh

CONTENTION_SOURCES: dict[str, str | None] = {"contention": "CPU", "contention-cuda": "H100"}


def contention_table(results: Results) -> str:
    present = [(name, label) for name, label in CONTENTION_SOURCES.items() if name in results]
    columns = [(name, label, corpus) for name, label in present
               for corpus in in_order(r["corpus"] for r in rows_of(results, name))]
    by = {(name, r["corpus"], r["approach"]): r for name, _ in present for r in rows_of(results, name)}
    first_name, first_label = present[0]
    first_corpus = rows_of(results, first_name)[0]["corpus"]
    labels = {r["approach"]: r["label"] for name, _ in present for r in rows_of(results, name)}
    header = (["approach"] + [f"{label}: {CORPUS_NAMES.get(corpus, corpus)}" for _, label, corpus in columns]
              + [f"first batch ms, {first_label} {CORPUS_NAMES.get(first_corpus, first_corpus)}",
                 f"peak RSS MiB, {first_label} {CORPUS_NAMES.get(first_corpus, first_corpus)}"])
    body = []
    for approach in in_order(a for name, _ in present for a in (r["approach"] for r in rows_of(results, name))):
        cells = [ratio(by[(n, c, approach)]["light"]["vs_alone"]) if (n, c, approach) in by else "-"
                 for n, _, c in columns]
        ref = by.get((first_name, first_corpus, approach))
        first = ref["light"]["first_batch_s"] if ref else None
        body.append([labels[approach]] + cells + [num(None if first is None else 1000 * first, 0),
                                                  num(ref["peak_rss_mb"] if ref else None, 0)])
    return table(header, body)


def contention_reading(results: Results) -> str:
    alone = []
    for name, label in CONTENTION_SOURCES.items():
        row = next((r for r in rows_of(results, name) if r["approach"] == "step-alone"), None)
        if row is not None:
            alone.append(f"{num(1000 * row['light']['step_s'])} ms on the {label} "
                         f"({CORPUS_NAMES.get(row['corpus'], row['corpus'])})")
    return f"The light step alone took {listing(alone)}." if alone else ""


def contention_plot(results: Results) -> Any:
    present = [(name, label) for name, label in CONTENTION_SOURCES.items() if name in results]
    fig, axes = figure(1, len(present), height=5.5)
    for ax, (name, label) in zip(axes.flat, present):
        rows = rows_of(results, name)
        approaches = in_order(r["approach"] for r in rows)
        corpora = in_order(r["corpus"] for r in rows)
        by = {(r["corpus"], r["approach"]): r for r in rows}
        grouped_barh(ax, approaches, {CORPUS_NAMES.get(c, c): [by[(c, a)]["light"]["vs_alone"] if (c, a) in by
                                                                else None for a in approaches] for c in corpora},
                     title=f"{label}: light step beside each loader", xlabel="step time / step alone (lower is better)")
    return finish(fig)


CONTENTION = Section(
    name="contention", title="Contention: a Python-bound step fed by each loader", sources=CONTENTION_SOURCES,
    about="Producer threads in the training process hold the GIL for the Python of each decode; a GPU step is Python "
          "launching kernels. The light step: 50 rounds of `relu(h @ W) + 0.1` on an (8, 64) tensor, then `.item()`, "
          "one intra-op thread. A cell: the median step beside that loader over the step alone with the data already "
          "there (lower is better), a fresh process per (corpus, approach, run). No loader in the first three rows: "
          "the step alone, fed fresh copies, or beside a process decoding the corpus. WAV and FLAC: 300 generated "
          "files of 1-4 s.",
    table=contention_table, reading=contention_reading, plot=contention_plot,
    alt="the light step's slowdown beside each loader, per corpus, on the CPU and on the H100")
