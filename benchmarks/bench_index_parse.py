"""Opening an index.json of N members: parsed by json, or by pyarrow's JSON reader, in a fresh process.

    python benchmarks/bench_index_parse.py                      # the default member counts
    python benchmarks/bench_index_parse.py --members 1000,20000 --runs 7

Each figure is the median over ``--runs`` fresh processes of the wall time of ``Source(index)``
(read, parse, check, the item table), imports of pyarrow included where the reader uses it, with
``audiobuffer.sources.table.ARROW_ROWS`` set so that one reader or the other is used. That
threshold is the member count from which pyarrow is the faster. The machine's load
average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import table

_OPEN = """
import sys, time
import audiobuffer.sources.table as table
from audiobuffer.sources.source import Source
table.ARROW_ROWS = int(sys.argv[2])
start = time.perf_counter()
source = Source(sys.argv[1])
print(time.perf_counter() - start, len(source), "pandas" in sys.modules)
"""


def write_index(folder: Path, members: int) -> Path:
    """An index of ``members`` members of 1000 bytes each in shards of 1000 members (no shard is read)."""
    per_shard = 1000
    shards = [{"members": per_shard, "name": f"shard-{s:06d}.tar", "size": per_shard * 1536 + 1024}
              for s in range((members + per_shard - 1) // per_shard)]
    rows = [{"duration": 1.25, "label": f"class{i % 10}", "member": f"spk{i % 40}__utt_{i:07d}.flac",
             "name": f"spk{i % 40}/utt_{i:07d}.flac", "offset": 512 + (i % per_shard) * 1536,
             "shard": shards[i // per_shard]["name"], "size": 1000} for i in range(members)]
    path = folder / f"index-{members}.json"
    text = json.dumps({"format": "audiobuffer-shards", "version": 1, "shards": shards, "members": rows},
                      indent=None, separators=(",", ":"))
    path.write_text(text.replace('},{"duration"', '},\n{"duration"'), encoding="utf-8", newline="\n")
    return path


def open_seconds(path: Path, threshold: int) -> float:
    out = subprocess.run([sys.executable, "-c", _OPEN, str(path), str(threshold)], capture_output=True,
                         text=True, check=True, timeout=600).stdout.split()
    return float(out[0])


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"
    except (AttributeError, OSError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", default="500,1000,2000,5000,10000,20000,100000",
                        help="member counts, comma-separated")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per figure (default 5)")
    args = parser.parse_args(argv)
    print(f"load average before: {load()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for members in (int(m) for m in args.members.split(",")):
            path = write_index(Path(tmp), members)
            times: dict[str, list[float]] = {"json": [], "pyarrow": []}
            for _ in range(args.runs):  # interleaved: both readers see the same load
                times["json"].append(open_seconds(path, 2**62))
                times["pyarrow"].append(open_seconds(path, 0))
            by_json, by_arrow = (statistics.median(times[k]) * 1000 for k in ("json", "pyarrow"))
            rows.append([members, f"{path.stat().st_size / 1e6:.2f}", f"{by_json:.0f}", f"{by_arrow:.0f}",
                         f"{by_json / by_arrow:.2f}x"])
            print(f"  {members} members done (load {load()})", flush=True)
    print(table(["members", "MB", "json ms", "pyarrow ms", "json / pyarrow"], rows))
    print(f"load average after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
