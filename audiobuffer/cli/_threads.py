"""torch's CPU threads beside producer threads: how many, and how idle ones wait.

Shared by ``audiobuffer demo`` and ``scripts/train_audio.py``. :func:`quiet_openmp` must run before
torch is imported; :func:`set_torch_threads` after.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Literal

from .._checks import check_int
from ..options import usable_cores

__all__ = ["Threads", "parse_threads", "quiet_openmp", "set_torch_threads",
           "threads_argument"]

#: ``--threads``: a count of torch intra-op threads, or ``"auto"`` (:func:`set_torch_threads`).
Threads = int | Literal["auto"]
#: Environment variables that already say how idle OpenMP threads wait (libgomp, LLVM and Intel OpenMP).
_WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
#: The load per core (1-minute load average) from which a machine counts as busy for ``spare``:
#: other processes fill every core.
BUSY_LOAD = 1.0
#: Environment variables that already say how many threads torch's pools start with.
_COUNT_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

# NOTE [ torch threads beside producers ]
# =======================================
# A CPU train step runs torch's intra-op pool (OpenMP): one thread per core by default, and an idle
# thread spins at the end of each parallel region before it sleeps (libgomp: about 3 ms, many times a
# step). Where every core is busy (the producers, other processes on a shared machine), a spinning
# thread holds the core that the thread everyone waits for needs, and steps take several times longer.
# OMP_WAIT_POLICY=PASSIVE makes idle threads sleep at once. OpenMP reads it when the library loads, so
# it is set before torch is imported (quiet_openmp), never over a wait the user set. With idle threads
# asleep the count can stay torch's own, one a core ("auto"; under torchrun, the cores shared out
# among this machine's ranks): on a quiet machine the second core is worth more than the time the
# producers take from it, and on a loaded one the passive threads keep out of the way. One thread is
# not the answer for the training script's model: slower on a quiet machine, and no faster on a busy
# one once threads sleep. The demo's model is smaller: on a quiet machine it too runs faster with a
# thread a core (the producers wait for room most of the time), but where other processes already
# fill every core (a 1-minute load average of at least one a core, BUSY_LOAD) its step gains less
# from a second thread than its producers lose, so there its "auto" leaves them a core (spare=1).
# A count in OMP_NUM_THREADS (torchrun sets 1 for several ranks) is the user's and is kept.
# benchmarks/bench_train_threads.py measures each choice, quiet or with busy processes beside it.


def parse_threads(value: str) -> Threads:
    """``--threads``: ``"auto"`` or an integer >= 1 (``ValueError`` otherwise)."""
    if value == "auto":
        return "auto"
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"--threads must be an integer >= 1 or 'auto', got {value!r}") from None
    return check_int("--threads", count, 1)


def threads_argument(value: str) -> Threads:
    """``--threads`` as an argparse ``type``: :func:`parse_threads`, errors worded as argparse's."""
    try:
        return parse_threads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--threads ")) from None


def quiet_openmp() -> str | None:
    """Before torch is imported: idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``),
    unless the environment already sets their wait. Returns how idle threads wait, for the line
    :func:`set_torch_threads` prints: ``"OMP_WAIT_POLICY=PASSIVE"``, the user's setting, or ``None``
    where torch was imported already and OpenMP's default holds."""
    for name in _WAIT_ENV:
        if os.environ.get(name):
            return f"{name}={os.environ[name]}"
    if "torch" in sys.modules:
        return None  # too late: OpenMP read its settings when torch loaded it
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "OMP_WAIT_POLICY=PASSIVE"


def set_torch_threads(threads: Threads, *, device_type: str, wait: str | None, spare: int = 0) -> str:
    """Set torch's intra-op thread count for a step on ``device_type`` and return one line that says
    what was chosen and why (see NOTE [ torch threads beside producers ]).

    Args:
        spare: cores ``"auto"`` leaves to the producers on a busy machine (never below one thread):
            a small model's step gains less from a second thread than its producers lose there.
    """
    import torch

    from ._measure import machine_load

    why = "--threads"
    if threads == "auto":
        named = [name for name in _COUNT_ENV if os.environ.get(name)]
        if named:
            count, why = torch.get_num_threads(), f"{named[0]}={os.environ[named[0]]}"
        elif device_type != "cpu":
            count, why = torch.get_num_threads(), f"torch's default; the step runs on {device_type}"
        else:
            cores = usable_cores()
            ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))  # torchrun's ranks on this machine
            why = f"auto: {cores} cores" + (f" shared by {ranks} ranks" if ranks > 1 else "")
            if spare:
                load, said = machine_load()
                busy = load is not None and load >= BUSY_LOAD
                spare = spare if busy else 0
                why += f", {said}" + (f": busy, {spare} left to the producers" if busy else "")
            count = max(1, cores // ranks - spare)
    else:
        count = threads
    torch.set_num_threads(count)
    waits = f"idle OpenMP threads: {wait}" if wait else "idle OpenMP threads: OpenMP's default (spin, then sleep)"
    return f"torch intra-op threads {torch.get_num_threads()} ({why}); {waits}"
