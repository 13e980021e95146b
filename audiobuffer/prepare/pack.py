"""Packing a source into tar shards in WebDataset's layout, with an index: :func:`pack`; and the same index
for shards that exist: :func:`index_shards`.

:mod:`audiobuffer.sources` re-exports both and reads the shards back (by index or streamed).

NOTE [ Shard layout ]
=====================
::

    OUT/shard-000000.tar   <key>.<ext> (the original file, byte for byte) and <key>.json, per sample
    OUT/shard-000001.tar   ...
    OUT/index.json         every member: shard, member name, offset and size of its data,
                           duration, label; with labels, "classes": the label names in the
                           order the source numbered them

A sample's ``<key>`` is its path relative to the source's folder, without the extension, with ``/``
made ``__`` and dots made ``_`` (WebDataset splits a member's name at the first dot of its base name
into key and extension); a key already taken gets ``-1``, ``-2``... The ``<key>.json`` sidecar holds
``{"name": the original relative path, "label": the label name or null, "label_index": its number
in the source's classes or null, "duration": seconds or null, "fields": the manifest's other
columns}``. Packing the same source twice gives the same bytes: the
input order is the source's (sorted for a folder), every tar header has mtime 0, uid and gid 0, no
user or group name and mode 0644. The index is written last, whole: its presence means the pack
finished.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import re
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from ..errors import SourceError, StorageError
from ..sources.index import (
    INDEX_FORMAT,
    INDEX_NAME,
    INDEX_VERSION,
    ShardIndex,
    name_problem,
    read_index,
    shard_name,
)
from ..sources.storage import Storage, is_url, sibling
from ..sources.tar import ENCODING, ERRORS, is_packed_sidecar, shard_samples

if TYPE_CHECKING:  # annotations only: pack() imports Source when it runs
    from ..sources.source import LabelSpec, SourceSpec

__all__ = ["index_shards", "pack"]

logger = logging.getLogger(__name__)

_SHARD_GLOB = "shard-*.tar"
_PARTIAL = ".partial"
_BLOCK = tarfile.BLOCKSIZE
_UNSAFE_KEY = re.compile(r"[^\w\-]+")
_UNKNOWN_FRAMES = 2**62


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
    storage = Storage.of(storage_options)
    if is_url(os.fspath(out_dir)):
        raise ValueError(f"out_dir must be a local folder, got the URL {os.fspath(out_dir)!r}; pack "
                         f"locally, then upload the folder (aws s3 sync, gsutil rsync, fsspec put)")
    from ..sources.source import AUDIO_PATTERNS, Source

    out = Path(out_dir)
    src = Source(source, patterns=AUDIO_PATTERNS if patterns is None else patterns, labels=labels,
                 path_column=path_column, storage_options=storage.options, retry=storage.retry)
    if src.table.segments is not None:
        raise SourceError(f"{src.description} names segments of its files (Lhotse cuts, or start and duration "
                          f"columns), and pack copies whole files: read it as it is, which gives random access "
                          f"already (BufferedDataset, IsolatedLoader, batches by duration)")
    paths = src.table.paths()
    names = _relative_names(source, paths)
    keys = _unique_keys(names)
    _prepare_out(out, overwrite)
    writer = _ShardWriter(out, shard_size)
    from tqdm import tqdm

    label_of = src.label_of  # each item's number in src.classes (-1: no label)
    try:
        with tqdm(total=len(src), unit="file", desc="pack", disable=not progress) as bar:
            for i, path in enumerate(paths):
                data = storage.read_bytes(path)
                ext = PurePosixPath(names[i]).suffix.lower().lstrip(".") or "bin"
                label = src.label_names[i] if src.label_names else None
                number = int(label_of[i]) if label is not None and label_of is not None else None
                fields = src.fields[i] if src.fields is not None else {}
                duration = _duration(ext, data)
                sidecar = {"name": names[i], "label": label, "label_index": number,
                           "duration": duration, "fields": fields}
                writer.add(keys[i], ext, data, sidecar)
                bar.update(1)
        writer.finish()
    except BaseException:
        writer.abandon()  # no half-written shard is left behind; the finished ones stay, without an index
        raise
    classes = src.classes if src.label_of is not None else None
    return _write_index(out / INDEX_NAME, writer.shards, writer.members, classes=classes)


def index_shards(shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                 out: str | os.PathLike[str] | None = None, *, overwrite: bool = False, progress: bool = True,
                 storage_options: Mapping[str, Any] | None = None) -> ShardIndex:
    """Write the ``index.json`` that :func:`pack` writes for tar shards that exist (any WebDataset shards).

    Each shard is read through once (:func:`~audiobuffer.sources.iter_shard`): each sample's main file is
    recorded with its offset and size, its duration from its header, and its fields (the other members:
    ``.json`` keys, ``.cls``, ``.txt``...), so that reading by the index gives the samples, fields and
    labels that streaming the shards gives, with random access, exact resume, the isolated loader and
    batches by duration. A sample's label in the index is its ``label`` field, where it has one.

    Args:
        shards: a path, URL, brace pattern or glob of shards, or a list of them.
        out: the index file to write (a local path); by default ``index.json`` in the folder of the
            first shard. Every local shard must lie inside its folder, where the index can name it.
            For shards in object storage it is written here, to be uploaded beside them.
        overwrite: replace an index file that exists.
        progress: show a progress bar (tqdm) on stderr.
        storage_options: fsspec options for shards given as URLs.

    Raises:
        SourceError: no shard matches, a shard is outside the index's folder, or a shard holds no sample.
        StorageError: the index exists (without ``overwrite``), or a shard cannot be read.
        DecodeError: a shard is truncated or malformed (the message names it and the member).
    """
    from tqdm import tqdm

    from ..sources.source import LABEL_COLUMN, _label_str
    from ..sources.tar import packed_class_order

    storage = Storage.of(storage_options)
    urls = storage.expand_urls(shards)
    if not urls:
        raise SourceError(f"no shards in {shards!r}")
    remote = is_url(urls[0])
    if out is None:
        out = "index.json" if remote else os.path.join(os.path.dirname(os.path.abspath(urls[0])), INDEX_NAME)
    elif is_url(os.fspath(out)):
        raise ValueError(f"out must be a local path, got the URL {os.fspath(out)!r}; write the index here, "
                         f"then upload it beside the shards")
    path = Path(out)
    if path.exists() and not overwrite:
        raise StorageError(f"index {str(path)!r} exists; pass overwrite=True (--overwrite) to replace it",
                           url=str(path))
    names = _shard_names(urls, path, remote)
    entries: list[dict[str, Any]] = []
    members: list[dict[str, Any]] = []
    left_out: set[str] = set()
    metas: list[Any] = []  # each sample's sidecar: packed ones give the class order
    with tqdm(total=len(urls), unit="shard", desc="index", disable=not progress) as bar:
        for url, name in zip(urls, names):
            count = 0
            for sample in shard_samples(url, storage=storage):
                _check_names(url, sample.member, sample.name)
                metas.append(sample.meta)
                fields = {}
                for key, value in sample.fields.items():
                    if isinstance(value, bytes):
                        left_out.add(key)
                    else:
                        fields[key] = value
                # a foreign sample's label in the index: its "label" field as a label name, as streaming reads it
                label = sample.label if is_packed_sidecar(sample.meta) else _label_str(fields.get(LABEL_COLUMN))
                ext = PurePosixPath(sample.member).suffix.lower().lstrip(".")
                members.append({"shard": name, "member": sample.member, "name": sample.name,
                                "offset": sample.offset, "size": len(sample.data),
                                "duration": _duration(ext, sample.data), "label": label, "fields": fields})
                count += 1
            entries.append({"name": name, "size": storage.size(url),
                            "members": count})
            bar.update(1)
    if not members:
        raise SourceError(f"the {len(urls)} shards of {shards!r} hold no sample")
    if left_out:
        logger.warning("members that are not text (%s) are fields when streaming but are not recorded in the "
                       "index", ", ".join(sorted(left_out)))
    path.parent.mkdir(parents=True, exist_ok=True)
    index = _write_index(path, entries, members, classes=packed_class_order(metas))
    if remote:
        logger.warning("wrote %s for shards in object storage: upload it beside them, as %s", path,
                       sibling(urls[0], INDEX_NAME))
    return index  # (for remote shards, its shard paths resolve beside the file written here)


def _check_names(url: str, member: str, name: str) -> None:
    """Refuse a sample whose member or original name an index cannot hold (a path outside the shard)."""
    for what, value in (("member", member), ("original name", name)):
        problem = name_problem(value) if value else "is empty"
        if problem is not None:
            raise SourceError(f"shard {url!r} holds a sample whose {what} {value!r} {problem}: an index "
                              f"cannot name it, and no index was written; write the shard again with names "
                              f"relative to it (no leading '/', no '..')")


def _shard_names(urls: list[str], index: Path, remote: bool) -> list[str]:
    """Each shard's name as the index at ``index`` records it: relative to the index's folder."""
    if remote:
        folder = urls[0].rsplit("/", 1)[0] + "/"
        outside = [u for u in urls if not u.startswith(folder) or "/" in u[len(folder):]]
        if outside:
            raise SourceError(f"shard {outside[0]!r} is not in the folder of {urls[0]!r}: an index names the "
                              f"shards of one folder")
        return [u[len(folder):] for u in urls]
    root = os.path.abspath(index.parent)
    names = []
    for url in urls:
        relative = os.path.relpath(os.path.abspath(url), root) if _same_drive(url, root) else ""
        if not relative or relative.startswith("..") or os.path.isabs(relative):
            raise SourceError(f"shard {url!r} is not inside the folder of the index {str(index)!r}; write the "
                              f"index into the shards' folder (or one above it)")
        names.append(Path(relative).as_posix())
    return names


def _same_drive(path: str, root: str) -> bool:
    return os.path.splitdrive(os.path.abspath(path))[0].lower() == os.path.splitdrive(root)[0].lower()



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
    if isinstance(spec, (str, os.PathLike)) and not is_url(os.fspath(spec)) and Path(spec).is_dir():
        root = os.path.abspath(os.fspath(spec))
        return [Path(os.path.relpath(os.path.abspath(p), root)).as_posix() for p in paths]
    if all(is_url(p) for p in paths):
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
    """Seconds of audio from the header of ``data``, counted by decoding it once where the header gives no
    frame count (FLAC without a total-samples field); ``None`` for what is not audio or cannot be counted."""
    from ..decoders import _wav
    from ..decoders._sndfile import read_to_end

    if ext in ("wav", "wave"):
        info = _wav.read_wav_info(data)
        if info is not None:
            return info.frames / info.samplerate if info.samplerate else None
    try:
        import soundfile

        with soundfile.SoundFile(io.BytesIO(data)) as f:
            rate, frames = f.samplerate, f.frames
            if frames >= _UNKNOWN_FRAMES:
                _, frames, error = read_to_end(f, count_only=True)
                if error is not None:  # breaks off: its length is not known
                    return None
    except Exception:  # not audio libsndfile reads: no duration
        return None
    if frames <= 0 or rate <= 0:
        return None
    return frames / rate


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
        self._tar = tarfile.open(path, "w", format=tarfile.PAX_FORMAT, encoding=ENCODING, errors=ERRORS)
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
        with tarfile.open(partial, "r:", encoding=ENCODING, errors=ERRORS) as tar:
            offsets = {info.name: info.offset_data for info in tar}
        for entry in self._pending:
            entry["offset"] = offsets[entry["member"]]
        self.members.extend(self._pending)
        self.shards.append({"name": name, "size": partial.stat().st_size, "members": len(self._pending)})
        self._pending = []
        os.replace(partial, self.out / name)


def _member_bytes(info: tarfile.TarInfo) -> int:
    """Bytes a member takes in a tar: its headers (with a PAX header for a long or non-ASCII name), its data."""
    header = len(info.tobuf(tarfile.PAX_FORMAT, ENCODING, ERRORS))
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


def _write_index(path: Path, shards: list[dict[str, Any]], members: list[dict[str, Any]], *,
                 classes: list[str] | None = None) -> ShardIndex:
    """Write the index at ``path`` and return it as read back; an index that does not read back (a value
    the checks of :func:`read_index` refuse) is not left behind, whole or partial. ``classes``: the
    label names in the order the packed source numbered them, recorded so that reading the index
    numbers them so too."""
    def line(obj: Any) -> str:
        return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))

    text = "".join([
        "{\n",
        f'"format": {line(INDEX_FORMAT)},\n"version": {INDEX_VERSION},\n',
        "" if classes is None else f'"classes": {line(classes)},\n',
        '"shards": [\n', ",\n".join(line(s) for s in shards), "\n],\n",
        '"members": [\n', ",\n".join(line(m) for m in members), "\n]\n}\n",
    ])
    partial = path.with_name(path.name + _PARTIAL)
    partial.write_bytes(text.encode("utf-8"))  # bytes: no \r\n on Windows, the same index everywhere
    try:
        index = read_index(partial)  # what every loader will read, checked before it is there
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)  # the index appears last, whole: its presence means the pack finished
    return dataclasses.replace(index, url=os.fspath(path))

