"""Epoch after epoch: ``num_producers="auto"`` against fixed counts over several epochs of one dataset.

    python benchmarks/bench_epochs.py            # print the table
    python benchmarks/bench_epochs.py --write    # and rewrite its section of BENCHMARKS.md

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

from bench_decode import LINEUP
from harness import FSDD, fsdd_files, machine, table, write_section
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
    from audiobuffer.decoders import audio as audio_module

    try:
        batches = LINEUP.loader(name, paths)  # loop-libsndfile turns the own WAV reader off: no pool runs meanwhile
        start = time.perf_counter()
        for _ in batches:
            pass
        return time.perf_counter() - start
    finally:
        audio_module._NATIVE_WAV = True


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


def report(results: dict[str, dict[Any, list[list[float]]]], epochs: int, rounds: int) -> str:
    lines = ["## Epoch after epoch: `auto` against fixed counts (`benchmarks/bench_epochs.py`)", "",
             f"Machine: {machine()}. One `BufferedDataset` per setting runs {epochs} epochs into "
             f"`DataLoader(num_workers=0, collate_fn=pad_collate)` (batches of {BATCH_SIZE}); the settings take "
             f"turns epoch by epoch; medians of {rounds} rounds, each with fresh datasets. From the second epoch "
             "on, `auto` starts where the last epoch settled (and keeps a failed trial's back-off). The loops below "
             "the settings decode and collate in the training thread, timed in turn with them as references; the "
             "last column is the soundfile loop's epoch over each row's (higher is faster)."]
    for corpus, times in results.items():
        med = {s: [statistics.median(t) for t in per_epoch] for s, per_epoch in times.items()}
        best = [min(med[s][e] for s in SETTINGS if s != "auto") for e in range(epochs)]
        reference = med.get("loop-libsndfile")
        rows = [[name_of(s)] + [f"{med[s][e]:.3f}" for e in range(epochs)]
                + [f"{med[s][-1] / best[-1]:.2f}x" if s in SETTINGS else "-"]
                + [f"{reference[-1] / med[s][-1]:.2f}x" if reference else "-"] for s in med]
        lines += ["", f"### {corpus}", "",
                  table(["setting"] + [f"epoch {e + 1} s" for e in range(epochs)]
                        + [f"epoch {epochs} vs best fixed", f"epoch {epochs}: soundfile loop / this"], rows)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="files per generated corpus (default 1000)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per dataset (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; medians are reported (default 5)")
    parser.add_argument("--fsdd", type=Path, default=FSDD, help=f"the FSDD recordings (default {FSDD})")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where corpora are made (default: a temp folder)")
    parser.add_argument("--write", action="store_true", help="rewrite the 'epochs' section of BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.epochs < 2 or args.rounds < 1 or args.files < BATCH_SIZE:
        parser.error(f"--epochs must be >= 2, --rounds >= 1 and --files >= {BATCH_SIZE}")
    results: dict[str, dict[Any, list[list[float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="audiobuffer-epochs-") as tmp:
        cache = args.cache_dir or Path(tmp)
        corpora = {f"{fmt.upper()}, {args.files} generated files of 1-4 s at 16 kHz":
                   make_corpus(cache / f"{fmt}-{args.files}", args.files, fmt) for fmt in ("flac", "wav")}
        fsdd = fsdd_files(args.fsdd)
        if fsdd:
            corpora[f"FSDD, {len(fsdd)} real recordings (WAV, 8 kHz)"] = fsdd
        for corpus, paths in corpora.items():
            results[corpus] = run_corpus(paths, args.epochs, args.rounds)
            print(f"  {corpus}: done", file=sys.stderr)
    text = report(results, args.epochs, args.rounds)
    print(text)
    if args.write:
        write_section("epochs", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
