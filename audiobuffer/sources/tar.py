"""Reading tar shards from start to end, WebDataset's way: samples grouped by key, a shuffle buffer.

:func:`iter_shard` reads one shard (any WebDataset shard; no index needed) and yields a
:class:`ShardSample` per key; :func:`stream_shards` chains shards through a seeded shuffle buffer
(:func:`shuffle_buffer`, WebDataset's ``shuffle(n)``). A truncated shard yields the members before the
cut, then raises a :class:`~audiobuffer.DecodeError` naming the shard and the member that was cut.
"""

from __future__ import annotations

import json
import math
import os
import re
import tarfile
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

import numpy as np

from ..errors import DecodeError
from .formats.tarheader import ENCODING, ERRORS, parse_header
from .storage import STREAM_BLOCK, RetrySpec, Storage

__all__ = [
    "MEMBER_STRIDE",
    "SHUFFLE_BUFFER",
    "ShardSample",
    "Truncated",
    "is_packed_sidecar",
    "iter_shard",
    "packed_class_order",
    "member_value",
    "sample_fields",
    "shard_samples",
    "shuffle_buffer",
    "split_key",
    "stream_shards",
]

#: Samples in each producer's shuffle buffer when a streamed epoch is shuffled.
SHUFFLE_BUFFER = 100
#: A streamed sample's index is its shard's number times this, plus its position in the shard.
MEMBER_STRIDE = 1 << 32

_BLOCK = tarfile.BLOCKSIZE
# Extensions of a WebDataset sample that hold metadata, not the sample's main file, by the last part of
# the extension ("speaker.txt" is metadata too).
_META_EXTENSIONS = frozenset({"json", "cls", "cls2", "txt", "text", "id", "index", "yaml", "yml"})

T = TypeVar("T")


@dataclass(frozen=True)
class ShardSample:
    """One sample streamed from a shard: its files grouped by key.

    Attributes:
        shard: the path or URL of the shard.
        key: the sample's key (member names up to the first dot of the base name).
        files: every file of the sample, by extension (``{"wav": b"...", "json": b"..."}``).
        member: the member name of the main file: the first that is not metadata (json, cls,
            txt...) and has a plain extension (``jpg``, not ``depth.png``), else the first that
            is not metadata.
        name: the original file name from the JSON sidecar's ``"name"`` (which
            :func:`~audiobuffer.prepare.pack.pack` writes), or ``member``.
        data: the main file's bytes.
        meta: the JSON sidecar, parsed, or ``None`` without one.
        fields: the sample's fields (see :func:`sample_fields`).
        label: the label the sidecar of a packed shard records, or ``None``.
        offset: where the main file's data starts in the shard, in bytes.
    """

    shard: str
    key: str
    files: Mapping[str, bytes]
    member: str
    name: str
    data: bytes
    meta: Mapping[str, Any] | None
    fields: Mapping[str, Any]
    label: Any = None
    offset: int = 0

    @property
    def path(self) -> str:
        """``<shard>/<name>``: names the shard and ends with the original file name."""
        return f"{self.shard}/{self.name}"


def iter_shard(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
               retry: RetrySpec = None,
               block_size: int = STREAM_BLOCK) -> Generator[ShardSample, None, None]:
    """The samples of one tar shard, read from start to end (any WebDataset shard; no index needed).

    Members are grouped into samples by key, WebDataset's way: consecutive members whose names agree
    up to the first dot of the base name. Directories, links and other non-file members are skipped.
    A sample with one extension twice (``k.wav k.cls k.wav k.cls``) is an error, as in WebDataset.

    Raises:
        StorageError: the shard is missing or forbidden, or a block still failing after the retries.
        DecodeError: the shard is truncated (after yielding every whole sample before the cut), holds
            a malformed header or a key twice in a row; the message names the shard and the member.
    """
    yield from shard_samples(url, storage=Storage.of(storage_options, retry), block_size=block_size)


def shard_samples(url: str | os.PathLike[str], *, storage: Storage,
                  block_size: int = STREAM_BLOCK) -> Generator[ShardSample, None, None]:
    """:func:`iter_shard` read through ``storage`` (what a source that holds one reads with)."""
    url = os.fspath(url)
    with storage.open_stream(url, block_size=block_size) as stream:
        key = ""
        dotted = False  # whether this shard's keys hold dots (see split_key)
        group: list[_Member] = []
        try:
            for name, payload, offset in _tar_members(stream, url):
                this = split_key(name, dotted=dotted)[0]
                if group and this == key and not dotted and _keys_have_dots(group, name):
                    dotted = True
                    yield from (_sample(url, k, g, dotted=True) for k, g in _regroup(group))
                    group = []
                    this = split_key(name, dotted=True)[0]
                elif group and this != key:
                    yield _sample(url, key, group, dotted=dotted)
                    group = []
                key = this
                group.append((name, payload, offset))
        except Truncated as exc:
            if group and exc.member is not None and split_key(exc.member, dotted=dotted)[0] != key:
                yield _sample(url, key, group, dotted=dotted)  # the cut is in the next sample: this one is whole
            raise
        if group:
            yield _sample(url, key, group, dotted=dotted)


_Member = tuple[str, bytes, int]  # a member's name, data, and the offset of its data in the shard


def _keys_have_dots(group: list[_Member], name: str) -> bool:
    """Whether ``name`` joining ``group`` (one key by WebDataset's rule) shows that the keys hold dots.

    That is when its last extension is already in the group (``utt.000.wav`` then ``utt.001.wav``) and
    every member's base name has two dots or more, so that each keeps an extension and a dotted key.
    """
    last = name.rpartition(".")[2]
    if last not in {m[0].rpartition(".")[2] for m in group}:
        return False
    return all(n.rpartition("/")[2].count(".") >= 2 for n in (*(m[0] for m in group), name))


def _regroup(group: list[_Member]) -> list[tuple[str, list[_Member]]]:
    """``group``'s members regrouped by their dotted keys, in order."""
    out: list[tuple[str, list[_Member]]] = []
    for member in group:
        key = split_key(member[0], dotted=True)[0]
        if out and out[-1][0] == key:
            out[-1][1].append(member)
        else:
            out.append((key, [member]))
    return out


def stream_shards(urls: Iterable[str], *, shuffle: int = 0, seed: int | Sequence[int] = 0,
                  storage_options: Mapping[str, Any] | None = None, retry: RetrySpec = None
                  ) -> Iterator[ShardSample]:
    """The samples of ``urls``' shards, shard after shard, through a shuffle buffer of ``shuffle`` samples.

    Every sample comes exactly once. With ``shuffle`` > 1 the order is WebDataset's
    ``shuffle(shuffle)``: a seeded buffer mixes samples within a window of about ``shuffle``
    samples (across shard boundaries); the same ``seed`` (an integer, or integers such as
    ``(seed, epoch, rank)``) gives the same order. Pick the order of the shards (per epoch, rank and
    worker) before calling this.
    """
    storage = Storage.of(storage_options, retry)
    samples = (s for url in urls for s in shard_samples(url, storage=storage))
    if shuffle > 1:
        return shuffle_buffer(samples, shuffle, np.random.default_rng(seed))
    return samples


def shuffle_buffer(items: Iterable[T], size: int, rng: np.random.Generator) -> Iterator[T]:
    """``items`` in a random order drawn within a window of ``size`` (WebDataset's shuffle buffer).

    The buffer fills to ``size``; then each new item takes the place of one drawn at random, which
    is yielded. What is left at the end comes out in random order. Every item comes out once.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"shuffle buffer size must be an integer >= 1, got {size!r}")
    buffer: list[T] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        k = int(rng.integers(len(buffer)))
        out, buffer[k] = buffer[k], item
        yield out
    rng.shuffle(buffer)
    yield from buffer


def split_key(name: str, *, dotted: bool = False) -> tuple[str, str]:
    """A member name's key and extension: WebDataset's split at the first dot of the base name.

    With ``dotted``, for shards whose keys hold dots (``utt.000.wav``, as ``webdataset.ShardWriter``
    writes a key ``"utt.000"``), the split is at the last dot instead. :func:`iter_shard` switches to
    that when a shard shows it: two members of one WebDataset key with the same last extension, every
    member's base name holding two dots or more.
    """
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.rpartition(".") if dotted else base.partition(".")
    if dotted and "." not in base:
        stem, ext = base, ""
    return (f"{folder}/{stem}" if folder else stem), ext


def _sample(shard: str, key: str, group: list[_Member], *, dotted: bool) -> ShardSample:
    files = {}
    main = derived = None
    for name, payload, offset in group:
        ext = split_key(name, dotted=dotted)[1]
        if ext in files:  # one sample's file twice: two samples under one key, or a member written twice
            raise DecodeError(f"shard {shard!r} holds key {key!r} twice in a row (member {name!r} comes again "
                              f"before another key): each sample needs a key of its own; write the shard "
                              f"again with unique keys (webdataset refuses it too: duplicate file name)",
                              path=f"{shard}/{name}")
        files[ext] = payload
        if ext.rpartition(".")[2].lower() in _META_EXTENSIONS:
            continue
        # A plain extension ("jpg") names the sample's own file, a dotted one ("depth.png") one
        # derived from it, whatever their order (webdataset writes a sample's members sorted).
        if main is None and "." not in ext:
            main = (name, payload, offset)
        elif derived is None and "." in ext:
            derived = (name, payload, offset)
    main = main or derived or group[0]
    meta = None
    if "json" in files:
        try:
            meta = json.loads(files["json"])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DecodeError(f"member {key + '.json'!r} of shard {shard!r} is not valid JSON ({exc})",
                              path=f"{shard}/{key}.json") from exc
        except RecursionError as exc:
            raise DecodeError(f"member {key + '.json'!r} of shard {shard!r} is nested too deeply to be a sidecar",
                              path=f"{shard}/{key}.json") from exc
    meta = meta if isinstance(meta, dict) else None
    original = meta.get("name") if meta is not None else None
    name = original if isinstance(original, str) and original else main[0]
    fields, label = sample_fields(files, split_key(main[0], dotted=dotted)[1], meta)
    return ShardSample(shard=shard, key=key, files=files, member=main[0], name=name, data=main[1],
                       meta=meta, fields=fields, label=label, offset=main[2])


def is_packed_sidecar(meta: Mapping[str, Any] | None) -> bool:
    """Whether ``meta`` is the sidecar :func:`~audiobuffer.prepare.pack.pack` writes (name, label,
    fields)."""
    return meta is not None and isinstance(meta.get("name"), str) and isinstance(meta.get("fields"), Mapping)


def packed_class_order(metas: Iterable[Mapping[str, Any] | None]) -> list[str] | None:
    """The label names in the order packed sidecars number them (each sidecar's ``label`` and
    ``label_index``: the class order of the source :func:`~audiobuffer.prepare.pack.pack` read), or
    ``None`` where a labelled sample is not packed or has no number, or names and numbers disagree
    (shards of several packs)."""
    by_number: dict[int, str] = {}
    by_name: dict[str, int] = {}
    for meta in metas:
        if meta is None or not is_packed_sidecar(meta):
            return None
        if meta.get("label") is None:
            continue
        name, number = str(meta["label"]), meta.get("label_index")
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            return None
        if by_name.setdefault(name, number) != number or by_number.setdefault(number, name) != name:
            return None
    return [by_number[n] for n in sorted(by_number)] if by_number else None


def sample_fields(files: Mapping[str, bytes], main: str, meta: Mapping[str, Any] | None
                  ) -> tuple[dict[str, Any], Any]:
    """A streamed sample's fields and packed label, from its members other than the main file ``main``.

    A shard that :func:`~audiobuffer.prepare.pack.pack` wrote gives the manifest fields its sidecar
    records and the sidecar's label, the same as reading it by index. Any other WebDataset sample gives
    every top-level key of its ``.json`` member, and every other member by its extension (``cls``,
    ``txt``, ``index``, ``speaker.txt``...): text as text, a number as a number, bytes that are not
    UTF-8 as bytes. A member's extension wins over a JSON key of the same name.
    """
    if is_packed_sidecar(meta):
        assert meta is not None
        return dict(meta["fields"]), meta.get("label")
    fields: dict[str, Any] = dict(meta) if meta is not None else {}
    for ext, payload in files.items():
        if ext != main and ext != "json":
            fields[ext] = member_value(payload)
    return fields, None


_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")


def member_value(payload: bytes) -> str | int | float | bytes:
    """A metadata member's value: its UTF-8 text stripped, a number where the text is one, else the bytes."""
    try:
        text = payload.decode("utf-8").strip()
    except UnicodeDecodeError:
        return payload
    if _INTEGER.fullmatch(text):
        return int(text)
    if _DECIMAL.fullmatch(text):
        number = float(text)
        if math.isfinite(number):
            return number
    return text


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    parts = []
    while n > 0:
        chunk = stream.read(n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


class Truncated(DecodeError):
    """A shard that ends early; ``member`` is the member cut, or ``None`` when the cut is between members."""

    def __init__(self, shard: str, member: str | None, detail: str) -> None:
        super().__init__(f"shard {shard!r} is truncated: {detail}; the samples before the cut were read, "
                         f"the rest of the shard is lost", path=f"{shard}/{member}" if member else shard)
        self.member = member


def _tar_members(stream: BinaryIO, shard: str) -> Iterator[_Member]:
    """``(name, data, offset of the data)`` of every regular file of a tar read sequentially from ``stream``.

    Unlike ``tarfile`` in stream mode, which takes a header cut short for the end of the archive,
    this insists on the end-of-archive marker (a zero block) and reports a cut as truncation.
    """
    long_name: str | None = None
    pax: dict[str, str] = {}
    last: str | None = None
    position = 0  # bytes read so far
    while True:
        header = _read_exact(stream, _BLOCK)
        position += len(header)
        if not header:
            raise Truncated(shard, None, f"it ends after member {last!r} without the end-of-archive marker"
                             if last else "it holds no member and no end-of-archive marker")
        if len(header) < _BLOCK:
            raise Truncated(shard, None, f"it ends inside the header after member {last!r} "
                             f"({len(header)} of {_BLOCK} bytes)")
        if header == bytes(_BLOCK):
            return  # the end-of-archive marker
        parsed = parse_header(header)
        if parsed is None:  # what the fast path leaves to tarfile: base-256 numbers, odd checksums, errors
            try:
                info = tarfile.TarInfo.frombuf(header, ENCODING, ERRORS)
            except tarfile.HeaderError as exc:
                raise DecodeError(f"shard {shard!r} has a malformed tar header after member {last!r} ({exc})",
                                  path=shard) from exc
            parsed = info.name, info.size, info.type
        header_name, size, kind = parsed
        name = pax.get("path") or long_name or header_name
        size = int(pax["size"]) if "size" in pax else size
        padded = -(-size // _BLOCK) * _BLOCK
        payload = _read_exact(stream, padded)
        offset, position = position, position + len(payload)
        if len(payload) < padded:
            if kind in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME):
                raise Truncated(shard, None, f"it ends inside an extended header after member {last!r}")
            raise Truncated(shard, name, f"it ends inside member {name!r} ({min(len(payload), size)} of "
                             f"its {size} bytes)")
        data = payload[:size]
        if kind == tarfile.GNUTYPE_LONGNAME:
            long_name = data.rstrip(b"\0").decode(ENCODING, ERRORS)
            continue
        if kind == tarfile.XHDTYPE:
            pax = _pax_records(data, shard)
            continue
        if kind == tarfile.XGLTYPE:
            continue
        long_name, pax = None, {}
        last = name
        if kind in tarfile.REGULAR_TYPES and not (kind == tarfile.AREGTYPE and name.endswith("/")):
            yield name, data, offset


def _pax_records(data: bytes, shard: str) -> dict[str, str]:
    """The ``path`` and ``size`` records of a PAX extended header (``"<len> <key>=<value>\\n"`` each)."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError as exc:
            raise DecodeError(f"shard {shard!r} has a malformed PAX header ({exc})", path=shard) from exc
        if length <= 0 or space < 0:
            raise DecodeError(f"shard {shard!r} has a malformed PAX header", path=shard)
        record = data[space + 1:pos + length - 1]
        key, _, value = record.partition(b"=")
        if key in (b"path", b"size"):
            records[key.decode()] = value.decode(ENCODING, ERRORS)
        pos += length
    return records
