"""GPU training: ``scripts/train_audio.py`` on FSDD with in-process producer threads and with the helper process.

    python benchmarks/bench_train.py --write                      # on a CUDA machine: results/train-cuda.json
    python benchmarks/bench_train.py --epochs 2 --max-steps 4 --rounds 1   # a smoke run: prints the section

Each pipeline is a set of ``--set`` overrides of ``configs/fsdd.yaml`` (:data:`PIPELINES`). The pipelines
take turns, round by round, each run a fresh process of ``scripts/train_audio.py --json`` that trains
``--epochs`` epochs (so each run starts its CUDA context, its helper process and its pinned memory anew).
A run's first epoch pays those starts and is left out: reported are each run's later epochs, their median
and mean over every run, the median against the in-process threads' with the same producer count, and the
range of each run's final test accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import render
from harness import FSDD, REPO, command_line, results

#: Each pipeline: its label and its overrides of ``configs/fsdd.yaml``.
PIPELINES: dict[str, tuple[str, list[str]]] = {
    "threads-2": ("`BufferedDataset`, 2 producers", ["buffer.num_producers=2"]),
    "threads-auto": ("`BufferedDataset`, `auto`", ["buffer.num_producers=auto"]),
    "isolated-2": ("`IsolatedLoader`, 2 producers", ["buffer.num_producers=2", "buffer.isolate=true"]),
    "isolated-auto": ("`IsolatedLoader`, `auto`", ["buffer.num_producers=auto", "buffer.isolate=true"]),
}
CONFIG = REPO / "configs" / "fsdd.yaml"
TRAIN = REPO / "scripts" / "train_audio.py"
RUN_TIMEOUT = 1800.0


def train(overrides: Sequence[str], epochs: int, max_steps: int | None, fsdd: Path, work: Path) -> dict[str, Any]:
    """One fresh run of ``scripts/train_audio.py``: its metrics (``--json``), each epoch's seconds included."""
    out = work / "metrics.json"
    cmd = [sys.executable, str(TRAIN), "--config", str(CONFIG), "--no-progress", "--json", str(out),
           "--checkpoint-dir", str(work / "checkpoints"), "--set", f"epochs={epochs}", "--set", f"source.root={fsdd}"]
    for override in overrides:
        cmd += ["--set", override]
    if max_steps is not None:
        cmd += ["--max-steps", str(max_steps)]
    # the checkout beside this script, as every benchmark measures it (harness.py), installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False, cwd=work, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"train_audio.py {' '.join(overrides)} failed (exit {done.returncode}):\n{done.stderr}")
    metrics: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return metrics


def rows_of(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per pipeline: each run's epochs after the first, their median and mean, against threads."""
    rows = []
    for key, metrics in runs.items():
        later = [[e["seconds"] for e in m["epochs"][1:]] for m in metrics]
        flat = [s for run in later for s in run]
        accuracy = [m["epochs"][-1]["test_accuracy"] for m in metrics if m["epochs"][-1]["test_accuracy"] is not None]
        rows.append({"pipeline": key, "label": PIPELINES[key][0], "overrides": PIPELINES[key][1], "epochs_s": later,
                     "first_epoch_s": [m["epochs"][0]["seconds"] for m in metrics],
                     "median_s": statistics.median(flat), "mean_s": statistics.fmean(flat), "test_accuracy": accuracy,
                     "test_accuracy_range": [min(accuracy), max(accuracy)] if accuracy else None})
    medians = {row["pipeline"]: row["median_s"] for row in rows}
    for row in rows:
        threads = medians.get("threads-" + row["pipeline"].split("-", 1)[1])
        row["vs_threads"] = threads / row["median_s"] if threads else None
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each pipeline, taking turns (default 3)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run, the first left out (default 4)")
    parser.add_argument("--pipelines", default=",".join(PIPELINES), help=f"subset of {','.join(PIPELINES)}")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop each epoch after this many steps (smoke runs)")
    parser.add_argument("--fsdd", type=Path, default=FSDD, help=f"the FSDD recordings (default {FSDD})")
    parser.add_argument("--write", action="store_true", help="save results/train-cuda.json and render BENCHMARKS.md")
    args = parser.parse_args(argv)
    pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    unknown = [p for p in pipelines if p not in PIPELINES]
    if unknown or not pipelines:
        parser.error(f"--pipelines takes a comma-separated subset of {','.join(PIPELINES)}, got {args.pipelines!r}")
    if args.rounds < 1 or args.epochs < 2:
        parser.error(f"--rounds must be >= 1 and --epochs >= 2, got {args.rounds} and {args.epochs}")
    if not any(args.fsdd.glob("*.wav")):
        parser.error(f"--fsdd {str(args.fsdd)!r} holds no .wav files (the FSDD recordings folder)")
    import torch

    if args.write and (args.max_steps is not None or not torch.cuda.is_available()):
        parser.error("--write takes a full run on a CUDA machine (the page's section is GPU training)")
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in pipelines}
    with tempfile.TemporaryDirectory(prefix="audiobuffer-train-") as tmp:
        for round_ in range(args.rounds):
            for pipeline in pipelines:
                work = Path(tmp) / f"{pipeline}-{round_}"
                work.mkdir()
                runs[pipeline].append(train(PIPELINES[pipeline][1], args.epochs, args.max_steps, args.fsdd, work))
                seconds = ", ".join(f"{e['seconds']:.2f}" for e in runs[pipeline][-1]["epochs"])
                print(f"  round {round_ + 1}: {pipeline}: {seconds} s", file=sys.stderr)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    measured = results(f"train-{device}", rows_of(runs), command=command_line("bench_train.py", argv),
                       settings={"runs_per_pipeline": args.rounds, "epochs": args.epochs, "first_epoch": 2,
                                 "max_steps": args.max_steps})
    print(render.preview(measured, name="train-cuda"))  # on a CPU: as it would read with these figures
    if args.write:
        render.publish(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
