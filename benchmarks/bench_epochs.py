"""Epoch after epoch: ``num_producers="auto"`` against fixed counts over several epochs of one dataset.

    python benchmarks/bench_epochs.py            # print the section
    python benchmarks/bench_epochs.py --write    # and save results/epochs.json, render BENCHMARKS.md

``audiobuffer bench`` times one epoch in a fresh process, so ``auto`` there always pays its first
epoch's trials. A training run reuses its dataset: from the second epoch on, ``auto`` starts at the
count the last epoch settled on (NOTE [ Producer tuning ] in ``audiobuffer/engine/tuner.py``). Here each
setting gets one ``BufferedDataset`` that runs ``--epochs`` epochs into ``DataLoader(num_workers=0,
collate_fn=pad_collate)``, batches of 16, on the generated FLAC and WAV corpora of ``audiobuffer
bench`` and on FSDD. The settings take turns epoch by epoch, so a busy spell of a shared machine
slows them alike; a figure is the median over ``--rounds`` rounds of that epoch's wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import render
from bench_decode import LINEUP
from harness import FSDD, command_line, fsdd_files, results
from torch.utils.data import DataLoader

from audiobuffer import AudioDecoder, BufferedDataset, pad_collate
from audiobuffer.cli.bench import BATCH_SIZE, BUFFER_SIZE, make_corpus

SETTINGS: list[Any] = ["auto", 1, 2]
#: Loops in the training thread, timed in turn with the settings as references (no state across epochs);
#: approaches of ``benchmarks/bench_decode.py``'s line-up.
LOOPS = ["loop", "loop-libsndfile", "spdl-load_wav"]


def epoch(ds: BufferedDataset, number: int) -> float:
    """Wall seconds of epoch ``number`` of ``ds`` through a DataLoader."""
    ds.set_epoch(number)
    start = time.perf_counter()
    for _ in DataLoader(ds, batch_size=BATCH_SIZE, collate_fn=pad_collate, num_workers=0):
        pass
    return time.perf_counter() - start


def loop_epoch(name: str, paths: list[str]) -> float:
    """Wall seconds of one epoch of the loop ``name`` (one of :data:`LOOPS`) in this thread: decode and
    ``pad_collate`` batches of 16, as ``audiobuffer bench`` times it (``loop-libsndfile`` reads WAV through
    libsndfile, not audiobuffer's own reader; ``spdl-load_wav`` decodes with SPDL's WAV parser)."""
    batches = LINEUP.loader(name, paths)  # loop-libsndfile's decoder has the own WAV reader off
    start = time.perf_counter()
    for _ in batches:
        pass
    return time.perf_counter() - start


def loops_for(paths: list[str]) -> list[str]:
    """The reference loops that apply to ``paths``: SPDL's ``load_wav`` only for WAV files, when installed."""
    return [name for name in LOOPS if LINEUP.available(name) and LINEUP.applies(name, paths, None)]


def run_corpus(paths: list[str], epochs: int, rounds: int) -> dict[Any, list[list[float]]]:
    """``times[setting or loop][epoch]``: that epoch's wall time in each round."""
    loops = loops_for(paths)
    times: dict[Any, list[list[float]]] = {s: [[] for _ in range(epochs)] for s in SETTINGS + loops}
    decoder = AudioDecoder()
    for _ in range(rounds):
        datasets = {s: BufferedDataset(paths, decoder, num_producers=s, buffer_size=BUFFER_SIZE) for s in SETTINGS}
        for number in range(epochs):
            for setting, ds in datasets.items():
                times[setting][number].append(epoch(ds, number))
            for name in loops:
                times[name][number].append(loop_epoch(name, paths))
        for ds in datasets.values():
            ds.close()
    return times


LOOP_NAMES = {"loop": "plain loop (same decoder, one thread)",
              "loop-libsndfile": "soundfile loop (WAV through libsndfile too)",
              "spdl-load_wav": "`spdl.io.load_wav` loop"}


def name_of(setting: Any) -> str:
    if setting in LOOP_NAMES:
        return str(LOOP_NAMES[setting])
    return "`auto` (the default)" if setting == "auto" else f"{setting} producer{'s' * (setting != 1)}"


def rows_of(times_by_corpus: dict[str, dict[Any, list[list[float]]]]) -> list[dict[str, Any]]:
    """One row per corpus and setting (or loop): the median of each epoch over the rounds, the last epoch
    over the best fixed count's, and the soundfile loop's last epoch over this one's (higher is faster)."""
    rows = []
    for corpus, times in times_by_corpus.items():
        med = {s: [statistics.median(t) for t in per_epoch] for s, per_epoch in times.items()}
        best = min(med[s][-1] for s in SETTINGS if s != "auto")
        reference = med.get("loop-libsndfile")
        rows += [{"corpus": corpus, "setting": str(s), "label": name_of(s), "epochs_s": med[s],
                  "vs_best_fixed": med[s][-1] / best if s in SETTINGS else None,
                  "soundfile_loop_over_this": reference[-1] / med[s][-1] if reference else None} for s in med]
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="files per generated corpus (default 1000)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per dataset (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; medians are reported (default 5)")
    parser.add_argument("--fsdd", type=Path, default=FSDD, help=f"the FSDD recordings (default {FSDD})")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where corpora are made (default: a temp folder)")
    parser.add_argument("--write", action="store_true", help="save results/epochs.json and render BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.epochs < 2 or args.rounds < 1 or args.files < BATCH_SIZE:
        parser.error(f"--epochs must be >= 2, --rounds >= 1 and --files >= {BATCH_SIZE}")
    times: dict[str, dict[Any, list[list[float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="audiobuffer-epochs-") as tmp:
        cache = args.cache_dir or Path(tmp)
        corpora = {f"{fmt.upper()}, {args.files} generated files of 1-4 s at 16 kHz":
                   make_corpus(cache / f"{fmt}-{args.files}", args.files, fmt) for fmt in ("flac", "wav")}
        fsdd = fsdd_files(args.fsdd)
        if fsdd:
            corpora[f"FSDD, {len(fsdd)} real recordings (WAV, 8 kHz)"] = fsdd
        for corpus, paths in corpora.items():
            times[corpus] = run_corpus(paths, args.epochs, args.rounds)
            print(f"  {corpus}: done", file=sys.stderr)
    measured = results("epochs", rows_of(times), command=command_line("bench_epochs.py", argv),
                       settings={"epochs": args.epochs, "rounds": args.rounds, "files": args.files,
                                 "batch_size": BATCH_SIZE})
    print(render.preview(measured))
    if args.write:
        render.publish(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
