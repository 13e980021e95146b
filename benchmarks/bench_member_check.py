"""What checking a member's tar header costs a read by index: ranged reads with and without the check.

    python benchmarks/bench_member_check.py                  # FSDD packed into shards in a temporary folder
    python benchmarks/bench_member_check.py --files 1000 --runs 9

Packs the first ``--files`` FSDD recordings (``audiobuffer.sources.pack``), then reads every member of the
index in turn, ``--runs`` rounds, three ways taking turns within a round: ``read_range`` of the member's
bytes alone (no check), ``read_member`` (the member and the 512-byte header before it in one read, the
header checked), and ``check_member`` alone on headers already in memory. Prints the median microseconds
a member and the machine's load average (``os.getloadavg``) before and after; saves nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from harness import FSDD, interleaved

from audiobuffer.sources import pack
from audiobuffer.sources.formats.tarheader import HEADER, check_member
from audiobuffer.sources.index import read_member
from audiobuffer.sources.storage import Storage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=FSDD, help=f"the FSDD recordings (default {FSDD})")
    parser.add_argument("--files", type=int, default=3000, help="recordings packed (default 3000)")
    parser.add_argument("--runs", type=int, default=7, help="rounds (medians; default 7)")
    args = parser.parse_args(argv)
    files = sorted(args.root.glob("*.wav"))[:args.files]
    if not files:
        print(f"no .wav files in {args.root}", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        index = pack([str(f) for f in files], Path(tmp) / "out", shard_size=4_000_000, progress=False)
        members = [(m.shard, m.offset, m.size, m.member) for m in index.members]
        storage = Storage()  # local files: no options, the default retry
        headers = [(storage.read_range(s, o - HEADER, HEADER), s, name, o, n) for s, o, n, name in members]

        def plain() -> None:
            for shard, offset, size, _ in members:
                storage.read_range(shard, offset, size)

        def checked() -> None:
            for shard, offset, size, name in members:
                read_member(shard, offset, size, member=name, storage=storage)

        def check_only() -> None:
            for header, shard, name, offset, size in headers:
                check_member(header, shard, name, offset, size)

        times = interleaved({"read_range (no check)": plain, "read_member (header read and checked)": checked,
                             "check_member alone": check_only}, args.runs)
    load_after = os.getloadavg()
    print(f"{len(members)} members, {args.runs} rounds; load average before {load_before[0]:.2f} "
          f"{load_before[1]:.2f} {load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} "
          f"{load_after[2]:.2f} ({os.cpu_count()} cores)")
    for name, runs in times.items():
        print(f"{name:40s} {statistics.median(runs) / len(members) * 1e6:8.1f} us a member (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
