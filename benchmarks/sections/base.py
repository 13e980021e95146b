"""What every section is made of: the :class:`Section`, and the text and numbers its tables are written with.

A section reads one or more saved results (``benchmarks/results/NAME.json``, see ``render.py``), each a
dict with ``machine``, ``versions``, ``date``, ``commit``, ``command`` (a list), ``settings``, ``rows``
and, where the measurement needs one, ``notes``. Tables format the figures as saved; ratios are the ones
the benchmark saved (computed from unrounded times), never recomputed from rounded figures.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Results = Mapping[str, Mapping[str, Any]]

#: The width prose is wrapped at.
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


def short_corpus(corpus: str) -> str:
    """``FLAC``, ``WAV``, ``FSDD``, ``FLAC + log-mel``: a corpus's name before its description."""
    return corpus.split(",")[0].replace("librosa ", "").replace(" per sample", "").strip()


#: The corpora of the contention benchmark, by their short names there.
CORPUS_NAMES = {"fsdd": "FSDD", "wav": "WAV", "flac": "FLAC", "flac+mel": "FLAC + log-mel"}
