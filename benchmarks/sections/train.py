"""GPU training: threads against the helper process (results ``train-cuda``: ``benchmarks/bench_train.py``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, num, ratio, rows_of, table
from .plots import barh, figure, finish


def train_table(results: Results) -> str:
    data = results["train-cuda"]
    settings = data["settings"]
    decimals = settings.get("decimals", 2)
    first, last = settings["first_epoch"], settings["epochs"]
    counted = f"epochs {first}-{last}" if last > first else f"epoch {first}"
    body = []
    for row in data["rows"]:
        runs = " / ".join(", ".join(num(e, decimals) for e in run) for run in row["epochs_s"])
        low, high = row["test_accuracy_range"]
        body.append([row["label"], runs, num(row["median_s"], decimals), num(row["mean_s"], 2),
                     ratio(row["vs_threads"]), f"{100 * low:g}-{100 * high:g}%" if low != high else f"{100 * low:g}%"])
    return table(["pipeline", f"{counted} s, each run", "median s", "mean s", "vs threads", "test accuracy"], body)


def train_plot(results: Results) -> Any:
    rows = rows_of(results, "train-cuda")
    fig, axes = figure(1, 1, width=7, height=2.6)
    ax = axes[0][0]
    labels = [r["label"].replace("`", "") for r in rows]
    barh(ax, labels, [r["median_s"] for r in rows], title="epoch seconds after the first (median; dots: each epoch)",
         xlabel="seconds (lower is faster)", reference=None)
    for y, row in enumerate(rows):
        epochs = [e for run in row["epochs_s"] for e in run]
        ax.plot(epochs, [y] * len(epochs), "k.", markersize=5)
    return finish(fig)


TRAIN = Section(
    name="train-cuda", title="GPU training: threads against the helper process", sources={"train-cuda": None},
    about="`scripts/train_audio.py` trains the log-mel CNN of `configs/fsdd.yaml` on the GPU (2700 FSDD files, batches "
          "of 32, 1 s crops, 4 epochs): a step of Python launching kernels, fed by producer threads that take the GIL "
          "from it or by `IsolatedLoader`'s helper process. In turns, a fresh process per run "
          "(`benchmarks/bench_train.py --write`); the first epoch, which pays the helper's start, is left out.",
    table=train_table, plot=train_plot, alt="epoch seconds after the first, threads and helper process")
