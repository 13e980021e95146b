"""The index of packed shards (``index.json``): where every member's data sits, for ranged reads.

:func:`read_index` gives :class:`Member` records with the URL of the shard, and the offset and size
of the member's data in it, so a producer reads one member with one ranged request
(:meth:`Member.reader`, :func:`~audiobuffer.storage.read_range`). :mod:`audiobuffer.shards`
re-exports the public names.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import storage
from .errors import SourceError
from .storage import RetrySpec

__all__ = ["INDEX_FORMAT", "INDEX_NAME", "INDEX_VERSION", "Member", "ShardIndex", "read_index", "shard_name"]

#: The index file :func:`pack` writes beside the shards.
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
               retry: RetrySpec = None) -> ShardIndex:
    """Read an ``index.json`` written by :func:`pack` from a path or URL.

    Shard names in the index are relative to the index's folder: the result holds their full paths
    or URLs (so ``s3://bucket/fsdd/index.json`` gives shards under ``s3://bucket/fsdd/``).

    Raises:
        StorageError: the index cannot be read.
        SourceError: it is not an index (malformed JSON, another format, a member that names no shard).
    """
    url = os.fspath(url)
    raw = storage.read_bytes(url, storage_options=storage_options, retry=retry)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"index {url!r} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
        raise SourceError(f"{url!r} is not an index of audiobuffer shards (no \"format\": \"{INDEX_FORMAT}\")")
    if data.get("version") != INDEX_VERSION:
        raise SourceError(f"index {url!r} has version {data.get('version')!r}; this audiobuffer reads "
                          f"version {INDEX_VERSION} (pack the source again)")
    try:
        names = [entry["name"] for entry in data["shards"]]
        shards = {name: storage.sibling(url, name) for name in names}
        members = tuple(
            Member(shard=shards[m["shard"]], member=m["member"], name=m["name"], offset=int(m["offset"]),
                   size=int(m["size"]), duration=m.get("duration"), label=m.get("label"),
                   fields=m.get("fields") or {})
            for m in data["members"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SourceError(f"index {url!r} is malformed: {type(exc).__name__}: {exc}") from exc
    return ShardIndex(url=url, shards=tuple(shards[n] for n in names), members=members)

