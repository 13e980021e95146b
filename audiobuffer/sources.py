"""Where the work items come from: files, manifests and labels.

A :class:`Source` is built once (listing a directory or reading a manifest, resolving labels) and is
immutable afterwards. Each epoch's order and shard come from ``_plan.plan_epoch``; the source turns
their indices into :class:`WorkItem` objects as producers ask for them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from .errors import SourceError

__all__ = [
    "AUDIO_PATTERNS",
    "IMAGE_PATTERNS",
    "LabelSpec",
    "Source",
    "SourceSpec",
    "WorkItem",
    "as_source",
]

#: Glob patterns a directory source matches by default: the audio containers libsndfile reads.
AUDIO_PATTERNS: tuple[str, ...] = (
    "**/*.wav", "**/*.flac", "**/*.ogg", "**/*.opus", "**/*.mp3", "**/*.aiff", "**/*.aif", "**/*.sph",
)
#: Glob patterns an :class:`~audiobuffer.ImageDecoder` reads from a directory by default: the common
#: formats Pillow decodes, with the upper-case suffixes cameras write.
IMAGE_PATTERNS: tuple[str, ...] = (
    "**/*.png", "**/*.jpg", "**/*.jpeg", "**/*.bmp", "**/*.gif", "**/*.tif", "**/*.tiff", "**/*.webp",
    "**/*.PNG", "**/*.JPG", "**/*.JPEG",
)
#: Characters that make a ``labels`` string a regular expression rather than a manifest column name.
_REGEX_CHARS = frozenset(".^$*+?{}[]|()\\")
_MANIFEST_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}

SourceSpec = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]
LabelSpec = Union[None, str, "re.Pattern[str]", Callable[[str], Hashable]]


@dataclass(frozen=True)
class WorkItem:
    """One unit of work for a decoder: a file, its label and metadata, and where it sits in the epoch.

    Attributes:
        index: the item's position in the source (stable across epochs and shards).
        path: the file to decode.
        label: the class index of the label (into ``Source.classes``), or ``None`` without labels.
        label_name: the label as found (folder name, regex match or manifest value), or ``None``.
        fields: the other columns of a manifest row (empty for directories and file lists).
        epoch: the epoch this item belongs to.
        seed: the dataset's seed.
        seq: the item's position in this shard's order for this epoch (0, 1, 2, ...).
        read: ``None`` (decoders open ``path``), or a callable returning the file's bytes (a member
            of a tar shard, an object in remote storage), called by the decoder in its thread.
    """

    index: int
    path: str
    label: int | None = None
    label_name: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    epoch: int = 0
    seed: int = 0
    seq: int = 0
    read: Callable[[], bytes] | None = field(default=None, compare=False, repr=False)

    def rng(self) -> np.random.Generator:
        """A random generator seeded by (seed, epoch, index).

        Random choices made with it (a random crop, say) are reproducible whatever thread decodes
        the item and in whatever order.
        """
        return np.random.default_rng([self.seed, self.epoch, self.index])


def _natural_key(name: str) -> tuple[int, Any]:
    """Sort numbers numerically and before words, so class "10" comes after class "9"."""
    try:
        return (0, int(name))
    except ValueError:
        return (1, name)


class Source:
    """The files of a dataset with their labels and fields.

    Args:
        source: a directory (matched with ``patterns``), a CSV/TSV/JSONL manifest with a path column,
            or a list of file paths.
        patterns: glob patterns, relative to a directory source (``**`` recurses).
        labels: where labels come from: ``None`` (no labels); ``"parent"`` (the parent folder's name);
            the name of a manifest column; a regular expression searched in the file name (its first
            group, or the whole match without groups); or a callable from path to label.
        path_column: the manifest column that holds the file paths; relative paths are resolved
            against the manifest's folder.

    Raises:
        SourceError: the source does not exist, a manifest is malformed, no file matched, or a file
            name does not match the label expression.
    """

    def __init__(self, source: SourceSpec, *, patterns: Sequence[str] = AUDIO_PATTERNS,
                 labels: LabelSpec = None, path_column: str = "path") -> None:
        self.description: str
        self.paths: list[str]
        self.fields: list[dict[str, Any]] | None = None
        columns: list[str] = []
        if isinstance(source, (str, os.PathLike)):
            root = Path(source)
            if root.is_dir():
                self.paths = _list_dir(root, patterns)
                self.description = f"{str(root)!r} (patterns {list(patterns)})"
            elif root.suffix.lower() in _MANIFEST_SUFFIXES:
                if not root.is_file():
                    raise SourceError(f"manifest {str(root)!r} does not exist")
                self.paths, self.fields, columns = _read_manifest(root, path_column)
                self.description = f"manifest {str(root)!r}"
            elif root.exists():
                raise SourceError(
                    f"source {str(root)!r} is neither a directory nor a manifest "
                    f"(expected one of {sorted(_MANIFEST_SUFFIXES)}); pass a list to use single files")
            else:
                raise SourceError(f"source {str(root)!r} does not exist")
        elif isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)):
            bad = [p for p in source if not isinstance(p, (str, os.PathLike))]
            if bad:
                raise TypeError(f"a source list must hold file paths, got {bad[0]!r}")
            self.paths = [os.fspath(p) for p in source]
            for n, p in enumerate(self.paths):
                if "\0" in p:
                    raise SourceError(f"source list entry {n}: the path {p[:80]!r} holds a NUL character")
            self.description = f"a list of {len(self.paths)} paths"
        else:
            raise TypeError(
                f"source must be a directory, a manifest file or a list of paths, got {source!r}")
        if not self.paths:
            raise SourceError(f"no files in {self.description}")
        self.label_names = _resolve_labels(labels, self.paths, self.fields, columns)
        names = {n for n in self.label_names if n is not None} if self.label_names else set()
        #: The sorted label names; a sample's ``label`` is an index into this list.
        self.classes: list[str] = sorted(names, key=_natural_key)
        #: The label name to class index map.
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(self.classes)}

    def __len__(self) -> int:
        return len(self.paths)

    def __repr__(self) -> str:
        labels = f", classes={len(self.classes)}" if self.label_names is not None else ""
        return f"Source({self.description}, items={len(self.paths)}{labels})"

    def fingerprint(self) -> str:
        """A digest of the file list (its order included): a saved state names the source it came from."""
        fingerprint = self.__dict__.get("_fingerprint")
        if fingerprint is None:
            digest = hashlib.sha256()
            for path in self.paths:
                digest.update(path.encode("utf-8", "surrogateescape") + b"\0")
            fingerprint = self.__dict__["_fingerprint"] = f"{len(self.paths)}:{digest.hexdigest()[:16]}"
        return fingerprint

    def subset(self, indices: Sequence[int]) -> Source:
        """A source of the files at ``indices``, keeping this source's classes (so label indices agree).

        Use it to split one source into train and test sets.
        """
        part = object.__new__(Source)
        part.description = f"{len(indices)} files of {self.description}"
        part.paths = [self.paths[i] for i in indices]
        part.fields = None if self.fields is None else [self.fields[i] for i in indices]
        part.label_names = None if self.label_names is None else [self.label_names[i] for i in indices]
        part.classes = list(self.classes)
        part.class_to_idx = dict(self.class_to_idx)
        if not part.paths:
            raise SourceError(f"an empty subset of {self.description}")
        return part

    def item(self, index: int, *, epoch: int = 0, seed: int = 0, seq: int = 0) -> WorkItem:
        """The work item for the source's ``index``-th file."""
        name = self.label_names[index] if self.label_names else None
        return WorkItem(
            index=index,
            path=self.paths[index],
            label=None if name is None else self.class_to_idx[name],
            label_name=name,
            fields=self.fields[index] if self.fields is not None else {},
            epoch=epoch,
            seed=seed,
            seq=seq,
        )


def _list_dir(root: Path, patterns: Sequence[str]) -> list[str]:
    if isinstance(patterns, str):
        patterns = [patterns]
    found: set[str] = set()
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise TypeError(f"patterns must be non-empty glob strings, got {pattern!r}")
        found.update(str(p) for p in root.glob(pattern) if p.is_file())
    return sorted(found)


def _read_manifest(path: Path, path_column: str) -> tuple[list[str], list[dict[str, Any]], list[str]]:
    kind = _MANIFEST_SUFFIXES[path.suffix.lower()]
    rows: list[dict[str, Any]] = []
    columns: list[str] = []
    try:
        # utf-8-sig: the byte order mark that spreadsheet programs write is not part of the first column.
        with open(path, newline="", encoding="utf-8-sig") as f:
            if kind == "jsonl":
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise SourceError(f"manifest {str(path)!r} line {lineno}: invalid JSON ({exc})") from exc
                    if not isinstance(row, dict):
                        raise SourceError(
                            f"manifest {str(path)!r} line {lineno}: expected a JSON object, got {row!r}")
                    rows.append(row)
                    columns.extend(k for k in row if k not in columns)
            else:
                reader = csv.DictReader(f, delimiter="\t" if kind == "tsv" else ",")
                columns = list(reader.fieldnames or [])
                rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SourceError(f"cannot read manifest {str(path)!r}: {exc}") from exc
    if path_column not in columns:
        raise SourceError(
            f"manifest {str(path)!r} has no path column {path_column!r}; its columns are {columns}")
    paths: list[str] = []
    fields: list[dict[str, Any]] = []
    for n, row in enumerate(rows):
        value = row.get(path_column)
        if not isinstance(value, str) or not value:
            raise SourceError(f"manifest {str(path)!r} row {n + 1}: empty or missing {path_column!r}")
        if "\0" in value:  # the C libraries would open the path cut at the NUL
            raise SourceError(f"manifest {str(path)!r} row {n + 1}: the path {value[:80]!r} holds a NUL character")
        file = Path(value)
        paths.append(str(file if file.is_absolute() else path.parent / file))
        fields.append({k: v for k, v in row.items() if k != path_column})
    return paths, fields, columns


def _resolve_labels(labels: LabelSpec, paths: list[str], fields: list[dict[str, Any]] | None,
                    columns: list[str]) -> list[str | None] | None:
    if labels is None:
        return None
    if callable(labels) and not isinstance(labels, re.Pattern):
        return [_label_str(labels(p)) for p in paths]
    if labels == "parent":
        return [Path(p).parent.name for p in paths]
    if isinstance(labels, str) and fields is not None and labels in columns:
        return [_label_str(row.get(labels)) for row in fields]
    if isinstance(labels, str) and fields is not None and not _REGEX_CHARS.intersection(labels):
        # A plain word on a manifest is a column name with a typo far more often than a regex: as a
        # regex it could only match itself and give every file the same label.
        raise SourceError(
            f"labels={labels!r} is not a column of the manifest; its columns are {columns}. For a regular "
            f"expression searched in the file names, pass re.compile({labels!r}) or one with a group")
    if isinstance(labels, str):
        try:
            pattern = re.compile(labels)
        except re.error as exc:
            raise ValueError(
                f"labels must be 'parent', a manifest column, a callable or a regular expression; "
                f"{labels!r} is not a valid regular expression ({exc})") from exc
    elif isinstance(labels, re.Pattern):
        pattern = labels
    else:
        raise TypeError(f"labels must be None, 'parent', a column name, a regex or a callable, got {labels!r}")
    names: list[str | None] = []
    for p in paths:
        match = pattern.search(os.path.basename(p))
        if match is None:
            hint = (f" (labels is not a column of the manifest either; its columns are {columns})"
                    if fields is not None else "")
            raise SourceError(f"file {p!r} does not match the label expression {pattern.pattern!r}{hint}")
        names.append(match.group(1) if pattern.groups else match.group(0))
    return names


def _label_str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def as_source(source: SourceSpec | Source, *, patterns: Sequence[str], labels: LabelSpec, path_column: str,
              explicit_patterns: Sequence[str] | None = None) -> Source:
    """``source`` itself if it is a :class:`Source`, else the :class:`Source` it describes.

    ``labels``, ``patterns`` (``explicit_patterns``, as the caller was given them) and ``path_column``
    describe how to list a source: with a ready ``Source`` they would be ignored, so they are refused.
    """
    if not isinstance(source, Source):
        return Source(source, patterns=patterns, labels=labels, path_column=path_column)
    given = [name for name, value, default in (("labels", labels, None), ("patterns", explicit_patterns, None),
                                               ("path_column", path_column, "path")) if value != default]
    if given:
        raise ValueError(f"{', '.join(given)} describe how to list a source; give them to Source(...), not together "
                         f"with a ready Source")
    return source
