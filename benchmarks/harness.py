"""The benchmarks' shared harness: timing and medians, the machine's description, and saving results.

Each benchmark saves its raw results (:func:`results`: the machine, the versions, the command, the date
and commit, its settings and rows) to ``benchmarks/results/NAME.json`` and renders its section of
BENCHMARKS.md again (``render.py``). Importing this module puts this checkout's ``audiobuffer`` first on
``sys.path``: a benchmark measures the code beside it.

Run as a script, it saves what ``audiobuffer stress`` measures and renders its section:

    python benchmarks/harness.py stress -- stress --rounds 5
    python benchmarks/harness.py soak -- stress --minutes 10 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
BENCHMARKS = REPO / "BENCHMARKS.md"
#: The shared data beside the repository (``AUDIOBUFFER_SHARED`` overrides the folder).
SHARED = Path(os.environ.get("AUDIOBUFFER_SHARED", REPO.parent / "shared"))
#: The FSDD recordings in the shared data.
FSDD = SHARED / "data" / "fsdd" / "recordings"

__all__ = ["BENCHMARKS", "FSDD", "REPO", "PeakRSS", "add_write_options", "command_line", "fsdd_files", "interleaved",
           "machine_info", "median_time", "read_lines", "record", "results", "revision", "table", "timed",
           "write_lines", "write_results"]


# -- timing -----------------------------------------------------------------------------------------

def timed(fn: Callable[[], object]) -> float:
    """The wall seconds of one call of ``fn``."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_time(fn: Callable[[], object], runs: int) -> tuple[float, list[float]]:
    """Run ``fn`` ``runs`` times; return the median wall time and all times."""
    times = [timed(fn) for _ in range(runs)]
    return statistics.median(times), times


def interleaved(fns: Mapping[str, Callable[[], object]], runs: int) -> dict[str, list[float]]:
    """Each function's wall times over ``runs`` rounds, the functions taking turns within a round, so that
    a busy spell of a shared machine slows them alike instead of one function's runs."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return times


class PeakRSS:
    """The peak resident memory of this process while the block runs, sampled every 5 ms (psutil).

    Only this process: :func:`audiobuffer.cli.bench.run_with_peak_rss` measures a child's whole tree.
    """

    def __enter__(self) -> PeakRSS:
        import psutil

        self._proc = psutil.Process()
        self.before = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-rss", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):  # a sampling period, not synchronisation
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, self._proc.memory_info().rss)


# -- inputs -----------------------------------------------------------------------------------------

def fsdd_files(folder: Path = FSDD) -> list[str]:
    """The FSDD recordings in ``folder``, sorted; none, with a note on stderr, where it holds none."""
    found = sorted(str(p) for p in folder.glob("*.wav")) if folder.is_dir() else []
    if not found:
        print(f"FSDD not found at {folder}: that corpus is left out", file=sys.stderr)
    return found


def write_lines(path: Path, lines: Iterable[str]) -> None:
    """One line per item, UTF-8 and ``\\n`` on every platform (file lists carry any file name)."""
    path.write_text("\n".join(lines), encoding="utf-8", newline="\n")


def read_lines(path: Path) -> list[str]:
    """The non-empty lines :func:`write_lines` wrote."""
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line]


# -- the results ------------------------------------------------------------------------------------

def machine_info() -> dict[str, str]:
    """This machine (architecture, usable cores, GPU) and the versions that matter, as two lines."""
    import numpy
    import soundfile

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    versions = (f"numpy {numpy.__version__}, soundfile {soundfile.__version__} "
                f"(libsndfile {soundfile.__libsndfile_version__})")
    try:
        import torch
    except ImportError:  # an interpreter without torch (bench_free_threaded.py runs the torch-free parts)
        return {"machine": f"{platform.machine()}, {cores} cores",
                "versions": f"Python {platform.python_version()}, no torch, {versions}"}
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return {"machine": f"{platform.machine()}, {cores} cores, {gpu}",
            "versions": f"Python {platform.python_version()}, torch {torch.__version__}, {versions}; "
                        f"intra-op threads {torch.get_num_threads()}"}


#: What a measured checkout may hold besides the code measured: the page, the results and the plots.
_OUTPUTS = ["BENCHMARKS.md", "benchmarks/results", "benchmarks/*.png"]


def revision() -> tuple[str | None, bool]:
    """The checkout's commit (short hash; ``None`` outside a git checkout) and whether its tracked files
    differ from it (the benchmarks' own outputs left out)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changes = git("status", "--porcelain", "--untracked-files=no", "--", ".", *(f":!{p}" for p in _OUTPUTS))
    except (OSError, subprocess.SubprocessError):
        return None, False
    return head, bool(changes)


def command_line(script: str, argv: Sequence[str], python: str = "python") -> str:
    """How ``benchmarks/SCRIPT`` was run, as a command to copy."""
    return " ".join([python, f"benchmarks/{script}", *argv])


def results(name: str, rows: Sequence[Mapping[str, object]], *, command: str | Sequence[str],
            settings: Mapping[str, object] | None = None, versions: str | None = None,
            machine: Mapping[str, str] | None = None) -> dict[str, object]:
    """What a benchmark saves to ``benchmarks/results/NAME.json`` (``render.publish``): this machine (or
    ``machine``, from :func:`machine_info` taken where the figures were measured), the versions (``versions``
    replaces them), today's date (UTC), this checkout's commit, the commands, the settings and the rows."""
    import datetime

    info = dict(machine) if machine is not None else machine_info()
    commit, dirty = revision()
    data: dict[str, object] = {
        "name": name, "machine": info["machine"], "versions": versions or info["versions"],
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), "commit": commit,
        "command": [command] if isinstance(command, str) else list(command), "settings": dict(settings or {}),
        "rows": [dict(row) for row in rows]}
    if dirty:
        data["dirty"] = True
    return data


def add_write_options(parser: argparse.ArgumentParser, name: str) -> None:
    """``--write`` (save ``results/NAME.json`` and render BENCHMARKS.md), and where to: ``--results`` and
    ``--page`` (a smoke run's results kept out of the real page)."""
    parser.add_argument("--write", action="store_true", help=f"save results/{name}.json and render BENCHMARKS.md")
    parser.add_argument("--results", type=Path, default=None,
                        help="with --write: the results folder (default benchmarks/results)")
    parser.add_argument("--page", type=Path, default=BENCHMARKS, help="with --write: the page (default BENCHMARKS.md)")


def load_average() -> str:
    """The 1, 5 and 15-minute load averages as ``0.52/0.61/0.70`` (``n/a`` on Windows, which has
    none)."""
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def write_results(measured: Mapping[str, Any], args: argparse.Namespace) -> None:
    """Save ``measured`` and render the page again (``render.publish``) where ``args`` (from
    :func:`add_write_options`) asks for it; otherwise nothing."""
    import render

    if args.write:
        render.publish(measured, folder=args.results or render.RESULTS, page_path=args.page)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _stress_results(name: str, args: Sequence[str], report: Mapping[str, Any]) -> dict[str, object]:
    """``audiobuffer stress --json``'s report as results: its shapes the rows, the rest the settings."""
    settings = {key: value for key, value in report.items() if key != "summary"}
    return results(name, report["summary"], command=f"python benchmarks/harness.py {name} -- {' '.join(args)}",
                   settings=settings)


#: The ``audiobuffer`` commands :func:`record` saves, each with what makes results of its JSON report.
RECORDED = {"stress": _stress_results}


def record(name: str, args: Sequence[str], *, folder: Path | None = None, page: Path = BENCHMARKS) -> int:
    """Run ``audiobuffer ARGS --json ...`` in a fresh process of this interpreter (this checkout's package),
    save what it measured as the results ``name`` and render the page again (``render.publish``).

    Returns:
        The command's exit status. A run that wrote no report (bad arguments, ``--help``) saves nothing;
        one that did is saved whatever its status (a stress run that lost items says so).
    """
    import json
    import tempfile

    import render

    if not args or args[0] not in RECORDED:
        raise ValueError(f"harness records the audiobuffer commands {sorted(RECORDED)}, not {list(args)[:1]}")
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryDirectory(prefix="audiobuffer-record-") as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run([sys.executable, "-m", "audiobuffer", *args, "--json", str(report)], env=env,
                              check=False)
        if not report.exists():
            return done.returncode
        measured = RECORDED[args[0]](name, args, json.loads(report.read_text(encoding="utf-8")))
    render.publish(measured, folder=folder or render.RESULTS, page_path=page)
    print(render.preview(measured))
    return done.returncode


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(usage="%(prog)s [-h] [--results DIR] [--page FILE] NAME -- stress ...",
                                     description="Save what an audiobuffer command measures as the results NAME "
                                                 "and render BENCHMARKS.md again.")
    parser.add_argument("name", help="the results' name (benchmarks/results/NAME.json): stress or soak")
    parser.add_argument("--results", type=Path, default=None, help="the results folder (default benchmarks/results)")
    parser.add_argument("--page", type=Path, default=BENCHMARKS, help="the page (default BENCHMARKS.md)")
    args = parser.parse_args(ours)
    if not command:
        parser.error("name the audiobuffer command after --, e.g. -- stress --minutes 10")
    if command[0] not in RECORDED:
        parser.error(f"records the audiobuffer commands {', '.join(sorted(RECORDED))}, got {command[0]!r}")
    return record(args.name, command, folder=args.results, page=args.page)


if __name__ == "__main__":
    sys.exit(main())
