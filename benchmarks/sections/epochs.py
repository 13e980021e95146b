"""Epoch after epoch: ``auto`` against pinned producer counts, each after another loader (results ``epochs``:
``benchmarks/bench_tuner.py``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, in_order, listing, num, ratio, rows_of, table
from .plots import figure, finish


def _short(corpus: str) -> str:
    """``speech``, ``FLAC``, ``FSDD``: a corpus's name before its description."""
    return corpus.split(":")[0].strip()


def epochs_table(results: Results) -> str:
    rows = rows_of(results, "epochs")
    corpora = in_order(r["corpus"] for r in rows)
    count = max(len(r["epochs_s"]) for r in rows)
    by = {(r["corpus"], r["setting"]): r for r in rows}
    epochs = " / ".join(str(e) for e in range(1, count + 1))
    header = ["contestant"] + [f"{_short(c)}: epoch {epochs} s" for c in corpora]
    body = []
    for setting in in_order(r["setting"] for r in rows):
        label = next(r["label"] for r in rows if r["setting"] == setting)
        cells = []
        for corpus in corpora:
            row = by.get((corpus, setting))
            cells.append(" / ".join(num(s, 2) for s in row["epochs_s"]) if row else "-")
        body.append([label, *cells])
    return table(header, body)


def epochs_reading(results: Results) -> str:
    rows = [r for r in rows_of(results, "epochs") if r["setting"] == "auto"]
    if not rows:
        return ""
    parts = [" / ".join(ratio(v) for v in r["vs_best_pinned"]) + f" ({_short(r['corpus'])})" for r in rows]
    settings = results["epochs"]["settings"]
    return (f"`auto` over the best pinned count, epoch by epoch: {listing(parts)}; load average "
            f"{settings['load_before']} before, {settings['load_after']} after.")


def epochs_plot(results: Results) -> Any:
    rows = rows_of(results, "epochs")
    corpora = in_order(r["corpus"] for r in rows)
    fig, axes = figure(1, len(corpora), height=3.6)
    for ax, corpus in zip(axes.flat, corpora):
        for row in (r for r in rows if r["corpus"] == corpus):
            epochs = range(1, len(row["epochs_s"]) + 1)
            style = "-o" if row["setting"] == "auto" else "--" if row["setting"] == "loop" else ":."
            ax.plot(list(epochs), row["epochs_s"], style, label=row["setting"], markersize=4)
            ax.set_xticks(list(epochs))
        ax.set_title(_short(corpus), fontsize=10)
        ax.set_xlabel("epoch", fontsize=9)
        ax.set_ylabel("seconds", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=8)
    axes.flat[-1].legend(fontsize=7)
    return finish(fig)


EPOCHS = Section(
    name="epochs", title="Epoch after epoch: auto against pinned producer counts", sources={"epochs": None},
    about="`num_producers=\"auto\"` tries counts as an epoch runs and starts the next where the last settled, "
          "checking that a settled count still pays. Contestants take turns in one process, each with its own "
          "loader, `auto` after each other in turn. Speech: duration batches (`max_batch_seconds=120`, 10 "
          "buckets); FLAC, FSDD: batches of 16.",
    table=epochs_table, reading=epochs_reading, plot=epochs_plot, alt="epoch seconds per epoch, per contestant")
