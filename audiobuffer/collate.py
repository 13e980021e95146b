"""``pad_collate``: batch variable-length audio samples into padded tensors plus lengths.

Padding and stacking run in numpy and each batch tensor is made once with ``torch.from_numpy``: on few
cores a torch operator here would wake torch's intra-op thread pool, which then spins on the cores
the producer threads decode on (measured: a torch-op collate alone showed 198% CPU on 2 cores).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

__all__ = ["pad_collate"]


def _as_numpy(value: Any) -> np.ndarray | None:
    """A numpy view of a CPU tensor or array (no copy), or ``None`` for anything else."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.requires_grad:
        return value.numpy()
    return None


def pad_collate(samples: Sequence[Mapping[str, Any]], *, key: str = "audio",
                pad_value: float = 0.0) -> dict[str, Any]:
    """Collate sample dicts into one batch dict, padding ``key`` along its last axis.

    - ``key`` (``(frames,)`` or ``(channels, frames)`` per sample) becomes ``(B, [channels,] T)``,
      ``T`` the longest in the batch, padded with ``pad_value``; ``lengths`` holds each sample's
      ``num_frames`` when samples carry it (the real audio before any padding), else its length.
    - Other arrays and tensors of one shape are stacked; numbers become a tensor; anything else
      (paths, label names, arrays of unequal shapes) stays a list.

    Works as ``DataLoader(..., collate_fn=pad_collate, pin_memory=True)``; for another key use
    ``functools.partial(pad_collate, key="wave")``.

    Example:
        >>> batch = pad_collate([{"audio": torch.ones(3)}, {"audio": torch.ones(5)}])
        >>> batch["audio"].shape, batch["lengths"].tolist()
        (torch.Size([2, 5]), [3, 5])

    Raises:
        TypeError: ``samples`` is empty or holds something other than mappings.
        KeyError: a sample lacks ``key`` or a key the first sample has.
        ValueError: the ``key`` arrays differ in anything but their last axis.
    """
    if not samples:
        raise TypeError("pad_collate needs at least one sample")
    first = samples[0]
    if not isinstance(first, Mapping):
        raise TypeError(f"pad_collate takes sample dicts, got {type(first).__name__}")
    if key not in first:
        raise KeyError(f"pad_collate: samples have no {key!r} (keys: {sorted(first)}); set key=")
    for sample in samples:
        missing = [k for k in first if k not in sample]
        if missing:
            raise KeyError(f"pad_collate: sample {sample.get('path', '?')!r} lacks {missing}")
    batch: dict[str, Any] = {}
    batch[key], lengths = _pad([s[key] for s in samples], key, pad_value)
    if "num_frames" in first:
        lengths = np.fromiter((s["num_frames"] for s in samples), dtype=np.int64, count=len(samples))
    batch["lengths"] = torch.from_numpy(lengths)
    for name in first:
        if name != key:
            batch[name] = _collate_field([s[name] for s in samples])
    return batch


def _pad(values: list[Any], key: str, pad_value: float) -> tuple[torch.Tensor, np.ndarray]:
    arrays = [_as_numpy(v) for v in values]
    if any(a is None for a in arrays):
        bad = next(v for v, a in zip(values, arrays) if a is None)
        raise TypeError(f"pad_collate: {key!r} must hold CPU tensors or numpy arrays, got {type(bad).__name__}")
    lead = arrays[0].shape[:-1]  # type: ignore[union-attr]
    for a in arrays:
        if a.ndim == 0 or a.shape[:-1] != lead:  # type: ignore[union-attr]
            raise ValueError(f"pad_collate: {key!r} arrays must differ only in their last axis, got "
                             f"shapes {[x.shape for x in arrays]}")  # type: ignore[union-attr]
    lengths = np.fromiter((a.shape[-1] for a in arrays), dtype=np.int64, count=len(arrays))  # type: ignore[union-attr]
    longest = int(lengths.max())
    # Each byte written once: the samples into their rows, the pad value into the tails only
    # (np.full first and the rows over it would write most of the batch twice).
    out = np.empty((len(arrays), *lead, longest), dtype=arrays[0].dtype)  # type: ignore[union-attr]
    for row, a, n in zip(out, arrays, lengths.tolist()):
        row[..., :n] = a  # type: ignore[union-attr]
        if n < longest:
            row[..., n:] = pad_value
    return torch.from_numpy(out), lengths


def _collate_field(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, (bool, int, float, np.number)) and all(
            isinstance(v, (bool, int, float, np.number)) for v in values):
        return torch.from_numpy(np.asarray(values))
    arrays = [_as_numpy(v) for v in values]
    if all(a is not None for a in arrays) and len({a.shape for a in arrays}) == 1:  # type: ignore[union-attr]
        return torch.from_numpy(np.stack(arrays))  # type: ignore[arg-type]
    if isinstance(first, torch.Tensor) and all(
            isinstance(v, torch.Tensor) and v.shape == first.shape for v in values):
        return torch.stack(values)
    return values
