"""Tar shards in WebDataset's layout: packing a source into them, and reading them back.

Layout (what :func:`pack` writes)::

    OUT/shard-000000.tar   <key>.<ext> (the original file, byte for byte) and <key>.json, per sample
    OUT/shard-000001.tar   ...
    OUT/index.json         every member: shard, member name, offset and size of its data, duration, label

A sample's ``<key>`` is its path relative to the source's folder, without the extension, with ``/``
made ``__`` and dots made ``_`` (WebDataset splits a member's name at the first dot of its base name
into key and extension); a key already taken gets ``-1``, ``-2``... The ``<key>.json`` sidecar holds
``{"name": the original relative path, "label": the label name or null, "duration": seconds or null,
"fields": the manifest's other columns}``. Packing the same source twice gives the same bytes: the
input order is the source's (sorted for a folder), every tar header has mtime 0, uid and gid 0, no
user or group name and mode 0644.

Reading, two ways:

* **By index** (random access): :func:`read_index` gives :class:`Member` records with the URL of
  the shard, and the offset and size of the member's data in it, so a producer reads one member with
  one ranged request (:meth:`Member.reader`, :func:`~audiobuffer.storage.read_range`); the epoch can
  shuffle across every member of every shard.
* **Streaming** (no index needed, any WebDataset shard): :func:`iter_shard` reads one shard from start
  to end and yields a :class:`ShardSample` per key (its files grouped, WebDataset's rule: consecutive
  members with the same key); :func:`stream_shards` chains shards in order through a seeded shuffle
  buffer (:func:`shuffle_buffer`, WebDataset's ``shuffle(n)``). A truncated shard yields the members
  before the cut, then raises a :class:`~audiobuffer.DecodeError` naming the shard and the member
  that was cut.

The path of a sample (:attr:`Member.path`, :attr:`ShardSample.path`) is ``<shard URL>/<original
relative path>``: it names the shard and ends with the original file name, so label expressions
and ``"parent"`` labels apply as they did to the original files.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import numpy as np

from . import storage
from .errors import DecodeError, SourceError, StorageError
from .storage import RetrySpec

if TYPE_CHECKING:  # sources.py may import this module to read shards: no import cycle at run time
    from .sources import LabelSpec, SourceSpec

__all__ = [
    "INDEX_NAME",
    "Member",
    "ShardIndex",
    "ShardSample",
    "iter_shard",
    "pack",
    "read_index",
    "shard_name",
    "shuffle_buffer",
    "stream_shards",
]

#: The index file :func:`pack` writes beside the shards.
INDEX_NAME = "index.json"
INDEX_FORMAT = "audiobuffer-shards"
INDEX_VERSION = 1
_SHARD_GLOB = "shard-*.tar"
_PARTIAL = ".partial"
_BLOCK = tarfile.BLOCKSIZE
_ENCODING, _ERRORS = "utf-8", "surrogateescape"
# Extensions of a WebDataset sample that hold metadata, not the sample's main file.
_META_EXTENSIONS = frozenset({"json", "cls", "cls2", "txt", "id", "index"})
_UNSAFE_KEY = re.compile(r"[^\w\-]+")
_UNKNOWN_FRAMES = 2**62

T = TypeVar("T")


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


# -- packing -------------------------------------------------------------------------------------

def pack(source: SourceSpec, out_dir: str | os.PathLike[str], *, shard_size: int,
         labels: LabelSpec = None, patterns: Sequence[str] | None = None, path_column: str = "path",
         overwrite: bool = False, progress: bool = True,
         storage_options: Mapping[str, Any] | None = None) -> ShardIndex:
    """Pack the files of a source into tar shards of at most ``shard_size`` bytes, and an index.

    Args:
        source: what :class:`~audiobuffer.Source` takes: a folder, a manifest, a list of files.
        out_dir: the local folder to write ``shard-NNNNNN.tar`` and ``index.json`` into; made if missing.
        shard_size: the most bytes a shard holds (a sample larger than that gets a shard of its own).
        labels: the source's labels (as :class:`~audiobuffer.Source` takes them); their names go
            into each sample's JSON sidecar and the index.
        patterns: glob patterns of a folder source (``None``: :data:`~audiobuffer.AUDIO_PATTERNS`).
        path_column: a manifest's path column.
        overwrite: replace the shards and index already in ``out_dir`` (other files there are kept);
            without it a folder that is not empty is an error.
        progress: show a progress bar (tqdm) on stderr.
        storage_options: fsspec options for a source of URLs.

    Returns:
        The :class:`ShardIndex` of what was written.

    Raises:
        StorageError: ``out_dir`` is not empty (without ``overwrite``) or not a folder, or a file
            cannot be read.
        SourceError: the source cannot be listed.

    Example:
        >>> pack("data/fsdd/recordings", "packed", shard_size=256 * 10**6, labels=r"^(\\d+)_")  # doctest: +SKIP
    """
    if isinstance(shard_size, bool) or not isinstance(shard_size, int):
        raise TypeError(f"shard_size must be an integer number of bytes >= 1, got {shard_size!r}")
    if shard_size < 1:
        raise ValueError(f"shard_size must be an integer number of bytes >= 1, got {shard_size!r}")
    if storage.is_url(os.fspath(out_dir)):
        raise ValueError(f"out_dir must be a local folder, got the URL {os.fspath(out_dir)!r}; pack "
                         f"locally, then upload the folder (aws s3 sync, gsutil rsync, fsspec put)")
    from .sources import AUDIO_PATTERNS, Source

    out = Path(out_dir)
    src = Source(source, patterns=AUDIO_PATTERNS if patterns is None else patterns, labels=labels,
                 path_column=path_column)
    names = _relative_names(source, src.paths)
    keys = _unique_keys(names)
    _prepare_out(out, overwrite)
    writer = _ShardWriter(out, shard_size)
    from tqdm import tqdm

    try:
        with tqdm(total=len(src), unit="file", desc="pack", disable=not progress) as bar:
            for i, path in enumerate(src.paths):
                data = storage.read_bytes(path, storage_options=storage_options)
                ext = PurePosixPath(names[i]).suffix.lower().lstrip(".") or "bin"
                label = src.label_names[i] if src.label_names else None
                fields = src.fields[i] if src.fields is not None else {}
                duration = _duration(ext, data)
                sidecar = {"name": names[i], "label": label, "duration": duration, "fields": fields}
                writer.add(keys[i], ext, data, sidecar)
                bar.update(1)
        writer.finish()
    except BaseException:
        writer.abandon()  # no half-written shard is left behind; the finished ones stay, without an index
        raise
    index_path = out / INDEX_NAME
    _write_index(index_path, writer.shards, writer.members)
    return read_index(index_path)


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise StorageError(f"output folder {str(out)!r} is a file; pick a folder", url=str(out))
    if out.is_dir():
        entries = sorted(p.name for p in out.iterdir())
        if entries and not overwrite:
            raise StorageError(
                f"output folder {str(out)!r} is not empty ({len(entries)} entries, e.g. {entries[0]!r}); "
                f"pick an empty or new folder, or pass overwrite=True (--overwrite) to replace its "
                f"shards and index", url=str(out))
        for pattern in (_SHARD_GLOB, _SHARD_GLOB + _PARTIAL, INDEX_NAME, INDEX_NAME + _PARTIAL):
            for old in out.glob(pattern):
                old.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _relative_names(spec: SourceSpec, paths: list[str]) -> list[str]:
    """Each path relative to the source's folder (a folder source) or to the files' common folder."""
    if isinstance(spec, (str, os.PathLike)) and not storage.is_url(os.fspath(spec)) and Path(spec).is_dir():
        root = os.path.abspath(os.fspath(spec))
        return [Path(os.path.relpath(os.path.abspath(p), root)).as_posix() for p in paths]
    if all(storage.is_url(p) for p in paths):
        parents = [p.rsplit("/", 1)[0] for p in paths]
        common = os.path.commonprefix([p + "/" for p in parents])
        common = common[:common.rfind("/") + 1]
        return [p[len(common):] for p in paths]
    local = [os.path.abspath(p) for p in paths]
    try:
        root = os.path.commonpath([os.path.dirname(p) for p in local])
    except ValueError:  # different drives on Windows
        return [Path(p).name for p in paths]
    return [Path(os.path.relpath(p, root)).as_posix() for p in local]


def _unique_keys(names: list[str]) -> list[str]:
    taken: set[str] = set()
    keys = []
    for name in names:
        stem = str(PurePosixPath(name).with_suffix("")) if PurePosixPath(name).suffix else name
        base = _UNSAFE_KEY.sub("_", stem.replace("/", "__")) or "sample"
        key, n = base, 0
        while key in taken:
            n += 1
            key = f"{base}-{n}"
        taken.add(key)
        keys.append(key)
    return keys


def _duration(ext: str, data: bytes) -> float | None:
    """Seconds of audio from the header of ``data``, or ``None`` (not audio, no frame count)."""
    from .decoders import _wav

    if ext in ("wav", "wave"):
        info = _wav.read_wav_info(data)
        if info is not None:
            return info.frames / info.samplerate if info.samplerate else None
    try:
        import soundfile

        info = soundfile.info(io.BytesIO(data))
    except Exception:  # not audio libsndfile reads: no duration
        return None
    if not 0 < info.frames < _UNKNOWN_FRAMES or info.samplerate <= 0:
        return None
    return info.frames / info.samplerate


class _ShardWriter:
    """Writes samples into ``shard-NNNNNN.tar`` files of at most ``shard_size`` bytes each."""

    def __init__(self, out: Path, shard_size: int) -> None:
        self.out = out
        self.shard_size = shard_size
        self.shards: list[dict[str, Any]] = []  # {"name", "size", "members"} of every finished shard
        self.members: list[dict[str, Any]] = []  # index entries of every finished shard
        self._tar: tarfile.TarFile | None = None
        self._pending: list[dict[str, Any]] = []  # index entries of the open shard, offsets to come
        self._bytes = 0

    def add(self, key: str, ext: str, data: bytes, sidecar: dict[str, Any]) -> None:
        meta = json.dumps(sidecar, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        member = f"{key}.{ext}"
        infos = [(_tar_info(member, len(data)), data), (_tar_info(f"{key}.json", len(meta)), meta)]
        need = sum(_member_bytes(info) for info, _ in infos)
        if self._tar is not None and _shard_bytes(self._bytes + need) > self.shard_size:
            self._close()
        tar = self._tar if self._tar is not None else self._open()
        for info, payload in infos:
            tar.addfile(info, io.BytesIO(payload))
        self._bytes += need
        entry = {"shard": shard_name(len(self.shards)), "member": member, "name": sidecar["name"],
                 "size": len(data), "duration": sidecar["duration"], "label": sidecar["label"],
                 "fields": sidecar["fields"]}
        self._pending.append(entry)

    def finish(self) -> None:
        if self._tar is not None:
            self._close()

    def abandon(self) -> None:
        """Close and delete the shard being written."""
        if self._tar is not None:
            self._tar.close()
            self._tar = None
            (self.out / (shard_name(len(self.shards)) + _PARTIAL)).unlink(missing_ok=True)

    def _open(self) -> tarfile.TarFile:
        path = self.out / (shard_name(len(self.shards)) + _PARTIAL)
        self._tar = tarfile.open(path, "w", format=tarfile.PAX_FORMAT, encoding=_ENCODING, errors=_ERRORS)
        self._bytes = 0
        return self._tar

    def _close(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        self._tar = None
        name = shard_name(len(self.shards))
        partial = self.out / (name + _PARTIAL)
        # offsets as a tar reader sees them
        with tarfile.open(partial, "r:", encoding=_ENCODING, errors=_ERRORS) as tar:
            offsets = {info.name: info.offset_data for info in tar}
        for entry in self._pending:
            entry["offset"] = offsets[entry["member"]]
        self.members.extend(self._pending)
        self.shards.append({"name": name, "size": partial.stat().st_size, "members": len(self._pending)})
        self._pending = []
        os.replace(partial, self.out / name)


def _member_bytes(info: tarfile.TarInfo) -> int:
    """Bytes a member takes in a tar: its headers (with a PAX header for a long or non-ASCII name), its data."""
    header = len(info.tobuf(tarfile.PAX_FORMAT, _ENCODING, _ERRORS))
    return header + -(-info.size // _BLOCK) * _BLOCK


def _shard_bytes(members: int) -> int:
    """The size of a tar file whose members take ``members`` bytes: the end marker, padded to a record."""
    return -(-(members + 2 * _BLOCK) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def _write_index(path: Path, shards: list[dict[str, Any]], members: list[dict[str, Any]]) -> None:
    def line(obj: Any) -> str:
        return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))

    text = "".join([
        "{\n",
        f'"format": {line(INDEX_FORMAT)},\n"version": {INDEX_VERSION},\n',
        '"shards": [\n', ",\n".join(line(s) for s in shards), "\n],\n",
        '"members": [\n', ",\n".join(line(m) for m in members), "\n]\n}\n",
    ])
    partial = path.with_name(path.name + _PARTIAL)
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)  # the index appears last, whole: its presence means the pack finished


# -- streaming -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShardSample:
    """One sample streamed from a shard: its files grouped by key.

    Attributes:
        shard: the path or URL of the shard.
        key: the sample's key (member names up to the first dot of the base name).
        files: every file of the sample, by extension (``{"wav": b"...", "json": b"..."}``).
        member: the member name of the main file (the first that is not metadata: json, cls, txt...).
        name: the original file name from the JSON sidecar's ``"name"`` (:func:`pack` writes it), or
            ``member``.
        data: the main file's bytes.
        meta: the JSON sidecar, parsed, or ``None`` without one.
    """

    shard: str
    key: str
    files: Mapping[str, bytes]
    member: str
    name: str
    data: bytes
    meta: Mapping[str, Any] | None

    @property
    def path(self) -> str:
        """``<shard>/<name>``: names the shard and ends with the original file name."""
        return f"{self.shard}/{self.name}"


def iter_shard(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
               retry: RetrySpec = None, block_size: int = storage.STREAM_BLOCK) -> Iterator[ShardSample]:
    """The samples of one tar shard, read from start to end (any WebDataset shard; no index needed).

    Members are grouped into samples by key, WebDataset's way: consecutive members whose names agree
    up to the first dot of the base name. Directories, links and other non-file members are skipped.

    Raises:
        StorageError: the shard is missing or forbidden, or a block still failing after the retries.
        DecodeError: the shard is truncated (after yielding every whole sample before the cut) or
            holds a malformed header; the message names the shard and the member.
    """
    url = os.fspath(url)
    with storage.open_stream(url, storage_options=storage_options, retry=retry, block_size=block_size) as stream:
        key = ""
        group: list[tuple[str, bytes]] = []
        try:
            for name, payload in _tar_members(stream, url):
                this = _split_key(name)[0]
                if group and this != key:
                    yield _sample(url, key, group)
                    group = []
                key = this
                group.append((name, payload))
        except _Truncated as exc:
            if group and exc.member is not None and _split_key(exc.member)[0] != key:
                yield _sample(url, key, group)  # the cut is in the next sample: this one is whole
            raise
        if group:
            yield _sample(url, key, group)


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
    samples = (s for url in urls
               for s in iter_shard(url, storage_options=storage_options, retry=retry))
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


def _split_key(name: str) -> tuple[str, str]:
    """WebDataset's split of a member name into key and extension: at the first dot of the base name."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


def _sample(shard: str, key: str, group: list[tuple[str, bytes]]) -> ShardSample:
    files = {}
    main = None
    for name, payload in group:
        ext = _split_key(name)[1]
        files[ext] = payload
        if main is None and ext.lower() not in _META_EXTENSIONS:
            main = (name, payload)
    if main is None:
        main = group[0]
    meta = None
    if "json" in files:
        try:
            meta = json.loads(files["json"])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DecodeError(f"member {key + '.json'!r} of shard {shard!r} is not valid JSON ({exc})",
                              path=f"{shard}/{key}.json") from exc
    original = meta.get("name") if isinstance(meta, dict) else None
    name = original if isinstance(original, str) and original else main[0]
    return ShardSample(shard=shard, key=key, files=files, member=main[0], name=name, data=main[1],
                       meta=meta if isinstance(meta, dict) else None)


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    parts = []
    while n > 0:
        chunk = stream.read(n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


class _Truncated(DecodeError):
    """A shard that ends early; ``member`` is the member cut, or ``None`` when the cut is between members."""

    def __init__(self, shard: str, member: str | None, detail: str) -> None:
        super().__init__(f"shard {shard!r} is truncated: {detail}; the samples before the cut were read, "
                         f"the rest of the shard is lost", path=f"{shard}/{member}" if member else shard)
        self.member = member


def _tar_members(stream: BinaryIO, shard: str) -> Iterator[tuple[str, bytes]]:
    """``(name, data)`` of every regular file of a tar read sequentially from ``stream``.

    Unlike ``tarfile`` in stream mode, which takes a header cut short for the end of the archive,
    this insists on the end-of-archive marker (a zero block) and reports a cut as truncation.
    """
    long_name: str | None = None
    pax: dict[str, str] = {}
    last: str | None = None
    while True:
        header = _read_exact(stream, _BLOCK)
        if not header:
            raise _Truncated(shard, None, f"it ends after member {last!r} without the end-of-archive marker"
                             if last else "it holds no member and no end-of-archive marker")
        if len(header) < _BLOCK:
            raise _Truncated(shard, None, f"it ends inside the header after member {last!r} "
                             f"({len(header)} of {_BLOCK} bytes)")
        if header == bytes(_BLOCK):
            return  # the end-of-archive marker
        try:
            info = tarfile.TarInfo.frombuf(header, _ENCODING, _ERRORS)
        except tarfile.HeaderError as exc:
            raise DecodeError(f"shard {shard!r} has a malformed tar header after member {last!r} ({exc})",
                              path=shard) from exc
        name = pax.get("path") or long_name or info.name
        size = int(pax["size"]) if "size" in pax else info.size
        padded = -(-size // _BLOCK) * _BLOCK
        payload = _read_exact(stream, padded)
        if len(payload) < padded:
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME):
                raise _Truncated(shard, None, f"it ends inside an extended header after member {last!r}")
            raise _Truncated(shard, name, f"it ends inside member {name!r} ({min(len(payload), size)} of "
                             f"its {size} bytes)")
        data = payload[:size]
        if info.type == tarfile.GNUTYPE_LONGNAME:
            long_name = data.rstrip(b"\0").decode(_ENCODING, _ERRORS)
            continue
        if info.type == tarfile.XHDTYPE:
            pax = _pax_records(data, shard)
            continue
        if info.type == tarfile.XGLTYPE:
            continue
        long_name, pax = None, {}
        last = name
        if info.type in tarfile.REGULAR_TYPES:
            yield name, data


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
            records[key.decode()] = value.decode(_ENCODING, _ERRORS)
        pos += length
    return records
