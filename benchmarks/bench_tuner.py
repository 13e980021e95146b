"""``num_producers="auto"`` against pinned counts, epoch by epoch, each contestant after another in one process.

    python benchmarks/bench_tuner.py                       # the speech corpus, generated FLAC and FSDD
    python benchmarks/bench_tuner.py --write               # and save results/epochs.json, render BENCHMARKS.md
    python benchmarks/bench_tuner.py --json tuner.json     # and save every round's figures

A training script often builds its loader after something else ran in the same process (a validation
loader, another experiment). Here every contestant gets its own dataset and runs ``--epochs`` epochs,
the contestants taking turns in one process, the order rotated each round and ``auto`` last, so that
it runs after each other one in turn: the plain loop (the same decoder and batches in the loop's
thread), pinned 0 (decoding in the consumer's thread, the count ``auto`` may settle on), 1 and 2
producers, an ``IsolatedLoader`` (2 producers in a helper process), and ``auto``. A figure is the
median over ``--rounds`` rounds of that epoch's wall time; the ratios are the loop's time over the
contestant's (higher is faster) and the contestant's time over the best pinned count's of the same
epoch (1.0 is as fast as the best).

Corpora: a speech-like corpus of ``--utterances`` FLAC files of 1-22 s at 16 kHz (seeded), batched by
duration (``max_batch_seconds=120``, 10 buckets, shuffled), and, in batches of 16 samples, the
generated FLAC corpus of ``audiobuffer bench`` and the FSDD recordings. The load average is printed
before and after: on a busy machine the ratios are the figures to trust, not the seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import render
from harness import (
    FSDD,
    add_write_options,
    command_line,
    fsdd_files,
    load_average,
    machine_info,
    revision,
    write_results,
)
from torch.utils.data import DataLoader

from audiobuffer import AudioDecoder, BufferedDataset, IsolatedLoader, pad_collate
from audiobuffer.cli.bench import BATCH_SIZE, BUFFER_SIZE, make_corpus
from audiobuffer.engine import pool as pool_module
from audiobuffer.engine.plan import plan_batches
from audiobuffer.sources.item import WorkItem

CONTESTANTS = ["loop", "auto", "0", "1", "2", "isolated"]
#: How the page names each contestant.
LABELS = {"loop": "plain loop (same decoder and batches)", "auto": "`auto` (the default)",
          "0": "pinned 0 (decoding in the loop's thread)", "1": "pinned 1 producer", "2": "pinned 2 producers",
          "isolated": "`IsolatedLoader` (2 producers)"}
PINNED = ["0", "1", "2"]
#: The speech corpus's batches: seconds of padded audio per batch, duration buckets.
MAX_BATCH_SECONDS = 120.0
BUCKETS = 10
SEED = 0


def speech_corpus(root: Path, count: int, *, seed: int = SEED) -> list[str]:
    """``count`` mono 16 kHz FLAC files of 1-22 s: a tone gliding under noise, syllable-like bursts
    (made once per folder)."""
    import soundfile as sf

    root.mkdir(parents=True, exist_ok=True)
    marker = root / f"COMPLETE-{count}-{seed}"
    paths = [str(root / f"utt{i:05d}.flac") for i in range(count)]
    if not marker.exists():
        rng = np.random.default_rng(seed)
        for path in paths:
            n = int(16000 * rng.uniform(1.0, 22.0))
            t = np.arange(n) / 16000
            pitch = rng.uniform(90, 250) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(0.2, 1.0) * t))
            bursts = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(3, 6) * t) ** 2
            audio = 0.3 * bursts * np.sin(2 * np.pi * np.cumsum(pitch) / 16000) + 0.02 * rng.standard_normal(n)
            sf.write(path, audio.astype(np.float32), 16000, subtype="PCM_16")
        marker.write_text("ok", encoding="utf-8", newline="\n")
    return paths


class _Inline:
    """A tuner that keeps the consumer decoding in its own thread: "pinned 0" (a pinned count is >= 1)."""

    count = 0

    def __init__(self) -> None:
        self.history = [(0.0, 0, "pinned 0")]

    def due(self, now: float) -> bool:
        return False

    def observe(self, sample: Any) -> int:
        return 0


@contextlib.contextmanager
def pinned_inline() -> Iterator[None]:
    """While it lasts, a pool with ``num_producers="auto"`` decodes in the consumer's thread throughout."""
    default = pool_module.default_tuner
    pool_module.default_tuner = lambda *args, **kwargs: _Inline()  # type: ignore[assignment]
    try:
        yield
    finally:
        pool_module.default_tuner = default


class Case:
    """One corpus and how its epochs are batched (by duration, or ``batch_size`` samples)."""

    def __init__(self, name: str, paths: list[str], *, by_duration: bool) -> None:
        self.name, self.paths, self.by_duration = name, paths, by_duration
        self.decoder = AudioDecoder()
        self._durations: np.ndarray | None = None

    def options(self) -> dict[str, Any]:
        if self.by_duration:
            return {"max_batch_seconds": MAX_BATCH_SECONDS, "buckets": BUCKETS, "shuffle": True, "seed": SEED}
        return {"shuffle": True, "seed": SEED}

    def durations(self) -> np.ndarray:
        if self._durations is None:
            import soundfile as sf

            self._durations = np.array([sf.info(p).duration for p in self.paths])
        return self._durations

    def loop_batches(self, epoch: int) -> list[list[int]]:
        """The loop's batches of ``epoch``: the dataset's duration batches, or the files in order by 16."""
        if self.by_duration:
            plan = plan_batches(self.durations(), max_batch_seconds=MAX_BATCH_SECONDS, buckets=BUCKETS,
                                shuffle=True, seed=SEED, epoch=epoch)
            return [[int(i) for i in b] for b in plan.batches]
        order = np.random.default_rng(SEED + epoch).permutation(len(self.paths))
        return [[int(i) for i in order[s:s + BATCH_SIZE]] for s in range(0, len(order), BATCH_SIZE)]


def run_contestant(case: Case, name: str, epochs: int) -> tuple[list[float], list[str]]:
    """Wall seconds of each epoch of ``name`` on ``case``, and, for ``auto``, each epoch's history."""
    times: list[float] = []
    notes: list[str] = []
    if name == "loop":
        for epoch in range(epochs):
            start = time.perf_counter()
            for batch in case.loop_batches(epoch):
                pad_collate([case.decoder(WorkItem(index=i, path=case.paths[i], epoch=epoch, seed=SEED))
                             for i in batch])
            times.append(time.perf_counter() - start)
        return times, notes
    options = case.options()
    if name == "isolated":
        batching: dict[str, Any] = {} if case.by_duration else {"batch_size": BATCH_SIZE}
        with IsolatedLoader(case.paths, case.decoder, num_producers=2, buffer_size=BUFFER_SIZE,
                            pin_memory=False, **batching, **options) as loader:
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                start = time.perf_counter()
                for _ in loader:
                    pass
                times.append(time.perf_counter() - start)
        return times, notes
    count: Any = "auto" if name in ("auto", "0") else int(name)
    with contextlib.ExitStack() as stack:
        if name == "0":
            stack.enter_context(pinned_inline())
        ds = stack.enter_context(BufferedDataset(case.paths, case.decoder, num_producers=count,
                                                 buffer_size=BUFFER_SIZE, **options))
        loader = DataLoader(ds, batch_size=None if case.by_duration else BATCH_SIZE, collate_fn=pad_collate)
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            start = time.perf_counter()
            for _ in loader:
                pass
            times.append(time.perf_counter() - start)
            if name == "auto":
                stats = ds.stats()
                history = stats.producer_history if stats is not None else []
                notes.append(" > ".join(f"{n}@{t:.2f}s" for t, n, _ in history) +
                             (f" ({history[0][2]})" if history else ""))
    return times, notes


def run_case(case: Case, epochs: int, rounds: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Every contestant's epochs, ``rounds`` times, the order rotated each round."""
    times: dict[str, list[list[float]]] = {c: [[] for _ in range(epochs)] for c in CONTESTANTS}
    notes: list[list[str]] = []
    others = [c for c in CONTESTANTS if c != "auto"]
    for r in range(rounds):
        # auto last, after each other contestant in turn (the IsolatedLoader first: its helper has the
        # most to wind down); the others rotated too
        shift = (r - 1) % len(others)
        order = [*others[shift + 1:], *others[:shift + 1], "auto"]
        for name in order:
            got, seen = run_contestant(case, name, epochs)
            for epoch, seconds in enumerate(got):
                times[name][epoch].append(seconds)
            if seen:
                before = order[order.index(name) - 1] if order.index(name) else "(none)"
                notes.append([f"after {before}", *seen])
        log(f"  {case.name}: round {r + 1}/{rounds} done, load {load_average():s}")
    median = {c: [statistics.median(t) for t in per_epoch] for c, per_epoch in times.items()}
    best = [min(median[p][e] for p in PINNED) for e in range(epochs)]
    return {"case": case.name, "epochs_s": median, "times_s": times, "best_pinned_s": best,
            "vs_loop": {c: [median["loop"][e] / median[c][e] for e in range(epochs)] for c in CONTESTANTS},
            "vs_best_pinned": {c: [median[c][e] / best[e] for e in range(epochs)] for c in CONTESTANTS},
            "auto_histories": notes}


def report(result: dict[str, Any]) -> list[str]:
    epochs = len(result["best_pinned_s"])
    head = " | ".join(f"epoch {e + 1}: s, x loop, / best pinned" for e in range(epochs))
    lines = [f"{result['case']}", f"  {'contestant':<10} {head}"]
    for c in CONTESTANTS:
        cells = " | ".join(f"{result['epochs_s'][c][e]:6.2f} {result['vs_loop'][c][e]:5.2f}x "
                           f"{result['vs_best_pinned'][c][e]:5.2f}" for e in range(epochs))
        lines.append(f"  {c:<10} {cells}")
    lines.append("  auto's producer count per epoch (count@seconds into the epoch):")
    for note in result["auto_histories"]:
        lines.append(f"    {note[0]}: " + " | ".join(note[1:]))
    return lines


def to_results(saved: dict[str, Any], *, epochs: int, rounds: int) -> dict[str, Any]:
    """The ``epochs`` results of the page (``harness.results``' shape) from a run's figures as ``--json``
    saves them: a row per corpus and contestant, with the commit and load the run had."""
    rows = []
    for case in saved["cases"]:
        for c in CONTESTANTS:
            row: dict[str, Any] = {"corpus": case["case"], "setting": c, "label": LABELS[c],
                                   "epochs_s": case["epochs_s"][c], "vs_loop": case["vs_loop"][c],
                                   "vs_best_pinned": case["vs_best_pinned"][c]}
            if c == "auto":
                row["histories"] = case["auto_histories"]
            rows.append(row)
    data: dict[str, Any] = {
        "name": "epochs", "machine": saved["machine"], "versions": saved["versions"], "date": saved["date"],
        "commit": saved["commit"], "command": [saved["command"]],
        "settings": {"epochs": epochs, "rounds": rounds, "load_before": saved["load_before"],
                     "load_after": saved["load_after"]},
        "rows": rows}
    if saved.get("dirty"):
        data["dirty"] = True
    return data


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--utterances", type=int, default=800, help="speech corpus files (default 800)")
    parser.add_argument("--files", type=int, default=1000, help="generated FLAC files of 1-4 s (default 1000)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per contestant (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported (default 3)")
    parser.add_argument("--cases", default="speech,flac,fsdd", help="which corpora (default speech,flac,fsdd)")
    parser.add_argument("--fsdd", type=Path, default=FSDD, help=f"the FSDD recordings (default {FSDD})")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where corpora are made (default: a temp folder)")
    parser.add_argument("--json", type=Path, default=None, help="also save every round's figures to this file")
    add_write_options(parser, "epochs")
    args = parser.parse_args(argv)
    if args.epochs < 2 or args.rounds < 1 or args.utterances < 1 or args.files < BATCH_SIZE:
        parser.error(f"--epochs must be >= 2, --rounds >= 1, --utterances >= 1 and --files >= {BATCH_SIZE}")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - {"speech", "flac", "fsdd"})
    if unknown:
        parser.error(f"--cases takes speech, flac and fsdd, got {unknown}")

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started, load_before = time.perf_counter(), load_average()
    log(f"load average before: {load_before}")
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="audiobuffer-tuner-") as tmp:
        cache = args.cache_dir or Path(tmp)
        built: list[Case] = []
        if "speech" in cases:
            built.append(Case(f"speech: {args.utterances} FLAC utterances of 1-22 s at 16 kHz, "
                              f"max_batch_seconds={MAX_BATCH_SECONDS:g}, {BUCKETS} buckets",
                              speech_corpus(cache / f"speech-{args.utterances}", args.utterances), by_duration=True))
        if "flac" in cases:
            built.append(Case(f"FLAC: {args.files} generated files of 1-4 s at 16 kHz, batches of {BATCH_SIZE}",
                              make_corpus(cache / f"flac-{args.files}", args.files, "flac"), by_duration=False))
        if "fsdd" in cases:
            fsdd = fsdd_files(args.fsdd)
            if fsdd:
                built.append(Case(f"FSDD: {len(fsdd)} real recordings (WAV, 8 kHz), batches of {BATCH_SIZE}",
                                  fsdd, by_duration=False))
        for case in built:
            result = run_case(case, args.epochs, args.rounds, log)
            out.append(result)
            print("\n".join(report(result)), flush=True)
    load_after = load_average()
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_after}; "
          f"{time.perf_counter() - started:.0f} s in all")
    import datetime

    commit, dirty = revision()
    data = {"command": command_line("bench_tuner.py", argv), **machine_info(), "commit": commit, "dirty": dirty,
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "load_before": load_before, "load_after": load_after, "cases": out}
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8", newline="\n")
    measured = to_results(data, epochs=args.epochs, rounds=args.rounds)
    print(render.preview(measured))
    write_results(measured, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
