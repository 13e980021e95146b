"""The per-sample transform of ``scripts/bench_contention.py``, in a module of its own.

:class:`~audiobuffer.IsolatedLoader` sends a transform to its helper process by reference, and
refuses one defined in the script being run (``__main__``): the helper imports this module instead
(it gets the trainer's ``sys.path``, which holds ``scripts/``). Nothing here imports torch.

librosa loads most of itself (scipy, numba: about 2 s) on its first call; the module makes that call
when it is imported, so each process pays it once, at start-up (before the clock in the benchmark's
own process; within the IsolatedLoader helper's start, as its first batch), not in its first sample.
"""

from __future__ import annotations

from typing import Any

import librosa
import numpy as np

N_MELS = 64
N_FFT = 512
HOP = 160


def log_mel(sample: dict[str, Any]) -> dict[str, Any]:
    """Replace ``sample["audio"]`` with its log-mel spectrogram ``(N_MELS, frames)``, computed by librosa.

    Per sample and mostly Python-driven (framing, windowing, FFT and the mel filter bank in librosa and
    numpy), so it holds the GIL for much of its time: the case in-process producer threads share badly.
    """
    audio = np.asarray(sample["audio"], dtype=np.float32)  # a tensor in-process, an array in the helper
    mel = librosa.feature.melspectrogram(y=audio, sr=int(sample["sample_rate"]), n_fft=N_FFT, hop_length=HOP,
                                         n_mels=N_MELS)
    features = np.log(mel + 1e-6).astype(np.float32)
    sample["audio"] = features
    sample["num_frames"] = features.shape[-1]
    return sample


log_mel({"audio": np.zeros(4 * N_FFT, dtype=np.float32), "sample_rate": 16000})  # see the module docstring
