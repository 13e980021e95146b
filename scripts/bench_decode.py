"""Decode benchmark against the alternatives; writes its section of BENCHMARKS.md and a plot.

    python scripts/bench_decode.py --fsdd ../shared/data/fsdd/recordings   # the full run (several minutes)
    python scripts/bench_decode.py --quick                                  # a smoke run, writes nothing

Everything but the writing is ``audiobuffer bench`` (``audiobuffer/tools/bench.py``); extra arguments go to it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmd import BENCHMARKS, machine, write_section  # noqa: E402

from audiobuffer.cli.bench import main as bench_main  # noqa: E402

PLOT = BENCHMARKS.parent / "benchmarks" / "decode.png"


def main() -> int:
    args = sys.argv[1:]
    if "--quick" in args:
        return bench_main(args)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        PLOT.parent.mkdir(exist_ok=True)
        status = bench_main(args + ["--json", str(out), "--markdown", str(Path(tmp) / "bench.md"), "--plot", str(PLOT)])
        if status:
            return status
        tables = (Path(tmp) / "bench.md").read_text(encoding="utf-8")
        results = json.loads(out.read_text(encoding="utf-8"))
    runs = next(iter(results.values()))[0]["runs"]
    body = "\n\n".join([
        "## Decoding an epoch: audiobuffer against the alternatives (`scripts/bench_decode.py`)",
        f"Machine: {machine()}. Command: `python scripts/bench_decode.py {' '.join(args)}`. Medians of {runs} runs "
        "(the approaches taking turns in each round), "
        "each approach in a fresh process; batches of 16 through the same `AudioDecoder` and numpy `pad_collate` "
        "(`spdl-load_wav` alone decodes with SPDL's WAV parser; the log-mel corpus adds the same librosa transform "
        "per sample in every approach). "
        "Peak RSS sums the processes of the tree (forked workers' shared pages count in each); CPU % is user + "
        "system time of the process and its joined workers over the wall time of the same window (the epoch "
        "and the workers' shutdown), so at most 100 per usable core.",
        tables.strip(),
        f"![throughput and time to first batch]({PLOT.relative_to(BENCHMARKS.parent)})",
    ])
    write_section("decode", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
