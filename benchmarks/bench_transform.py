"""A per-sample transform (librosa's log-mel) behind each loader: first and warm epochs, the loop.

    python benchmarks/bench_transform.py            # print the table
    python benchmarks/bench_transform.py --contestants loop-blas1,isolated-bg,isolated-fg --runs 5
    python benchmarks/bench_transform.py --contestants loop-blas1,isolated-bg,isolated-fg --between 8

The second compares ``background`` True and False; the third gives the helper 8 s to warm up while
the script "builds its model". ``--write`` saves ``results/NAME.json`` (``--name``, default
``transform``) for a section of BENCHMARKS.md to show; no section shows them yet.

``--files`` (300) generated FLAC files of 1-4 s (``audiobuffer bench``'s corpus), each decoded by
``AudioDecoder`` and turned into its log-mel spectrogram by ``audiobuffer bench``'s
``mel_transform`` (librosa), in batches of 16 (``pad_collate``). Each run of a contestant is a fresh
process that imports torch and audiobuffer and calls the transform once before the clock (as a
training script that uses it has librosa loaded), then times ``--epochs`` (3) epochs: the first
from the loader's construction (an ``IsolatedLoader``'s helper starts there; ``--between S``
seconds between the construction and the first ``iter()``, not timed, stand for the script
building its model), then the warm ones. The contestants take turns, ``--runs`` (3) each; a figure
is the median over runs (a run's warm figure is the median of its warm epochs), with the load
average (1 minute) before and after each run.

Contestants: ``loop`` (decode and transform in the training thread; ``loop-blas1`` with BLAS
limited to one thread by threadpoolctl, as a script that knows to does), ``dataset``
(``BufferedDataset``, ``num_producers="auto"``), ``isolated-bg`` and ``isolated-fg``
(``IsolatedLoader``, ``background`` True and False), ``isolated-start`` (``IsolatedLoader`` with
``start_in_trainer=True``: the first batches decoded in the trainer while the helper warms up), and
with ``blas_threads=None`` (BLAS left as it is) ``dataset-blas`` and ``isolated-blas``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import (
    add_write_options,
    command_line,
    read_lines,
    results,
    table,
    write_lines,
    write_results,
)

CONTESTANTS = ["loop", "loop-blas1", "dataset", "isolated-bg", "isolated-fg", "isolated-start",
               "dataset-blas", "isolated-blas"]


def measure(name: str, paths: list[str], epochs: int, between: float) -> dict[str, Any]:
    """``epochs`` epochs of contestant ``name`` in this (fresh) process: each one's wall seconds."""
    import numpy as np
    import torch  # noqa: F401 - imported before the clock, as a training script has it
    from torch.utils.data import DataLoader

    from audiobuffer import AudioDecoder, BufferedDataset, IsolatedLoader, pad_collate
    from audiobuffer.cli._bench_approaches import BATCH_SIZE, BUFFER_SIZE, batches_of, mel_transform

    mel_transform({"audio": np.zeros(2048, dtype=np.float32), "sample_rate": 16000})  # loads librosa
    blas: dict[str, Any] = {"blas_threads": None} if name.endswith("-blas") else {}
    times: list[float] = []
    start = time.perf_counter()
    if name.startswith("loop"):
        from threadpoolctl import threadpool_limits

        decoder = AudioDecoder()
        with threadpool_limits(1 if name == "loop-blas1" else None, user_api="blas"):
            for _ in range(epochs):
                for _batch in batches_of(mel_transform(decoder(p)) for p in paths):
                    pass
                times.append(time.perf_counter() - start)
                start = time.perf_counter()
        return {"epochs_s": times}
    loader: Any
    if name.startswith("dataset"):
        loader = BufferedDataset(paths, AudioDecoder(), buffer_size=BUFFER_SIZE,
                                 transform=mel_transform, **blas)
        batches: Any = DataLoader(loader, batch_size=BATCH_SIZE, collate_fn=pad_collate)
    else:
        background = {"isolated-bg": True, "isolated-fg": False}.get(name, None)
        chosen: dict[str, Any] = {} if background is None else {"background": background}
        if name == "isolated-start":
            chosen["start_in_trainer"] = True
        loader = batches = IsolatedLoader(
            paths, AudioDecoder(), batch_size=BATCH_SIZE, buffer_size=BUFFER_SIZE,
            transform=mel_transform, pin_memory=False, **blas, **chosen)
    built = time.perf_counter() - start
    time.sleep(between)  # the script's own set-up
    start = time.perf_counter() - built
    try:
        for _ in range(epochs):
            for _batch in batches:
                pass
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
        producers = getattr(loader.stats(), "num_producers", None)
    finally:
        loader.close()
    return {"epochs_s": times, "build_s": built, "num_producers": producers}


def run(args: argparse.Namespace, file_list: Path) -> dict[str, list[dict[str, Any]]]:
    """Every contestant ``args.runs`` times, taking turns, each run a fresh process."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.contestants}
    for round_ in range(args.runs):
        for name in args.contestants:
            load_before = os.getloadavg()[0]
            command = [sys.executable, __file__, "--one", name, str(file_list), "--epochs",
                       str(args.epochs), "--between", str(args.between)]
            done = subprocess.run(command, capture_output=True, text=True, encoding="utf-8",
                                  timeout=900)
            if done.returncode:
                raise RuntimeError(f"{name} failed:\n{done.stderr[-4000:]}")
            measured = json.loads(done.stdout.strip().splitlines()[-1])
            measured.update(load_before=load_before, load_after=os.getloadavg()[0])
            runs[name].append(measured)
            epochs = " ".join(f"{t:.2f}" for t in measured["epochs_s"])
            print(f"  round {round_ + 1} {name}: {epochs} s (load {load_before:.1f} -> "
                  f"{measured['load_after']:.1f})", file=sys.stderr, flush=True)
    return runs


def rows_of(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per contestant: medians over runs, and their ratios to the loop's."""
    rows = []
    for name, measured in runs.items():
        first = statistics.median(m["epochs_s"][0] for m in measured)
        warm = statistics.median(statistics.median(m["epochs_s"][1:]) for m in measured)
        loads = [m[key] for m in measured for key in ("load_before", "load_after")]
        rows.append({"contestant": name, "first_s": first, "warm_s": warm,
                     "build_s": statistics.median(m.get("build_s", 0.0) for m in measured),
                     "num_producers": [m.get("num_producers") for m in measured],
                     "load_min": min(loads), "load_max": max(loads),
                     "runs": [m["epochs_s"] for m in measured]})
    # the reference: the plain loop, else the loop with BLAS on one thread
    loop = next((r for name in ("loop", "loop-blas1") for r in rows if r["contestant"] == name), None)
    for row in rows:
        if loop is not None:
            row["loop"] = loop["contestant"]
            row["first_over_loop_s"] = row["first_s"] - loop["first_s"]
            row["warm_speed_vs_loop"] = loop["warm_s"] / row["warm_s"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs per run: the first, then warm ones")
    parser.add_argument("--between", type=float, default=0.0,
                        help="seconds between construction and iter()")
    parser.add_argument("--contestants", type=lambda s: s.split(","), default=CONTESTANTS)
    parser.add_argument("--one", nargs=2, metavar=("NAME", "FILE_LIST"), help=argparse.SUPPRESS)
    parser.add_argument("--name", default="transform", help="the results' name (results/NAME.json)")
    add_write_options(parser, "NAME")
    args = parser.parse_args(argv)
    if args.one:
        name, file_list = args.one
        measured = measure(name, read_lines(Path(file_list)), args.epochs, args.between)
        print(json.dumps(measured), flush=True)
        return 0
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first, then warm ones)")
    unknown = [c for c in args.contestants if c not in CONTESTANTS]
    if unknown:
        parser.error(f"--contestants: unknown {unknown}; known: {','.join(CONTESTANTS)}")
    from audiobuffer.cli.bench import make_corpus

    with tempfile.TemporaryDirectory(prefix="bench-transform-") as work:
        paths = make_corpus(Path(work) / "flac", args.files, "flac")
        file_list = Path(work) / "files.txt"
        write_lines(file_list, paths)
        rows = rows_of(run(args, file_list))
    header = ["contestant", "first epoch s", "over loop s", "warm epoch s", "speed vs loop",
              "producers", "load"]
    print(table(header, [[r["contestant"], f"{r['first_s']:.2f}",
                          f"{r.get('first_over_loop_s', 0.0):+.2f}",
                          f"{r['warm_s']:.2f}", f"{r.get('warm_speed_vs_loop', 0.0):.2f}x",
                          ",".join(str(n) for n in r["num_producers"]),
                          f"{r['load_min']:.1f}-{r['load_max']:.1f}"] for r in rows]))
    argv_shown = sys.argv[1:] if argv is None else argv
    measured = results(args.name, rows, command=command_line("bench_transform.py", argv_shown),
                       settings={"files": args.files, "runs": args.runs, "epochs": args.epochs,
                                 "between_s": args.between, "cores": os.cpu_count()})
    write_results(measured, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
