"""What every decoder shares: accepting a path or a work item, the fields every sample carries, how a
cause is described in a decode error, and tensors.

Arrays become tensors through :func:`as_tensor` (``torch.from_numpy``: zero-copy, no torch operator),
which imports torch on first use, never on import: in the helper process of
:class:`~audiobuffer.IsolatedLoader`, which runs without torch, :data:`TENSORS` is ``False`` and
samples keep their numpy arrays (the trainer makes the batch tensors).
"""

from __future__ import annotations

import os
from typing import Any, Union

from ..sources.item import WorkItem

ItemLike = Union[WorkItem, str, "os.PathLike[str]"]

#: Whether decoders hand tensors over (``False`` in the isolated loader's helper process: numpy arrays).
TENSORS = True


def as_tensor(array: Any) -> Any:
    """``torch.from_numpy(array)``, or ``array`` itself where :data:`TENSORS` is off."""
    if not TENSORS:
        return array
    import torch  # imported by the trainer anyway; a no-op lookup after the first call

    return torch.from_numpy(array)


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
