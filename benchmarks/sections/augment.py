"""Augmentation: speed, noise and reverberation against the plain epoch and Lhotse's own (results
``augment``: ``benchmarks/bench_augment.py``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, num, ratio, rows_of, table
from .plots import figure, finish

#: How the page names each contestant.
LABELS = {"plain": "plain `BufferedDataset`", "augmented": "`AudioDecoder(augment=[...])`",
          "transform": "the same as a per-sample `transform=`", "lhotse 0": "Lhotse, 0 workers",
          "lhotse 2": "Lhotse, 2 workers"}


def _epochs(results: Results) -> list[dict[str, Any]]:
    return [r for r in rows_of(results, "augment") if "vs_plain" in r]


def augment_table(results: Results) -> str:
    body = [[LABELS.get(r["contestant"], r["contestant"]), num(r["epoch_s"], 2), ratio(r["vs_plain"]),
             " / ".join(num(t, 2) for t in r["times_s"])] for r in _epochs(results)]
    body += [[r["contestant"], "-", "-", f"{num(r['per_item_ms'], 2)} ms an item"]
             for r in rows_of(results, "augment") if "per_item_ms" in r]
    return table(["contestant", "warm epoch s", "x plain", "each round s"], body)


def augment_reading(results: Results) -> str:
    rows = {r["contestant"]: r for r in rows_of(results, "augment")}
    augmented, alone = rows.get("augmented"), rows.get("one thread: all three augmentations")
    if augmented is None or alone is None:
        return ""
    settings = results["augment"]["settings"]
    return (f"The augmented epoch took {ratio(augmented['vs_plain'])} the plain one (each round's ratio: "
            f"median {ratio(augmented['vs_plain_rounds_median'])}); in one thread, decoding and augmenting "
            f"take {ratio(alone['decode_plus_augment_over_decode'])} decoding alone, the ceiling where no core "
            f"is idle. "
            + (f"Lhotse's best took {ratio(augmented['lhotse_best_over_this'])} the augmented epoch. "
               if "lhotse_best_over_this" in augmented else "")
            + f"Load average {settings['load_before']} before, {settings['load_after']} after.")


def augment_plot(results: Results) -> Any:
    rows = _epochs(results)
    fig, axes = figure(1, 1, width=7, height=2.6)
    ax = axes[0][0]
    labels = [LABELS.get(r["contestant"], r["contestant"]).replace("`", "") for r in rows]
    ax.barh(labels, [r["epoch_s"] for r in rows], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_title("warm epoch seconds (median; log scale)", fontsize=10)
    ax.tick_params(labelsize=8)
    return finish(fig)


AUGMENT = Section(
    name="augment", title="Augmentation: speed, noise and reverberation",
    sources={"augment": None},
    about="1000 generated FLAC files of 1-4 s, batches of 16, the contestants taking turns in one process. "
          "Augmented: `SpeedPerturb((0.9, 1.0, 1.1))`, `AddNoise(p=0.5)` and `Reverb(p=0.3)` from seeded noise "
          "and impulse-response corpora the script makes; Lhotse: its recipes' `PerturbSpeed`, `CutMix` and "
          "`ReverbWithImpulseResponse` in `K2SpeechRecognitionDataset`. The one-thread rows time each step "
          "over every item.",
    table=augment_table, reading=augment_reading, plot=augment_plot,
    alt="warm epoch seconds, plain, augmented and Lhotse")
