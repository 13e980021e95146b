"""The benchmarks' shared harness: timing and medians, the machine's description, and BENCHMARKS.md sections.

Each benchmark owns sections of BENCHMARKS.md, between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``,
and rewrites only those, so the benchmarks can be run one at a time. Importing this module puts this
checkout's ``audiobuffer`` first on ``sys.path``: a benchmark measures the code beside it.

Run as a script, it records what a command of the ``audiobuffer`` CLI prints into a section:

    python benchmarks/harness.py stress --title "Buffer stress test against queue.Queue" -- stress
    python benchmarks/harness.py soak --title "Soak: the stress test for 10 minutes" -- stress --minutes 10
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

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
BENCHMARKS = REPO / "BENCHMARKS.md"
#: The shared data beside the repository (``AUDIOBUFFER_SHARED`` overrides the folder).
SHARED = Path(os.environ.get("AUDIOBUFFER_SHARED", REPO.parent / "shared"))
#: The FSDD recordings in the shared data.
FSDD = SHARED / "data" / "fsdd" / "recordings"

__all__ = ["BENCHMARKS", "FSDD", "REPO", "PeakRSS", "fsdd_files", "interleaved", "machine", "median_time",
           "read_lines", "record", "table", "timed", "write_lines", "write_section"]


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


# -- the report -------------------------------------------------------------------------------------

def machine() -> str:
    """One line about this machine and the versions that matter."""
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
        return f"{platform.machine()}, {cores} cores; Python {platform.python_version()}, no torch, {versions}"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.machine()}, {cores} cores, {gpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__}, {versions}; intra-op threads {torch.get_num_threads()}")


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(name: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace (or append) the section ``name`` of BENCHMARKS.md with ``body``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8", newline="\n")


def record(section: str, args: Sequence[str], *, title: str | None = None, path: Path = BENCHMARKS) -> int:
    """Run ``audiobuffer ARGS`` in a fresh process of this interpreter (this checkout's package) and write
    what it printed into ``section``, under a title naming the command and a line naming the machine.

    Returns:
        The command's exit status. A run that printed no table (bad arguments, ``--help``) writes nothing;
        one that printed its tables is written whatever its status (a stress run that lost items says so).
    """
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    done = subprocess.run([sys.executable, "-m", "audiobuffer", *args], stdout=subprocess.PIPE, env=env,
                          check=False)
    out = done.stdout.decode("utf-8", errors="replace")
    print(out, end="")
    if not any(line.startswith("|") for line in out.splitlines()):
        return done.returncode
    command = f"`audiobuffer {' '.join(args)}`"
    heading = f"## {title} ({command})" if title else f"## {command}"
    write_section(section, "\n\n".join([heading, f"Machine: {machine()}.", out.strip()]), path)
    return done.returncode


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(usage="%(prog)s [-h] [--title TITLE] [--file FILE] SECTION -- COMMAND ...",
                                     description="Record what an audiobuffer command prints into a section of "
                                                 "BENCHMARKS.md.")
    parser.add_argument("section", help="the section's name (its <!-- NAME:start --> marker)")
    parser.add_argument("--title", default=None, help="the section's heading (default: the command)")
    parser.add_argument("--file", type=Path, default=BENCHMARKS, help="the Markdown file (default BENCHMARKS.md)")
    args = parser.parse_args(ours)
    if not command:
        parser.error("name the audiobuffer command after --, e.g. -- stress --minutes 10")
    return record(args.section, command, title=args.title, path=args.file)


if __name__ == "__main__":
    sys.exit(main())
