"""A per-sample transform (librosa's log-mel) behind each loader, fresh processes: first and warm
epochs against the loop (results ``transform``: ``benchmarks/bench_transform.py``)."""

from __future__ import annotations

from typing import Any

from .base import Results, Section, num, ratio, rows_of, table
from .plots import figure, finish, grouped_barh

#: How the page names each contestant.
LABELS = {"loop": "the loop", "loop-blas1": "the loop, BLAS on one thread",
          "dataset": "`BufferedDataset`", "isolated-fg": "`IsolatedLoader`",
          "isolated-bg": "`IsolatedLoader(background=True)`",
          "isolated-start": "`IsolatedLoader(start_in_trainer=True)`",
          "dataset-blas": "`BufferedDataset`, BLAS left alone",
          "isolated-blas": "`IsolatedLoader`, BLAS left alone"}


def _label(row: dict[str, Any]) -> str:
    return LABELS.get(row["contestant"], row["contestant"])


def transform_table(results: Results) -> str:
    body = [[_label(r), num(r["first_s"]), f"{r.get('first_over_loop_s', 0.0):+.2f}",
             num(r["warm_s"]), ratio(r.get("warm_speed_vs_loop")),
             f"{r['load_min']:.1f}-{r['load_max']:.1f}"]
            for r in rows_of(results, "transform")]
    return table(["contestant", "first epoch s", "over the loop s", "warm epoch s", "speed vs loop",
                  "load"], body)


def transform_reading(results: Results) -> str:
    settings = results["transform"]["settings"]
    between = settings.get("between_s", 0.0)
    return (f"{settings['files']} FLAC files of 1-4 s, each decoded to its log-mel spectrogram "
            f"by librosa in the decoding thread, batches of 16; each run a "
            f"fresh process with librosa loaded before the clock; {between:g} s between the "
            f"loader's construction and its first `iter()`. The first epoch counts from the "
            f"construction (an `IsolatedLoader`'s helper starts there).")


def transform_plot(results: Results) -> Any:
    rows = rows_of(results, "transform")
    fig, axes = figure(1, 1, width=7, height=2.6)
    grouped_barh(axes[0][0], [_label(r).replace("`", "") for r in rows],
                 {"first epoch": [r["first_s"] for r in rows],
                  "warm epoch": [r["warm_s"] for r in rows]},
                 title="epoch seconds (median)", xlabel="seconds (lower is better)", reference=None,
                 colors=["tab:orange", "tab:blue"])
    return finish(fig)


TRANSFORM = Section(
    name="transform", title="A per-sample transform: first and warm epochs",
    sources={"transform": None},
    about="The loop, `BufferedDataset` and `IsolatedLoader` with a log-mel transform per sample.",
    table=transform_table, plot=transform_plot, reading=transform_reading,
    alt="first and warm epoch seconds with a log-mel transform per sample")
