"""Epoch after epoch: ``auto`` against fixed producer counts (results ``epochs``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, in_order, listing, num, ratio, rows_of, short_corpus, table
from .plots import figure, finish


def epochs_table(results: Results) -> str:
    rows = rows_of(results, "epochs")
    corpora = in_order(r["corpus"] for r in rows)
    last = max(len(r["epochs_s"]) for r in rows)
    by = {(r["corpus"], r["setting"]): r for r in rows}
    header = ["setting"] + [f"{short_corpus(c)}: epoch {e} s" for c in corpora for e in (1, last)]
    body = []
    for setting in in_order(r["setting"] for r in rows):
        label = next(r["label"] for r in rows if r["setting"] == setting)
        cells = []
        for corpus in corpora:
            row = by.get((corpus, setting))
            cells += [num(row["epochs_s"][0], 3), num(row["epochs_s"][-1], 3)] if row else ["-", "-"]
        body.append([label] + cells)
    return table(header, body)


def epochs_reading(results: Results) -> str:
    rows = [r for r in rows_of(results, "epochs") if r["setting"] == "auto" and r["vs_best_fixed"] is not None]
    if not rows:
        return ""
    last = len(rows[0]["epochs_s"])
    parts = [f"{ratio(r['vs_best_fixed'])} ({short_corpus(r['corpus'])})" for r in rows]
    return f"At epoch {last}, `auto` took {listing(parts)} the time of the best fixed count."


def epochs_plot(results: Results) -> Any:
    rows = rows_of(results, "epochs")
    corpora = in_order(r["corpus"] for r in rows)
    fig, axes = figure(1, len(corpora), height=3.6)
    for ax, corpus in zip(axes.flat, corpora):
        for row in (r for r in rows if r["corpus"] == corpus):
            epochs = range(1, len(row["epochs_s"]) + 1)
            style = "-o" if row["setting"] in ("auto", "1", "2") else "--"
            ax.plot(list(epochs), row["epochs_s"], style, label=row["setting"], markersize=4)
            ax.set_xticks(list(epochs))
        ax.set_title(short_corpus(corpus), fontsize=10)
        ax.set_xlabel("epoch", fontsize=9)
        ax.set_ylabel("seconds", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=8)
    axes.flat[-1].legend(fontsize=7)
    return finish(fig)


EPOCHS = Section(
    name="epochs", title="Epoch after epoch: auto against fixed producer counts", sources={"epochs": None},
    about="From the second epoch on, `num_producers=\"auto\"` starts at the count the last epoch settled on. One "
          "`BufferedDataset` per setting runs its epochs into a `DataLoader` (batches of 16), the settings taking "
          "turns epoch by epoch; the loops, in the training thread, are references. The decode section's corpora.",
    table=epochs_table, reading=epochs_reading, plot=epochs_plot, alt="epoch seconds per epoch, per setting")
