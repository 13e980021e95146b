"""The item table: a source's items as columns of arrays, with no Python object per item.

An :class:`ItemTable` holds each item's path (a folder prefix shared by many items, and the rest of
the path), its label's class, a manifest's other columns, and an index member's shard, offset, size
and duration. Python values are made for one item at a time, when a work item is made for a producer.
A table can be moved into memory that another process maps too (NOTE [ Shared item table ]).

NOTE [ Shared item table ]
==========================
The helper process of ``IsolatedLoader`` gets its source's table as memory both processes map, not as a
pickle of its items, and the trainer gives up the copy it built: the table's pages are in memory once,
however many processes read them. :meth:`ItemTable.share` writes every array of the table of 4 KiB or
more (64-byte aligned) and a pickle of the rest (column names, folder prefixes, the values of coded
columns, the smaller arrays) into one region of memory, and maps it back: the trainer goes on with the
table over its map, whose arrays are read-only views. The :class:`SharedTable` it returns pickles as the
region's handle and layout (where each array and the pickle lie); unpickled in the helper, it maps the
region and makes the same views, so the helper starts in the same time whatever the number of items. The
region begins with a random token the reference carries, so that a map of anything else is refused. What
the region is, and how the system frees it with its last map, is in ``loaders/isolated/tables.py``.
"""

from __future__ import annotations

import hashlib
import io
import math
import numbers
import pickle
import secrets
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, overload

import numpy as np

__all__ = ["ABSENT", "ARROW_ROWS", "Coded", "Column", "ItemTable", "Numbers", "Objects", "Region", "SharedTable",
           "Strings", "TableView", "arrow_bools", "arrow_numbers", "arrow_valid", "as_column", "column_of",
           "numbers_arrow", "release_arrow_memory", "seconds_array", "seconds_of"]


class _Absent:
    """A column's value for a row that does not have the column (a JSONL row without the key)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


#: The value of a row without that column: its work item's ``fields`` leave the key out.
ABSENT: Any = _Absent()
_ENCODING = ("utf-8", "surrogateescape")  # undecodable file names round-trip as POSIX keeps them


class Strings:
    """A column of strings: their UTF-8 bytes end to end (``data``) and where each starts (``offsets``)."""

    __slots__ = ("data", "offsets")

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        self.data = data
        self.offsets = offsets

    @classmethod
    def from_strings(cls, values: Iterable[str]) -> Strings:
        encoded = [v.encode(*_ENCODING) for v in values]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets)

    @classmethod
    def from_arrow(cls, array: Any) -> Strings:
        """From a pyarrow string or binary array (chunked or not) without nulls: its buffers, copied once."""
        import pyarrow as pa

        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
        if not (pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)):
            array = array.cast(pa.large_binary() if pa.types.is_binary(array.type) else pa.large_string())
        n = len(array)
        buffers = array.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int64, count=n + 1, offset=array.offset * 8)
        start, end = int(offsets[0]), int(offsets[-1])
        data = np.frombuffer(buffers[2], dtype=np.uint8)[start:end].copy() if buffers[2] is not None and end > start \
            else np.empty(0, dtype=np.uint8)
        return cls(data, offsets - start)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        o = self.offsets
        return self.data[o[i]:o[i + 1]].tobytes().decode(*_ENCODING)

    def raw(self, i: int) -> bytes:
        o = self.offsets
        return self.data[o[i]:o[i + 1]].tobytes()

    def tolist(self) -> list[str]:
        data, o = self.data.tobytes(), self.offsets.tolist()
        return [data[o[i]:o[i + 1]].decode(*_ENCODING) for i in range(len(o) - 1)]

    def take(self, indices: np.ndarray) -> Strings:
        starts, ends = self.offsets[indices], self.offsets[np.asarray(indices) + 1]
        lengths = ends - starts
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # Each output byte's source: its row's start plus its place within the row.
        where = np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
        return Strings(self.data[where], offsets)

    def arrow(self) -> Any:
        """The column as a pyarrow ``large_binary`` array over the same memory (for bulk string work)."""
        import pyarrow as pa

        return pa.Array.from_buffers(pa.large_binary(), len(self),
                                     [None, pa.py_buffer(self.offsets), pa.py_buffer(self.data)])


class Coded:
    """A column of few distinct values: each row's code (``-1``: :data:`ABSENT`) into ``values``."""

    __slots__ = ("codes", "values")

    def __init__(self, codes: np.ndarray, values: list[Any]) -> None:
        self.codes = codes
        self.values = values

    @classmethod
    def encode(cls, values: Sequence[Any]) -> Coded:
        """Code hashable ``values`` (:data:`ABSENT` for a missing one) in order of first appearance."""
        lookup: dict[Any, int] = {ABSENT: -1}
        codes = np.fromiter((lookup.setdefault(v, len(lookup) - 1) for v in values), dtype=np.int32,
                            count=len(values))
        del lookup[ABSENT]
        return cls(codes, list(lookup))

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: int) -> Any:
        code = self.codes[i]
        return ABSENT if code < 0 else self.values[code]

    def take(self, indices: np.ndarray) -> Coded:
        return Coded(self.codes[indices], self.values)


class Numbers:
    """A column of numbers (or booleans) as one array; ``absent`` marks the rows without a value."""

    __slots__ = ("array", "absent")

    def __init__(self, array: np.ndarray, absent: np.ndarray | None = None) -> None:
        self.array = array
        self.absent = absent

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> Any:
        if self.absent is not None and self.absent[i]:
            return ABSENT
        return self.array[i].item()

    def take(self, indices: np.ndarray) -> Numbers:
        return Numbers(self.array[indices], None if self.absent is None else self.absent[indices])


class Objects:
    """A column of any values (nested JSON, a malformed CSV's rows): one Python object per row."""

    __slots__ = ("values",)

    def __init__(self, values: list[Any]) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> Any:
        return self.values[i]

    def take(self, indices: np.ndarray) -> Objects:
        return Objects([self.values[i] for i in indices.tolist()])


Column = Strings | Coded | Numbers | Objects


def column_of(values: Sequence[Any]) -> Column:
    """The most compact column for Python ``values`` (:data:`ABSENT` where a row lacks it), each value
    given back as it was (an int stays an int, a float a float)."""
    kinds = {type(v) for v in values}
    if kinds <= {str, _Absent}:
        distinct = len(set(values))
        if distinct <= max(16, len(values) // 4) or _Absent in kinds:
            return Coded.encode(values)
        try:
            return Strings.from_strings(values)
        except UnicodeEncodeError:  # a lone surrogate (from JSON's \ud800), which UTF-8 cannot hold
            return Objects(list(values))
    if len(kinds) == 1 and kinds <= {int, float, bool}:
        try:
            return Numbers(np.asarray(values, dtype={int: np.int64, float: np.float64, bool: np.bool_}[kinds.pop()]))
        except OverflowError:  # an int beyond 64 bits
            pass
    return Objects(list(values))


def as_column(values: Any) -> Column:
    """A manifest column (a list of Python values, or a pyarrow array) as a table column."""
    if isinstance(values, (Strings, Coded, Numbers, Objects)):
        return values
    if isinstance(values, list):
        return column_of(values)
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if values.null_count == 0 and (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        encoded = pc.dictionary_encode(values)
        if len(encoded.dictionary) <= max(16, len(values) // 4):
            return Coded(arrow_numbers(encoded.indices, np.int32), encoded.dictionary.to_pylist())
        return Strings.from_arrow(values)
    if values.null_count == 0 and pa.types.is_boolean(values.type):
        return Numbers(arrow_bools(values))
    if values.null_count == 0 and (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        wide = pa.float64() if pa.types.is_floating(values.type) else pa.int64()
        return Numbers(arrow_numbers(values.cast(wide), np.float64 if wide == pa.float64() else np.int64))
    return Objects(values.to_pylist())


# -- numbers between numpy and pyarrow, without pandas --------------------------------------------
# pyarrow imports pandas, where it is installed, on its first conversion between pyarrow and Python or
# numpy values (``pa.array``, ``pa.scalar``, ``to_numpy``, ``np.asarray`` of an array): half a second
# and some 60 MiB that reading an index or a manifest does not need. These read and write the buffers.

#: From this many rows an index is parsed, and a list of paths split, by pyarrow; below, by Python, which
#: is done before pyarrow is imported (benchmarks/bench_index_parse.py measures where they cross).
ARROW_ROWS = 50_000


def arrow_numbers(array: Any, dtype: Any) -> np.ndarray:
    """The values of a pyarrow array of fixed-width numbers (``dtype``: its type's numpy twin), chunked
    or not, as a new numpy array; a null's value is unspecified (:func:`arrow_valid` says which)."""
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    kind = np.dtype(dtype)
    if kind.itemsize * 8 != array.type.bit_width:
        raise TypeError(f"a pyarrow {array.type} array is not read as {kind}")
    data = array.buffers()[1]
    if data is None:  # an array of nulls only
        return np.zeros(len(array), dtype=kind)
    return np.frombuffer(data, dtype=kind, count=array.offset + len(array))[array.offset:].copy()


def arrow_bools(array: Any) -> np.ndarray:
    """A pyarrow boolean array (chunked or not) as numpy booleans; a null reads as ``False``."""
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return _bits(array.buffers()[1], array.offset, len(array)) & arrow_valid(array)


def arrow_valid(array: Any) -> np.ndarray:
    """Whether each value of a pyarrow array (not chunked) is given (not null), as numpy booleans."""
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    return _bits(array.buffers()[0], array.offset, len(array))


def _bits(buffer: Any, offset: int, count: int) -> np.ndarray:
    if buffer is None:
        return np.zeros(count, dtype=bool)
    bits = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), count=offset + count, bitorder="little")
    return bits[offset:].astype(bool)


def numbers_arrow(values: np.ndarray) -> Any:
    """A one-dimensional numpy array of int32, int64 or float64 as a pyarrow array without nulls (a copy)."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    kind = {"int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64()}[values.dtype.name]
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values.copy())])


def release_arrow_memory() -> None:
    """Give back to the system the memory pyarrow's pool keeps after bulk work on a table (reading a
    manifest, a fingerprint): the table holds its own arrays, and the pool would otherwise keep the
    largest size it reached for the process's life. Where pyarrow is not imported, it holds nothing."""
    pa = sys.modules.get("pyarrow")
    try:
        if pa is not None:
            pa.default_memory_pool().release_unused()
    except AttributeError:
        pass


def seconds_array(column: Column) -> tuple[np.ndarray, np.ndarray]:
    """A column read as seconds: ``(float64 values, valid)``; ``valid`` is false where a value is not a
    finite number >= 0 (a string of one counts) or is absent. Numbers are converted in bulk; strings
    by pyarrow where it can, one by one where it cannot."""
    if isinstance(column, Numbers) and column.array.dtype.kind in "iuf":
        seconds = column.array.astype(np.float64)
    elif isinstance(column, Coded):
        per_value = np.array([_nan_if_none(seconds_of(v)) for v in column.values] + [np.nan], dtype=np.float64)
        seconds = per_value[column.codes]  # code -1 picks the NaN at the end
    elif isinstance(column, Strings):
        seconds = _parse_floats(column)
    else:
        seconds = np.array([_nan_if_none(None if v is ABSENT else seconds_of(v))
                            for v in (column[i] for i in range(len(column)))], dtype=np.float64)
    valid = np.isfinite(seconds) & (seconds >= 0)
    if isinstance(column, Numbers) and column.absent is not None:
        valid &= ~column.absent
    return seconds, valid


def _nan_if_none(value: float | None) -> float:
    return np.nan if value is None else value


def seconds_of(value: Any) -> float | None:
    """A duration column's value (a number, or a string of one: CSV cells are) as seconds; ``None`` when
    it is not a finite number >= 0. Manifest rows and streamed samples' sidecar fields are read alike."""
    seconds = None
    if isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            pass
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        seconds = float(value)
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


def _parse_floats(column: Strings) -> np.ndarray:
    try:
        import pyarrow as pa
        import pyarrow.compute as pc

        floats = pc.cast(column.arrow().cast(pa.large_string()), pa.float64())
        return np.where(arrow_valid(floats), arrow_numbers(floats, np.float64), np.nan)
    except Exception:  # noqa: BLE001 - a value pyarrow does not read ("1_000", " 2"): Python reads each
        return np.array([_nan_if_none(seconds_of(v)) for v in column.tolist()], dtype=np.float64)


class TableView(Sequence[Any]):
    """A read-only sequence over one of a table's columns, made an item at a time (``Source.paths``)."""

    def __init__(self, n: int, get: Any) -> None:
        self._n = n
        self._get = get

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self._get(j) for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"index {i} out of range for {self._n} items")
        return self._get(i)

    def __iter__(self) -> Iterator[Any]:
        return (self._get(i) for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (TableView, list, tuple)):
            return len(other) == self._n and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        shown = ", ".join(repr(v) for v in self[:3])
        return f"[{shown}{', ...' if self._n > 3 else ''}] ({self._n} items)"


class ItemTable:
    """The items of a source, in columns.

    Attributes:
        prefixes: the distinct folder prefixes of the paths (with their trailing separator).
        prefix_of: each item's prefix, an index into ``prefixes``.
        names: the rest of each item's path (``prefixes[prefix_of[i]] + names[i]`` is the path).
        columns: a manifest's column names (the path column included), in order; empty without one.
        fields: each non-path column of a manifest (or an index's fields), or ``None`` without columns.
        shards, shard_of, offsets, sizes, members, durations: an index's shards and each member's shard
            (an index into ``shards``), data offset and size in it, tar member name and duration
            (``NaN``: unknown); ``None`` for other sources.
        labels: a column ``labels=`` may name beside ``fields`` (an index's packed label), or ``None``.
        segments: each item's part of its file as ``(start, duration)`` seconds, an ``(n, 2)`` float array
            (a duration of ``NaN``: to the end of the file), or ``None`` where every item is a whole file.
        label_of: each item's class as its source resolved it (-1: no label), or ``None``.

    Thread safety: read-only once made; any thread may read it.
    """

    def __init__(self, prefixes: list[str], prefix_of: np.ndarray, names: Strings, *,
                 columns: list[str] | None = None, fields: dict[str, Column] | None = None,
                 labels: Column | None = None, shards: list[str] | None = None, shard_of: np.ndarray | None = None,
                 offsets: np.ndarray | None = None, sizes: np.ndarray | None = None, members: Strings | None = None,
                 durations: np.ndarray | None = None, segments: np.ndarray | None = None) -> None:
        self.prefixes = prefixes
        self.prefix_of = prefix_of
        self.names = names
        self.columns = columns or []
        self.fields = fields
        self.labels = labels
        self.shards = shards
        self.shard_of = shard_of
        self.offsets = offsets
        self.sizes = sizes
        self.members = members
        self.durations = durations
        self.segments = segments
        #: Each item's class, set by the source that resolves the labels (-1: none), or ``None``.
        self.label_of: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.prefix_of)

    def path(self, i: int) -> str:
        return self.prefixes[self.prefix_of[i]] + self.names[i]

    def paths(self) -> list[str]:
        """Every path (one string per item: for listings, not for the items' lifetime)."""
        prefixes = self.prefixes
        return [prefixes[p] + n for p, n in zip(self.prefix_of.tolist(), self.names.tolist())]

    def row(self, i: int) -> dict[str, Any]:
        """Item ``i``'s fields (a manifest row without its path column; an index member's fields)."""
        if not self.fields:
            return {}
        row = {}
        for name, column in self.fields.items():
            value = column[i]
            if value is not ABSENT:
                row[name] = value
        return row

    def column(self, name: str) -> Column | None:
        """The column ``name``: ``label`` of an index (its packed label), else one of the fields; or ``None``."""
        if name == "label" and self.labels is not None:
            return self.labels
        return self.fields.get(name) if self.fields is not None else None

    @property
    def is_index(self) -> bool:
        return self.offsets is not None

    def take(self, indices: Sequence[int] | np.ndarray) -> ItemTable:
        """A table of the items at ``indices``, in that order."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)

        def opt(array: np.ndarray | None) -> np.ndarray | None:
            return None if array is None else array[idx]

        part = ItemTable(self.prefixes, self.prefix_of[idx], self.names.take(idx), columns=self.columns,
                         fields=None if self.fields is None else {k: c.take(idx) for k, c in self.fields.items()},
                         labels=None if self.labels is None else self.labels.take(idx), shards=self.shards,
                         shard_of=opt(self.shard_of), offsets=opt(self.offsets), sizes=opt(self.sizes),
                         members=None if self.members is None else self.members.take(idx),
                         durations=opt(self.durations), segments=opt(self.segments))
        part.label_of = opt(self.label_of)
        return part

    def fingerprint(self) -> str:
        """``<items>:<digest>``: the SHA-256 of every path, each followed by a NUL byte, in order."""
        digest = hashlib.sha256()
        try:
            self._digest_paths(digest)
        except ImportError:
            for path in self.paths():
                digest.update(path.encode(*_ENCODING) + b"\0")
        release_arrow_memory()  # what the joined paths took, back to the system
        if self.segments is not None:  # the segments of one recording share its path
            digest.update(np.ascontiguousarray(self.segments, dtype=np.float64).tobytes())
        return f"{len(self)}:{digest.hexdigest()[:16]}"

    def _digest_paths(self, digest: Any) -> None:
        """Feed every path and a NUL byte after each to ``digest``, a million at a time (pyarrow).

        Raises:
            ImportError: pyarrow is not installed.
        """
        import pyarrow.compute as pc

        prefixes = Strings.from_strings(self.prefixes).arrow()
        nul, empty = Strings.from_strings(["\0", ""]).arrow()  # scalars made without pa.scalar (pandas)
        step = 1 << 20
        for start in range(0, len(self), step):
            stop = min(start + step, len(self))
            part = self.names.take(np.arange(start, stop)) if start or stop < len(self) else self.names
            taken = pc.take(prefixes, numbers_arrow(self.prefix_of[start:stop].astype(np.int64)))
            joined = pc.binary_join_element_wise(taken, part.arrow(), nul, empty)
            offsets = np.frombuffer(joined.buffers()[1], dtype=np.int64, count=len(joined) + 1,
                                    offset=joined.offset * 8)
            digest.update(memoryview(joined.buffers()[2])[int(offsets[0]):int(offsets[-1])])

    # -- sharing with another process (NOTE [ Shared item table ]) --------------------------------

    def share(self, make_region: Callable[[int], Region]) -> tuple[ItemTable, SharedTable]:
        """This table moved into a region of memory another process maps (NOTE [ Shared item table ]).

        Args:
            make_region: makes a region of the given size in bytes, which this writes once.

        Returns:
            The table over the region (read-only arrays: this process's copy from then on, the one made in
            memory being free to go) and a reference that pickles as the region, unpickling into the same
            table over the other process's map of it.
        """
        arrays: list[np.ndarray] = []

        class Saver(pickle.Pickler):
            def persistent_id(self, obj: Any) -> Any:
                if isinstance(obj, np.ndarray) and obj.dtype != object and obj.nbytes >= 4096:
                    arrays.append(np.ascontiguousarray(obj))
                    return len(arrays) - 1
                return None

        state = io.BytesIO()
        Saver(state, protocol=pickle.HIGHEST_PROTOCOL).dump(self.__dict__)
        places: list[tuple[int, str, tuple[int, ...]]] = []
        end = len(_TOKEN_SPACE)
        for array in arrays:
            places.append((end, array.dtype.str, array.shape))
            end = _aligned(end + array.nbytes)
        region = make_region(end + state.tell())
        token = secrets.token_bytes(len(_TOKEN_SPACE))
        region.write(0, memoryview(token))
        for (offset, _, _), array in zip(places, arrays):
            if array.nbytes:
                region.write(offset, array.reshape(-1).view(np.uint8).data)
        region.write(end, state.getbuffer())
        reference = SharedTable(region.handle, token, places, end, state.tell())
        return reference.over(region.map()), reference

    def __reduce__(self) -> Any:
        return (_from_state, (self.__dict__,))


def _aligned(offset: int) -> int:
    return -(-offset // 64) * 64


_TOKEN_SPACE = bytes(64)  # the region's first bytes: its random token, as long, before the first array


class Region(Protocol):
    """Memory that :meth:`ItemTable.share` writes once and maps (``loaders/isolated/tables.py``)."""

    handle: Any  # picklable; ``handle.map()`` maps the region in another process

    def write(self, offset: int, data: memoryview) -> None: ...

    def map(self) -> Any: ...


class SharedTable:
    """A reference to a table that :meth:`ItemTable.share` wrote into a region: pickled, it is the region's
    handle and the table's layout; unpickled, the table over this process's map of the region."""

    def __init__(self, handle: Any, token: bytes, places: list[tuple[int, str, tuple[int, ...]]], state_at: int,
                 state_size: int) -> None:
        self.handle, self.token, self.places = handle, token, places
        self.state_at, self.state_size = state_at, state_size

    def over(self, region: Any) -> ItemTable:
        """The table over ``region`` (a buffer: the mapped region), its arrays read-only views of it.

        Raises:
            ValueError: ``region`` does not hold this table (another region, or an empty one made in its
                place after its owner had gone).
        """
        view = memoryview(region)
        if bytes(view[:len(self.token)]) != self.token:
            raise ValueError("the shared item table is not in the region mapped (the process that shared it "
                             "has gone, or closed it)")
        places = self.places

        class Loader(pickle.Unpickler):
            def persistent_load(self, pid: Any) -> Any:
                offset, dtype, shape = places[int(pid)]
                array = np.frombuffer(region, dtype=np.dtype(dtype), count=math.prod(shape), offset=offset)
                array = array.reshape(shape)
                array.flags.writeable = False  # a Windows section maps writable: nobody writes it
                return array

        state = Loader(io.BytesIO(view[self.state_at:self.state_at + self.state_size])).load()
        return _from_state(state)

    def __reduce__(self) -> Any:
        return (_open_shared, (self.handle, self.token, self.places, self.state_at, self.state_size))


def _from_state(state: Mapping[str, Any]) -> ItemTable:
    table = object.__new__(ItemTable)
    table.__dict__.update(state)
    return table


def _open_shared(handle: Any, token: bytes, places: list[tuple[int, str, tuple[int, ...]]], state_at: int,
                 state_size: int) -> ItemTable:
    """The table a :class:`SharedTable` pickled refers to, over this process's map of its region."""
    return SharedTable(handle, token, places, state_at, state_size).over(handle.map())
