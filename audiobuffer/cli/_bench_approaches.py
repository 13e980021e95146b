"""What ``audiobuffer bench`` measures, and how it shows it: the loaders, corpora and transforms.

Each loader (:func:`loader`) makes one epoch's batches from a list of paths. Every approach decodes
with the same :class:`~audiobuffer.AudioDecoder` (libsndfile through python-soundfile), applies the
corpus's per-sample transform where it has one (:func:`mel_transform` for ``flac+mel``), and collates
batches of :data:`BATCH_SIZE` with :func:`~audiobuffer.pad_collate`; ``spdl-load_wav`` alone decodes
with SPDL's own WAV parser. Peers whose package is missing are left out (:func:`available`).
The corpora come from ``--formats`` (:func:`parse_formats`, :func:`generated_corpora`); the results
become Markdown tables under a header line naming the GIL state (:func:`markdown`, :func:`gil_line`)
and a plot (:func:`plot`). :mod:`audiobuffer.cli.bench` runs and measures them and re-exports the
public names. Nothing here imports torch at import time: the helper process of ``isolated-2``
imports this module to find :func:`mel_transform`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..options import gil_enabled  # noqa: F401  (bench.py imports it from here)

APPROACHES = [
    "loop", "loop-libsndfile", "dataloader-0", "dataloader-1", "dataloader-2", "dataloader-4", "dataloader-2-pin",
    "dataloader-2-spawn", "audiobuffer-1", "audiobuffer-2", "audiobuffer-4", "audiobuffer-8", "audiobuffer-auto",
    "isolated-2", "torchdata-2", "prefetch_generator", "spdl-pipeline-2", "spdl-pipeline-4", "spdl-load_wav",
]
QUICK_APPROACHES = ["loop", "dataloader-2", "dataloader-2-spawn", "audiobuffer-2", "audiobuffer-auto", "isolated-2",
                    "torchdata-2", "prefetch_generator", "spdl-pipeline-2", "spdl-load_wav"]
BATCH_SIZE = 16
#: Samples decoded ahead of the consumer, for every approach that has such a bound.
BUFFER_SIZE = 64
#: Per-sample transforms by corpus suffix (``--formats flac+mel``); see :func:`mel_transform`.
TRANSFORMS = ("mel",)
#: The package each peer needs (approaches not listed need only audiobuffer's own dependencies).
_PACKAGES = {"torchdata-2": "torchdata.nodes", "prefetch_generator": "prefetch_generator",
             "spdl-pipeline-2": "spdl.pipeline", "spdl-pipeline-4": "spdl.pipeline", "spdl-load_wav": "spdl.io"}
#: Approaches that read WAV files only.
_WAV_ONLY = ("spdl-load_wav",)

N_MELS, N_FFT, HOP = 64, 512, 160


def mel_transform(sample: dict[str, Any]) -> dict[str, Any]:
    """Replace ``sample["audio"]`` with its log-mel spectrogram ``(N_MELS, frames)``, computed by librosa.

    Per sample and mostly Python-driven (framing, windowing, the FFT and the filter bank in librosa and
    numpy), so much of it holds the GIL: where producer threads are weakest. ``num_frames`` becomes the
    spectrogram's frames (what ``pad_collate`` pads) and ``seconds`` keeps the audio's duration.
    Module-level, so that :class:`~audiobuffer.IsolatedLoader` and ``spawn`` workers can import it.
    """
    import librosa  # a lookup after the first call; loading it is paid by warm_up()

    audio = np.asarray(sample["audio"], dtype=np.float32)  # a tensor in-process, an array in the helper
    sample_rate = int(sample["sample_rate"])
    mel = librosa.feature.melspectrogram(y=audio, sr=sample_rate, n_fft=N_FFT, hop_length=HOP, n_mels=N_MELS)
    features = np.log(mel + 1e-6).astype(np.float32)
    sample["seconds"] = audio.shape[-1] / sample_rate
    sample["audio"] = features
    sample["num_frames"] = features.shape[-1]
    return sample


def get_transform(name: str | None) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """The transform called ``name`` (one of :data:`TRANSFORMS`), or None."""
    if name is None:
        return None
    if name != "mel":
        raise ValueError(f"transform must be one of {TRANSFORMS}, got {name!r}")
    return mel_transform


def warm_up(approach: str, transform: Callable[..., Any] | None) -> None:
    """Import what ``approach`` needs and load librosa before the clock starts, as a training script would."""
    module = _PACKAGES.get(approach)
    if module is not None:
        __import__(module)
    if transform is not None:  # librosa loads scipy and numba on its first call (seconds)
        transform({"audio": np.zeros(4 * N_FFT, dtype=np.float32), "sample_rate": 16000})


def missing_modules(names: Sequence[str]) -> list[str]:
    """The modules of ``names`` that cannot be imported."""
    missing = []
    for name in names:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def available(approach: str) -> bool:
    """Whether the approach's package is installed."""
    module = _PACKAGES.get(approach)
    return module is None or not missing_modules([module])


def available_transform(name: str) -> bool:
    """Whether the package of the transform called ``name`` (librosa for ``mel``) is installed."""
    return importlib.util.find_spec({"mel": "librosa"}[name]) is not None


def applies(approach: str, paths: Sequence[str], transform: str | None) -> bool:
    """Whether ``approach`` can run on this corpus (``spdl-load_wav``: WAV files without a transform)."""
    if approach in _WAV_ONLY:
        return transform is None and all(p.lower().endswith(".wav") for p in paths)
    return True


class PathDataset:
    """A map-style dataset of paths, decoded (and transformed) in ``__getitem__``; importable, so ``spawn`` can
    pickle it."""

    def __init__(self, paths: Sequence[str], transform: Callable[..., Any] | None = None) -> None:
        from ..decoders import AudioDecoder

        self.paths = list(paths)
        self.decoder = AudioDecoder()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        sample = self.decoder(self.paths[i])
        return sample if self.transform is None else self.transform(sample)


def _batches_of(samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    from ..collate import pad_collate

    batch: list[dict[str, Any]] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == BATCH_SIZE:
            yield pad_collate(batch)
            batch = []
    if batch:
        yield pad_collate(batch)


def _closing(batches: Iterator[dict[str, Any]], close: Callable[[], None]) -> Iterator[dict[str, Any]]:
    """``batches``, then ``close()`` (within the epoch's time, as DataLoader joins its workers within it)."""
    try:
        yield from batches
    finally:
        close()


def _spdl_pipeline(paths: list[str], decode: Callable[[Any], dict[str, Any]], concurrency: int
                   ) -> Iterator[dict[str, Any]]:
    """SPDL's pipeline: a source of batches of paths -> a thread stage that decodes and collates each batch.

    Settings tried on FSDD (3000 tiny WAVs) and 400 generated FLAC files, SPDL 0.8.0, on 2 cores that
    others were using too (load about 4; medians of 1-3 runs, so only the large differences count):

    - the layout the SPDL docs draw, ``source(paths) -> pipe(decode, concurrency=N) -> aggregate(16) ->
      pipe(pad_collate) -> sink``: 2.5-3.3 s on FSDD against 0.26-0.42 s for the loop. Each item crosses
      three asyncio queues and a ``run_in_executor`` in SPDL's event-loop thread, about 0.3 ms of GIL-held
      Python per item here (a pipeline of no-op stages takes 1.8 s for 3000 items);
    - ``aggregate(16)`` first, then one stage decoding and collating a batch: 1.4-1.8 s on FSDD (the
      aggregate stage still moves every path through a queue);
    - a source that yields the batches of paths, then that stage (kept): 0.52 s on FSDD; on FLAC 0.40 s
      with concurrency 4 against 0.68 s with 2, 0.62-0.72 s per item, and 0.58 s for the loop;
    - ``num_threads`` equal to the concurrency (more threads than concurrent tasks idle),
      ``use_thread_output_queue=True`` (no change beyond noise), a sink of ``BUFFER_SIZE // BATCH_SIZE``
      batches (the samples the other approaches decode ahead), ``output_order="completion"`` (the default),
      and the default task hooks (disabling them changed nothing beyond noise).

    Every epoch ends about 0.1 s after its last batch: SPDL's event-loop thread notices the end and the
    stop request by polling every 0.1 s. That is what a user of ``auto_stop()`` pays, so it is measured.
    """
    from spdl.pipeline import PipelineBuilder

    from ..collate import pad_collate

    def decode_batch(batch_paths: list[str]) -> dict[str, Any]:
        return pad_collate([decode(p) for p in batch_paths])

    chunks = [paths[i:i + BATCH_SIZE] for i in range(0, len(paths), BATCH_SIZE)]
    builder: PipelineBuilder[list[str], dict[str, Any]] = PipelineBuilder()
    # mypy cannot solve the type variables of spdl's union of stage kinds from a plain function
    builder = builder.add_source(chunks).pipe(decode_batch, concurrency=concurrency)  # type: ignore[arg-type]
    pipeline = (builder
                .add_sink(max(1, BUFFER_SIZE // BATCH_SIZE)).build(num_threads=concurrency))
    with pipeline.auto_stop():
        yield from pipeline.get_iterator(timeout=600)


_WAV_SCALE = {np.dtype(np.int16): 1 / 32768, np.dtype(np.int32): 1 / 2**31}


def _load_wav(path: str, index: int) -> dict[str, Any]:
    """``spdl.io.load_wav`` on the file's bytes, as :class:`~audiobuffer.AudioDecoder` would return it (mono)."""
    import spdl.io
    import torch

    with open(path, "rb") as f:
        data = f.read()
    sample_rate = spdl.io.parse_wav(data).sample_rate
    raw = np.asarray(spdl.io.load_wav(data))  # (frames, channels): int16 for PCM 16, as stored
    audio: np.ndarray
    if raw.dtype == np.uint8:
        audio = (raw.astype(np.float32) - 128) / 128
    elif raw.dtype in _WAV_SCALE:
        audio = raw.astype(np.float32) * np.float32(_WAV_SCALE[raw.dtype])  # libsndfile's scaling: exact
    else:
        audio = raw.astype(np.float32)
    audio = audio[:, 0] if audio.shape[1] == 1 else audio.mean(axis=1, dtype=np.float32)
    return {"path": path, "index": index, "audio": torch.from_numpy(np.ascontiguousarray(audio)),
            "sample_rate": sample_rate, "num_frames": audio.shape[0]}


def loader(approach: str, paths: list[str], transform: Callable[..., Any] | None = None
           ) -> Iterator[dict[str, Any]]:
    """One epoch of batches of ``paths`` through ``approach`` (one of :data:`APPROACHES`)."""
    from torch.utils.data import DataLoader, Dataset

    from ..collate import pad_collate
    from ..decoders import AudioDecoder
    from ..loaders.dataset import BufferedDataset

    decoder = AudioDecoder()
    decode: Callable[[str], dict[str, Any]] = decoder
    if transform is not None:
        def decode(path: str) -> dict[str, Any]:
            return transform(decoder(path))

    if approach in ("loop", "loop-libsndfile"):  # -libsndfile: WAV too through libsndfile, as before the own reader
        from ..decoders import audio as audio_module

        audio_module._NATIVE_WAV = approach == "loop"  # a fresh process per approach: nothing else sees it
        return _batches_of(decode(p) for p in paths)
    if approach.startswith("dataloader-"):
        parts = approach.split("-")
        extra: dict[str, Any] = {"multiprocessing_context": "spawn"} if "spawn" in parts else {}
        dataset = cast(Dataset, PathDataset(paths, transform))  # map-style by duck typing: no torch at import
        return iter(DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=int(parts[1]),
                               collate_fn=pad_collate, pin_memory="pin" in parts, **extra))
    if approach.startswith("audiobuffer-"):
        count = approach.split("-")[1]
        producers: dict[str, Any] = {} if count == "auto" else {"num_producers": int(count)}
        ds = BufferedDataset(paths, decoder, buffer_size=BUFFER_SIZE, transform=transform, **producers)
        return _closing(iter(DataLoader(ds, batch_size=BATCH_SIZE, collate_fn=pad_collate)), ds.close)
    if approach == "isolated-2":
        from ..loaders.isolated.loader import IsolatedLoader

        isolated = IsolatedLoader(paths, decoder, batch_size=BATCH_SIZE, num_producers=2, buffer_size=BUFFER_SIZE,
                                  transform=transform, pin_memory=False)
        return _closing(iter(isolated), isolated.close)
    if approach == "torchdata-2":
        from torchdata.nodes import Batcher, IterableWrapper, Loader, Mapper, ParallelMapper

        node = ParallelMapper(IterableWrapper(paths), map_fn=decode, num_workers=2, method="thread", in_order=False)
        return iter(Loader(Mapper(Batcher(node, batch_size=BATCH_SIZE, drop_last=False), pad_collate)))
    if approach == "prefetch_generator":
        from prefetch_generator import BackgroundGenerator

        return iter(BackgroundGenerator(_batches_of(decode(p) for p in paths), max_prefetch=4))
    if approach.startswith("spdl-pipeline-"):
        return _spdl_pipeline(paths, decode, int(approach.rsplit("-", 1)[1]))
    if approach == "spdl-load_wav":
        if transform is not None:
            raise ValueError("spdl-load_wav takes no transform")
        return _batches_of(_load_wav(p, i) for i, p in enumerate(paths))
    raise ValueError(f"unknown approach {approach!r}; known: {APPROACHES}")


# -- corpora -------------------------------------------------------------------------------------


def make_corpus(root: Path, files: int, fmt: str, *, seed: int = 0) -> list[str]:
    """``files`` mono 16 kHz noise-and-tone files of 1-4 s (made once per folder)."""
    import soundfile as sf

    root.mkdir(parents=True, exist_ok=True)
    marker = root / f"COMPLETE-{files}-{fmt}"
    paths = [str(root / f"{i:05d}.{fmt}") for i in range(files)]
    if not marker.exists():
        rng = np.random.default_rng(seed)
        for path in paths:
            n = int(16000 * rng.uniform(1.0, 4.0))
            t = np.arange(n) / 16000
            audio = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 2000) * t) + 0.05 * rng.standard_normal(n)
            sf.write(path, audio.astype(np.float32), 16000, subtype="PCM_16")
        marker.write_text("ok", encoding="utf-8", newline="\n")
    return paths


def parse_formats(text: str) -> list[tuple[str, str | None]]:
    """``--formats`` (``flac,wav,flac+mel``) as ``(format, transform or None)`` pairs.

    Raises:
        ValueError: an empty format, a format libsndfile cannot write as 16-bit PCM (the corpus could not
            be made), or a transform that is not one of :data:`TRANSFORMS`.
    """
    formats = list(dict.fromkeys(f.strip().lower().partition("+") for f in text.split(",") if f.strip()))
    bad = [base + plus + name for base, plus, name in formats if not base or (plus and name not in TRANSFORMS)]
    if bad:
        raise ValueError(f"--formats takes FORMAT or FORMAT+TRANSFORM (transforms: {', '.join(TRANSFORMS)}), "
                         f"got {bad}")
    writable = _pcm16_formats()
    unknown = list(dict.fromkeys(base for base, _, _ in formats if base not in writable))
    if unknown:
        verb = "is not a format" if len(unknown) == 1 else "are not formats"
        raise ValueError(f"--formats: {', '.join(map(repr, unknown))} {verb} the corpus can be written in and read "
                         f"back (16-bit PCM through libsndfile); use one of {', '.join(writable)}")
    return [(base, name or None) for base, _, name in formats]


def _pcm16_formats() -> list[str]:
    """The formats a generated corpus can be made in.

    Returns:
        The file extensions (lower case) libsndfile writes 16-bit PCM to, as :func:`make_corpus` writes,
        and reads back from the file alone (not RAW: headerless, its rate and channels would be needed).
    """
    import soundfile as sf

    return sorted(f.lower() for f in sf.available_formats() if f != "RAW" and sf.check_format(f, "PCM_16"))


def generated_corpora(formats: Sequence[tuple[str, str | None]], files: int, cache: Path
                      ) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The generated corpora by name (made under ``cache``), and the transform of each that has one.

    A corpus whose transform's package is missing is left out with a note on stderr.
    """
    corpora: dict[str, list[str]] = {}
    transforms: dict[str, str] = {}
    for base, name in formats:
        if name and not available_transform(name):
            print(f"  {base}+{name}: librosa is not installed, corpus left out", file=sys.stderr)
            continue
        corpus = f"{base.upper()}{' + librosa log-mel per sample' if name else ''}, {files} generated files " \
                 "of 1-4 s at 16 kHz"
        corpora[corpus] = make_corpus(cache / f"{base}-{files}", files, base)
        if name:
            transforms[corpus] = name
    return corpora, transforms


# -- the output ----------------------------------------------------------------------------------


def gil_line(results: dict[str, list[dict[str, Any]]]) -> str:
    """The header line: the interpreter, whether the GIL was enabled in the measured processes, the peers' versions."""
    build = "free-threaded build" if sysconfig.get_config_var("Py_GIL_DISABLED") else "default build"
    states = {r["approach"]: bool(r.get("gil_enabled", True)) for rows in results.values() for r in rows}
    if all(states.values()):
        gil = "GIL enabled"
    elif not any(states.values()):
        gil = "GIL disabled"
    else:
        gil = f"GIL disabled, but enabled by an import in: {', '.join(a for a, on in states.items() if on)}"
    peers = []
    for name in ("torchdata", "prefetch_generator", "spdl", "librosa"):
        try:
            peers.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return f"Python {platform.python_version()} ({build}): {gil}. Peers: {', '.join(peers) or 'none installed'}."


def markdown(results: dict[str, list[dict[str, Any]]]) -> str:
    """The results as Markdown tables, one per corpus, after the :func:`gil_line`."""
    out = [gil_line(results), ""]
    for corpus, rows in results.items():
        out.append(f"#### {corpus}\n")
        out.append("| approach | epoch s | vs loop | vs best DataLoader | first batch ms | files/s (steady) | "
                   "audio s/s (steady) | peak RSS MiB (tree) | CPU % |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            loop, best = (f"{r[k]:.2f}x" if r[k] is not None else "-" for k in ("vs_loop", "vs_best_dataloader"))
            out.append(f"| {r['approach']} | {r['total_s']:.2f} | {loop} | {best} | "
                       f"{1000 * r['first_batch_s']:.0f} | {r['steady_files_per_s']:.0f} | "
                       f"{r['steady_audio_per_s']:.0f} | "
                       f"{r['peak_rss_mb']:.0f} | {r['cpu_percent']:.0f} |")
        out.append("")
    return "\n".join(out)


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """A PNG: epoch throughput and time to first batch per approach, per corpus."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(13, 3.2 * len(results)), squeeze=False)
    for row, (corpus, rows) in zip(axes, results.items()):
        names = [r["approach"] for r in rows]
        colors = ["tab:green" if n.startswith(("audiobuffer", "isolated")) else "tab:gray" if n == "loop" else
                  "tab:orange" if n.startswith("spdl") else "tab:blue" for n in names]
        row[0].barh(names, [r["files"] / r["total_s"] for r in rows], color=colors)
        row[0].set_xlabel("files per second (whole epoch)")
        row[0].set_title(corpus)
        row[0].invert_yaxis()
        row[1].barh(names, [1000 * r["first_batch_s"] for r in rows], color=colors)
        row[1].set_xscale("log")
        row[1].set_xlabel("time to first batch, ms (log)")
        row[1].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
