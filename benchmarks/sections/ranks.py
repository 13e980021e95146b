"""Ranks in step: batches by duration across ranks, against Lhotse (results ``ranks``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, in_order, percent, rows_of, table
from .plots import figure, finish, grouped_barh

#: The loaders of the benchmark, by their names in the rows.
LOADERS = {"audiobuffer": "audiobuffer", "lhotse": "Lhotse"}
#: Each loader's colour, light without ``sync_buckets`` and dark with it.
COLORS = {("audiobuffer", False): "lightsteelblue", ("audiobuffer", True): "tab:blue",
          ("lhotse", False): "navajowhite", ("lhotse", True): "tab:orange"}


def _by_setup(results: Results) -> dict[tuple[int, float], dict[tuple[str, bool], dict[str, Any]]]:
    """The rows of each (ranks, budget), by (loader, sync_buckets), in the order measured."""
    rows = rows_of(results, "ranks")
    setups = in_order((r["ranks"], r["max_batch_seconds"]) for r in rows)
    return {setup: {(r["loader"], r["sync_buckets"]): r for r in rows
                    if (r["ranks"], r["max_batch_seconds"]) == setup} for setup in setups}


def _batches(row: dict[str, Any], epochs: int) -> int:
    """All the batches of a row: per rank and epoch, times the ranks and the epochs."""
    return round(row["batches"] * row["ranks"] * epochs)


def ranks_table(results: Results) -> str:
    epochs = results["ranks"]["settings"]["epochs"]
    body = []
    for (ranks, budget), by in _by_setup(results).items():
        gaps = [percent(by[(loader, sync)]["gap"]) if (loader, sync) in by else "-"
                for loader in LOADERS for sync in (False, True)]
        lhotse = by.get(("lhotse", True))
        over = f"{lhotse['over_budget']} of {_batches(lhotse, epochs)}" if lhotse else "-"
        padding = " / ".join(percent(by[(loader, True)]["padding"]) if (loader, True) in by else "-"
                             for loader in LOADERS)
        body.append([ranks, f"{budget:g}", *gaps, padding, over])
    return table(["ranks", "max_batch_seconds", "step gap: audiobuffer", "audiobuffer, synced", "Lhotse",
                  "Lhotse, synced", "padding, synced: audiobuffer / Lhotse", "Lhotse, synced: batches over budget"],
                 body)


def ranks_reading(results: Results) -> str:
    rows = rows_of(results, "ranks")
    ours = [r for r in rows if r["loader"] == "audiobuffer"]
    theirs = [r for r in rows if r["loader"] == "lhotse"]
    if not ours:
        return ""
    settings = results["ranks"]["settings"]
    corpus, epochs = settings["corpus"], settings["epochs"]
    if all(r["every_item"] and r["spread"] == 0 and r["over_budget"] == 0 for r in ours):
        found = (f"audiobuffer gave the ranks equal batch counts, every item each epoch (up to "
                 f"{max(r['repeated_items'] for r in ours):.1f} repeated to even out the ranks) and no batch over "
                 "the budget, in every row")
    else:
        found = "audiobuffer left an item out, gave the ranks different batch counts or a batch over the budget"
    sentence = (f"Over {epochs} epoch{'s' * (epochs != 1)} of {corpus['items']} generated durations "
                f"({corpus['min_s']:g}-{corpus['max_s']:g} s, log-normal; nothing decoded), {settings['buckets']} "
                f"buckets, {found}.")
    missing = sorted({r["sync_buckets"] for r in theirs if not r["every_item"]})
    if missing:
        which = {(False,): "without `sync_buckets`", (True,): "with `sync_buckets`"}.get(tuple(missing), "")
        sentence += f" Lhotse's epochs {which} left items out.".replace("  ", " ")
    return sentence


def ranks_plot(results: Results) -> Any:
    setups = _by_setup(results)
    labels = [f"{ranks} ranks, {budget:g} s" for ranks, budget in setups]
    series, colors = {}, []
    for loader, name in LOADERS.items():
        for sync in (False, True):
            if any((loader, sync) in by for by in setups.values()):
                series[f"{name}{', sync_buckets' if sync else ''}"] = [
                    100 * by[(loader, sync)]["gap"] if (loader, sync) in by else None for by in setups.values()]
                colors.append(COLORS[(loader, sync)])
    fig, axes = figure(1, 1, width=8, height=3.4)
    grouped_barh(axes[0][0], labels, series, title="mean gap between the ranks' padded lengths at a step",
                 xlabel="percent of the longest (lower is better)", reference=None, colors=colors)
    return finish(fig)


RANKS = Section(
    name="ranks", title="Ranks in step: batches by duration across ranks", sources={"ranks": None},
    about="Under DDP each step waits for the slowest rank. A step's gap: (longest - shortest) / longest of the ranks' "
          "padded lengths (a batch's longest item), averaged over the steps; `sync_buckets=True` draws all ranks' "
          "batches of a step from one bucket. audiobuffer against Lhotse's `DynamicBucketingSampler`, same budget and "
          "buckets.",
    table=ranks_table, reading=ranks_reading, plot=ranks_plot,
    alt="mean step gap across ranks, with and without sync_buckets, audiobuffer and Lhotse")
