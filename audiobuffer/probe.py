"""Batch budgets found by running the training step: :func:`probe_budgets` gives each duration
bucket the largest batch that runs without running out of memory, in seconds, for
``max_batch_seconds``."""

from __future__ import annotations

import gc
import logging
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ._checks import check_int, short_repr
from .options import MAX_BATCH_SIZE

__all__ = ["OUT_OF_MEMORY", "probe_budgets", "synthetic_batch"]

logger = logging.getLogger(__name__)

#: What a step raises when a batch does not fit (``torch.cuda.OutOfMemoryError`` is the same class).
OUT_OF_MEMORY: tuple[type[BaseException], ...] = (torch.OutOfMemoryError,)


def synthetic_batch(
    n: int, frames: int, *, sample_rate: int = 16000, device: str | torch.device = "cpu"
) -> dict[str, Any]:
    """A batch as :func:`~audiobuffer.pad_collate` makes it from ``n`` mono samples of ``frames``
    frames each (noise, labels 0), on ``device``: ``audio`` ``(n, frames)``, ``lengths``,
    ``num_frames``, ``sample_rate``, ``index`` and ``label``."""
    full = torch.full((n,), frames, dtype=torch.int64, device=device)
    return {
        "audio": torch.randn(n, frames, device=device),
        "lengths": full,
        "num_frames": full.clone(),
        "sample_rate": torch.full((n,), sample_rate, dtype=torch.int64, device=device),
        "index": torch.arange(n, device=device),
        "label": torch.zeros(n, dtype=torch.int64, device=device),
    }


def probe_budgets(
    step: Callable[[dict[str, Any]], Any],
    bucket_edges: Sequence[float] | Mapping[float, Any],
    *,
    sample_rate: int = 16000,
    device: str | torch.device = "cpu",
    margin: float = 0.1,
    memory_limit: int | None = None,
    max_steps: int = 30,
    tolerance: float = 0.01,
    max_batch_size: int = 1 << 16,
    quadratic_duration: float | None = None,
    make_batch: Callable[[int, int], dict[str, Any]] | None = None,
) -> list[float]:
    """Each bucket's budget in seconds: the largest batch of its longest items that ``step`` runs.

    For each bucket (shortest first) the probe calls ``step`` on synthetic batches of ``n`` samples
    as long as the bucket's upper edge (:func:`synthetic_batch`: ``pad_collate``'s dict on
    ``device``), doubling ``n`` from the previous bucket's (or halving it while it does not fit),
    then bisecting, until the largest ``n`` that fits is known within ``tolerance`` (never above
    it). A batch does not fit when ``step`` raises ``torch.OutOfMemoryError``, or when its peak
    memory passes ``memory_limit`` bytes: on CUDA the allocator's peak, elsewhere the number of
    bytes ``step`` returns (so that a CPU run can probe a memory model the test or user gives).
    After each call on CUDA the probe frees the cached blocks and resets the peak. The budget is
    ``n x edge x (1 - margin)`` (with ``quadratic_duration`` ``Q``, ``n x (edge + edge**2 / Q) x
    (1 - margin)``, as ``max_batch_seconds`` then counts it), to give as
    ``max_batch_seconds={edge: budget, ...}``.

    ``step`` should run what a training step runs (forward, backward, the optimizer's step) and
    leave nothing behind (``optimizer.zero_grad(set_to_none=True)``): the probe runs it many times.

    Example:
        >>> def step(batch):  # the model's forward, backward and optimizer step
        ...     return (batch["audio"] ** 2).mean().item()
        >>> probe_budgets(step, [2.0, 4.0], sample_rate=100, max_batch_size=64, margin=0.0)
        [128.0, 256.0]

    Args:
        step: the training step, called with one batch; on CPU with ``memory_limit``, it returns
            its peak memory in bytes.
        bucket_edges: each bucket's upper edge in seconds, increasing (a mapping's keys, as
            ``max_batch_seconds`` holds them, serve too).
        sample_rate: frames per second of the synthetic audio.
        device: where the batches are made and the step runs.
        margin: the fraction of the largest batch left free, in [0, 1).
        memory_limit: the most bytes a batch's step may use at its peak, or ``None`` (only an
            out-of-memory error stops a batch; required on CPU for a step that never raises it).
        max_steps: the most calls of ``step`` per bucket.
        tolerance: how close below the largest fitting batch size the search stops (a fraction).
        max_batch_size: the largest batch tried.
        quadratic_duration: the loader's ``quadratic_duration``, or ``None``.
        make_batch: ``(n, frames) -> batch``, instead of :func:`synthetic_batch` (other keys or
            shapes).

    Raises:
        TypeError, ValueError: an argument of the wrong type or value (the message names it).
        RuntimeError: a batch of one sample of a bucket does not fit.
    """
    edges = _check_edges(bucket_edges)
    check_int("sample_rate", sample_rate, 1)
    check_int("max_steps", max_steps, 2)
    check_int("max_batch_size", max_batch_size, 1, MAX_BATCH_SIZE)
    _check_fraction("margin", margin)
    _check_fraction("tolerance", tolerance)
    if memory_limit is not None:
        check_int("memory_limit", memory_limit, 1, also="(bytes) or None")
    if quadratic_duration is not None and not (
        isinstance(quadratic_duration, (int, float)) and quadratic_duration > 0
    ):
        raise ValueError(
            f"quadratic_duration must be None or a number of seconds > 0, got "
            f"{short_repr(quadratic_duration)}"
        )
    where = torch.device(device)
    build = make_batch or (
        lambda n, frames: synthetic_batch(n, frames, sample_rate=sample_rate, device=where)
    )
    budgets: list[float] = []
    start = 1
    for edge in edges:
        frames = max(1, round(edge * sample_rate))
        trial = _Trial(step, build, frames, where, memory_limit)
        n = _largest(trial, start, max_steps, tolerance, max_batch_size)
        if n == 0:
            raise RuntimeError(
                f"a batch of one sample of {edge:g} s ({frames} frames) does not fit on "
                f"{where} ({trial.reason}): shorten the bucket (its edge), or give the step "
                f"more memory"
            )
        if n >= max_batch_size:
            warnings.warn(
                f"every batch up to max_batch_size={max_batch_size} fit the bucket of {edge:g} s "
                f"on {where}: nothing ran out of memory, so its budget is that cap, not a "
                f"measurement (on a CPU, give memory_limit and let the step return its peak "
                f"bytes)",
                UserWarning,
                stacklevel=2,
            )
        per_item = (
            edge if quadratic_duration is None else edge + edge * edge / float(quadratic_duration)
        )
        budgets.append(n * per_item * (1.0 - margin))
        logger.info(
            "bucket up to %g s: %d samples fit (%d steps), budget %.1f s",
            edge,
            n,
            trial.calls,
            budgets[-1],
        )
        start = n
    return budgets


class _Trial:
    """Whether a batch of ``n`` fits: one call of the step, its out-of-memory error caught."""

    def __init__(
        self,
        step: Callable[[dict[str, Any]], Any],
        build: Callable[[int, int], dict[str, Any]],
        frames: int,
        device: torch.device,
        memory_limit: int | None,
    ) -> None:
        self.step, self.build, self.frames = step, build, frames
        self.device, self.memory_limit = device, memory_limit
        self.calls = 0
        self.reason = ""

    def __call__(self, n: int) -> bool:
        self.calls += 1
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        fits, used = True, None
        batch: dict[str, Any] | None = None
        try:
            batch = self.build(n, self.frames)
            used = self.step(batch)
            if cuda:
                torch.cuda.synchronize(self.device)
                used = torch.cuda.max_memory_allocated(self.device)
        except OUT_OF_MEMORY as exc:
            fits, self.reason = False, f"{type(exc).__name__} at {n} samples"
        batch = None  # noqa: F841 (the batch's memory goes before the next call)
        if cuda:  # reference cycles in the step's graph too (a collection takes tens of ms)
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        if fits and self.memory_limit is not None:
            if isinstance(used, bool) or not isinstance(used, (int, float)):
                raise TypeError(
                    f"with memory_limit on {self.device}, the step must return its peak memory "
                    f"in bytes, got {short_repr(used)}"
                )
            if used > self.memory_limit:
                fits, self.reason = False, f"{used:.0f} bytes > memory_limit at {n} samples"
        return fits


def _largest(fits: _Trial, start: int, max_steps: int, tolerance: float, most: int) -> int:
    """The largest ``n`` in [1, ``most``] that ``fits``, found from ``start`` by doubling or
    halving,
    then bisecting until within ``tolerance`` below it; 0 when even 1 does not fit."""
    lo, hi = 0, most + 1  # lo fits (0: none yet), hi does not
    n = max(1, min(start, most))
    while fits.calls < max_steps:
        if fits(n):
            lo = n
            if n >= most:
                break
            n = min(2 * n, most) if hi > most else n
        else:
            hi = n
            if n == 1:
                break
            n = max(1, n // 2) if lo == 0 else n
        if lo and hi <= most:
            break  # bracketed: bisect
    while fits.calls < max_steps and hi - lo > 1 and (hi - lo) > tolerance * lo:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _check_edges(bucket_edges: Sequence[float] | Mapping[float, Any]) -> list[float]:
    if isinstance(bucket_edges, (str, bytes)) or not isinstance(bucket_edges, (Sequence, Mapping)):
        raise TypeError(
            f"bucket_edges must be a list of seconds (each bucket's upper edge), got "
            f"{short_repr(bucket_edges)}"
        )
    edges = list(bucket_edges)
    if not edges:
        raise ValueError("bucket_edges must give at least one bucket's upper edge, got none")
    for edge in edges:
        if isinstance(edge, bool) or not isinstance(edge, (int, float)):
            raise TypeError(f"bucket_edges must hold numbers of seconds, got {short_repr(edge)}")
        if not (math.isfinite(edge) and edge > 0):
            raise ValueError(
                f"bucket_edges must hold finite numbers of seconds > 0, got {short_repr(edge)}"
            )
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"bucket_edges must increase, got {short_repr(edges)}")
    return [float(edge) for edge in edges]


def _check_fraction(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a fraction in [0, 1), got {short_repr(value)}")
    if not 0 <= value < 1:
        raise ValueError(f"{name} must be a fraction in [0, 1), got {short_repr(value)}")
