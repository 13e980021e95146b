"""Free-threaded Python: audiobuffer's producer pool with the GIL on and off, on one interpreter.

    python3.13t benchmarks/bench_free_threaded.py --write    # a free-threaded build (3.13t, 3.14t): the results
    python3.13t benchmarks/bench_free_threaded.py --quick    # a smoke run: 64 files, 1 run, prints the section

Tiny WAV files are the case threads win least under the GIL: their decode is mostly Python, so a
producer thread can only run beside the loop in its system calls (BENCHMARKS.md, decode speed). This
script measures what the same code does without the GIL. It needs no torch: it runs what the
``IsolatedLoader``'s helper runs (``ProducerPool``, ``Buffer``, ``AudioDecoder`` with numpy samples,
the numpy collate), so a free-threaded interpreter needs only numpy, soundfile and soxr.

Every (GIL setting, corpus, approach, run) is a fresh subprocess of this interpreter, with
``PYTHON_GIL=1`` (the GIL on) or ``PYTHON_GIL=0`` (off); the approaches take turns in each round and
a figure is the median over ``--runs`` rounds. Each child reports whether the GIL was in fact enabled
(``sys._is_gil_enabled()``) and checks that every item came out once. Approaches, each one epoch of
batches of 16:

- ``soundfile-loop``: ``AudioDecoder`` reading every file through libsndfile, then the collate, in one
  thread (the soundfile loop of the other benchmarks);
- ``loop``: the same with audiobuffer's own WAV reader;
- ``pool-1``, ``pool-2``, ``pool-auto``: a ``ProducerPool`` with 1 or 2 producer threads, or tuned
  (``"auto"``, the default), the consumer thread collating.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import render
from harness import FSDD, command_line, machine_info, read_lines, results, write_lines

APPROACHES = ["soundfile-loop", "loop", "pool-1", "pool-2", "pool-auto"]
BATCH_SIZE = 16
BUFFER_SIZE = 64
SECTION = "free-threaded"


# -- the child: one epoch ---------------------------------------------------------------------------

def epoch(approach: str, paths: list[str]) -> dict[str, Any]:
    """One epoch of ``approach`` over ``paths`` in this process: its seconds, and whether the GIL was on."""
    from audiobuffer._numpy_collate import collate_numpy
    from audiobuffer.buffer import Buffer
    from audiobuffer.decoders import AudioDecoder
    from audiobuffer.engine.pool import ProducerPool
    from audiobuffer.options import gil_enabled
    from audiobuffer.sources import Source

    # numpy samples, as in the helper process: no torch here
    decoder = AudioDecoder(native_wav=approach != "soundfile-loop", tensors=False)
    source = Source(paths)
    seen: list[int] = []
    batch: list[dict[str, Any]] = []
    pool = None
    start = time.perf_counter()
    if approach.startswith("pool-"):
        count = approach.split("-")[1]
        pool = ProducerPool(lambda seq: source.item(seq, seq=seq), len(paths), decoder, Buffer(BUFFER_SIZE),
                            num_producers="auto" if count == "auto" else int(count))
        pool.start()
    pairs = pool if pool is not None else ((seq, decoder(source.item(seq, seq=seq))) for seq in range(len(paths)))
    try:
        for seq, sample in pairs:
            seen.append(seq)
            batch.append(sample)
            if len(batch) == BATCH_SIZE:
                collate_numpy(batch)
                batch = []
        settled = pool.num_producers if pool is not None else 0
    finally:
        if pool is not None:
            pool.close()
    if batch:
        collate_numpy(batch)
    seconds = time.perf_counter() - start
    if sorted(seen) != list(range(len(paths))):
        raise RuntimeError(f"{approach}: {len(seen)} items came out for {len(paths)}, not each once")
    return {"seconds": seconds, "gil_enabled": gil_enabled(), "producers": settled}


# -- the parent ---------------------------------------------------------------------------------------

def free_threaded() -> bool:
    """Whether this interpreter is a free-threaded build (one that can run with the GIL off)."""
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def measure(approach: str, gil: bool, file_list: Path) -> dict[str, Any]:
    """One fresh child with the GIL on or off."""
    env = dict(os.environ, PYTHON_GIL="1" if gil else "0")
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", approach, "--file-list",
                          str(file_list)], env=env, capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{approach} (PYTHON_GIL={env['PYTHON_GIL']}) failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def corpora(files: int, cache: Path, fsdd: Path | None) -> dict[str, list[str]]:
    """The corpora by name: FSDD (its first ``files`` recordings) when ``fsdd`` is given, and generated
    WAV and FLAC (as ``audiobuffer bench`` makes them, at most 1000 files each)."""
    from audiobuffer.cli._bench_approaches import make_corpus

    found: dict[str, list[str]] = {}
    if fsdd is not None:
        paths = sorted(str(p) for p in fsdd.glob("*.wav"))[:files]
        found[f"FSDD, {len(paths)} real recordings (WAV, 8 kHz)"] = paths
    for fmt in ("wav", "flac"):
        found[f"{fmt.upper()}, {min(files, 1000)} generated files of 1-4 s at 16 kHz"] = \
            make_corpus(cache / f"{fmt}-{min(files, 1000)}", min(files, 1000), fmt)
    return found


def run(files: int, runs: int, cache: Path, fsdd: Path | None) -> dict[str, dict[str, dict[str, Any]]]:
    """Medians per corpus, per GIL setting and approach."""
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="audiobuffer-ft-") as tmp:
        for name, paths in corpora(files, cache, fsdd).items():
            file_list = Path(tmp) / "files.txt"
            write_lines(file_list, paths)
            seen: dict[str, list[dict[str, Any]]] = {}
            for _ in range(runs):
                for gil in (True, False):
                    for approach in APPROACHES:
                        seen.setdefault(f"{'on' if gil else 'off'}/{approach}", []).append(
                            measure(approach, gil, file_list))
            rows: dict[str, dict[str, Any]] = {}
            for key, got in seen.items():
                rows[key] = {"seconds": statistics.median(r["seconds"] for r in got),
                             "gil_enabled": sorted({r["gil_enabled"] for r in got}, key=str),
                             "producers": sorted({r["producers"] for r in got})}
            results[name] = rows
            print(f"  {name}: " + ", ".join(f"{k} {v['seconds']:.3f} s" for k, v in rows.items()), file=sys.stderr)
    return results


def rows_of(measured: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per corpus and approach: the epoch with the GIL on and off, each against the soundfile loop
    with the same GIL setting, off over on, and what the children reported (GIL, producers settled on)."""
    rows = []
    for corpus, by_key in measured.items():
        base_on, base_off = by_key["on/soundfile-loop"]["seconds"], by_key["off/soundfile-loop"]["seconds"]
        for approach in APPROACHES:
            on, off = by_key[f"on/{approach}"], by_key[f"off/{approach}"]
            rows.append({"corpus": corpus, "approach": approach, "gil_on_s": on["seconds"],
                         "on_vs_soundfile_loop": base_on / on["seconds"], "gil_off_s": off["seconds"],
                         "off_vs_soundfile_loop": base_off / off["seconds"],
                         "off_vs_on": on["seconds"] / off["seconds"],
                         "gil_reported": {"on": on["gil_enabled"], "off": off["gil_enabled"]},
                         "producers": ({"on": on["producers"], "off": off["producers"]} if approach == "pool-auto"
                                       else None)})
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs per approach and GIL setting (medians)")
    parser.add_argument("--files", type=int, default=3000, help="FSDD files (generated corpora: at most 1000)")
    parser.add_argument("--fsdd", type=Path, default=FSDD, help="the FSDD recordings")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the generated corpora are made")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 64 files, 1 run")
    parser.add_argument("--write", action="store_true", help=f"save results/{SECTION}.json and render BENCHMARKS.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--file-list", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        paths = read_lines(args.file_list)
        print(json.dumps(epoch(args.child, paths)))
        return 0
    if not free_threaded():
        parser.error(f"{sys.executable} is Python {sys.version.split()[0]}, which cannot turn the GIL off: run "
                     "this script with a free-threaded build (python3.13t, python3.14t)")
    if args.runs < 1 or args.files < 1:
        parser.error(f"--runs and --files must be >= 1, got {args.runs} and {args.files}")
    fsdd: Path | None = args.fsdd
    if fsdd is not None and not any(fsdd.glob("*.wav")):
        if args.fsdd != FSDD:  # given: a typo, not a choice
            parser.error(f"--fsdd {str(fsdd)!r} holds no .wav files (the FSDD recordings folder)")
        print(f"FSDD not found at {fsdd}: that corpus is left out", file=sys.stderr)
        fsdd = None
    files, runs = (64, 1) if args.quick else (args.files, args.runs)
    if args.write and args.quick:
        parser.error("--write takes a full run; --quick is a smoke test whose numbers mean little")
    with tempfile.TemporaryDirectory(prefix="audiobuffer-ft-corpora-") as tmp:
        by_corpus = run(files, runs, args.cache_dir or Path(tmp), fsdd)
    build = "free-threaded build" if free_threaded() else "default build"
    info = machine_info()
    measured = results(SECTION, rows_of(by_corpus), machine=info, versions=f"{info['versions']}; {build}",
                       command=command_line("bench_free_threaded.py", argv, python=Path(sys.executable).name),
                       settings={"runs": runs, "batch_size": BATCH_SIZE})
    print(render.preview(measured))
    if args.write:
        render.publish(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
