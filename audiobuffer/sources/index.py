"""The index of packed shards (``index.json``): where every member's data sits, for ranged reads.

:func:`read_index` gives :class:`Member` records with the URL of the shard, and the offset and size
of the member's data in it, so a producer reads one member with one ranged request
(:meth:`Member.reader`, :func:`~audiobuffer.sources.storage.read_range`). :func:`read_index_columns`
gives the same as columns, checked in bulk, with no object per member: what a source of millions of
members is listed from. :mod:`audiobuffer.sources` re-exports the public names.
"""

from __future__ import annotations

import codecs
import functools
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

import numpy as np

from .._checks import short_repr
from ..errors import SourceError
from . import table as item_table
from .formats.tarheader import HEADER, check_member
from .storage import RetrySpec, Storage, inside_folder, sibling
from .table import (
    ABSENT,
    Coded,
    Column,
    Strings,
    arrow_numbers,
    arrow_valid,
    as_column,
    release_arrow_memory,
)

__all__ = ["INDEX_FORMAT", "INDEX_NAME", "INDEX_VERSION", "IndexColumns", "Member", "ShardIndex",
           "index_columns", "read_index", "read_index_columns", "read_member", "shard_name"]

#: The index file :func:`~audiobuffer.prepare.pack.pack` writes beside the shards.
INDEX_NAME = "index.json"
INDEX_FORMAT = "audiobuffer-shards"
INDEX_VERSION = 1


def shard_name(number: int) -> str:
    """The file name of shard ``number``: ``shard-000000.tar``, ``shard-000001.tar``..."""
    return f"shard-{number:06d}.tar"


# -- the index -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Member:
    """One sample of a packed shard, as the index records it.

    Attributes:
        shard: the path or URL of the shard that holds it.
        member: its member name in the tar (``<key>.<ext>``).
        name: its original path relative to the packed source (``"0_jackson_0.wav"``).
        offset: where its data starts in the shard, in bytes.
        size: its size in bytes.
        duration: its duration in seconds from its header, or ``None`` when unknown.
        label: its label name, or ``None``.
        fields: the other columns of its manifest row.
    """

    shard: str
    member: str
    name: str
    offset: int
    size: int
    duration: float | None = None
    label: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """``<shard>/<name>``: names the shard and ends with the original file name."""
        return f"{self.shard}/{self.name}"

    def reader(self, *, storage_options: Mapping[str, Any] | None = None,
               retry: RetrySpec = None) -> Callable[[], bytes]:
        """A callable that reads this member's bytes with one ranged request (retried as ``retry`` says),
        checking that they are this member's (:func:`read_member`).

        It can be pickled, and it reads when called, not before: give it to a work item and the
        producer thread that decodes the item does the I/O.
        """
        return functools.partial(read_member, self.shard, self.offset, self.size,
                                 member=self.member, storage=Storage.of(storage_options, retry))


def read_member(url: str, offset: int, size: int, *, member: str, storage: Storage) -> bytes:
    """The ``size`` bytes of member ``member`` at ``offset`` in shard ``url``, with one ranged
    request through ``storage`` that takes the member's tar header along (NOTE [ Members where an
    index says ] in ``formats/tarheader.py``).

    Raises:
        StorageError: as :func:`~audiobuffer.sources.storage.read_range`, or the header before the data
            is not ``member``'s (:func:`~audiobuffer.sources.formats.tarheader.check_member`).
    """
    head = min(offset, HEADER) if isinstance(offset, int) and offset > 0 else 0
    data = storage.read_range(url, offset - head, size + head, member=member)
    check_member(data[:head], url, member, offset, size)
    return data[head:]


@dataclass(frozen=True)
class ShardIndex:
    """The index of a packed set of shards (:func:`read_index`).

    Attributes:
        url: where the index was read from.
        shards: the shards' paths or URLs, in order.
        members: every member, in packing order (shard by shard).
        classes: the label names in the order the packed source numbered them (``None``: not
            recorded; :func:`~audiobuffer.sources.source.class_order` then sorts them).
    """

    url: str
    shards: tuple[str, ...]
    members: tuple[Member, ...]
    classes: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.members)

    def ranges(self) -> list[tuple[str, int, int]]:
        """``(shard URL, offset, size)`` of every member, in order: what a ranged read needs."""
        return [(m.shard, m.offset, m.size) for m in self.members]


@dataclass(frozen=True)
class IndexColumns:
    """An index's members as columns (:func:`read_index_columns`), in packing order.

    Attributes:
        url: where the index was read from.
        shards: the shards' paths or URLs, in order.
        shard_of: each member's shard, an index into ``shards``.
        members, names: each member's name in its tar, and its original path relative to the source.
        offsets, sizes: where each member's data starts in its shard, and its size, in bytes.
        durations: each member's duration in seconds (``NaN``: unknown).
        labels: each member's label (``None`` for none).
        fields: each of the members' other columns (:data:`~audiobuffer.sources.table.ABSENT` where a
            member lacks it), in order of first appearance.
        classes: as :attr:`ShardIndex.classes`.
    """

    url: str
    shards: tuple[str, ...]
    shard_of: np.ndarray
    members: Strings
    names: Strings
    offsets: np.ndarray
    sizes: np.ndarray
    durations: np.ndarray
    labels: Coded
    fields: dict[str, Column]
    classes: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def member(self, i: int) -> Member:
        """Member ``i`` as a record."""
        duration = float(self.durations[i])
        fields = {key: value for key, value in ((k, c[i]) for k, c in self.fields.items()) if value is not ABSENT}
        return Member(shard=self.shards[self.shard_of[i]], member=self.members[i], name=self.names[i],
                      offset=int(self.offsets[i]), size=int(self.sizes[i]),
                      duration=None if math.isnan(duration) else duration, label=self.labels[i], fields=fields)


def read_index(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
               retry: RetrySpec = None, allow_outside: bool = False) -> ShardIndex:
    """Read an ``index.json`` written by :func:`~audiobuffer.prepare.pack.pack` from a path or URL.

    Shard names in the index are relative to the index's folder: the result holds their full paths
    or URLs (so ``s3://bucket/fsdd/index.json`` gives shards under ``s3://bucket/fsdd/``). An index is
    data that may come from elsewhere, so it reads nothing outside its own folder: a shard named by an
    absolute path, a URL of another scheme, bucket, host or folder, or a name stepping out with ``..``
    is refused, and every member must lie within its shard's size as the index records it.

    Args:
        url: the index's path or URL.
        storage_options: options for the fsspec filesystem of a URL.
        retry: how transient storage failures are retried.
        allow_outside: resolve shard names wherever they point (an index you wrote yourself that
            names shards in another folder or bucket), as :func:`~audiobuffer.sources.storage.sibling` does.

    Raises:
        StorageError: the index cannot be read.
        SourceError: it is not an index (malformed JSON, another format, a member that names no shard),
            names a shard outside its folder, or holds a value that does not fit (the message names
            the member and the value).
    """
    columns = read_index_columns(url, storage_options=storage_options, retry=retry, allow_outside=allow_outside)
    return ShardIndex(url=columns.url, shards=columns.shards,
                      members=tuple(columns.member(i) for i in range(len(columns))),
                      classes=columns.classes)


def read_index_columns(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
                       retry: RetrySpec = None, allow_outside: bool = False) -> IndexColumns:
    """:func:`read_index` as columns (:func:`index_columns`).

    Raises:
        StorageError, SourceError: as :func:`read_index` (a malformed member is named as it does).
    """
    return index_columns(url, storage=Storage.of(storage_options, retry),
                         allow_outside=allow_outside)


def index_columns(url: str | os.PathLike[str], *, storage: Storage,
                  allow_outside: bool = False) -> IndexColumns:
    """:func:`read_index` as columns, read through ``storage``, with no object per member: an index
    of :data:`~audiobuffer.sources.table.ARROW_ROWS` members or more is parsed into columns by
    pyarrow and checked a column at a time where it has the plain shape ``pack`` writes (each
    member's values of one type, its fields in every member, no escapes, little nesting) and pyarrow
    reads every value as :mod:`json` does; otherwise (and a smaller index always, without importing
    pyarrow) it is parsed by :mod:`json` and checked as :func:`read_index` does. Either way the same
    index gives the same members, or is refused with the same message.

    Raises:
        StorageError, SourceError: as :func:`read_index` (a malformed member is named as it does).
    """
    url = os.fspath(url)
    raw = storage.read_bytes(url)
    resolve = functools.partial(sibling if allow_outside else inside_folder, url)
    # A small index (its members counted as the "offset" keys in its text) is parsed by json alone.
    parsed = _parse_arrow(raw) if raw.count(b'"offset"') >= item_table.ARROW_ROWS else None
    if parsed is not None:
        head, members = parsed
        try:
            shards = _shards(url, head, resolve)
        except SourceError:  # json reads it again, and says what is wrong as it reads it
            shards = None
        columns = None if shards is None else _columns_arrow(url, members, shards, raw)
        del parsed, members
        release_arrow_memory()
        if columns is not None:
            return _with_classes(columns, head.get("classes"))
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"index {url!r} is not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise SourceError(f"index {url!r} is nested too deeply to be an index of shards") from exc
    del raw
    shards = _shards(url, data, resolve)
    rows = data["members"]
    found = _columns(url, rows, shards)
    if found is None:  # a member the bulk checks refuse: the checks of one member name it
        for n, row in enumerate(rows):
            _member(url, n, row, shards)
        raise SourceError(f"index {url!r} is malformed: its members do not fit together (pack the source again)")
    return _with_classes(found, data.get("classes"))


def _with_classes(columns: IndexColumns, classes: Any) -> IndexColumns:
    """``columns`` with the index's ``"classes"`` (``None`` where it records none), checked:
    distinct strings that name every member's label."""
    if classes is None:
        return columns
    url = columns.url
    if not isinstance(classes, list) or not _all_of(classes, str) \
            or len(set(classes)) < len(classes):
        raise SourceError(f"index {url!r} is malformed: \"classes\" must be a list of distinct "
                          f"label names, got {short_repr(classes)} (pack the source again)")
    known = set(classes)
    for label in columns.labels.values:
        if label is not None and str(label) not in known:
            raise SourceError(f"index {url!r} is malformed: a member's label {str(label)!r} is "
                              f"not one of its classes {short_repr(classes)} (pack the source "
                              f"again)")
    return replace(columns, classes=tuple(classes))


def _shards(url: str, data: Any, resolve: Callable[[str], str]) -> dict[str, tuple[str, int]]:
    """The shards of the parsed index ``data`` (its format and version checked): name in the index ->
    (path or URL, size in bytes)."""
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
        raise SourceError(f"{url!r} is not an index of audiobuffer shards (no \"format\": \"{INDEX_FORMAT}\")")
    if data.get("version") != INDEX_VERSION:
        raise SourceError(f"index {url!r} has version {data.get('version')!r}; this audiobuffer reads "
                          f"version {INDEX_VERSION} (pack the source again)")
    entries, rows = data.get("shards"), data.get("members")
    if not isinstance(entries, list) or not isinstance(rows, list):
        raise SourceError(f"index {url!r} is malformed: \"shards\" and \"members\" must be lists")
    shards: dict[str, tuple[str, int]] = {}
    for n, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        size = entry.get("size") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or not _is_count(size):
            raise SourceError(f"index {url!r} shard {n} is malformed: it needs a \"name\" and a \"size\" in bytes "
                              f"(an integer >= 0), got {short_repr(entry)}")
        try:
            shards[name] = (resolve(name), size)
        except ValueError as exc:
            raise SourceError(f"index {url!r} shard {exc}; an index names shards inside its own folder: pass "
                              f"allow_outside=True (read_index, Source) to read shards elsewhere") from exc
    return shards


# -- members in bulk: parsed by pyarrow, or by json ------------------------------------------------

#: A member name that is empty, rooted, holds a NUL or steps out with ``..`` (as ``_is_inner_name`` says).
_OUTER_NAME = r"^$|^[/\\]|\x00|(^|[/\\])\.\.([/\\]|$)"
#: The deepest nesting of arrays and objects pyarrow's JSON reader is given: it recurses, and text nested
#: some thousands deep overflows its stack, a crash of the process (an index nests 4 deep, its fields more).
_ARROW_DEPTH = 64
_SCAN = 1 << 22  # bytes of an index looked at a time by _arrow_may_read
_NOT_MARKS = bytes(c for c in range(256) if c not in b'"[]{}')
_STEPS = np.zeros(256, dtype=np.int64)
_STEPS[list(b"[{")], _STEPS[list(b"]}")] = 1, -1


def _arrow_may_read(raw: bytes) -> bool:
    """Whether pyarrow's JSON reader may be given ``raw``: UTF-8 (pyarrow takes other bytes into its
    strings, where json refuses them), without a backslash (no escapes: a string is what lies between a
    quote and the next, and a key is written one way only) and nested at most ``_ARROW_DEPTH`` deep."""
    if b"\\" in raw:
        return False
    utf8 = None if raw.isascii() else codecs.getincrementaldecoder("utf-8")()
    depth = quotes = 0
    for start in range(0, len(raw), _SCAN):
        part = raw[start:start + _SCAN]
        if utf8 is not None:
            try:
                utf8.decode(part, final=start + _SCAN >= len(raw))
            except UnicodeDecodeError:
                return False
        # The quotes and brackets, less each pair of quotes with nothing between (a string without
        # brackets): a bracket left counts where an even number of quotes lies before it (outside strings).
        marks = np.frombuffer(part.translate(None, _NOT_MARKS).replace(b'""', b""), dtype=np.uint8)
        steps = _STEPS[marks]
        quote = marks == ord('"')
        if quotes % 2 or quote.any():
            steps[(np.cumsum(quote) + quotes) % 2 == 1] = 0  # in a string (a quote's own step is 0)
            quotes += int(quote.sum())
        levels = depth + np.cumsum(steps)
        if len(levels) and (levels.max() > _ARROW_DEPTH or levels.min() < 0):
            return False
        depth = int(levels[-1]) if len(levels) else depth
    return True


def _parse_arrow(raw: bytes) -> tuple[dict[str, Any], Any] | None:
    """The index parsed by pyarrow's JSON reader: its header (format, version, shards; ``members`` an
    empty list) and its members as one struct array; ``None`` where it cannot (not a single JSON object,
    a member of another shape, values of mixed types, pyarrow missing) or may not (:func:`_arrow_may_read`)."""
    if not _arrow_may_read(raw):
        return None
    try:
        import pyarrow as pa
        import pyarrow.json as pj

        table = pj.read_json(pa.BufferReader(raw), read_options=pj.ReadOptions(block_size=len(raw) + 1),
                             parse_options=pj.ParseOptions(newlines_in_values=True))
        table.validate(full=True)  # pyarrow's reader makes lists that start with null longer than their values
    except Exception:  # noqa: BLE001 - whatever pyarrow refuses, json reads (and explains)
        return None
    if table.num_rows != 1 or not {"shards", "members"} <= set(table.column_names):
        return None
    members = table.column("members").combine_chunks()
    if not pa.types.is_list(members.type) or not pa.types.is_struct(members.type.value_type) or members.null_count:
        return None
    kept = ("format", "version", "shards", "classes")
    head = {name: table.column(name)[0].as_py() for name in kept
            if name in table.column_names}
    head["members"] = []
    return head, members.values


def _columns_arrow(url: str, members: Any, shards: Mapping[str, tuple[str, int]], raw: bytes) -> IndexColumns | None:
    """The members of a struct array (parsed from ``raw``) as columns, checked a column at a time as
    :func:`_member` checks each; ``None`` when a check fails or a column has a shape :mod:`json` reads
    otherwise (a field some members lack, or of values pyarrow converts: :func:`_as_json_reads`): the
    caller reads the index again with :mod:`json`, which names what is wrong."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = members.type
    names = {kind.field(i).name for i in range(kind.num_fields)}

    def child(name: str) -> Any:
        return members.field(name) if name in names else pa.nulls(len(members))

    if members.null_count or not {"member", "shard", "name", "offset", "size"} <= names:
        return None
    member, shard, name = child("member"), child("shard"), child("name")
    if any(not pa.types.is_string(c.type) or c.null_count for c in (member, shard, name)):
        return None
    if len(member) and not pc.min(pc.binary_length(member)).as_py() \
            or pc.any(pc.match_substring_regex(name, _OUTER_NAME)).as_py():
        return None
    offset, size = child("offset"), child("size")
    if any(not pa.types.is_int64(c.type) or c.null_count for c in (offset, size)):
        return None
    offsets, sizes = arrow_numbers(offset, np.int64), arrow_numbers(size, np.int64)
    encoded = pc.dictionary_encode(shard)
    code = {name: n for n, name in enumerate(shards)}
    known = np.array([code.get(s, -1) for s in encoded.dictionary.to_pylist()] + [-1], dtype=np.int32)
    shard_of = known[arrow_numbers(encoded.indices, np.int32)]
    duration = child("duration")
    if not any(test(duration.type) for test in (pa.types.is_floating, pa.types.is_integer, pa.types.is_null)):
        return None
    seconds = duration.cast(pa.float64(), safe=False)  # the nearest float, as json gives of an int beyond 2**53
    given = arrow_valid(seconds)
    durations = np.where(given, arrow_numbers(seconds, np.float64), math.nan)
    if not _fits(shards, shard_of, offsets, sizes, durations, given):
        return None
    label = child("label")
    if not (pa.types.is_string(label.type) or pa.types.is_null(label.type)):
        return None
    labels = pc.dictionary_encode(label.cast(pa.string()), null_encoding="encode")
    fields: dict[str, Column] = {}
    if "fields" in names and not pa.types.is_null(child("fields").type):
        struct = child("fields")
        if not pa.types.is_struct(struct.type) or struct.null_count:
            return None
        for i in range(struct.type.num_fields):
            values = struct.field(i)
            if values.null_count:  # a member without the field, or with null: json tells them apart
                return None
            if not _as_json_reads(values, struct.type.field(i).name, raw):
                return None
            fields[struct.type.field(i).name] = as_column(values)
    return IndexColumns(url=url, shards=tuple(path for path, _ in shards.values()), shard_of=shard_of,
                        members=Strings.from_arrow(member), names=Strings.from_arrow(name), offsets=offsets,
                        sizes=sizes, durations=durations,
                        labels=Coded(arrow_numbers(labels.indices, np.int32), labels.dictionary.to_pylist()),
                        fields=fields)


def _as_json_reads(values: Any, key: str, raw: bytes) -> bool:
    """Whether the column of field ``key`` as pyarrow parsed it from ``raw`` holds what :mod:`json` gives:
    strings, integers or booleans, or floats where ``raw`` writes no value of ``key`` as an integer
    (pyarrow reads a column of integers and floats, or an integer beyond 64 bits, as floats; json keeps
    an int an int). Not a date (pyarrow reads an ISO date as a timestamp), a list or an object (pyarrow
    gives each object every key some object of the column has)."""
    import pyarrow as pa

    kind = values.type
    if pa.types.is_string(kind) or pa.types.is_int64(kind) or pa.types.is_boolean(kind):
        return True
    if not pa.types.is_float64(kind):
        return False
    floats = arrow_numbers(values, np.float64)
    if not (floats == np.floor(floats)).any():  # no float that an integer could have been written as
        return True
    written_as_int = rb'"' + re.escape(key.encode("utf-8")) + rb'"\s*:\s*-?\d+\s*[,}]'  # raw has no escapes
    return re.search(written_as_int, raw) is None


def _fits(shards: Mapping[str, tuple[str, int]], shard_of: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
          durations: np.ndarray, given: np.ndarray) -> bool:
    """Whether the members' columns hold what :func:`_member` lets through: each one's shard known (-1: not),
    its bytes inside that shard, and each duration ``given`` a finite number >= 0 (not NaN or Infinity)."""
    if (shard_of < 0).any() or (offsets < 0).any() or (sizes < 0).any():
        return False
    if _past_shard_ends(offsets, sizes, shard_of, shards):
        return False
    return bool(np.isfinite(durations[given]).all() and (durations[given] >= 0).all())


def _past_shard_ends(offsets: np.ndarray, sizes: np.ndarray, shard_of: np.ndarray,
                     shards: Mapping[str, tuple[str, int]]) -> bool:
    """Whether some member's bytes end past its shard's size (``offsets``, ``sizes``: int64 >= 0), exactly."""
    limits = [size for _, size in shards.values()]
    capped = np.array([min(size, 2**63 - 1) for size in limits], dtype=np.int64)[shard_of]
    past = sizes > capped - offsets  # no overflow: every term is in [0, 2**63)
    return any(int(offsets[i]) + int(sizes[i]) > limits[shard_of[i]]  # a shard beyond int64 counts exactly
               for i in np.flatnonzero(past).tolist())


def _columns(url: str, rows: list[Any], shards: Mapping[str, tuple[str, int]]) -> IndexColumns | None:
    """The members parsed by :mod:`json` as columns, checked a column at a time as :func:`_member` checks
    each; ``None`` when a check fails (:func:`_member` then finds the member and says what is wrong)."""
    if any(type(row) is not dict for row in rows):
        return None
    members = [row.get("member") for row in rows]
    names = [row.get("name") for row in rows]
    if not _all_of(members, str) or not all(members) or not _all_of(names, str) \
            or not all(map(_is_inner_name, names)):
        return None
    code = {name: n for n, name in enumerate(shards)}
    try:
        shard_of = np.fromiter((code.get(row.get("shard"), -1) for row in rows), dtype=np.int32, count=len(rows))
    except TypeError:  # a shard value that cannot be looked up (a list)
        return None
    offset, size = [row.get("offset") for row in rows], [row.get("size") for row in rows]
    raw = [row.get("duration") for row in rows]
    if not _all_of(offset, int) or not _all_of(size, int) or not {type(d) for d in raw} <= {int, float, type(None)}:
        return None
    try:  # an int beyond int64 or beyond any float: _member names it
        offsets, sizes = np.array(offset, dtype=np.int64).reshape(-1), np.array(size, dtype=np.int64).reshape(-1)
        durations = np.array([math.nan if d is None else d for d in raw], dtype=np.float64).reshape(-1)
    except OverflowError:
        return None
    if not _fits(shards, shard_of, offsets, sizes, durations,
                 np.fromiter((d is not None for d in raw), dtype=bool, count=len(raw))):
        return None
    rows_fields = [row.get("fields") for row in rows]
    if not {type(f) for f in rows_fields} <= {dict, type(None)}:
        return None
    present = [f or {} for f in rows_fields]
    keys = list(dict.fromkeys(k for f in present if f for k in f))
    labels = [row.get("label") for row in rows]
    if not {type(label) for label in labels} <= _LABEL_TYPES:
        return None
    try:
        member_column, name_column = Strings.from_strings(members), Strings.from_strings(names)
    except UnicodeEncodeError:  # a lone surrogate, which no file name holds
        return None
    return IndexColumns(url=url, shards=tuple(path for path, _ in shards.values()), shard_of=shard_of,
                        members=member_column, names=name_column, offsets=offsets, sizes=sizes, durations=durations,
                        labels=Coded.encode(labels),
                        fields={key: as_column([f.get(key, ABSENT) for f in present]) for key in keys})


#: The types of a label json may give (a class name; numbers are names too).
_LABEL_TYPES = {str, int, float, bool, type(None)}


def _all_of(values: list[Any], kind: type) -> bool:
    """Whether every value is of type ``kind`` exactly (no bool for int)."""
    return all(type(v) is kind for v in values)


def _member(url: str, n: int, row: Any, shards: Mapping[str, tuple[str, int]]) -> Member:
    """Member ``n`` of the index at ``url``, every value checked; a :class:`SourceError` naming it otherwise."""
    if not isinstance(row, dict):
        raise SourceError(f"index {url!r} member {n} is malformed: expected a JSON object, got {short_repr(row)}")
    member = row.get("member")
    where = f"index {url!r} member {n} ({short_repr(member)})"

    def bad(problem: str) -> SourceError:
        return SourceError(f"{where} is malformed: {problem} (pack the source again, or mend the index)")

    if not isinstance(member, str) or not member or not _encodable(member):
        raise bad(f"member {short_repr(member)} is not a member name")
    shard = row.get("shard")
    if not isinstance(shard, str) or shard not in shards:
        raise bad(f"shard {short_repr(shard)} is not one of the index's shards")
    path, shard_size = shards[shard]
    name = row.get("name")
    problem = name_problem(name)
    if problem is not None or not isinstance(name, str):  # (the second for the type checker)
        raise bad(f"name {short_repr(name)} {problem}")
    offset, size = row.get("offset"), row.get("size")
    if not _is_count(offset):
        raise bad(f"offset {short_repr(offset)} is not an integer >= 0")
    if not _is_count(size):
        raise bad(f"size {short_repr(size)} is not an integer >= 0")
    if offset + size > shard_size:
        raise bad(f"bytes {offset}..{offset + size} lie outside its shard {shard!r} of {shard_size} bytes")
    duration = row.get("duration")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                 or not _finite(duration) or duration < 0):
        raise bad(f"duration {short_repr(duration)} is not a number of seconds >= 0 or null")
    fields = row.get("fields")
    if fields is not None and not isinstance(fields, dict):
        raise bad(f"fields {short_repr(fields)} is not a JSON object")
    label = row.get("label")
    if type(label) not in _LABEL_TYPES:
        raise bad(f"label {short_repr(label)} is not a string, a number or null")
    return Member(shard=path, member=member, name=name, offset=offset, size=size,
                  duration=None if duration is None else float(duration), label=label,
                  fields=fields or {})


def _finite(value: int | float) -> bool:
    """Whether ``value`` is a finite float, or an int a float can hold (``10**400`` is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _encodable(name: str) -> bool:
    """Whether ``name`` is text a file name can be (no lone surrogate but those of undecodable bytes)."""
    try:
        name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def name_problem(name: Any) -> str | None:
    """What is wrong with ``name`` as a member's original name in an index (``None``: nothing), in words
    that follow it: a relative path that stays below its shard, a file name."""
    if not isinstance(name, str) or not _is_inner_name(name):
        return "is not a relative path inside the shard"
    if not _encodable(name):
        return "is not a file name (it holds a lone surrogate)"
    return None


def _is_inner_name(name: str) -> bool:
    """Whether a member's original name is a relative path that stays below its shard (no root, no ``..``):
    it ends the member's ``path``, which label expressions and ``"parent"`` read."""
    return (bool(name) and not name.startswith(("/", "\\")) and "\0" not in name
            and ".." not in name.replace("\\", "/").split("/"))
