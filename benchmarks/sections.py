"""The sections of BENCHMARKS.md, one per question: what each measures, its table and its plot, made from results.

A section reads one or more saved results (``benchmarks/results/NAME.json``, see ``render.py``), each
a dict with ``machine``, ``versions``, ``date``, ``commit``, ``command`` (a list), ``settings``, ``rows``
and, where the measurement needs one, ``notes``. The tables format the figures as saved; ratios are the
ones the benchmark saved (computed from unrounded times), never recomputed from rounded figures. Plots
import matplotlib on first use, so the page renders without it.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Results = Mapping[str, Mapping[str, Any]]

__all__ = ["INTRO", "SECTIONS", "Section", "anchor"]

INTRO = """\
# Benchmarks

What audiobuffer's loaders gain and cost, one section per question: one table of the current figures,
how and where they were measured (machine, versions, date, commit, the command that measures them
again) and a plot. Ratios compare approaches measured in the same run on the same machine. Sections
were measured on different days, and the CPU machine's host has changed over time (the same loop has
run at different speeds on different dates), so compare figures across sections only where the
machine and the date match.

The machines:
- **CPU**: a virtual machine with 2 cores (x86_64) and no GPU, shared with other work: read
  differences under about 15% as noise.
- **H100**: 16 cores and one NVIDIA H100 80GB HBM3; its timings varied by up to 25% from run to run.

A benchmark run with `--write` saves its results to `benchmarks/results/NAME.json` and renders its
section again (`audiobuffer stress` through `python benchmarks/harness.py NAME -- stress ...`).
`python benchmarks/render.py` renders the whole page and every plot from the saved results, without
measuring anything."""

WIDTH = 110


# -- text ---------------------------------------------------------------------------------------------

def anchor(title: str) -> str:
    """The link anchor GitHub gives a heading ``title``."""
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=" " * len(indent),
                         break_long_words=False, break_on_hyphens=False)


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def num(value: float | None, decimals: int = 2) -> str:
    return "-" if value is None else f"{value:,.{decimals}f}"


def ratio(value: float | None) -> str:
    """``1.23x``; one decimal from 5x up."""
    return "-" if value is None else f"{value:.1f}x" if value >= 5 else f"{value:.2f}x"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def listing(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _method(settings: Mapping[str, Any]) -> str:
    if "runs" in settings:
        return f"medians of {settings['runs']} runs" if settings["runs"] > 1 else "one run"
    if "rounds_per_shape" in settings:
        return f"medians of {settings['rounds_per_shape']} rounds per shape"
    if "rounds" in settings:
        return f"medians of {settings['rounds']} rounds"
    return ""


def _commit(data: Mapping[str, Any]) -> str:
    if not data.get("commit"):
        return "commit unknown"
    return f"commit {data['commit']}" + (" with uncommitted changes" if data.get("dirty") else "")


def measured(sources: Sequence[tuple[Mapping[str, Any], str | None]]) -> str:
    """Where and how each results was measured, one list item per machine: the machine and the versions,
    then for each results its date, commit and commands (not wrapped: they copy whole)."""
    lines: list[str] = []
    machine = None
    for data, label in sources:
        if (data["machine"], data["versions"], label) != machine:
            machine = (data["machine"], data["versions"], label)
            lines.append(f"- {label or 'Machine'}: {data['machine']}; {data['versions']}.")
        method = _method(data.get("settings", {}))
        commands = ", then ".join(f"`{c}`" for c in data["command"])
        lines.append(f"  Measured {data['date']}, {_commit(data)}{', ' + method if method else ''}: {commands}")
    return "\n".join(lines)


# -- a section ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Section:
    """One question of the page: its results (names, each with the label of its machine where there are
    several), what it measures (``about``), and functions of the results for the table, a sentence read
    from the figures (optional) and the plot (a matplotlib figure)."""

    name: str
    title: str
    sources: dict[str, str | None]
    about: str
    table: Callable[[Results], str]
    plot: Callable[[Results], Any]
    alt: str
    reading: Callable[[Results], str] | None = field(default=None)

    def has_results(self, results: Results) -> bool:
        return any(name in results for name in self.sources)

    def render(self, results: Results) -> str:
        parts = [f"## {self.title}", wrap(self.about), self.table(results)]
        if self.reading is not None:
            sentence = self.reading(results)
            if sentence:
                parts.append(wrap(sentence))
        present = [(name, label) for name, label in self.sources.items() if name in results]
        parts += [wrap(note) for name, _ in present for note in results[name].get("notes", [])]
        parts.append(measured([(results[name], label) for name, label in present]))
        parts.append(f"![{self.alt}](benchmarks/{self.name}.png)")
        return "\n\n".join(parts)


def rows_of(results: Results, name: str) -> list[dict[str, Any]]:
    return list(results[name]["rows"]) if name in results else []


def in_order(values: Iterable[Any]) -> list[Any]:
    """``values`` without repeats, in their first order."""
    return list(dict.fromkeys(values))


# -- plots --------------------------------------------------------------------------------------------

FAMILY_COLORS = {"audiobuffer": "tab:blue", "isolated": "tab:cyan", "dataloader": "tab:gray", "loop": "tab:green",
                 "peer": "tab:orange"}


def family(approach: str) -> str:
    """Which kind of loader an approach name or label is, for its colour."""
    lowered = approach.lower()
    for key, names in (("isolated", ("isolated",)), ("dataloader", ("dataloader",)),
                       ("audiobuffer", ("audiobuffer", "buffered", "batchslot", "pool", "auto", "producer",
                                        "prefetcher", "devicetensor", "index", "streamed")),
                       ("loop", ("loop", "step alone"))):
        if any(n in lowered for n in names):
            return key
    return "peer"


def figure(rows: int, columns: int, width: float = 10.0, height: float = 3.2) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    return plt.subplots(rows, columns, figsize=(width, height * rows), squeeze=False)


def barh(ax: Any, labels: Sequence[str], values: Sequence[float | None], *, title: str, xlabel: str,
         reference: float | None = 1.0, colors: Sequence[str] | None = None, log: bool = False) -> None:
    """Horizontal bars, top to bottom in the order given; a missing value is left out."""
    kept = [(label, value, (colors or [FAMILY_COLORS[family(label)]] * len(labels))[i])
            for i, (label, value) in enumerate(zip(labels, values)) if value is not None]
    ax.barh([k[0] for k in kept], [k[1] for k in kept], color=[k[2] for k in kept])
    ax.invert_yaxis()
    if reference is not None:
        ax.axvline(reference, color="black", linewidth=0.8)
    if log:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.tick_params(labelsize=8)


def grouped_barh(ax: Any, labels: Sequence[str], series: Mapping[str, Sequence[float | None]], *, title: str,
                 xlabel: str, reference: float | None = 1.0) -> None:
    """Several series of horizontal bars side by side for each label; a missing value is left out."""
    height = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ys = [y + i * height for y, v in enumerate(values) if v is not None]
        ax.barh(ys, [v for v in values if v is not None], height=height, label=name)
    ax.set_yticks([y + 0.4 - height / 2 for y in range(len(labels))], labels)
    ax.invert_yaxis()
    if reference is not None:
        ax.axvline(reference, color="black", linewidth=0.8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(4, len(series)), frameon=False)


def finish(fig: Any) -> Any:
    fig.tight_layout()
    return fig


# -- decode: audiobuffer against its peers --------------------------------------------------------------

def short_corpus(corpus: str) -> str:
    """``FLAC``, ``WAV``, ``FSDD``, ``FLAC + log-mel``: a corpus's name before its description."""
    return corpus.split(",")[0].replace("librosa ", "").replace(" per sample", "").strip()


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
    about="One epoch through each loader, each approach in a fresh process, the approaches taking turns: the same "
          "files, `AudioDecoder`, transform and `pad_collate`, batches of 16. `loop` decodes in the training thread "
          "(`loop-libsndfile`: WAV through libsndfile); `dataloader-N` is `DataLoader(num_workers=N)` (fork; "
          "`-spawn`, `-pin`); `audiobuffer-N` is `BufferedDataset(num_producers=N)`, `-auto` its default; "
          "`isolated-2` is `IsolatedLoader`; the peers: torchdata's `ParallelMapper`, prefetch_generator's "
          "`BackgroundGenerator`, SPDL's pipeline and a loop over SPDL's `load_wav`. FLAC and WAV: 1000 generated "
          "files of 1-4 s at 16 kHz (+ log-mel: a librosa log-mel per sample, which holds the GIL); FSDD: 3000 "
          "recordings under a second at 8 kHz. Epoch seconds (lower is faster) include each loader's start.",
    table=decode_table, reading=decode_reading, plot=decode_plot,
    alt="each approach's epoch speed against the loop, per corpus")


# -- epochs: auto against fixed counts, epoch after epoch -------------------------------------------------

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
    return (f"At epoch {last}, `auto` took {listing(parts)} the time of the best fixed count (under 1.00x: "
            "faster).")


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
    about="A training run reuses its dataset: from the second epoch on, `num_producers=\"auto\"` starts at the "
          "count the last epoch settled on instead of paying its first trials again. One `BufferedDataset` per "
          "setting runs its epochs into a `DataLoader` (batches of 16), the settings taking turns epoch by epoch; "
          "the loops decode in the training thread, as references. The decode section's corpora; lower is faster.",
    table=epochs_table, reading=epochs_reading, plot=epochs_plot, alt="epoch seconds per epoch, per setting")


# -- overlap: loading beside training ---------------------------------------------------------------------

def overlap_table(results: Results) -> str:
    rows = rows_of(results, "overlap")
    by = {(r["work"], r["t1_ms"], r["t2_ms"]): r for r in rows}
    body = []
    for t1, t2 in in_order((r["t1_ms"], r["t2_ms"]) for r in rows):
        real, sleep = by.get(("real", t1, t2)), by.get(("sleep", t1, t2))
        body.append([t1, t2] + ([num(real["sequential_s"], 3), num(real["audiobuffer_s"], 3), num(real["ideal_s"], 3),
                                 ratio(real["over_ideal"])] if real else ["-"] * 4)
                    + [ratio(sleep["over_ideal"]) if sleep else "-"])
    return table(["T1 ms", "T2 ms", "real: sequential s", "real: audiobuffer s", "real: ideal s",
                  "real: audiobuffer / ideal", "sleep: audiobuffer / ideal"], body)


def overlap_reading(results: Results) -> str:
    rows = rows_of(results, "overlap")
    spans = []
    for work, doing in (("real", "with real work"), ("sleep", "sleeping")):
        values = [r["over_ideal"] for r in rows if r["work"] == work]
        if values:
            spans.append(f"{ratio(min(values))}-{ratio(max(values))} of the ideal {doing}")
    return f"audiobuffer took {listing(spans)}." if spans else ""


def overlap_plot(results: Results) -> Any:
    rows = rows_of(results, "overlap")
    cells = in_order((r["t1_ms"], r["t2_ms"]) for r in rows)
    by = {(r["work"], r["t1_ms"], r["t2_ms"]): r for r in rows}

    def series(work: str, key: str) -> list[float | None]:
        return [by[(work, *c)][key] / by[(work, *c)]["ideal_s"] if (work, *c) in by else None for c in cells]

    fig, axes = figure(1, 1, width=8, height=4)
    grouped_barh(axes[0][0], [f"T1 {a} ms, T2 {b} ms" for a, b in cells],
                 {"sequential, real work": series("real", "sequential_s"),
                  "audiobuffer, real work": series("real", "audiobuffer_s"),
                  "audiobuffer, sleep": series("sleep", "audiobuffer_s")},
                 title="epoch time over the ideal n * max(T1, T2)", xlabel="time / ideal (1.0: fully overlapped)")
    return finish(fig)


OVERLAP = Section(
    name="overlap", title="Overlap: loading beside training", sources={"overlap": None},
    about="A load step of T1 ms and a train step of T2 ms, n of each (100): in sequence in one thread, and through "
          "`BufferedDataset` (1 producer, a buffer of 2). The ideal is n * max(T1, T2): the larger of the loads "
          "alone and the train steps alone, timed in the same run (1.00x). Real work: soxr resampling and torch "
          "matmuls on one intra-op thread, both of which release the GIL; sleep: the control.",
    table=overlap_table, reading=overlap_reading, plot=overlap_plot,
    alt="epoch time over the ideal, sequential and through audiobuffer")


# -- contention: a Python-bound step fed by each loader ---------------------------------------------------

CONTENTION_SOURCES: dict[str, str | None] = {"contention": "CPU", "contention-cuda": "H100"}
CORPUS_NAMES = {"fsdd": "FSDD", "wav": "WAV", "flac": "FLAC", "flac+mel": "FLAC + log-mel"}


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
    about="A GPU training step is Python launching small kernels, and producer threads in the training process hold "
          "the GIL for the Python of every decode. The light step: 50 rounds of `relu(h @ W) + 0.1` on an (8, 64) "
          "tensor, then `.item()`, one intra-op thread, on the CPU or the GPU. Each cell is the median step beside "
          "that loader over the step alone with the data already there (lower is better); each (corpus, "
          "approach, run) is a fresh process running one epoch. The first three rows have no loader: the step "
          "alone, receiving each batch as a fresh copy, and beside another process decoding the corpus. WAV and "
          "FLAC: 300 generated files of 1-4 s. The first batch includes the worker or helper process's start.",
    table=contention_table, reading=contention_reading, plot=contention_plot,
    alt="the light step's slowdown beside each loader, per corpus, on the CPU and on the H100")


# -- GPU training: threads against the helper process ------------------------------------------------------

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
    about="`scripts/train_audio.py` trains the small log-mel CNN of `configs/fsdd.yaml` on the GPU (2700 FSDD files, "
          "batches of 32, 1 s crops, features on the GPU, 4 epochs): a step of Python launching kernels, fed from "
          "tiny WAV files. Producer threads in the training process take the GIL from it for every decode; "
          "`IsolatedLoader` (`buffer.isolate: true`) decodes in a helper process. The pipelines take turns, each "
          "run a fresh process; the first epoch, which pays the helper's start, is left out. "
          "`python benchmarks/bench_train.py --write` runs this on a GPU.",
    table=train_table, plot=train_plot, alt="epoch seconds after the first, threads and helper process")


# -- the device path -----------------------------------------------------------------------------------------

DEVICE_SOURCES: dict[str, str | None] = {"device-cpu": "CPU", "device-cuda": "H100"}
DEVICE_PARTS = {"prefetch": ("ms per step", "ms_per_step", 2), "tensors": ("epoch s", "epoch_s", 3),
                "slots": ("files/s", "files_per_s", 0)}


def _device_rows(results: Results, name: str) -> list[dict[str, Any]]:
    """The rows of one device run; of the prefetch rows, those at the machine's own intra-op threads."""
    rows = rows_of(results, name)
    threads = max((r["intra_op_threads"] for r in rows if r["part"] == "prefetch"), default=None)
    return [r for r in rows if r["part"] != "prefetch" or r["intra_op_threads"] == threads]


def device_table(results: Results) -> str:
    present = [(name, label) for name, label in DEVICE_SOURCES.items() if name in results]
    by = {(name, r["part"], r["label"]): r for name, _ in present for r in _device_rows(results, name)}
    header = ["figure", "loop or loader"] + [h for _, label in present for h in (str(label), "speed-up")]
    body = []
    for part, (unit, key, decimals) in DEVICE_PARTS.items():
        labels = in_order(r["label"] for name, _ in present for r in _device_rows(results, name) if r["part"] == part)
        for i, label in enumerate(labels):
            cells: list[str] = []
            for name, _ in present:
                row = by.get((name, part, label))
                cells += [num(row[key], decimals), ratio(row["ratio"])] if row else ["-", "-"]
            body.append([unit if i == 0 else "", label] + cells)
    return table(header, body)


def device_plot(results: Results) -> Any:
    present = [(name, label) for name, label in DEVICE_SOURCES.items() if name in results]
    fig, axes = figure(1, len(DEVICE_PARTS), width=12, height=3.4)
    titles = {"prefetch": "prefetch (speed-up over copying in the loop)",
              "tensors": "tensors on the device (over DataLoader)", "slots": "batch slots (over the collate path)"}
    for ax, part in zip(axes.flat, DEVICE_PARTS):
        labels = in_order(r["label"] for name, _ in present for r in _device_rows(results, name) if r["part"] == part)
        by = {(name, r["label"]): r["ratio"] for name, _ in present for r in _device_rows(results, name)
              if r["part"] == part}
        grouped_barh(ax, [textwrap.fill(label, 24, break_long_words=False) for label in labels],
                     {str(label): [by.get((name, lab)) for lab in labels] for name, label in present},
                     title=titles[part], xlabel="speed-up (higher is faster)")
    return finish(fig)


def device_reading(results: Results) -> str:
    steps = []
    for name, label in DEVICE_SOURCES.items():
        if name in results:
            settings = results[name]["settings"]
            steps.append(f"{num(settings['step_ms'][0], 1)} ms ({settings['layers'][0]} layers) on the {label}")
    return f"The prefetch step took {listing(steps)}." if steps else ""


DEVICE = Section(
    name="device", title="Device path: prefetch, tensors on the device, batch slots", sources=DEVICE_SOURCES,
    about="Three ways to cut the host's work between batches. `DevicePrefetcher` copies the next batch (4 MiB) on a "
          "side stream while the step runs (a step grown to a few ms on the device at hand), against the loop "
          "that copies each batch itself; `DeviceTensorLoader` keeps whole tensors on the device (60000 x 784 "
          "float32, batches of 128, one shuffled epoch), against `DataLoader(TensorDataset)`; `BatchSlotLoader` "
          "writes rows into recycled (pinned) batches, against `BufferedDataset` + `DataLoader(pad_collate, "
          "pin_memory)` (640 FLAC files of 1-2 s, 1 s crops, batches of 32, 2 producers). Higher is faster.",
    table=device_table, reading=device_reading, plot=device_plot,
    alt="speed-ups of the prefetcher, DeviceTensorLoader and the batch slots")


# -- packed shards and object storage -----------------------------------------------------------------------------

def _storage_place(settings: Mapping[str, Any], where: str) -> str:
    def shards(n: int) -> str:
        return f"{n} shard{'s' * (n != 1)}"

    if where == "local":
        return f"local shards ({settings['files']} files, {shards(settings['shards'])})"
    return (f"S3, {settings['delay_ms']:g} ms a request ({settings['remote_files']} files, "
            f"{shards(settings['remote_shards'])})")


def storage_table(results: Results) -> str:
    data = results["storage"]
    body, last = [], None
    for row in data["rows"]:
        place = _storage_place(data["settings"], row["where"])
        epoch = num(row["median_s"], 3 if row["where"] == "local" else 2)  # as many decimals as the run resolves
        body.append([place if place != last else "", row["approach"], epoch,
                     num(row["files_per_s"], 0), ratio(row["vs_loop"]), num(row["peak_rss_rise_mb"], 1)])
        last = place
    return table(["data", "approach", "epoch s", "files/s", "vs loop", "peak RSS rise MiB"], body)


def storage_reading(results: Results) -> str:
    settings = results["storage"]["settings"]
    cpu = settings.get("request_cpu_ms")
    if not cpu:
        return ""
    return (f"Over S3 every request cost {num(sum(cpu.values()), 1)} ms of CPU in the server, the proxy and the "
            f"client together, all on this machine's cores, which caps the threads near "
            f"{ratio(settings['request_cap'])} the per-member loop here, whatever their count; against a real "
            "object store the server's share is on other machines.")


def storage_plot(results: Results) -> Any:
    data = results["storage"]
    places = in_order(r["where"] for r in data["rows"])
    fig, axes = figure(1, len(places), width=12, height=3.4)
    for ax, where in zip(axes.flat, places):
        rows = [r for r in data["rows"] if r["where"] == where]
        barh(ax, [textwrap.fill(r["approach"].replace("`", ""), 40, break_long_words=False) for r in rows],
             [r["vs_loop"] for r in rows],
             title=_storage_place(data["settings"], where), xlabel="speed against the loop (log; higher is faster)",
             log=True)
    return finish(fig)


STORAGE = Section(
    name="storage", title="Packed shards and object storage", sources={"storage": None},
    about="FSDD packed into tar shards with an index (`audiobuffer pack`): an epoch by index (members read by byte "
          "range) and of the streamed shards, against `soundfile.read` over the original files; then FSDD on an S3 "
          "server (moto on 127.0.0.1) behind a proxy that holds every request 20 ms, against single-threaded "
          "loops that read each member with a ranged GET, or each shard whole. The approaches take turns.",
    table=storage_table, reading=storage_reading, plot=storage_plot,
    alt="each approach's speed against the loop, local shards and S3")


# -- duration batches: padding and throughput -----------------------------------------------------------------

def durations_table(results: Results) -> str:
    body = []
    throughput = rows_of(results, "batches")
    if throughput:
        budget = results["batches"]["settings"]["budget"]
        samples = next(r for r in throughput if r["mode"] == "samples")
        by_duration = [r for r in throughput if r["mode"] == "by duration"]
        ratios = ", ".join(f"{ratio(r['vs_samples'])} ({r['producers']} producers)".replace("(auto producers)",
                                                                                         "(`auto`)")
                           for r in by_duration)
        size = samples["batching"].split("=")[1]
        body.append(["FSDD, decoded", f"{budget:g}", size, percent(by_duration[0]["padding"]),
                     percent(samples["padding"]), ratios])
    for row in rows_of(results, "padding"):
        body.append([row["corpus"], f"{row['max_batch_seconds']:g}", num(row["mean_batch_size"], 1),
                     percent(row["padding_duration"]), percent(row["padding_random"]), "-"])
    return table(["corpus", "max_batch_seconds", "mean batch size", "padding, by duration",
                  "padding, random batches", "audio s/s, by duration / samples"], body)


def durations_plot(results: Results) -> Any:
    labels, by_duration, random = [], [], []
    throughput = rows_of(results, "batches")
    if throughput:
        budget = results["batches"]["settings"]["budget"]
        labels.append(f"FSDD, decoded, {budget:g} s")
        by_duration.append(100 * next(r for r in throughput if r["mode"] == "by duration")["padding"])
        random.append(100 * next(r for r in throughput if r["mode"] == "samples")["padding"])
    for row in rows_of(results, "padding"):
        labels.append(f"{row['corpus'].split(' (')[0]}, {row['max_batch_seconds']:g} s")
        by_duration.append(100 * row["padding_duration"])
        random.append(100 * row["padding_random"])
    fig, axes = figure(1, 1, width=8, height=3.2)
    grouped_barh(axes[0][0], labels, {"batches by duration": by_duration, "random batches, same size": random},
                 title="padding: padded frames / frames in the batches", xlabel="percent (lower is better)",
                 reference=None)
    return finish(fig)


DURATIONS = Section(
    name="duration-batches", title="Duration batches: padding and throughput",
    sources={"padding": None, "batches": None},
    about="With `max_batch_seconds`, batches are cut from duration buckets so that a batch's padded length "
          "(count x longest) stays within the budget. Padding: the share of padded frames (the mean over 5 "
          "epochs), against random batches of the same mean size; durations from the file headers (FSDD) or "
          "drawn log-normal in 1-20 s (speech-like). The first row decodes FSDD through `BufferedDataset`, "
          "batches by duration against sample mode, and compares the seconds of audio delivered per second.",
    table=durations_table, plot=durations_plot, alt="padding of batches by duration and of random batches")


# -- the buffer stress test and soak --------------------------------------------------------------------------

def stress_table(results: Results) -> str:
    stress, soak = rows_of(results, "stress"), rows_of(results, "soak")
    soaked = {(r["producers"], r["consumers"], r["capacity"]): r for r in soak}
    header = ["producers x consumers x capacity", "queue.Queue get, items/s", "Buffer get, items/s", "vs Queue",
              "Buffer get_many, items/s", "vs Queue"]
    minutes = results["soak"]["settings"].get("minutes") if soak else None
    if soak:
        header += [f"{minutes:g}-minute soak: get vs Queue", "soak: get_many vs Queue"]
    body = []
    for row in stress or soak:
        shape = (row["producers"], row["consumers"], row["capacity"])
        cells = [" x ".join(map(str, shape)), num(row["queue_items_per_s"], 0), num(row["buffer_items_per_s"], 0),
                 ratio(row["ratio"]), num(row["buffer_many_items_per_s"], 0), ratio(row["ratio_many"])]
        if soak:
            s = soaked.get(shape)
            cells += [ratio(s["ratio"]), ratio(s["ratio_many"])] if s else ["-", "-"]
        body.append(cells)
    return table(header, body)


def stress_reading(results: Results) -> str:
    parts = []
    for name in ("stress", "soak"):
        if name in results:
            s = results[name]["settings"]
            files = ("open files not counted" if s["fds_start"] is None else
                     f"open files {s['fds_start']} / {s['fds_peak']} / {s['fds_end']}")
            parts.append(f"the {'soak' if name == 'soak' else 'stress test'} moved {s['items_moved']:,} items in "
                         f"{s['rounds']:,} rounds: {s['lost']} lost, {s['duplicated']} duplicated, "
                         f"{s['bound_violations']} rounds over the bound; threads {s['threads_start']} / "
                         f"{s['threads_peak']} / {s['threads_end']} and {files} (at the start / at most / at the end)")
    return ("Checks: " + "; ".join(parts) + ".") if parts else ""


def stress_plot(results: Results) -> Any:
    series: dict[str, list[float | None]] = {}
    shapes: list[str] = []
    for name, label in (("stress", "stress"), ("soak", "soak")):
        rows = rows_of(results, name)
        shapes = shapes or [f"{r['producers']} x {r['consumers']} x {r['capacity']}" for r in rows]
        if rows:
            series[f"get, {label}"] = [r["ratio"] for r in rows]
            series[f"get_many, {label}"] = [r["ratio_many"] for r in rows]
    fig, axes = figure(1, 1, width=8, height=3.4)
    grouped_barh(axes[0][0], shapes, series, title="Buffer against queue.Queue (producers x consumers x capacity)",
                 xlabel="items/s over queue.Queue's (higher is faster)")
    return finish(fig)


STRESS = Section(
    name="stress", title="Buffer stress test and soak", sources={"stress": None, "soak": None},
    about="P producer threads move numbered items to C consumer threads through a `Buffer`, against `queue.Queue` "
          "of the same shape in the same run: items per second, 100,000 items a round with no delays. `get` takes "
          "one item per call, as `queue.Queue.get` does; `get_many` every ready item at once, as "
          "`BufferedDataset`'s consumer does. Every round (jittered ones too) checks that each item arrives "
          "exactly once and the buffer never holds more than its capacity; the soak also checks that threads and "
          "open files stay flat.",
    table=stress_table, reading=stress_reading, plot=stress_plot, alt="Buffer's items/s over queue.Queue's per shape")


# -- free-threaded Python ------------------------------------------------------------------------------------------

def free_threaded_table(results: Results) -> str:
    rows = rows_of(results, "free-threaded")
    corpora = in_order(r["corpus"] for r in rows)
    by = {(r["corpus"], r["approach"]): r for r in rows}
    header = ["approach"] + [f"{short_corpus(c)}: GIL {gil} s" for c in corpora for gil in ("on", "off")]
    body = []
    for approach in in_order(r["approach"] for r in rows):
        cells = []
        for corpus in corpora:
            row = by.get((corpus, approach))
            cells += [num(row["gil_on_s"], 3), num(row["gil_off_s"], 3)] if row else ["-", "-"]
        body.append([approach] + cells)
    return table(header, body)


def free_threaded_reading(results: Results) -> str:
    rows = rows_of(results, "free-threaded")
    on = sorted({str(v) for r in rows for v in r["gil_reported"]["on"]})
    off = sorted({str(v) for r in rows for v in r["gil_reported"]["off"]})
    return (f"In the children `sys._is_gil_enabled()` was {' and '.join(on)} with `PYTHON_GIL=1` and "
            f"{' and '.join(off)} with `PYTHON_GIL=0`; every epoch yielded each item once.")


def free_threaded_plot(results: Results) -> Any:
    rows = rows_of(results, "free-threaded")
    corpora = in_order(r["corpus"] for r in rows)
    fig, axes = figure(1, len(corpora), width=12, height=3.2)
    for ax, corpus in zip(axes.flat, corpora):
        mine = [r for r in rows if r["corpus"] == corpus]
        grouped_barh(ax, [r["approach"] for r in mine],
                     {"GIL on": [r["on_vs_soundfile_loop"] for r in mine],
                      "GIL off": [r["off_vs_soundfile_loop"] for r in mine]},
                     title=short_corpus(corpus), xlabel="speed against the soundfile loop (higher is faster)")
    return finish(fig)


FREE_THREADED = Section(
    name="free-threaded", title="Free-threaded Python: the producer pool with the GIL on and off",
    sources={"free-threaded": None},
    about="The producer pool with the GIL on (`PYTHON_GIL=1`) and off (`PYTHON_GIL=0`) on one free-threaded "
          "interpreter, without torch, as the `IsolatedLoader`'s helper runs it (numpy samples and collate), "
          "batches of 16. `soundfile-loop` reads through libsndfile and `loop` with audiobuffer's WAV reader, in "
          "one thread; `pool-N` decodes in N producer threads. Each (GIL, corpus, approach, run) is a fresh "
          "process; epoch seconds, lower is faster.",
    table=free_threaded_table, reading=free_threaded_reading, plot=free_threaded_plot,
    alt="speed against the soundfile loop with the GIL on and off")


#: The page's sections, in order.
SECTIONS = [DECODE, EPOCHS, OVERLAP, CONTENTION, TRAIN, DEVICE, STORAGE, DURATIONS, STRESS, FREE_THREADED]
