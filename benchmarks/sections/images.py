"""Images: training crops through audiobuffer against a Pillow ``Dataset`` fed by ``DataLoader``,
and a Python-bound step fed with images (results ``images``: ``benchmarks/bench_images.py``;
``contention-images``: ``benchmarks/bench_contention.py --images``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, listing, num, ratio, rows_of, table
from .plots import barh, figure, finish

#: How the sentence names the approaches that did not run, by group (a family, or ``pin``).
SKIPPED = {"torchvision": "`ImageFolder` + `transforms.v2`", "spdl": "SPDL",
           "pin": "`pin_memory=True`"}
#: The contention approaches the steps/s sentence and plot name, in their order, and their names.
STEPPERS = {"isolated-2": "`IsolatedLoader`",
            "isolated-auto": "`IsolatedLoader` (auto)",
            "buffered-2": "`BufferedDataset`",
            "buffered-auto": "`BufferedDataset` (auto)",
            "isolated-2-torch": "`IsolatedLoader` (torch)",
            "isolated-2-torch-start": "`IsolatedLoader` (torch, `start_in_trainer=True`)",
            "buffered-2-torch": "`BufferedDataset` (torch)",
            "dataloader-2": "`DataLoader(num_workers=2)`, fork",
            "dataloader-2-spawn": "`DataLoader(num_workers=2)`, spawn"}
#: The approaches the sentence names.
IN_SENTENCE = ("isolated-2", "isolated-2-torch", "isolated-2-torch-start", "buffered-2-torch",
               "dataloader-2")


def _ran(results: Results) -> list[dict[str, Any]]:
    return [r for r in rows_of(results, "images") if "images_per_s" in r]


def _ceilings(results: Results) -> list[dict[str, Any]]:
    """The rows of the pipelines timed alone in one thread, with the ceilings the cores allow."""
    return [r for r in rows_of(results, "images") if "ceiling_images_per_s" in r]


def images_table(results: Results) -> str:
    body = [[r["label"], num(r["images_per_s"], 0), ratio(r.get("vs_fork")),
             num(r["first_batch_s"], 2), num(r["peak_mib"], 0), ratio(r.get("memory_vs_fork"))]
            for r in _ran(results)]
    body += [[f"ceiling: {r['cores']} cores at {r['label']}'s {num(r['ms_per_image'], 2)} ms an "
              "image (one thread)", num(r["ceiling_images_per_s"], 0),
              ratio(r.get("ceiling_vs_fork")), num(r["first_batch_floor_s"], 3), "-", "-"]
             for r in _ceilings(results)]
    return table(["approach", "images/s", "x Pillow 2 fork", "first batch s", "peak MiB (tree)",
                  "memory x fork"], body)


def _skipped(results: Results) -> str:
    groups: dict[str, str] = {}
    for r in rows_of(results, "images"):
        if "skipped" in r:
            group = "pin" if r["approach"].endswith("-pin") else r["approach"].split("-")[0]
            groups.setdefault(SKIPPED.get(group, r["label"]), r["skipped"])
    parts = [f"{name} ({reason})" for name, reason in groups.items()]
    return f"Not run here: {'; '.join(parts)}. " if parts else ""


#: The plain loop of two threads and no library (``bench_images.thread_batches``).
PLAIN_LOOP = "threads-torch"
#: The ``BufferedDataset`` row the goals are read on (here and by ``bench_images.goals``), first
#: found first, with its decoder's one-thread row: batches stacked on arrival and the faster
#: backend, where they ran.
OURS = (("audiobuffer-torch-batches", "one-thread-imagedecoder-torch"),
        ("audiobuffer-torch", "one-thread-imagedecoder-torch"),
        ("audiobuffer", "one-thread-imagedecoder"))


def _ours(results: Results) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    ran = {r["approach"]: r for r in _ran(results)}
    alone = {r["approach"]: r for r in _ceilings(results)}
    return next(((ran[a], alone.get(one)) for a, one in OURS if a in ran), None)


def _ceiling(results: Results) -> str:
    """What the cores allow the goals' ``ImageDecoder``, against the goals on images/s and the
    first batch."""
    found = _ours(results)
    alone = found[1] if found else None
    if alone is None or "ceiling_vs_fork" not in alone or "floor_vs_spawn" not in alone:
        return ""
    most, soonest = alone["ceiling_vs_fork"], alone["floor_vs_spawn"]
    above = [goal for goal, out in (("1.3x", most < 1.3), ("0.05x", soonest > 0.05)) if out]
    verdict = f"the goals {listing(above)} are above" if len(above) == 2 else (
        f"the goal {above[0]} is above" if above else "both goals are within")
    plain = {r["approach"]: r for r in _ran(results)}.get(PLAIN_LOOP)
    measured = "" if plain is None or "first_vs_spawn" not in plain else (
        f"The plain loop (2 threads, that decoder, no library): {ratio(plain.get('vs_fork'))}, "
        f"first batch {plain['first_vs_spawn']:.4f}x. ")
    return (f"The {alone['label']} ceiling (one thread's time over the cores): "
            f"{ratio(most)} the fork rate, a first batch in {soonest:.3f}x spawn's: {verdict} what "
            f"{alone['cores']} cores allow. {measured}")


def _rate(row: dict[str, Any], name: str, key: str = "steps_per_s") -> str:
    return num(row[name][key], 2) if row[name].get(key) is not None else "-"


def _steps(results: Results) -> str:
    """The steps/s of a Python-bound step fed with these images: the first epoch (the loader
    made in it) and the loader's next epoch, where measured."""
    if "contention-images" not in results:
        return ""
    rows = {r["approach"]: r for r in rows_of(results, "contention-images")}
    step = results["contention-images"]["settings"]["steps"]
    name = "heavy" if "heavy" in step else next(iter(step))
    shown = [a for a in IN_SENTENCE if a in rows]
    if not shown:
        return ""
    warm = all(rows[a][name].get("warm_steps_per_s") is not None for a in shown)
    rates = listing([f"{STEPPERS[a]} {_rate(rows[a], name)}"
                     + (f" / {_rate(rows[a], name, 'warm_steps_per_s')}" if warm else "")
                     for a in shown])
    isolated = [a for a in shown if a.startswith("isolated-2")]  # each ratio of a rate shown
    fork = rows.get("dataloader-2")
    versus = ""
    if isolated and fork:
        keys = ("steps_per_s", "warm_steps_per_s") if warm else ("steps_per_s",)
        best = [max(rows[a][name].get(key) or 0.0 for a in isolated) / fork[name][key]
                for key in keys]
        which = "the best `IsolatedLoader`" if len(isolated) > 1 else "`IsolatedLoader`"
        versus = f" ({which} {' / '.join(ratio(b) for b in best)} DataLoader's)"
    settings = results["contention-images"]["settings"]
    files = rows[shown[0]]["files"]
    epochs = ", first / next epoch" if warm else ""
    return (f"Steps/s, the contention section's {name} step ({step[name]} rounds), {files} of "
            f"these JPEGs, 2 producers{epochs}: {rates}{versus}; "
            f"load {settings['load_before']} before, {settings['load_after']} after.")


def images_reading(results: Results) -> str:
    found = _ours(results)
    ours = found[0] if found else None
    text = ""
    if ours is not None and "vs_fork" in ours:
        text = (f"{ours['label']}: {ratio(ours['vs_fork'])} the images/s of Pillow with 2 fork "
                f"workers, {ratio(ours['memory_vs_fork'])} its peak memory")
        if "first_vs_spawn" in ours:
            text += f", its first batch in {ours['first_vs_spawn']:.4f}x spawn's"
        settings = results["images"]["settings"]
        text += f" (load {settings['load_before']} before, {settings['load_after']} after). "
    return (text + _ceiling(results) + _skipped(results) + _steps(results)).strip()


def images_plot(results: Results) -> Any:
    rows = _ran(results)
    steps = rows_of(results, "contention-images")
    fig, axes = figure(1, 3 if steps else 2, width=13 if steps else 10, height=3.4)
    labels = [r["label"].replace("`", "") for r in rows]
    barh(axes[0][0], labels, [r["images_per_s"] for r in rows], title="images/s (median)",
         xlabel="images/s", reference=None)
    barh(axes[0][1], labels, [r["peak_mib"] for r in rows], title="peak memory of the process tree",
         xlabel="MiB", reference=None)
    axes[0][1].set_yticklabels([])
    if steps:
        name = "heavy" if "heavy" in steps[0] else "light"
        shown = [r for r in steps if r["approach"] in STEPPERS]
        labels = [STEPPERS[r["approach"]].replace("`", "").replace("(num_workers=2)", "(2)")
                  for r in shown]
        barh(axes[0][2], labels, [r[name]["steps_per_s"] for r in shown],
             title=f"steps/s, {name} Python-bound step", xlabel="steps/s", reference=None)
    return finish(fig)


IMAGES = Section(
    name="images", title="Images: training crops against a Pillow Dataset and DataLoader",
    sources={"images": None, "contention-images": None},
    about="2000 JPEGs (300-600 px) from photographs scikit-learn and matplotlib ship, 10 "
          "folders; `RandomResizedCrop(224)` + flip, batches of 64, one process a run; Pillow "
          "`Dataset`: as users write it.",
    table=images_table, reading=images_reading, plot=images_plot,
    alt="images/s and peak memory per approach, and steps/s of a Python-bound step fed with images")

