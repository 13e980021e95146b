"""An epoch with speed perturbation, noise and reverberation against the same epoch without them,
and against Lhotse's own augmentation of the same corpus, in one process, the contestants taking
turns.

    python benchmarks/bench_augment.py                 # print the table
    python benchmarks/bench_augment.py --write         # and save benchmarks/results/augment.json
    python benchmarks/bench_augment.py --files 200 --rounds 1 --epochs 2   # a quick look

The corpus is ``audiobuffer bench``'s: ``--files`` generated mono 16 kHz FLAC files of 1-4 s. The
script makes the corpora mixed in, seeded: 20 noise recordings of 5 s (white noise through a random
one-pole low-pass filter, FLAC) and 20 room impulse responses of 0.2-0.6 s (white noise under an
exponential decay of 50-150 ms, FLAC). Every contestant reads batches of 16 in a shuffled order:

- ``plain``: ``BufferedDataset`` (``num_producers="auto"``), ``DataLoader(batch_size=16,
  collate_fn=pad_collate)``, no augmentation;
- ``augmented``: the same with ``AudioDecoder(augment=[SpeedPerturb((0.9, 1.0, 1.1)),
  AddNoise(noise, p=0.5), Reverb(rirs, p=0.3)])``;
- ``transform``: the same augmentations written as a per-sample ``transform=`` in Python, as one
  would without ``augment=`` (soxr, numpy's RNG, ``scipy.signal.fftconvolve``; unseeded);
- ``lhotse N``: Lhotse's pipeline as its recipes write it: a ``CutSet`` of the files with one
  supervision each, ``SimpleCutSampler(max_cuts=16, shuffle=True)``, ``K2SpeechRecognitionDataset(
  input_strategy=AudioSamples(), cut_transforms=[PerturbSpeed((0.9, 1.1), p=2/3), CutMix(noise cuts,
  snr=(10, 20), p=0.5, random_mix_offset=True), ReverbWithImpulseResponse(rirs, p=0.3)])``, in a
  ``DataLoader(batch_size=None, num_workers=N, persistent_workers=True)`` for N in
  ``--lhotse-workers``.

A figure is the median over ``--rounds`` rounds of the last of ``--epochs`` epochs (the warm one).
The ratios are each contestant's time over the plain epoch's and Lhotse's best over the augmented
epoch's, and each round's augmented over plain (their median: the figure a busy spell in one
contestant's turn moves least). The "one thread" rows time, in one thread, decoding every file,
then each augmentation on every decoded item with a warm epoch's draws (per item: over all
items, applied or not): ``(decode + augment) / decode`` is what the augmented epoch costs over
the plain one where the augmentations have no idle core to run on. The load average is recorded
before and after.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import render
from harness import add_write_options, command_line, load_average, results, table, write_results
from torch.utils.data import DataLoader

from audiobuffer import AudioDecoder, BufferedDataset, pad_collate
from audiobuffer.augment import AddNoise, Reverb, SpeedPerturb
from audiobuffer.cli.bench import BATCH_SIZE, make_corpus
from audiobuffer.sources.item import WorkItem

SEED = 0
SAMPLE_RATE = 16000
#: The noise and impulse-response corpora: how many files of each.
NOISES, RIRS = 20, 20


def make_noise(root: Path, count: int = NOISES, *, seed: int = SEED) -> list[str]:
    """``count`` FLAC files of 5 s of white noise through a random one-pole low-pass filter."""
    import soundfile as sf
    from scipy.signal import lfilter

    root.mkdir(parents=True, exist_ok=True)
    paths = [str(root / f"noise{i:03d}.flac") for i in range(count)]
    marker = root / f"COMPLETE-{count}-{seed}"
    if not marker.exists():
        rng = np.random.default_rng(seed)
        for path in paths:
            pole = rng.uniform(0.0, 0.95)
            audio = lfilter([1.0 - pole], [1.0, -pole], rng.standard_normal(5 * SAMPLE_RATE))
            audio *= 0.3 / np.max(np.abs(audio))
            sf.write(path, audio.astype(np.float32), SAMPLE_RATE, subtype="PCM_16")
        marker.write_text("ok", encoding="utf-8", newline="\n")
    return paths


def make_rirs(root: Path, count: int = RIRS, *, seed: int = SEED) -> list[str]:
    """``count`` FLAC impulse responses of 0.2-0.6 s: white noise under an exponential decay."""
    import soundfile as sf

    root.mkdir(parents=True, exist_ok=True)
    paths = [str(root / f"rir{i:03d}.flac") for i in range(count)]
    marker = root / f"COMPLETE-{count}-{seed}"
    if not marker.exists():
        rng = np.random.default_rng(seed + 1)
        for path in paths:
            t = np.arange(int(SAMPLE_RATE * rng.uniform(0.2, 0.6))) / SAMPLE_RATE
            rir = rng.standard_normal(len(t)) * np.exp(-t / rng.uniform(0.05, 0.15))
            rir[0] = 4.0  # the direct path
            sf.write(path, (0.9 * rir / np.max(np.abs(rir))).astype(np.float32), SAMPLE_RATE,
                     subtype="PCM_16")
        marker.write_text("ok", encoding="utf-8", newline="\n")
    return paths


def augmentations(noise: list[str], rirs: list[str]) -> list[Any]:
    return [SpeedPerturb((0.9, 1.0, 1.1)), AddNoise(noise, snr_db=(10.0, 20.0), p=0.5),
            Reverb(rirs, p=0.3)]


class PerSample:
    """The same augmentations as a per-sample ``transform=`` in plain Python (unseeded)."""

    def __init__(self, noise: list[str], rirs: list[str]) -> None:
        import soundfile as sf

        self.noise = [sf.read(p, dtype="float32")[0] for p in noise]
        self.rirs = [sf.read(p, dtype="float32")[0] for p in rirs]
        self.rng = np.random.default_rng()

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        import soxr
        import torch
        from scipy.signal import fftconvolve

        rng = self.rng
        audio = sample["audio"].numpy()
        factor = float(rng.choice([0.9, 1.0, 1.1]))
        if factor != 1.0:
            audio = soxr.resample(audio, SAMPLE_RATE, SAMPLE_RATE / factor)
        if rng.random() < 0.5:
            clip = self.noise[rng.integers(len(self.noise))]
            noise = np.resize(np.roll(clip, -int(rng.integers(len(clip)))), len(audio))
            snr = rng.uniform(10.0, 20.0)
            scale = np.sqrt(np.mean(audio**2) / (np.mean(noise**2) * 10 ** (snr / 10)))
            audio = audio + scale * noise
        if rng.random() < 0.3:
            wet = fftconvolve(audio, self.rirs[rng.integers(len(self.rirs))])[: len(audio)]
            audio = wet * np.sqrt(np.sum(audio**2) / np.sum(wet**2))
        return {**sample, "audio": torch.from_numpy(audio.astype(np.float32)),
                "num_frames": len(audio)}


def ours(
    paths: list[str], decoder: AudioDecoder, transform: Any = None
) -> Callable[[int], Iterator[Any]]:
    ds = BufferedDataset(paths, decoder, transform=transform, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=BATCH_SIZE, collate_fn=pad_collate)

    def epoch(e: int) -> Iterator[Any]:
        ds.set_epoch(e)
        return iter(loader)

    epoch.close = ds.close  # type: ignore[attr-defined]
    return epoch


def lhotse_pipeline(paths: list[str], noise: list[str], rirs: list[str],
                    workers: int) -> Callable[[int], Iterator[Any]]:
    """Lhotse's on-the-fly augmentation of the same files, as its recipes write it."""
    import random

    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet
    from lhotse.dataset import K2SpeechRecognitionDataset, SimpleCutSampler
    from lhotse.dataset.cut_transforms import CutMix, PerturbSpeed, ReverbWithImpulseResponse
    from lhotse.dataset.input_strategies import AudioSamples

    recordings = RecordingSet.from_recordings(Recording.from_file(p) for p in paths)
    supervisions = SupervisionSet.from_segments(
        SupervisionSegment(id=r.id, recording_id=r.id, start=0.0, duration=r.duration, text="")
        for r in recordings)
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
    noise_cuts = CutSet.from_manifests(
        recordings=RecordingSet.from_recordings(Recording.from_file(p) for p in noise))
    rir_recordings = RecordingSet.from_recordings(Recording.from_file(p) for p in rirs)
    dataset = K2SpeechRecognitionDataset(
        input_strategy=AudioSamples(),
        cut_transforms=[
            PerturbSpeed(factors=[0.9, 1.1], p=2 / 3, randgen=random.Random(SEED)),
            CutMix(cuts=noise_cuts, snr=(10, 20), p=0.5, seed=SEED, random_mix_offset=True),
            ReverbWithImpulseResponse(rir_recordings, p=0.3, randgen=random.Random(SEED)),
        ])
    sampler = SimpleCutSampler(cuts, max_cuts=BATCH_SIZE, shuffle=True, seed=SEED)
    loader = DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=workers,
                        persistent_workers=workers > 0)

    def epoch(e: int) -> Iterator[Any]:
        sampler.set_epoch(e)
        return iter(loader)

    epoch.close = lambda: None  # type: ignore[attr-defined]
    return epoch


def ceiling(paths: list[str], noise: list[str], rirs: list[str]) -> tuple[float, dict[str, float]]:
    """Seconds to decode every file, then each augmentation's seconds on every decoded item (the
    draws of epoch 1, in turn, as the decoder runs them, after an untimed epoch 0 that decodes the
    noise and computes the impulse responses' spectra, as a warm epoch finds them), all in this
    thread."""
    decoder = AudioDecoder()
    augment = augmentations(noise, rirs)
    start = time.perf_counter()
    decoded = [decoder(WorkItem(index=i, path=p, epoch=0, seed=SEED))["audio"].numpy()[None, :]
               for i, p in enumerate(paths)]
    decode_s = time.perf_counter() - start
    spent = {type(aug).__name__: 0.0 for aug in augment}
    for epoch in (0, 1):
        for i, audio in enumerate(decoded):
            for k, aug in enumerate(augment):
                start = time.perf_counter()
                audio = aug(audio, SAMPLE_RATE, (SEED, epoch, i, k))
                if epoch == 1:
                    spent[type(aug).__name__] += time.perf_counter() - start
    return decode_s, spent


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--files", type=int, default=1000, help="FLAC files of 1-4 s (default 1000)")
    add("--epochs", type=int, default=2, help="epochs each; the last is timed (default 2)")
    add("--rounds", type=int, default=3, help="rounds; medians are reported (default 3)")
    add("--lhotse-workers", default="0,2", help="Lhotse's DataLoader workers (default 0,2)")
    add("--no-lhotse", action="store_true", help="leave Lhotse out")
    add("--cache-dir", type=Path, default=None, help="where corpora are made (default: temp)")
    add_write_options(parser, "augment")
    args = parser.parse_args(argv)
    if args.files < BATCH_SIZE or args.epochs < 1 or args.rounds < 1:
        parser.error(f"--files must be >= {BATCH_SIZE}, --epochs and --rounds >= 1")
    workers = ([] if args.no_lhotse else
               [int(w) for w in args.lhotse_workers.split(",") if w.strip()])
    if not args.no_lhotse:
        try:
            import lhotse  # noqa: F401
        except ImportError:
            print("lhotse is not installed: its rows are left out", file=sys.stderr)
            workers = []

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started, load_before = time.perf_counter(), load_average()
    log(f"load average before: {load_before}")
    with tempfile.TemporaryDirectory(prefix="audiobuffer-augment-") as tmp:
        cache = args.cache_dir or Path(tmp)
        paths = make_corpus(cache / f"flac-{args.files}", args.files, "flac")
        noise, rirs = make_noise(cache / "noise"), make_rirs(cache / "rirs")
        makers: dict[str, Callable[[], Callable[[int], Iterator[Any]]]] = {
            "plain": lambda: ours(paths, AudioDecoder()),
            "augmented": lambda: ours(paths, AudioDecoder(augment=augmentations(noise, rirs))),
            "transform": lambda: ours(paths, AudioDecoder(), PerSample(noise, rirs)),
        }
        for w in workers:
            makers[f"lhotse {w}"] = lambda w=w: lhotse_pipeline(paths, noise, rirs, w)
        times: dict[str, list[float]] = {name: [] for name in makers}
        decode_s: list[float] = []
        augment_s: dict[str, list[float]] = {}
        names = list(makers)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:  # rotated each round
                epoch = makers[name]()
                try:
                    for e in range(args.epochs):
                        start = time.perf_counter()
                        for _ in epoch(e):
                            pass
                        seconds = time.perf_counter() - start
                finally:
                    epoch.close()  # type: ignore[attr-defined]
                times[name].append(seconds)
            d, spent = ceiling(paths, noise, rirs)
            decode_s.append(d)
            for name, seconds in spent.items():
                augment_s.setdefault(name, []).append(seconds)
            done = ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items())
            log(f"  round {r + 1}/{args.rounds}: {done}; decode {d:.2f} s, augment "
                f"{sum(spent.values()):.2f} s; load {load_average()}")
    load_after = load_average()
    median = {name: statistics.median(t) for name, t in times.items()}
    plain = median["plain"]
    lhotse = {n: s for n, s in median.items() if n.startswith("lhotse")}
    best_lhotse = min(lhotse, key=lambda n: lhotse[n]) if lhotse else None
    rows: list[dict[str, Any]] = []
    for name, seconds in median.items():
        row: dict[str, Any] = {"contestant": name, "epoch_s": round(seconds, 3),
                               "vs_plain": round(seconds / plain, 2),
                               "times_s": [round(t, 3) for t in times[name]]}
        if name == "augmented":
            row["vs_plain_rounds_median"] = round(statistics.median(
                a / p for a, p in zip(times[name], times["plain"])), 2)
            if best_lhotse is not None:
                row["lhotse_best_over_this"] = round(lhotse[best_lhotse] / seconds, 2)
        rows.append(row)
    dec = statistics.median(decode_s)
    each = {name: statistics.median(t) for name, t in augment_s.items()}
    aug = sum(each.values())
    rows.append({"contestant": "one thread: decode", "epoch_s": round(dec, 3),
                 "per_item_ms": round(1000 * dec / args.files, 3)})
    for name, seconds in each.items():
        rows.append({"contestant": f"one thread: {name}", "epoch_s": round(seconds, 3),
                     "per_item_ms": round(1000 * seconds / args.files, 3)})
    rows.append({"contestant": "one thread: all three augmentations", "epoch_s": round(aug, 3),
                 "per_item_ms": round(1000 * aug / args.files, 3),
                 "decode_plus_augment_over_decode": round((dec + aug) / dec, 2)})
    print(table(["contestant", "warm epoch s (median)", "x plain", "runs s"],
                [[r["contestant"], f"{r['epoch_s']:.2f}",
                  f"{r['vs_plain']:.2f}x" if "vs_plain" in r else f"{r['per_item_ms']:.2f} ms/item",
                  " ".join(f"{t:.2f}" for t in r.get("times_s", []))]
                 for r in rows]))
    print("augmented over plain, each round's ratio: median "
          f"{rows[1]['vs_plain_rounds_median']:.2f}")
    if best_lhotse is not None:
        print(f"{best_lhotse} (Lhotse's best) takes "
              f"{lhotse[best_lhotse] / median['augmented']:.2f}x the augmented epoch")
    print(f"one thread: (decode + augment) / decode = {(dec + aug) / dec:.2f}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_after}; "
          f"{time.perf_counter() - started:.0f} s in all")
    measured = results("augment", rows, command=command_line("bench_augment.py", argv),
                       settings={"files": args.files, "epochs": args.epochs, "rounds": args.rounds,
                                 "batch_size": BATCH_SIZE, "noises": NOISES, "rirs": RIRS,
                                 "lhotse_workers": workers, "load_before": load_before,
                                 "load_after": load_after})
    print(render.preview(measured))
    write_results(measured, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
