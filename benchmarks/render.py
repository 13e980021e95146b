"""BENCHMARKS.md and its plots, made from the saved results in ``benchmarks/results/`` (nothing is measured here).

    python benchmarks/render.py              # rewrite BENCHMARKS.md and every plot from the saved results
    python benchmarks/render.py --check      # exit 1 where BENCHMARKS.md is not what the saved results give
    python benchmarks/render.py --no-plots   # the page only

Each benchmark saves its raw results to ``benchmarks/results/NAME.json`` (:func:`save`): the machine, the
versions, the commands, the date and commit, its settings and its rows (:func:`harness.results` makes
that dict). Each section of the page (:data:`sections.SECTIONS`) answers one question from one or more of
those files: one table, how and where it was measured, and a plot ``benchmarks/SECTION.png``. A
benchmark run with ``--write`` calls :func:`publish`, which saves its results and renders the page and
that section's plot again, so the page is always what the saved results give.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sections
from harness import BENCHMARKS, REPO
from sections import SECTIONS, Section

#: Where each benchmark's results are saved, one ``NAME.json`` per results name.
RESULTS = Path(__file__).resolve().parent / "results"
#: The resolution of the plots (small files that stay readable).
DPI = 80

__all__ = ["RESULTS", "load_all", "main", "page", "plot_path", "preview", "publish", "save", "section_text",
           "write_page"]


# -- the saved results --------------------------------------------------------------------------------

def save(results: Mapping[str, Any], folder: Path = RESULTS) -> Path:
    """Write ``results`` to ``folder/NAME.json`` (UTF-8, ``\\n``), NAME being ``results["name"]``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{results['name']}.json"
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8", newline="\n")
    return path


def load_all(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every saved results file in ``folder``, by name."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if "name" not in data:  # written by a script in its own format (bench_ranks.py): no section of the page
            continue
        if data.get("name") != path.stem:
            raise ValueError(f"{path}: its 'name' is {data.get('name')!r}, not {path.stem!r} (the file's name)")
        found[path.stem] = data
    return found


# -- the page -----------------------------------------------------------------------------------------

def plot_path(section: Section, folder: Path = REPO) -> Path:
    """Where ``section``'s plot is written, under the repository ``folder``."""
    return folder / "benchmarks" / f"{section.name}.png"


def section_text(section: Section, results: Mapping[str, Mapping[str, Any]]) -> str:
    """``section`` between its markers: title, what it measures, table, reading, where measured, plot."""
    return "\n".join([f"<!-- {section.name}:start -->", section.render(results),
                      f"<!-- {section.name}:end -->"])


def page(results: Mapping[str, Mapping[str, Any]]) -> str:
    """BENCHMARKS.md: the introduction, then every section that has results, one after the other (a section's
    end marker followed by the next one's start). GitHub and the documentation site list the sections."""
    present = [s for s in SECTIONS if s.has_results(results)]
    body = "\n".join(section_text(s, results) for s in present)
    return "\n\n".join([sections.INTRO, body]) + "\n"


def write_page(results: Mapping[str, Mapping[str, Any]], path: Path = BENCHMARKS) -> None:
    path.write_text(page(results), encoding="utf-8", newline="\n")


def draw(section: Section, results: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """Draw ``section``'s plot to ``path`` (PNG; matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = section.plot(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.savefig(path, dpi=DPI)
    finally:
        plt.close(figure)


def publish(results: Mapping[str, Any], *, folder: Path = RESULTS, page_path: Path = BENCHMARKS,
            plots: bool = True) -> list[Section]:
    """Save ``results`` and render the page again from every saved result; draw the plot of each section
    that uses them. Returns those sections (none: the results are saved, but no section shows them)."""
    save(results, folder)
    everything = load_all(folder)
    write_page(everything, page_path)
    touched = [s for s in SECTIONS if results["name"] in s.sources]
    if plots:
        for section in touched:
            draw(section, everything, plot_path(section, page_path.parent))
    return touched


def preview(results: Mapping[str, Any], folder: Path = RESULTS, *, name: str | None = None) -> str:
    """The sections that show ``results``, as they read with ``results`` saved (what a benchmark prints);
    ``name``: in the place of the results of that name (a smoke run's results, which no section shows)."""
    name = name or results["name"]
    everything = {**load_all(folder), name: results}
    shown = [section_text(s, everything) for s in SECTIONS if name in s.sources]
    return "\n\n".join(shown) if shown else f"(no section of BENCHMARKS.md shows the results {name!r})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 where BENCHMARKS.md differs from what the saved results give")
    parser.add_argument("--no-plots", action="store_true", help="render the page only")
    args = parser.parse_args(argv)
    results = load_all()
    if args.check:
        if BENCHMARKS.read_text(encoding="utf-8") != page(results):
            print(f"{BENCHMARKS} is not what {RESULTS} gives: run python benchmarks/render.py", file=sys.stderr)
            return 1
        return 0
    write_page(results)
    print(f"wrote {BENCHMARKS}")
    if not args.no_plots:
        for section in SECTIONS:
            if section.has_results(results):
                draw(section, results, plot_path(section))
                print(f"wrote {plot_path(section)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
