"""Buffer stress test against queue.Queue; writes its section of BENCHMARKS.md.

    python scripts/stress_buffer.py                 # the standard run
    python scripts/stress_buffer.py --minutes 10    # the soak (its own section)
    python scripts/stress_buffer.py --quick         # a smoke run, writes nothing

Everything but the writing is ``audiobuffer stress`` (``audiobuffer/stress.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmd import machine, write_section  # noqa: E402

from audiobuffer.tools.stress import markdown, parse_shapes, stress  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="1x1x64,4x1x64,2x2x16,8x2x4")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--payload", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--minutes", type=float, default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    items, rounds = (2000, 1) if args.quick else (args.items, args.rounds)
    report = stress(parse_shapes(args.shapes), items=items, payload=args.payload, rounds=rounds, minutes=args.minutes)
    table = markdown(report)
    print(table)
    ok = report["lost"] == report["duplicated"] == report["bound_violations"] == 0
    if args.quick:
        return 0 if ok else 1
    command = " ".join(sys.argv[1:])
    if args.minutes:
        title = f"## Soak: the stress test for {args.minutes:g} minutes (`scripts/stress_buffer.py {command}`)"
        name = "soak"
    else:
        title = f"## Buffer stress test against queue.Queue (`scripts/stress_buffer.py {command}`)"
        name = "stress"
    write_section(name, "\n\n".join([
        title,
        f"Machine: {machine()}. {items:,} items per contended round ({args.payload} payload bytes each), medians of "
        f"{rounds} rounds per shape; jittered rounds add random sub-millisecond delays on both sides and move a "
        "tenth as many items. `get` takes one item per call, as `queue.Queue.get` does; `get_many` takes every "
        "ready item under one lock acquisition (what `BufferedDataset`'s consumer does).",
        table,
    ]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
