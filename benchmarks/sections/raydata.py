"""The Ray path's cost on one machine: ``audiobuffer.ray.read`` against ``BufferedDataset``
(results ``ray``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, in_order, listing, num, ratio, rows_of, table
from .plots import figure, finish, grouped_barh

#: The loaders, by their names in the rows.
LOADERS = {"buffered": "`BufferedDataset` + `DataLoader`",
           "ray": "`audiobuffer.ray.read` + `iter_torch_batches`"}


def _short(corpus: str) -> str:
    return corpus.split(":")[0].strip()


def ray_table(results: Results) -> str:
    rows = rows_of(results, "ray")
    by = {(r["corpus"], r["loader"]): r for r in rows}
    corpora = in_order(r["corpus"] for r in rows)
    body = []
    for loader, label in LOADERS.items():
        cells = [f"{num(by[(c, loader)]['epoch_s'])} ({ratio(by[(c, loader)]['vs_buffered'])})"
                 if (c, loader) in by else "-" for c in corpora]
        body.append([label, *cells])
    return table(["loader", *(f"{c}: epoch s (vs BufferedDataset)" for c in corpora)], body)


def ray_reading(results: Results) -> str:
    rows = [r for r in rows_of(results, "ray") if r["loader"] == "ray"]
    if not rows:
        return ""
    settings = results["ray"]["settings"]
    every = all(r["every_item"] for r in rows_of(results, "ray"))
    ratios = listing([f"{ratio(r['vs_buffered'])} ({_short(r['corpus'])})" for r in rows])
    return (f"The Ray path's epoch over BufferedDataset's: {ratios} (goal: {settings['goal']}x); "
            f"every item once in every run: {'yes' if every else 'no'}. A local cluster of "
            f"{settings['ray_cpus']} CPUs, started in {settings['ray_start_s']:.1f} s (not "
            f"counted); load average {settings['load_before']} before, "
            f"{settings['load_after']} after.")


def ray_plot(results: Results) -> Any:
    rows = rows_of(results, "ray")
    corpora = in_order(r["corpus"] for r in rows)
    by = {(r["corpus"], r["loader"]): r["epoch_s"] for r in rows}
    series = {label.replace("`", ""): [by.get((c, loader)) for c in corpora]
              for loader, label in LOADERS.items()}
    fig, axes = figure(1, 1, width=8, height=2.6)
    grouped_barh(axes[0][0], [_short(c) for c in corpora], series,
                 title="one shuffled epoch, batches of 32", xlabel="seconds (lower is better)",
                 reference=None, colors=["tab:blue", "tab:green"])
    return finish(fig)


RAY = Section(
    name="ray", title="The Ray path on one machine", sources={"ray": None},
    about="The same shuffled epoch through `audiobuffer.ray.read(...).iter_torch_batches` (a local "
          "Ray cluster, a new dataset per epoch) and through `BufferedDataset` + `DataLoader`, "
          "batches of 32 padded; what Ray costs where one machine decodes.",
    table=ray_table, reading=ray_reading, plot=ray_plot,
    alt="epoch seconds, BufferedDataset and the Ray path")
