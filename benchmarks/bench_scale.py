"""Millions of items: the time and memory to build a loader over a manifest of N rows, and its first batch.

For each size (10k, 100k, 1M, 10M rows by default) a CSV manifest (``path,speaker,seconds``) names
the FSDD recordings over and over; each case runs in a fresh process, with ``torch`` and
``audiobuffer`` imported before the clock starts:

- ``dataset``: ``BufferedDataset(manifest, AudioDecoder(...), shuffle=True)``;
- ``duration``: the same with ``max_batch_seconds=8, duration_column="seconds"`` (durations from the column);
- ``isolated``: ``IsolatedLoader(manifest, AudioDecoder(...), batch_size=32, shuffle=True)``;
- ``index``: ``BufferedDataset(index, AudioDecoder(...), shuffle=True)`` over an ``index.json`` of N
  members (the packed FSDD recordings, named over and over), up to 1M members.

The files are read once before the cases, so that each case finds them in the page cache (the first
read of a file just written is slower, whichever case makes it). Each reports the build time, the
resident memory it added (per item; pyarrow, torch and audiobuffer
are imported before, and pyarrow's first compute call, which imports pandas where it is installed:
their own memory is reported apart), the time to its first batch, and for ``isolated`` the helper
process's memory (resident; proportional, its share of pages it maps with others; and its own, the
pages no other process maps; of it, the proportional part of the item table's region, which is the
items' one copy, mapped by both processes) and, in the same process, the own memory of a helper over a
10-row manifest: what any second Python process with numpy and soundfile costs, whatever the items.
Each case runs ``--runs`` times (3), each time in a fresh process: each figure is the median.
Results go to ``benchmarks/results/scale.json``.

    python benchmarks/bench_scale.py                 # every size and case
    python benchmarks/bench_scale.py --sizes 10000 1000000 --cases dataset isolated
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import FSDD, add_write_options, command_line, fsdd_files, write_results
from harness import results as harness_results

SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
CASES = ("dataset", "duration", "isolated", "index")
#: The largest index.json the ``index`` case writes (10M members would be a 1.8 GB JSON file).
INDEX_MOST = 1_000_000
BATCH = 32


def write_manifest(path: Path, n: int) -> None:
    """A CSV of ``n`` rows naming the FSDD recordings in turn, with each one's speaker and seconds."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import soundfile as sf

    files = fsdd_files()
    if not files:
        raise SystemExit(f"the FSDD recordings are needed at {FSDD}")
    seconds = [f"{sf.info(f).duration:.4f}" for f in files]
    speakers = [Path(f).stem.split("_")[1] for f in files]
    take = pa.array(np.arange(n, dtype=np.int64) % len(files))
    table = pa.table({"path": pa.array(files).take(take), "speaker": pa.array(speakers).take(take),
                      "seconds": pa.array(seconds).take(take)})
    pcsv.write_csv(table, str(path))


def write_index(packed: Path, n: int) -> Path:
    """An ``index.json`` beside the packed FSDD shards in ``packed`` naming their members over and over, ``n``
    in all (each under a name of its own)."""
    data = json.loads((packed / "index.json").read_text(encoding="utf-8"))
    members = data["members"]
    data["members"] = [{**members[i % len(members)], "member": f"{i:08d}.wav",
                        "name": f"r{i // len(members)}/{members[i % len(members)]['name']}"} for i in range(n)]
    path = packed / f"index-{n}.json"
    path.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8", newline="\n")
    return path


def measure(case: str, manifest: str, n: int) -> dict[str, object]:
    """One case in this (fresh) process."""
    import gc

    import psutil

    proc = psutil.Process()
    bare = proc.memory_info().rss
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv  # noqa: F401 - the libraries' own memory is a fixed cost, counted apart (imports_mib)
    import torch  # noqa: F401 - imported before the clock, as a training script has it

    pc.equal(pa.array([1]), 1)  # pyarrow's first compute call imports pandas (if installed): a fixed cost too

    import audiobuffer as ab
    from audiobuffer import AudioDecoder, BufferedDataset, IsolatedLoader, pad_collate

    decoder = AudioDecoder(sample_rate=8000, crop_seconds=1.0)
    gc.collect()
    before = proc.memory_info().rss
    start = time.perf_counter()
    if case == "isolated":
        loader: object = IsolatedLoader(manifest, decoder, batch_size=BATCH, shuffle=True, num_producers=2)
    elif case == "duration":
        loader = BufferedDataset(manifest, decoder, shuffle=True, num_producers=2, max_batch_seconds=8.0,
                                 duration_column="seconds")
    else:  # dataset, or index (the manifest is an index.json)
        loader = BufferedDataset(manifest, decoder, shuffle=True, num_producers=2)
    built = time.perf_counter() - start
    gc.collect()
    added = proc.memory_info().rss - before
    start = time.perf_counter()
    if case in ("dataset", "index"):
        from torch.utils.data import DataLoader

        batches = iter(DataLoader(loader, batch_size=BATCH, collate_fn=pad_collate))  # type: ignore[arg-type]
    elif case == "duration":
        from torch.utils.data import DataLoader

        batches = iter(DataLoader(loader, batch_size=None))  # type: ignore[arg-type]
    else:
        batches = iter(loader)  # type: ignore[call-overload]
    next(batches)
    first = time.perf_counter() - start
    result: dict[str, object] = {"case": case, "items": n, "imports_mib": round((before - bare) / 2**20, 1),
                                 "build_s": round(built, 3),
                                 "added_mib": round(added / 2**20, 1), "bytes_per_item": round(added / n, 1),
                                 "first_batch_s": round(first, 3)}
    trainer = proc.memory_info().rss - before
    result["trainer_after_first_batch_mib"] = round(trainer / 2**20, 1)
    if case == "isolated":
        helper = psutil.Process(loader.helper_info["pid"])  # type: ignore[attr-defined]
        info = helper.memory_full_info()
        result["helper_rss_mib"] = round(info.rss / 2**20, 1)
        result["helper_pss_mib"] = round(getattr(info, "pss", info.rss) / 2**20, 1)
        result["helper_uss_mib"] = round(info.uss / 2**20, 1)
        table = mapped_pss(helper.pid, "audiobuffer-table-")
        if table is not None:  # the item table's one copy, which the helper maps (Linux)
            result["helper_table_pss_mib"] = round(table / 2**20, 1)
        result["bare_helper_uss_mib"] = bare_helper_uss(manifest, decoder)
    state = loader.state_dict()  # type: ignore[attr-defined]
    result["state_dict_bytes"] = len(json.dumps({k: (v.hex() if isinstance(v, bytes) else v)
                                                 for k, v in state.items()}, default=str))
    del batches
    loader.close()  # type: ignore[attr-defined]
    result["version"] = ab.__version__
    return result


def mapped_pss(pid: int, marker: str) -> int | None:
    """Bytes of proportional memory process ``pid`` maps from files whose name holds ``marker`` (Linux's
    ``/proc/<pid>/smaps``; ``None`` elsewhere). The kernel maps a file's large folios whole, so a few
    reads spread over a table map most of its pages."""
    smaps = Path(f"/proc/{pid}/smaps")
    if not smaps.exists():
        return None
    total, inside = 0, False
    for line in smaps.read_text(encoding="utf-8").splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            inside = marker in line
        elif inside and head == "Pss:":
            total += int(line.split()[1]) * 1024
    return total


def median_row(runs: list[dict[str, object]]) -> dict[str, object]:
    """One row of several runs of a case: the median of each figure, and every build time."""
    import statistics

    row = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float) or (isinstance(value, int) and key not in ("items", "state_dict_bytes")):
            row[key] = round(statistics.median(float(r[key]) for r in runs), 3)  # type: ignore[arg-type]
    row["runs"] = len(runs)
    row["build_s_each"] = [r["build_s"] for r in runs]
    return row


def bare_helper_uss(manifest: str, decoder: object) -> float:
    """The own memory (MiB) of the helper of an ``IsolatedLoader`` over the first 10 rows of ``manifest``,
    after its first batch: a helper's cost whatever the number of items."""
    import psutil

    from audiobuffer import IsolatedLoader

    with tempfile.TemporaryDirectory(prefix="bench-scale-bare-") as folder:
        small = Path(folder) / "small.csv"
        with open(manifest, encoding="utf-8", newline="") as f:
            small.write_text("".join(line for _, line in zip(range(11), f)), encoding="utf-8", newline="")
        with IsolatedLoader(str(small), decoder, batch_size=BATCH, num_producers=2) as loader:  # type: ignore[arg-type]
            next(iter(loader))
            return round(psutil.Process(loader.helper_info["pid"]).memory_full_info().uss / 2**20, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per case; each figure is their median")
    add_write_options(parser, "scale")
    parser.add_argument("--one", nargs=3, metavar=("CASE", "MANIFEST", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        case, manifest, n = args.one
        print(json.dumps(measure(case, manifest, int(n))), flush=True)
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as work:
        packed = None
        if "index" in args.cases:
            from audiobuffer.sources import pack

            packed = Path(work) / "packed"
            pack(FSDD, packed, shard_size=64 << 20, progress=False)
        for n in args.sizes:
            manifest = Path(work) / f"manifest-{n}.csv"
            start = time.perf_counter()
            write_manifest(manifest, n)
            if hasattr(os, "sync"):
                os.sync()  # the manifest's pages written back now, not during the first case's build
            print(f"{n} rows written in {time.perf_counter() - start:.1f} s "
                  f"({manifest.stat().st_size / 2**20:.0f} MiB)", file=sys.stderr, flush=True)
            index = write_index(packed, n) if packed is not None and n <= INDEX_MOST else None
            for written in (manifest, index):  # read once, so that every case finds it in the page cache
                if written is not None:
                    with open(written, "rb") as f:
                        while f.read(1 << 24):
                            pass
            for case in args.cases:
                if case == "index" and index is None:
                    continue
                given = index if case == "index" else manifest
                runs = []
                for _ in range(args.runs):
                    done = subprocess.run([sys.executable, __file__, "--one", case, str(given), str(n)],
                                          capture_output=True, text=True, encoding="utf-8", timeout=1800)
                    if done.returncode != 0:
                        print(f"{case} at {n} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
                        runs = [{"case": case, "items": n, "error": done.stderr.strip().splitlines()[-1:]}]
                        break
                    runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
                row = runs[0] if "error" in runs[0] else median_row(runs)
                print(json.dumps(row), flush=True)
                results.append(row)
            manifest.unlink()
            if index is not None:
                index.unlink()
    argv = [a for a in sys.argv[1:] if a != "--write"]
    measured = harness_results("scale", results, command=command_line("bench_scale.py", [*argv, "--write"]),
                               settings={"sizes": list(args.sizes), "cases": list(args.cases), "runs": args.runs,
                                         "imports_mib": results[0].get("imports_mib") if results else None})
    print(json.dumps(measured["rows"], indent=1))
    write_results(measured, args)


if __name__ == "__main__":
    main()
