"""Plot helpers of the sections: colours by kind of loader, figures, bars. matplotlib is imported on first use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
                 xlabel: str, reference: float | None = 1.0, colors: Sequence[str] | None = None) -> None:
    """Several series of horizontal bars side by side for each label (``colors``: one per series; default
    matplotlib's cycle); a missing value is left out."""
    height = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ys = [y + i * height for y, v in enumerate(values) if v is not None]
        ax.barh(ys, [v for v in values if v is not None], height=height, label=name,
                **({"color": colors[i]} if colors else {}))
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
