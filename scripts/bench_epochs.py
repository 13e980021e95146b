"""Epoch after epoch: ``num_producers="auto"`` against fixed counts over several epochs of one dataset.

    python scripts/bench_epochs.py            # print the table
    python scripts/bench_epochs.py --write    # and rewrite its section of BENCHMARKS.md

``audiobuffer bench`` times one epoch in a fresh process, so ``auto`` there always pays its first
epoch's trials. A training run reuses its dataset: from the second epoch on, ``auto`` starts at the
count the last epoch settled on (NOTE [ Producer tuning ] in ``audiobuffer/_tuner.py``). Here each
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmd import FSDD, machine, table, write_section  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from audiobuffer import AudioDecoder, BufferedDataset, pad_collate  # noqa: E402
from audiobuffer.tools.bench import make_corpus  # noqa: E402

SETTINGS: list[Any] = ["auto", 1, 2]
BATCH_SIZE = 16
BUFFER_SIZE = 64


def epoch(ds: BufferedDataset, number: int) -> float:
    """Wall seconds of epoch ``number`` of ``ds`` through a DataLoader."""
    ds.set_epoch(number)
    start = time.perf_counter()
    for _ in DataLoader(ds, batch_size=BATCH_SIZE, collate_fn=pad_collate, num_workers=0):
        pass
    return time.perf_counter() - start


def run_corpus(paths: list[str], epochs: int, rounds: int) -> dict[Any, list[list[float]]]:
    """``times[setting][epoch]``: that epoch's wall time in each round."""
    times: dict[Any, list[list[float]]] = {s: [[] for _ in range(epochs)] for s in SETTINGS}
    decoder = AudioDecoder()
    for _ in range(rounds):
        datasets = {s: BufferedDataset(paths, decoder, num_producers=s, buffer_size=BUFFER_SIZE) for s in SETTINGS}
        for number in range(epochs):
            for setting, ds in datasets.items():
                times[setting][number].append(epoch(ds, number))
        for ds in datasets.values():
            ds.close()
    return times


def name_of(setting: Any) -> str:
    return "`auto` (the default)" if setting == "auto" else f"{setting} producer{'s' * (setting != 1)}"


def report(results: dict[str, dict[Any, list[list[float]]]], epochs: int, rounds: int) -> str:
    lines = ["## Epoch after epoch: `auto` against fixed counts (`scripts/bench_epochs.py`)", "",
             f"Machine: {machine()}. One `BufferedDataset` per setting runs {epochs} epochs into "
             f"`DataLoader(num_workers=0, collate_fn=pad_collate)` (batches of {BATCH_SIZE}); the settings take "
             f"turns epoch by epoch; medians of {rounds} rounds, each with fresh datasets. From the second epoch "
             "on, `auto` starts where the last epoch settled (and keeps a failed trial's back-off)."]
    for corpus, times in results.items():
        med = {s: [statistics.median(t) for t in per_epoch] for s, per_epoch in times.items()}
        best = [min(med[s][e] for s in SETTINGS if s != "auto") for e in range(epochs)]
        rows = [[name_of(s)] + [f"{med[s][e]:.3f}" for e in range(epochs)]
                + [f"{med[s][-1] / best[-1]:.2f}x"] for s in SETTINGS]
        lines += ["", f"### {corpus}", "",
                  table(["setting"] + [f"epoch {e + 1} s" for e in range(epochs)]
                        + [f"epoch {epochs} vs best fixed"], rows)]
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
        fsdd = sorted(str(p) for p in args.fsdd.glob("*.wav")) if args.fsdd.is_dir() else []
        if fsdd:
            corpora[f"FSDD, {len(fsdd)} real recordings (WAV, 8 kHz)"] = fsdd
        else:
            print(f"FSDD not found at {args.fsdd}: that corpus is left out", file=sys.stderr)
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
