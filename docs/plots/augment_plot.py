"""Draw docs/augment-before-after.png: one recording's waveform and spectrogram before and after
speed perturbation (1.1), noise at 10 dB and reverberation, as ``AudioDecoder(augment=[...])`` runs
them.

    python docs/plots/augment_plot.py             # an FSDD recording where the shared data has it
    python docs/plots/augment_plot.py --out x.png

The noise (low-passed white noise) and the impulse response (white noise under a 0.1 s exponential
decay, 0.4 s long) are made here, seeded; without the FSDD recordings a gliding tone stands in.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
RECORDING = REPO.parent / "shared" / "data" / "fsdd" / "recordings" / "7_jackson_0.wav"
OUT = REPO / "docs" / "augment-before-after.png"


def source(rate: int) -> tuple[np.ndarray, str]:
    """The recording at ``rate`` Hz (mono float32), and what it is."""
    from audiobuffer import AudioDecoder, WorkItem

    if RECORDING.exists():
        sample = AudioDecoder(rate)(WorkItem(index=0, path=str(RECORDING), epoch=0, seed=0))
        return sample["audio"].numpy(), f"FSDD {RECORDING.stem}"
    t = np.arange(rate) / rate
    glide = np.sin(2 * np.pi * np.cumsum(200 + 300 * t) / rate) * np.sin(np.pi * t) ** 2
    return (0.5 * glide).astype(np.float32), "a gliding tone"


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import soundfile as sf
    from scipy.signal import lfilter

    from audiobuffer.augment import AddNoise, Reverb, SpeedPerturb

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"the PNG (default {OUT})")
    args = parser.parse_args(argv)
    rate = 8000
    audio, what = source(rate)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="augment-plot-") as tmp:
        noise = lfilter([0.3], [1.0, -0.7], rng.standard_normal(2 * rate))
        sf.write(f"{tmp}/noise.wav", (0.2 * noise).astype(np.float32), rate, subtype="FLOAT")
        t = np.arange(int(0.4 * rate)) / rate
        rir = rng.standard_normal(len(t)) * np.exp(-t / 0.1)
        rir[0] = 4.0  # the direct path
        rir = (rir / np.max(np.abs(rir))).astype(np.float32)
        sf.write(f"{tmp}/rir.wav", rir, rate, subtype="FLOAT")
        chain = [SpeedPerturb((1.1,)), AddNoise([f"{tmp}/noise.wav"], snr_db=10.0),
                 Reverb([f"{tmp}/rir.wav"])]
        out = audio[None, :]
        for position, aug in enumerate(chain):
            out = aug(out, rate, (0, 0, 0, position))
    after = out[0]
    figure, axes = plt.subplots(2, 2, figsize=(10, 5.5), sharey="row")
    titles = (f"before: {what}", "after: speed 1.1, noise at 10 dB, reverb (0.4 s response)")
    for column, (signal, title) in enumerate(zip((audio, after), titles)):
        wave, spec = axes[0][column], axes[1][column]
        wave.plot(np.arange(len(signal)) / rate, signal, linewidth=0.5)
        wave.set_title(title, fontsize=10)
        wave.set_xlim(0, len(audio) / rate)
        spec.specgram(signal, NFFT=256, Fs=rate, noverlap=192, cmap="magma", vmin=-120)
        spec.set_xlim(0, len(audio) / rate)
        spec.set_xlabel("seconds")
    axes[0][0].set_ylabel("amplitude")
    axes[1][0].set_ylabel("Hz")
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=80)
    plt.close(figure)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
