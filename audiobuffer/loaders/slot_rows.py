"""How a sample becomes a row of a batch slot: the slot's columns from the first sample, and each
later sample checked and converted to them before a producer claims its row.

NOTE [ Slot rows ]
==================
A producer converts its sample to the slot's columns before it claims a row: each value must have
its column's shape and a dtype of a kind the column takes (an integer column takes integers, not a
float, a bool or ``None``; a float column takes integers and floats, not bools), and is cast to the
column's dtype, out-of-range integers refused. A sample that does not fit is that item's failure,
with no row claimed, so its batch mates are kept and no row is left unwritten (a hole that would be
handed out holding a previous batch's data). Once claimed, a row is filled by a same-dtype,
same-shape numpy copy and list stores, which cannot fail; if one does anyway, the producer ends the
epoch with an error naming the file rather than leave a hole.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import SampleError
from ..sources.source import WorkItem

__all__ = ["FITS", "Field", "RowWriteFailed", "convert", "layout"]


class Field:
    """How one sample key is stored in a slot: a tensor row, or a list entry."""

    __slots__ = ("key", "shape", "dtype", "np_dtype")

    def __init__(self, key: str, shape: tuple[int, ...] | None, dtype: torch.dtype | None) -> None:
        self.key = key
        self.shape = shape  # None: kept in a list
        self.dtype = dtype
        self.np_dtype: np.dtype | None = None
        if dtype is not None:
            try:
                self.np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            except TypeError as exc:  # bfloat16 and other dtypes numpy has not
                raise SampleError(f"{key!r} has dtype {dtype}, which a batch slot cannot hold (numpy has no such "
                                  f"dtype): convert it in the decoder or a transform") from exc


def layout(sample: dict[str, Any]) -> list[Field]:
    fields = []
    for key, value in sample.items():
        if isinstance(value, torch.Tensor):
            fields.append(Field(key, tuple(value.shape), value.dtype))
        elif isinstance(value, np.ndarray) and value.dtype != object:
            fields.append(Field(key, value.shape, torch.from_numpy(value[:0].copy()).dtype))
        elif isinstance(value, (bool, np.bool_)):
            fields.append(Field(key, (), torch.bool))
        elif isinstance(value, (int, np.integer)):
            fields.append(Field(key, (), torch.int64))
        elif isinstance(value, (float, np.floating)):
            fields.append(Field(key, (), torch.float64))
        else:
            fields.append(Field(key, None, None))
    return fields


#: The numpy kinds a column of each kind takes: no float or bool into an integer column, no bool into
#: a number column, no number into a bool column (numpy's own casting rules allow bool -> int).
FITS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf", "c": "iufc"}


def describe(value: Any) -> str:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"a {type(value).__name__} of dtype {value.dtype}"
    text = repr(value)
    return f"{text[:40] + '...' if len(text) > 40 else text} ({type(value).__name__})"


def convert(sample: dict[str, Any], fields: list[Field], item: WorkItem) -> list[Any]:
    """The sample's values, each converted to its column's dtype and checked against its shape.

    Raises :class:`SampleError` naming the key, the value and the file for a sample that does not
    fit the slot: NOTE [ Slot rows ].
    """
    if len(sample) != len(fields) or any(f.key not in sample for f in fields):
        raise SampleError(f"sample keys {sorted(sample)} in {item.path!r} differ from the batch slot's "
                          f"{sorted(f.key for f in fields)} (set by the first sample): "
                          "every sample needs the same keys",
                          path=item.path, index=item.index)
    values = []
    for f in fields:
        value = sample[f.key]
        if f.shape is None:
            values.append(value)
            continue
        dtype: np.dtype = f.np_dtype  # type: ignore[assignment]
        try:
            array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        except (TypeError, ValueError, RuntimeError) as exc:  # ragged lists, dtypes numpy has not
            array = None
            cause: BaseException | None = exc
        else:
            cause = None
        if array is None or array.dtype.kind not in FITS.get(dtype.kind, dtype.kind):
            raise SampleError(
                f"{f.key!r} is {describe(value)} in {item.path!r}, but the batch slot's {f.key!r} column is "
                f"{dtype} (set by the first sample): give every sample the same type of {f.key!r}, converting "
                f"it in a transform if need be", path=item.path, index=item.index) from cause
        if array.shape != f.shape:
            raise SampleError(
                f"{f.key!r} has shape {array.shape}, the batch slot {f.shape}, in {item.path!r}: BatchSlotLoader "
                f"needs fixed-shape samples (crop_seconds with pad=True for audio, a size for images)",
                path=item.path, index=item.index)
        if array.dtype != dtype:
            converted = array.astype(dtype)
            if dtype.kind in "iu" and not np.array_equal(converted, array):
                raise SampleError(f"{f.key!r} holds values out of the range of the batch slot's {dtype} column in "
                                  f"{item.path!r}", path=item.path, index=item.index)
            array = converted
        values.append(array)
    return values


class RowWriteFailed(BaseException):
    """Copying a converted sample into its claimed row failed (NOTE [ Slot rows ]: it cannot).

    A ``BaseException`` on purpose: the producer pool reports it as a crash that ends the epoch,
    whatever ``on_error`` says, rather than as one item's failure that could be skipped while the
    row it leaves unwritten is handed out or holds its batch mates back.
    """

