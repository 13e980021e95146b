"""Moving batches to a device.

``to_device`` walks a nested batch (tensor, dict, list, tuple, namedtuple) and copies every tensor to
the device, leaving anything else (paths, label names) as it is.
"""

from __future__ import annotations

from typing import Any, Union

import torch

__all__ = ["resolve_device", "to_device"]


def resolve_device(device: Union[str, torch.device]) -> torch.device:
    """``"auto"`` is CUDA when available, else the CPU; anything else goes to ``torch.device``.

    Raises:
        ValueError: a CUDA device is asked for and none is available.
    """
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was asked for, but CUDA is not available here; use 'cpu' or 'auto'")
    return resolved


def to_device(batch: Any, device: torch.device, *, non_blocking: bool = True) -> Any:
    """``batch`` with every tensor in it copied to ``device`` (tensors already there stay as they are)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return type(batch)((k, to_device(v, device, non_blocking=non_blocking)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device, non_blocking=non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking=non_blocking) for v in batch)
    return batch
