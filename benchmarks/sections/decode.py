"""Decode speed: audiobuffer against its peers (results ``decode``: ``benchmarks/bench_decode.py``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, in_order, listing, num, rows_of, short_corpus, table
from .plots import barh, figure, finish


def decode_table(results: Results) -> str:
    rows = rows_of(results, "decode")
    corpora = in_order(r["corpus"] for r in rows)
    first = corpora[0]
    by = {(r["corpus"], r["approach"]): r for r in rows}
    header = (["approach"] + [f"{short_corpus(c)}: epoch s" for c in corpora]
              + [f"first batch ms, {short_corpus(first)}", f"peak RSS MiB, {short_corpus(first)}"])
    body = []
    for approach in in_order(r["approach"] for r in rows):
        cells = [num(by[(c, approach)]["total_s"]) if (c, approach) in by else "-" for c in corpora]
        ref = by.get((first, approach))
        body.append([approach] + cells + [num(1000 * ref["first_batch_s"], 0) if ref else "-",
                                          num(ref["peak_rss_mb"], 0) if ref else "-"])
    return table(header, body)


def decode_reading(results: Results) -> str:
    rows = rows_of(results, "decode")
    fastest = []
    for corpus in in_order(r["corpus"] for r in rows):
        best = min((r for r in rows if r["corpus"] == corpus), key=lambda r: r["total_s"])
        fastest.append(f"{short_corpus(corpus)} `{best['approach']}` ({num(best['total_s'])} s)")
    return f"Fastest per corpus: {listing(fastest)}."


def decode_plot(results: Results) -> Any:
    rows = rows_of(results, "decode")
    corpora = in_order(r["corpus"] for r in rows)
    fig, axes = figure((len(corpora) + 1) // 2, 2, height=4.2)
    for ax, corpus in zip(axes.flat, corpora):
        mine = [r for r in rows if r["corpus"] == corpus]
        barh(ax, [r["approach"] for r in mine], [r["vs_loop"] for r in mine], title=short_corpus(corpus),
             xlabel="epoch speed against the loop (higher is faster)")
    for ax in list(axes.flat)[len(corpora):]:
        ax.set_visible(False)
    return finish(fig)


DECODE = Section(
    name="decode", title="Decode speed: audiobuffer against its peers", sources={"decode": None},
    about="One epoch (start included) per loader, each in a fresh process, in turns: the same files, `AudioDecoder`, "
          "transform and `pad_collate`, batches of 16. `loop` decodes in the training thread (`-libsndfile`: WAV "
          "through libsndfile); `dataloader-N` is `DataLoader(num_workers=N)` (fork; `-spawn`, `-pin`); "
          "`audiobuffer-N` is `BufferedDataset(num_producers=N)`, `-auto` its default; `isolated-2` is "
          "`IsolatedLoader`; peers: torchdata's `ParallelMapper`, prefetch_generator, SPDL's pipeline and `load_wav`. "
          "FLAC, WAV: 1000 generated files of 1-4 s, 16 kHz (+ log-mel: librosa's, per sample, holding the GIL); FSDD: "
          "3000 files under 1 s, 8 kHz.",
    table=decode_table, reading=decode_reading, plot=decode_plot,
    alt="each approach's epoch speed against the loop, per corpus")
