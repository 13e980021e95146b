"""Shared by the benchmark scripts: medians, the machine's description, and BENCHMARKS.md sections.

Each script owns one section of BENCHMARKS.md, between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``,
and rewrites only that section, so the scripts can be run one at a time.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
#: The FSDD recordings in the shared data beside the repository (``AUDIOBUFFER_SHARED`` overrides the folder).
FSDD = Path(os.environ.get("AUDIOBUFFER_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data" / "fsdd" \
    / "recordings"


def median_time(fn: Callable[[], object], runs: int) -> tuple[float, list[float]]:
    """Run ``fn`` ``runs`` times; return the median wall time and all times."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


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
