"""The Ray path's cost on one machine: ``audiobuffer.ray.read`` against ``BufferedDataset``
(results ``ray``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, in_order, num, ratio, rows_of, table
from .plots import figure, finish, grouped_barh

#: The loaders, by their names in the rows.
LOADERS = {"buffered": "`BufferedDataset` + `DataLoader`",
           "ray": "`audiobuffer.ray.read` + `iter_torch_batches`",
           "floor": "Ray Data alone, nothing decoded",
           "plain": "Ray Data decoding with soundfile"}


def _short(corpus: str) -> str:
    return corpus.split(":")[0].strip()


def _load(text: str) -> str:
    """The 1-minute load average of ``load_average()``'s ``1/5/15``."""
    return text.split("/")[0]


def ray_table(results: Results) -> str:
    rows = rows_of(results, "ray")
    if not rows:
        return ""
    settings = results["ray"]["settings"]
    load = f"{_load(settings['load_before'])} / {_load(settings['load_after'])}"
    by = {(r["corpus"], r["loader"]): r for r in rows}
    body = []
    for corpus in in_order(r["corpus"] for r in rows):
        ours, theirs = by.get((corpus, "ray")), by.get((corpus, "buffered"))
        # absent from results saved before they were measured
        floor, plain = by.get((corpus, "floor")), by.get((corpus, "plain"))
        every = all(r["every_item"] for r in (ours, theirs, floor, plain) if r is not None)
        body.append([corpus, num(theirs["epoch_s"]) if theirs else "-",
                     num(ours["epoch_s"]) if ours else "-",
                     ratio(ours["vs_buffered"]) if ours else "-", _with_ratio(plain),
                     _with_ratio(floor), _bound(floor, theirs, settings["ray_cpus"]),
                     "yes" if every else "no", load])
    return table(["corpus", "BufferedDataset s", "audiobuffer.ray s", "ratio (goal "
                  f"{settings['goal']}x)", "Ray Data decoding with soundfile: s (ratio)",
                  "Ray Data alone, nothing decoded: s (ratio)", "CPU bound of the Ray path",
                  "every item once", "load before / after"], body)


def _with_ratio(row: dict[str, Any] | None) -> str:
    return f"{num(row['epoch_s'])} ({ratio(row['vs_buffered'])})" if row else "-"


def _bound(floor: dict[str, Any] | None, buffered: dict[str, Any] | None, cores: int) -> str:
    """The least the Ray path can take as a ratio of ``BufferedDataset``'s epoch: the CPU seconds
    of Ray alone and of the decoding, over the cores ("-" where a row lacks them)."""
    if floor is None or buffered is None or "cpu_s" not in floor or "cpu_s" not in buffered:
        return "-"
    return ratio((floor["cpu_s"] + buffered["cpu_s"]) / cores / buffered["epoch_s"])


def ray_plot(results: Results) -> Any:
    rows = rows_of(results, "ray")
    corpora = in_order(r["corpus"] for r in rows)
    by = {(r["corpus"], r["loader"]): r["epoch_s"] for r in rows}
    series = {label.replace("`", ""): [by.get((c, loader)) for c in corpora]
              for loader, label in LOADERS.items() if any((c, loader) in by for c in corpora)}
    fig, axes = figure(1, 1, width=8, height=2.6)
    grouped_barh(axes[0][0], [_short(c) for c in corpora], series,
                 title="one shuffled epoch, batches of 32", xlabel="seconds (lower is better)",
                 reference=None,
                 colors=["tab:blue", "tab:green", "tab:gray", "tab:orange"][:len(series)])
    return finish(fig)


RAY = Section(
    name="ray", title="The Ray path on one machine", sources={"ray": None},
    about="One shuffled epoch, padded batches of 32: `audiobuffer.ray.read` on a local Ray cluster "
          "vs `BufferedDataset`; the same epoch in Ray Data alone, its blocks read with soundfile "
          "in `map_batches` (what Ray Data allows here), and with nothing decoded (the floor). "
          "CPU bound: the CPU seconds of the floor and of `BufferedDataset` (each over its process "
          "tree) over the cores.",
    table=ray_table, plot=ray_plot,
    alt="epoch seconds, BufferedDataset and the Ray path")
