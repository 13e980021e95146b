"""What every decoder shares: accepting a path or a work item, the fields every sample carries, how a
cause is described in a decode error, and tensors.

Arrays become tensors through :func:`as_tensor` (``torch.from_numpy``: zero-copy, no torch operator),
which imports torch on first use, never on import. A decoder made with ``tensors=False`` keeps the
numpy arrays: the helper process of :class:`~audiobuffer.IsolatedLoader`, which runs without
torch, sets that on its copy of the decoder (:func:`numpy_output`); the trainer makes the batch
tensors.
"""

from __future__ import annotations

import os
from typing import Any, Union

from ..sources.item import WorkItem

ItemLike = Union[WorkItem, str, "os.PathLike[str]"]


def as_tensor(array: Any) -> Any:
    """``torch.from_numpy(array)`` (a decoder with ``tensors=False`` does not call it)."""
    import torch  # imported by the trainer anyway; a no-op lookup after the first call

    return torch.from_numpy(array)


def numpy_output(decoder: Any) -> None:
    """Have ``decoder`` hand numpy arrays over rather than tensors, where it offers the choice (a
    ``tensors`` attribute that is ``True`` or ``False``, as the built-in decoders have). The
    isolated loader's helper process, which runs without torch, calls it on its decoder copy."""
    if isinstance(getattr(decoder, "tensors", None), bool):
        decoder.tensors = False


def check_flag(name: str, value: Any) -> bool:
    """``value``, which must be ``True`` or ``False`` (else a TypeError naming ``name``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def as_item(item: ItemLike) -> WorkItem:
    """``item`` as a :class:`WorkItem` (a bare path becomes item 0 with no label)."""
    if isinstance(item, WorkItem):
        return item
    if isinstance(item, (str, os.PathLike)):
        return WorkItem(index=0, path=os.fspath(item))
    raise TypeError(f"a decoder takes a WorkItem or a path, got {item!r}")


def sample_fields(item: WorkItem) -> dict[str, Any]:
    """The fields of a sample that come from its work item: manifest fields, path, index, label."""
    sample: dict[str, Any] = dict(item.fields)
    sample["path"] = item.path
    sample["index"] = item.index
    if item.label is not None:
        sample["label"] = item.label
        sample["label_name"] = item.label_name
    return sample


def describe(exc: BaseException) -> str:
    """``"Type: message"`` for ``exc``, never with an empty message.

    An exception raised without a message (audioread's ``NoBackendError()``) is described by the
    first paragraph of its class's own docstring (not for builtins, whose docstrings are generic), or
    as ``(no message)``.
    """
    text = str(exc).strip()
    if not text:
        doc = "" if type(exc).__module__ == "builtins" else type(exc).__dict__.get("__doc__") or ""
        text = " ".join(doc.strip().split("\n\n")[0].split()) or "(no message)"
    return f"{type(exc).__name__}: {text}"
