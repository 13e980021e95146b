"""The per-sample transform of ``scripts/bench_contention.py``, in a module of its own.

It is ``audiobuffer bench``'s log-mel transform (:func:`audiobuffer.cli.bench.mel_transform`,
64 mels, FFT 512, hop 160, computed by librosa), so both benchmarks run the same work per sample.
:class:`~audiobuffer.IsolatedLoader` sends a transform to its helper process by reference, and
refuses one defined in the script being run (``__main__``): the helper imports the function from
``audiobuffer.cli._bench_approaches``, where it is defined.

librosa loads most of itself (scipy, numba: about 2 s) on its first call; this module makes that call
when it is imported, so the benchmark's own process pays it once, at start-up, before its clock (the
IsolatedLoader helper pays it on its first sample, within its first batch).
"""

from __future__ import annotations

import numpy as np

from audiobuffer.cli.bench import mel_transform

#: The name ``scripts/bench_contention.py`` uses.
log_mel = mel_transform

log_mel({"audio": np.zeros(2048, dtype=np.float32), "sample_rate": 16000})  # see the module docstring
