"""The index of packed shards (``index.json``): where every member's data sits, for ranged reads.

:func:`read_index` gives :class:`Member` records with the URL of the shard, and the offset and size
of the member's data in it, so a producer reads one member with one ranged request
(:meth:`Member.reader`, :func:`~audiobuffer.sources.storage.read_range`). :mod:`audiobuffer.sources`
re-exports the public names.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from .._checks import short_repr
from ..errors import SourceError
from . import storage
from .storage import RetrySpec

__all__ = ["INDEX_FORMAT", "INDEX_NAME", "INDEX_VERSION", "Member", "ShardIndex", "read_index", "shard_name"]

#: The index file :func:`~audiobuffer.sources.pack.pack` writes beside the shards.
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
        """A callable that reads this member's bytes with one ranged request (retried as ``retry`` says).

        It can be pickled, and it reads when called, not before: give it to a work item and the
        producer thread that decodes the item does the I/O.
        """
        return functools.partial(storage.read_range, self.shard, self.offset, self.size,
                                 storage_options=storage_options, retry=retry, member=self.member)


@dataclass(frozen=True)
class ShardIndex:
    """The index of a packed set of shards (:func:`read_index`).

    Attributes:
        url: where the index was read from.
        shards: the shards' paths or URLs, in order.
        members: every member, in packing order (shard by shard).
    """

    url: str
    shards: tuple[str, ...]
    members: tuple[Member, ...]

    def __len__(self) -> int:
        return len(self.members)

    def ranges(self) -> list[tuple[str, int, int]]:
        """``(shard URL, offset, size)`` of every member, in order: what a ranged read needs."""
        return [(m.shard, m.offset, m.size) for m in self.members]


def read_index(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
               retry: RetrySpec = None, allow_outside: bool = False) -> ShardIndex:
    """Read an ``index.json`` written by :func:`~audiobuffer.sources.pack.pack` from a path or URL.

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
    url = os.fspath(url)
    raw = storage.read_bytes(url, storage_options=storage_options, retry=retry)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"index {url!r} is not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise SourceError(f"index {url!r} is nested too deeply to be an index of shards") from exc
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
        raise SourceError(f"{url!r} is not an index of audiobuffer shards (no \"format\": \"{INDEX_FORMAT}\")")
    if data.get("version") != INDEX_VERSION:
        raise SourceError(f"index {url!r} has version {data.get('version')!r}; this audiobuffer reads "
                          f"version {INDEX_VERSION} (pack the source again)")
    entries, rows = data.get("shards"), data.get("members")
    if not isinstance(entries, list) or not isinstance(rows, list):
        raise SourceError(f"index {url!r} is malformed: \"shards\" and \"members\" must be lists")
    resolve = functools.partial(storage.sibling if allow_outside else storage.inside_folder, url)
    shards: dict[str, tuple[str, int]] = {}  # name in the index -> (path or URL, size)
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
    members = tuple(_member(url, n, row, shards) for n, row in enumerate(rows))
    return ShardIndex(url=url, shards=tuple(path for path, _ in shards.values()), members=members)


def _member(url: str, n: int, row: Any, shards: Mapping[str, tuple[str, int]]) -> Member:
    """Member ``n`` of the index at ``url``, every value checked; a :class:`SourceError` naming it otherwise."""
    if not isinstance(row, dict):
        raise SourceError(f"index {url!r} member {n} is malformed: expected a JSON object, got {short_repr(row)}")
    member = row.get("member")
    where = f"index {url!r} member {n} ({short_repr(member)})"

    def bad(problem: str) -> SourceError:
        return SourceError(f"{where} is malformed: {problem} (pack the source again, or mend the index)")

    if not isinstance(member, str) or not member:
        raise bad(f"member {short_repr(member)} is not a member name")
    shard = row.get("shard")
    if not isinstance(shard, str) or shard not in shards:
        raise bad(f"shard {short_repr(shard)} is not one of the index's shards")
    path, shard_size = shards[shard]
    name = row.get("name")
    if not isinstance(name, str) or not _is_inner_name(name):
        raise bad(f"name {short_repr(name)} is not a relative path inside the shard")
    offset, size = row.get("offset"), row.get("size")
    if not _is_count(offset):
        raise bad(f"offset {short_repr(offset)} is not an integer >= 0")
    if not _is_count(size):
        raise bad(f"size {short_repr(size)} is not an integer >= 0")
    if offset + size > shard_size:
        raise bad(f"bytes {offset}..{offset + size} lie outside its shard {shard!r} of {shard_size} bytes")
    duration = row.get("duration")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                 or not math.isfinite(duration) or duration < 0):
        raise bad(f"duration {short_repr(duration)} is not a number of seconds >= 0 or null")
    fields = row.get("fields")
    if fields is not None and not isinstance(fields, dict):
        raise bad(f"fields {short_repr(fields)} is not a JSON object")
    return Member(shard=path, member=member, name=name, offset=offset, size=size,
                  duration=None if duration is None else float(duration), label=row.get("label"),
                  fields=fields or {})


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_inner_name(name: str) -> bool:
    """Whether a member's original name is a relative path that stays below its shard (no root, no ``..``):
    it ends the member's ``path``, which label expressions and ``"parent"`` read."""
    return (bool(name) and not name.startswith(("/", "\\")) and "\0" not in name
            and ".." not in name.replace("\\", "/").split("/"))
