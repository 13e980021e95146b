"""Buffer stress test against queue.Queue; writes its section of BENCHMARKS.md.

    python scripts/stress_buffer.py                 # the standard run
    python scripts/stress_buffer.py --minutes 10    # the soak (its own section)
    python scripts/stress_buffer.py --quick         # a smoke run, writes nothing

Everything but the writing is ``audiobuffer stress`` (``audiobuffer/tools/stress.py``); the arguments go to it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmd import machine, write_section  # noqa: E402

from audiobuffer.cli.stress import main as stress_main  # noqa: E402
from audiobuffer.cli.stress import markdown  # noqa: E402


def main() -> int:
    args = sys.argv[1:]
    if "--quick" in args:
        return stress_main(args)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stress.json"
        status = stress_main(args + ["--json", str(out)])
        if not out.is_file():
            return status  # it stopped before running (bad arguments, --help)
        report = json.loads(out.read_text(encoding="utf-8"))
    command = " ".join(args)
    if report["minutes"]:
        title = f"## Soak: the stress test for {report['minutes']:g} minutes (`scripts/stress_buffer.py {command}`)"
        name = "soak"
    else:
        title = f"## Buffer stress test against queue.Queue (`scripts/stress_buffer.py {command}`)"
        name = "stress"
    write_section(name, "\n\n".join([
        title,
        f"Machine: {machine()}. {report['items_per_round']:,} items per contended round ({report['payload']} payload "
        f"bytes each), medians per shape; jittered rounds add random sub-millisecond delays on both sides and "
        "move a tenth as many items. `get` takes one item per call, as `queue.Queue.get` does; `get_many` takes "
        "every ready item under one lock acquisition (what `BufferedDataset`'s consumer does).",
        markdown(report),
    ]))
    return status


if __name__ == "__main__":
    sys.exit(main())
