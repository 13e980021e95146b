"""What ``audiobuffer bench`` measures, and how it shows it: the loaders, corpora and transforms.

Each loader (:func:`loader`) makes one epoch's batches from a list of paths. Every approach decodes
with the same :class:`~audiobuffer.AudioDecoder` (libsndfile through python-soundfile), applies the
corpus's per-sample transform where it has one (:func:`mel_transform` for ``flac+mel``), and collates
batches of :data:`BATCH_SIZE` with :func:`~audiobuffer.pad_collate`. A :class:`Lineup` is the set of
approaches one run may measure: :data:`LINEUP` holds audiobuffer's own loaders, the plain loop and
DataLoader workers; ``benchmarks/bench_decode.py`` in the source repository adds other libraries'
loaders to it as :class:`Peer` entries. The corpora come from ``--formats`` (:func:`parse_formats`,
:func:`generated_corpora`); the results become Markdown tables under a header line naming the GIL
state (:func:`markdown`, :func:`gil_line`) and a plot (:func:`plot`). :mod:`audiobuffer.cli.bench`
runs and measures them and re-exports the public names. Nothing here imports torch at import time:
the helper process of ``isolated-2`` imports this module to find :func:`mel_transform`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
import sysconfig
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..options import gil_enabled  # noqa: F401  (bench.py imports it from here)

Sample = dict[str, Any]
Transform = Callable[[Sample], Sample]

APPROACHES = [
    "loop", "loop-libsndfile", "dataloader-0", "dataloader-1", "dataloader-2", "dataloader-4", "dataloader-2-pin",
    "dataloader-2-spawn", "audiobuffer-1", "audiobuffer-2", "audiobuffer-4", "audiobuffer-8", "audiobuffer-auto",
    "isolated-2",
]
QUICK_APPROACHES = ["loop", "dataloader-2", "dataloader-2-spawn", "audiobuffer-2", "audiobuffer-auto", "isolated-2"]
BATCH_SIZE = 16
#: Samples decoded ahead of the consumer, for every approach that has such a bound.
BUFFER_SIZE = 64
#: Per-sample transforms by corpus suffix (``--formats flac+mel``); see :func:`mel_transform`.
TRANSFORMS = ("mel",)

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


def missing_modules(names: Sequence[str]) -> list[str]:
    """The modules of ``names`` that cannot be imported."""
    missing = []
    for name in names:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def available_transform(name: str) -> bool:
    """Whether the package of the transform called ``name`` (librosa for ``mel``) is installed."""
    return importlib.util.find_spec({"mel": "librosa"}[name]) is not None


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


def batches_of(samples: Iterator[Sample]) -> Iterator[dict[str, Any]]:
    """``samples`` collated into batches of :data:`BATCH_SIZE` in this thread (the last one may be short)."""
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


def decoding(transform: Transform | None = None, *,
             native_wav: bool = True) -> Callable[[str], Sample]:
    """The decode every approach shares: :class:`~audiobuffer.AudioDecoder` (``native_wav`` as
    given), then ``transform`` if any."""
    from ..decoders import AudioDecoder

    decoder = AudioDecoder(native_wav=native_wav)
    if transform is None:
        return decoder

    def decode(path: str) -> Sample:
        return transform(decoder(path))

    return decode


def loader(approach: str, paths: list[str], transform: Transform | None = None) -> Iterator[dict[str, Any]]:
    """One epoch of batches of ``paths`` through ``approach`` (one of :data:`APPROACHES`)."""
    from torch.utils.data import DataLoader, Dataset

    from ..collate import pad_collate
    from ..decoders import AudioDecoder
    from ..loaders.dataset import BufferedDataset

    if approach in ("loop", "loop-libsndfile"):  # -libsndfile: WAV too through libsndfile, as before the own reader
        decode = decoding(transform, native_wav=approach == "loop")
        return batches_of(decode(p) for p in paths)
    if approach.startswith("dataloader-"):
        parts = approach.split("-")
        extra: dict[str, Any] = {"multiprocessing_context": "spawn"} if "spawn" in parts else {}
        dataset = cast(Dataset, PathDataset(paths, transform))  # map-style by duck typing: no torch at import
        return iter(DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=int(parts[1]),
                               collate_fn=pad_collate, pin_memory="pin" in parts, **extra))
    if approach.startswith("audiobuffer-"):
        count = approach.split("-")[1]
        producers: dict[str, Any] = {} if count == "auto" else {"num_producers": int(count)}
        ds = BufferedDataset(paths, AudioDecoder(), buffer_size=BUFFER_SIZE, transform=transform, **producers)
        return _closing(iter(DataLoader(ds, batch_size=BATCH_SIZE, collate_fn=pad_collate)), ds.close)
    if approach == "isolated-2":
        from ..loaders.isolated.loader import IsolatedLoader

        isolated = IsolatedLoader(paths, AudioDecoder(), batch_size=BATCH_SIZE, num_producers=2,
                                  buffer_size=BUFFER_SIZE, transform=transform, pin_memory=False)
        return _closing(iter(isolated), isolated.close)
    raise ValueError(f"unknown approach {approach!r}; known: {APPROACHES}")


# -- the line-up: audiobuffer's own approaches, and others' beside them ----------------------------


@dataclass(frozen=True)
class Peer:
    """An approach from another library, measured beside audiobuffer's own (``benchmarks/bench_decode.py``).

    Attributes:
        module: imported before the clock starts; where it cannot be, the approach is left out.
        make: one epoch of batches: ``make(paths, transform)``; it decodes with :func:`decoding` (the
            decode every approach shares) unless it measures a decoder of its own.
        distribution: the package whose version the header line names.
        wav_only: it reads WAV files only and takes no transform (a WAV parser of its own).
        color: its bars in the plot.
    """

    module: str
    make: Callable[[list[str], Transform | None], Iterator[dict[str, Any]]]
    distribution: str
    wav_only: bool = False
    color: str = "tab:blue"


@dataclass(frozen=True)
class Lineup:
    """The approaches one bench run may measure, and the command that runs one in a fresh process.

    :data:`LINEUP` is ``audiobuffer bench``'s: :data:`APPROACHES`, each child started as
    ``python -m audiobuffer.cli.bench --child ...``. A line-up with :class:`Peer` entries names them
    in ``names`` too, and a ``child`` script that calls :func:`audiobuffer.cli.bench.main` with it.

    Attributes:
        names: every approach, in the order of the tables.
        quick: the approaches of ``--quick``.
        peers: the approaches from other libraries, by name.
        child: what follows ``sys.executable`` on a child's command line.
    """

    names: tuple[str, ...]
    quick: tuple[str, ...]
    peers: Mapping[str, Peer] = field(default_factory=dict)
    child: tuple[str, ...] = ("-m", "audiobuffer.cli.bench")

    def __post_init__(self) -> None:
        unknown = [n for n in (*self.quick, *self.peers) if n not in self.names]
        own = [n for n in self.names if n not in self.peers and n not in APPROACHES]
        if unknown or own:
            raise ValueError(f"a line-up's quick approaches and peers must be in its names, and each name must be "
                             f"audiobuffer's or a peer's; not in names: {unknown}; neither audiobuffer's nor a "
                             f"peer: {own}")

    def loader(self, approach: str, paths: list[str], transform: Transform | None = None
               ) -> Iterator[dict[str, Any]]:
        """One epoch of batches of ``paths`` through ``approach``."""
        peer = self.peers.get(approach)
        return loader(approach, paths, transform) if peer is None else peer.make(paths, transform)

    def available(self, approach: str) -> bool:
        """Whether the approach's package is installed (audiobuffer's own always are)."""
        peer = self.peers.get(approach)
        return peer is None or not missing_modules([peer.module])

    def applies(self, approach: str, paths: Sequence[str], transform: str | None) -> bool:
        """Whether ``approach`` can run on this corpus (a WAV-only peer: WAV files without a transform)."""
        peer = self.peers.get(approach)
        if peer is not None and peer.wav_only:
            return transform is None and all(p.lower().endswith(".wav") for p in paths)
        return True

    def warm_up(self, approach: str, transform: Transform | None) -> None:
        """Import what ``approach`` needs and load librosa before the clock starts, as a training script would."""
        peer = self.peers.get(approach)
        if peer is not None:
            __import__(peer.module)
        if transform is not None:  # librosa loads scipy and numba on its first call (seconds)
            transform({"audio": np.zeros(4 * N_FFT, dtype=np.float32), "sample_rate": 16000})

    def color(self, approach: str) -> str:
        """The colour of the approach's bars in the plot."""
        peer = self.peers.get(approach)
        if peer is not None:
            return peer.color
        return ("tab:green" if approach.startswith(("audiobuffer", "isolated")) else
                "tab:gray" if approach == "loop" else "tab:blue")


#: ``audiobuffer bench``'s line-up: audiobuffer's loaders, the plain loop and DataLoader workers.
LINEUP = Lineup(tuple(APPROACHES), tuple(QUICK_APPROACHES))


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


def gil_line(results: dict[str, list[dict[str, Any]]], lineup: Lineup = LINEUP) -> str:
    """The header line: the interpreter, whether the GIL was enabled in the measured processes, and the
    versions of the peers and of librosa (``Peers:`` where the line-up has peers, else ``Packages:``)."""
    build = "free-threaded build" if sysconfig.get_config_var("Py_GIL_DISABLED") else "default build"
    states = {r["approach"]: bool(r.get("gil_enabled", True)) for rows in results.values() for r in rows}
    if all(states.values()):
        gil = "GIL enabled"
    elif not any(states.values()):
        gil = "GIL disabled"
    else:
        gil = f"GIL disabled, but enabled by an import in: {', '.join(a for a, on in states.items() if on)}"
    versions = []
    for name in dict.fromkeys([*(peer.distribution for peer in lineup.peers.values()), "librosa"]):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    label = "Peers" if lineup.peers else "Packages"
    return (f"Python {platform.python_version()} ({build}): {gil}. "
            f"{label}: {', '.join(versions) or 'none installed'}.")


def markdown(results: dict[str, list[dict[str, Any]]], lineup: Lineup = LINEUP) -> str:
    """The results as Markdown tables, one per corpus, after the :func:`gil_line`."""
    out = [gil_line(results, lineup), ""]
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


def plot(results: dict[str, list[dict[str, Any]]], path: Path, lineup: Lineup = LINEUP) -> None:
    """A PNG: epoch throughput and time to first batch per approach, per corpus."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(13, 3.2 * len(results)), squeeze=False)
    for row, (corpus, rows) in zip(axes, results.items()):
        names = [r["approach"] for r in rows]
        colors = [lineup.color(n) for n in names]
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
