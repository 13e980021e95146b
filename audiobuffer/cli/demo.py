"""The demo: train a tiny audio classifier through the full pipeline on a corpus the package makes.

The corpus is ten classes of synthetic "spoken digit-like" sounds: a voiced source (harmonics of a
pitch that drifts) shaped by two formant resonances that glide from a class-specific start to a
class-specific end, with a random length, loudness, pitch and noise per file. It is deterministic
(seeded), written once as FLAC to a cache folder, and reused afterwards.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch
from torch.utils.data import DataLoader

from ..collate import pad_collate
from ..decoders import AudioDecoder
from ..loaders.dataset import BufferedDataset
from ..loaders.device import DevicePrefetcher, resolve_device
from ..prepare.durations import cache_root
from ._model import SpeechCNN, evaluate, make_optimizer, train_step
from ._threads import Threads, quiet_openmp, set_torch_threads
from .report import RunSummary, Timer

__all__ = ["default_cache_dir", "make_demo_corpus", "run_demo"]

logger = logging.getLogger(__name__)

SAMPLE_RATE = 8000
CORPUS_VERSION = 1
#: (F1 start, F2 start, F1 end, F2 end) in Hz for each class.
_FORMANTS = [
    (730, 1090, 730, 1090), (270, 2290, 270, 2290), (300, 870, 300, 870), (530, 1840, 530, 1840),
    (660, 1720, 270, 2290), (270, 2290, 730, 1090), (570, 840, 300, 870), (300, 870, 660, 1720),
    (440, 1020, 530, 1840), (490, 1350, 390, 1990),
]
_TEST_FILES = re.compile(r"_(\d+)\.flac$")


#: Where the demo corpus is made: audiobuffer's cache folder (``$AUDIOBUFFER_CACHE_DIR``, else
#: ``$XDG_CACHE_HOME/audiobuffer``, else ``~/.cache/audiobuffer``).
default_cache_dir = cache_root


def _utterance(label: int, rng: np.random.Generator) -> np.ndarray:
    seconds = rng.uniform(0.35, 0.9)
    n = int(seconds * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    glide = np.clip(t / seconds * rng.uniform(0.9, 1.1), 0, 1)
    f0 = rng.uniform(90, 220) * (1 + rng.uniform(-0.15, 0.15) * glide)
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    f1s, f2s, f1e, f2e = (f * rng.uniform(0.92, 1.08) for f in _FORMANTS[label])
    f1 = f1s + (f1e - f1s) * glide
    f2 = f2s + (f2e - f2s) * glide
    signal = np.zeros(n)
    for h in range(1, int(SAMPLE_RATE / 2 / 90)):
        freq = h * f0
        gain = np.exp(-((freq - f1) / 90.0) ** 2) + 0.7 * np.exp(-((freq - f2) / 120.0) ** 2) + 0.02
        signal += np.where(freq < SAMPLE_RATE / 2, gain * np.sin(h * phase), 0.0)
    envelope = np.minimum(1.0, t / 0.04) * np.minimum(1.0, (seconds - t) / 0.08)
    signal = signal * envelope / (np.abs(signal).max() + 1e-9) * rng.uniform(0.3, 0.9)
    signal += rng.normal(0, rng.uniform(0.003, 0.02), n)
    lead = np.zeros(int(rng.uniform(0, 0.08) * SAMPLE_RATE))
    return np.concatenate([lead, signal]).astype(np.float32)


def make_demo_corpus(root: Path | None = None, *, per_class: int = 50, seed: int = 0) -> Path:
    """Write (once) the demo corpus ``{label}_synth_{i}.flac`` under ``root``; return its folder.

    A marker file records the parameters, so a finished corpus is reused and a partial one redone.
    """
    root = (root or default_cache_dir()) / f"demo-v{CORPUS_VERSION}-{per_class}-{seed}"
    marker = root / "COMPLETE"
    if marker.is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    for label in range(len(_FORMANTS)):
        for i in range(per_class):
            audio = _utterance(label, np.random.default_rng([seed, label, i]))
            sf.write(root / f"{label}_synth_{i}.flac", audio, SAMPLE_RATE, subtype="PCM_16")
    made = {"version": CORPUS_VERSION, "per_class": per_class, "seed": seed}
    marker.write_text(json.dumps(made), encoding="utf-8", newline="\n")
    return root


def _split(root: Path, test_per_class: int) -> tuple[list[str], list[str]]:
    train: list[str] = []
    test: list[str] = []
    for path in sorted(root.glob("*.flac")):
        match = _TEST_FILES.search(path.name)
        (test if match and int(match.group(1)) < test_per_class else train).append(str(path))
    return train, test


def run_demo(*, epochs: int = 12, per_class: int = 50, num_producers: int = 2, batch_size: int = 32,
             lr: float = 1e-2, device: str = "auto", threads: Threads = "auto", cache_dir: Path | None = None,
             seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Make the corpus, train, evaluate; return the results (accuracy, time split, summary).

    ``threads``: torch's intra-op threads for a CPU step (see NOTE [ torch threads beside producers ]);
    the line that says what was chosen is the result's ``threads``.
    """
    torch.manual_seed(seed)
    dev = resolve_device(device)
    # The demo's model is small: a second thread helps its step less than the core helps its producers.
    chosen = set_torch_threads(threads, device_type=dev.type, wait=quiet_openmp(), spare=1)
    start = time.perf_counter()
    root = make_demo_corpus(cache_dir, per_class=per_class, seed=seed)
    corpus_s = time.perf_counter() - start
    train_files, test_files = _split(root, test_per_class=max(1, per_class // 5))
    decoder = AudioDecoder(SAMPLE_RATE, crop_seconds=1.0, crop="start")
    labels = r"^(\d+)_"
    train = BufferedDataset(train_files, decoder, labels=labels, shuffle=True, seed=seed,
                            num_producers=num_producers, buffer_size=4 * batch_size)
    test = BufferedDataset(test_files, decoder, labels=labels, ordered=True, num_producers=num_producers)
    pin = dev.type == "cuda"
    train_loader = DataLoader(train, batch_size=batch_size, collate_fn=pad_collate, pin_memory=pin)
    test_loader = DataLoader(test, batch_size=64, collate_fn=pad_collate, pin_memory=pin)

    model = SpeechCNN(len(train.classes), SAMPLE_RATE, n_fft=256, hop_length=80, n_mels=40, channels=16).to(dev)
    optimizer, schedule = make_optimizer(model, lr=lr, weight_decay=1e-4, epochs=epochs,
                                         steps_per_epoch=-(-len(train) // batch_size))
    summary = RunSummary()
    history = []
    steps = Timer()
    train_start = time.perf_counter()
    for epoch in range(epochs):
        train.set_epoch(epoch)
        model.train()
        total_loss, seen = 0.0, 0
        batches = DevicePrefetcher(train_loader, dev)  # copies the next batches while this one trains
        for batch in _progress(batches, progress, f"epoch {epoch + 1}/{epochs}"):
            with steps:
                total_loss += train_step(model, batch, optimizer, schedule) * len(batch["label"])
                seen += len(batch["label"])
            summary.add_batch(batch)
        summary.add_epoch(train.stats())
        accuracy = evaluate(model, test_loader, dev)
        history.append({"epoch": epoch, "loss": total_loss / max(1, seen), "test_accuracy": accuracy})
        logger.info("epoch %d: loss %.3f, test accuracy %.1f%%", epoch, history[-1]["loss"], 100 * accuracy)
    summary.wall_s = time.perf_counter() - train_start
    summary.step_s = steps.seconds
    summary.judge(producers_key="--num-producers")
    return {
        "corpus": str(root), "corpus_s": corpus_s, "train_files": len(train_files),
        "test_files": len(test_files), "classes": len(train.classes), "epochs": epochs,
        "device": str(dev), "intra_op_threads": torch.get_num_threads(), "threads": chosen,
        "num_producers": num_producers,
        "history": history, "test_accuracy": history[-1]["test_accuracy"] if history else 0.0,
        "summary": summary.as_dict(), "summary_lines": summary.lines(),
    }


def _progress(iterable: Any, enabled: bool, desc: str) -> Any:
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, unit="batch", leave=False, disable=None)  # None: off when not a terminal
