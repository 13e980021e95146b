"""Listing what a :class:`~audiobuffer.Source` names: folders, manifests, indexes of shards, lists of files.

Each kind may be local or remote: a URL (``s3://``, ``gs://``, ``https://``...) is listed and read
through fsspec (:mod:`audiobuffer.sources.storage`) with the source's ``storage_options``. A remote manifest's
relative paths resolve against the manifest's URL, inside its bucket or host; an index's shards
against the index's URL or path, inside its folder (``allow_outside`` lifts both); a remote folder is
listed with the same glob ``patterns`` as a local one.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..errors import SourceError
from . import storage
from .index import Member, read_index
from .storage import RetrySpec

__all__ = ["LABEL_COLUMN", "MANIFEST_SUFFIXES", "Listing", "list_source", "names_shards"]

MANIFEST_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
#: The column of an index's (or a shard sidecar's) label name, as ``labels=`` names it.
LABEL_COLUMN = "label"


@dataclass
class Listing:
    """What a source lists.

    Attributes:
        paths: the files (paths or URLs; an index member's ``<shard>/<name>``).
        description: the source, for messages.
        fields: each file's sample fields (a manifest's other columns), or ``None``.
        rows: what ``labels=`` may name a column of (the fields, plus an index's ``label``), or ``None``.
        columns: those columns.
        members: an index's members (read by range), or ``None``.
    """

    paths: list[str]
    description: str
    fields: list[dict[str, Any]] | None = None
    rows: list[dict[str, Any]] | None = None
    columns: list[str] = field(default_factory=list)
    members: tuple[Member, ...] | None = None


def names_shards(source: Any) -> bool:
    """Whether ``source`` names tar shards: a path, URL or pattern ending in ``.tar``, or a list of them."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source).lower().endswith(".tar")
    return (isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)) and len(source) > 0
            and all(isinstance(p, (str, os.PathLike)) and os.fspath(p).lower().endswith(".tar") for p in source))


def list_source(source: Any, *, patterns: Sequence[str], path_column: str,
                storage_options: Mapping[str, Any] | None, retry: RetrySpec, allow_outside: bool = False) -> Listing:
    """List ``source``: a folder, a manifest, an ``index.json`` of shards (paths or URLs), or a list of files.

    What data names is confined unless ``allow_outside``: an index's shards to its folder, a remote
    manifest's files to its bucket or host (a local manifest is the user's own: any path).

    Raises:
        SourceError: the source does not exist, is malformed or cannot be listed.
        StorageError: a remote manifest or index cannot be read.
        TypeError: ``source`` is none of these.
    """
    if names_shards(source):
        raise SourceError(f"{source!r} names tar shards: without their index they are streamed, which "
                          f"BufferedDataset does; for random access give the shards' index.json")
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        suffix = Path(text.split("?", 1)[0]).suffix.lower() if storage.is_url(text) else Path(text).suffix.lower()
        if suffix == ".json":
            return _list_index(text, storage_options, retry, allow_outside)
        if storage.is_url(text):
            if suffix in MANIFEST_SUFFIXES:
                data = storage.read_bytes(text, storage_options=storage_options, retry=retry)
                resolve = storage.sibling if allow_outside else storage.inside_bucket
                hint = "" if allow_outside else "; pass allow_outside=True to Source to read files elsewhere"
                return _manifest(text, io.StringIO(_text(data, text), newline=""), MANIFEST_SUFFIXES[suffix],
                                 path_column, lambda value: resolve(text, value), hint)
            return _list_remote_dir(text, patterns, storage_options, retry)
        root = Path(text)
        if root.is_dir():
            return Listing(_list_dir(root, patterns), f"{str(root)!r} (patterns {list(patterns)})")
        if suffix in MANIFEST_SUFFIXES:
            if not root.is_file():
                raise SourceError(f"manifest {str(root)!r} does not exist")
            try:
                # utf-8-sig: the byte order mark that spreadsheet programs write is not part of the first column.
                with open(root, newline="", encoding="utf-8-sig") as f:
                    return _manifest(str(root), f, MANIFEST_SUFFIXES[suffix], path_column,
                                     lambda value: _beside(root, Path(value)))
            except (OSError, UnicodeDecodeError) as exc:
                raise SourceError(f"cannot read manifest {str(root)!r}: {exc}") from exc
        if root.exists():
            raise SourceError(
                f"source {str(root)!r} is neither a directory nor a manifest (expected one of "
                f"{sorted(MANIFEST_SUFFIXES)}) nor an index of shards (.json); pass a list to use single files")
        raise SourceError(f"source {str(root)!r} does not exist")
    if isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)):
        bad = [p for p in source if not isinstance(p, (str, os.PathLike))]
        if bad:
            raise TypeError(f"a source list must hold file paths, got {bad[0]!r}")
        paths = [os.fspath(p) for p in source]
        for n, p in enumerate(paths):
            if "\0" in p:
                raise SourceError(f"source list entry {n}: the path {p[:80]!r} holds a NUL character")
        return Listing(paths, f"a list of {len(paths)} paths")
    raise TypeError(f"source must be a directory, a manifest file, an index of shards, a pattern of .tar "
                    f"shards or a list of paths, got {source!r}")


def _beside(manifest: Path, file: Path) -> str:
    return str(file if file.is_absolute() else manifest.parent / file)


def _list_dir(root: Path, patterns: Sequence[str]) -> list[str]:
    found: set[str] = set()
    for pattern in _patterns(patterns):
        found.update(str(p) for p in root.glob(pattern) if p.is_file())
    return sorted(found)


def _list_remote_dir(url: str, patterns: Sequence[str], storage_options: Mapping[str, Any] | None,
                     retry: RetrySpec) -> Listing:
    base = url.rstrip("/")
    found: set[str] = set()
    for pattern in _patterns(patterns):
        found.update(storage.glob_urls(f"{base}/{pattern}", storage_options=storage_options, retry=retry))
        if pattern.startswith("**/"):  # fsspec's ** may or may not match no folder at all: both, to be sure
            found.update(storage.glob_urls(f"{base}/{pattern[3:]}", storage_options=storage_options, retry=retry))
    return Listing(sorted(found), f"{url!r} (patterns {list(patterns)})")


def _patterns(patterns: Sequence[str]) -> list[str]:
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise TypeError(f"patterns must be non-empty glob strings, got {pattern!r}")
    return patterns


def _text(data: bytes, url: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(f"cannot read manifest {url!r}: {exc}") from exc


def _manifest(name: str, f: IO[str], kind: str, path_column: str, resolve: Any, hint: str = "") -> Listing:
    """The files of a manifest read from ``f``; ``resolve`` turns a path column value into a path or URL
    (a ``ValueError`` for one it refuses, reported with ``hint``)."""
    rows: list[dict[str, Any]] = []
    columns: list[str] = []
    try:
        if kind == "jsonl":
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SourceError(f"manifest {name!r} line {lineno}: invalid JSON ({exc})") from exc
                except RecursionError as exc:
                    raise SourceError(f"manifest {name!r} line {lineno}: JSON nested too deeply to be a row") from exc
                if not isinstance(row, dict):
                    raise SourceError(f"manifest {name!r} line {lineno}: expected a JSON object, got {row!r}")
                rows.append(row)
                columns.extend(k for k in row if k not in columns)
        else:
            reader = csv.DictReader(f, delimiter="\t" if kind == "tsv" else ",")
            columns = list(reader.fieldnames or [])
            rows = list(reader)
    except csv.Error as exc:
        raise SourceError(f"cannot read manifest {name!r}: {exc}") from exc
    if path_column not in columns:
        raise SourceError(f"manifest {name!r} has no path column {path_column!r}; its columns are {columns}")
    paths: list[str] = []
    fields: list[dict[str, Any]] = []
    for n, row in enumerate(rows):
        value = row.get(path_column)
        if not isinstance(value, str) or not value:
            raise SourceError(f"manifest {name!r} row {n + 1}: empty or missing {path_column!r}")
        if "\0" in value:  # the C libraries would open the path cut at the NUL
            raise SourceError(f"manifest {name!r} row {n + 1}: the path {value[:80]!r} holds a NUL character")
        try:
            paths.append(resolve(value))
        except ValueError as exc:  # a path leaving a remote manifest's bucket or host
            raise SourceError(f"manifest {name!r} row {n + 1}: {exc}{hint}") from exc
        fields.append({k: v for k, v in row.items() if k != path_column})
    return Listing(paths, f"manifest {name!r}", fields, fields, columns)


def _list_index(url: str, storage_options: Mapping[str, Any] | None, retry: RetrySpec,
                allow_outside: bool) -> Listing:
    if not storage.is_url(url) and not Path(url).is_file():
        raise SourceError(f"index {url!r} does not exist")
    index = read_index(url, storage_options=storage_options, retry=retry, allow_outside=allow_outside)
    members = index.members
    fields = [dict(m.fields) for m in members]
    columns = [LABEL_COLUMN, *dict.fromkeys(k for row in fields for k in row if k != LABEL_COLUMN)]
    rows = [{**row, LABEL_COLUMN: m.label} for m, row in zip(members, fields)]
    return Listing([m.path for m in members], f"index {url!r} ({len(index.shards)} shards)", fields, rows,
                   columns, members)
