"""Listing a source into an :class:`~audiobuffer.sources.table.ItemTable`: a folder, a list of files or
a manifest (CSV, TSV, JSONL, Parquet), each filled in bulk.

CSV, TSV and Parquet manifests are read by pyarrow into columns; a CSV file pyarrow cannot read as a
plain table (ragged rows, a repeated column name, bytes that are not UTF-8) is read by the ``csv``
module instead, which gives the same values and names the row at fault. Paths are stored as a folder
prefix (one per folder) and the rest of the path; a local manifest's relative paths are resolved once
per folder, not once per row.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import SourceError
from . import table as item_table
from .storage import Storage, inside_bucket, is_url, sibling
from .table import (
    ABSENT,
    Coded,
    ItemTable,
    Strings,
    arrow_bools,
    arrow_numbers,
    as_column,
    numbers_arrow,
    release_arrow_memory,
)

__all__ = ["LABEL_COLUMN", "Listing", "MANIFEST_SUFFIXES", "list_files", "names_shards", "table_of_paths"]

MANIFEST_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
#: The column of an index's (or a shard sidecar's) label name, as ``labels=`` names it.
LABEL_COLUMN = "label"
# The separators pathlib splits a local path at.
_SEPARATORS = "/\\" if os.name == "nt" else "/"


@dataclass
class Listing:
    """What a source lists: its item table, a description of it for messages, and the order of its
    classes where the data records one (a packed index's)."""

    table: ItemTable
    description: str
    classes: Sequence[str] | None = None


def names_shards(source: Any) -> bool:
    """Whether ``source`` names tar shards: a path, URL or pattern ending in ``.tar``, or a list of them."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source).lower().endswith(".tar")
    return (isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)) and len(source) > 0
            and all(isinstance(p, (str, os.PathLike)) and os.fspath(p).lower().endswith(".tar") for p in source))


def list_files(source: Any, *, patterns: Sequence[str], path_column: str, storage: Storage,
               allow_outside: bool = False) -> Listing:
    """List ``source``: a folder, a manifest or a list of files (paths or URLs, read through
    ``storage``); an ``index.json`` of shards is listed by
    :func:`~audiobuffer.sources.source.list_source`.

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
        suffix = Path(text.split("?", 1)[0] if is_url(text) else text).suffix.lower()
        if suffix == ".json":
            raise SourceError(f"{text!r} is an index of shards: Source lists it (sources/source.py)")
        if is_url(text):
            if suffix in MANIFEST_SUFFIXES:
                data = storage.read_bytes(text)
                resolve = sibling if allow_outside else inside_bucket
                hint = "" if allow_outside else "; pass allow_outside=True to Source to read files elsewhere"
                return _manifest(text, data, MANIFEST_SUFFIXES[suffix], path_column,
                                 _RowResolver(lambda value: resolve(text, value), hint))
            return _list_remote_dir(text, patterns, storage)
        root = Path(text)
        if root.is_dir():
            return Listing(table_of_paths(_list_dir(root, patterns)), f"{str(root)!r} (patterns {list(patterns)})")
        if suffix in MANIFEST_SUFFIXES:
            if not root.is_file():
                raise SourceError(f"manifest {str(root)!r} does not exist")
            return _manifest(str(root), root, MANIFEST_SUFFIXES[suffix], path_column, _FolderResolver(root))
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
        return Listing(table_of_paths(paths), f"a list of {len(paths)} paths")
    raise TypeError(f"source must be a directory, a manifest file, an index of shards, a pattern of .tar "
                    f"shards or a list of paths, got {source!r}")


# -- paths -------------------------------------------------------------------------------------

def table_of_paths(paths: Sequence[str], **columns: Any) -> ItemTable:
    """A table of ``paths`` as given, each split into its folder prefix and the rest."""
    prefixes, prefix_of, names = _split(paths)
    release_arrow_memory()
    return ItemTable(prefixes, prefix_of, names, **columns)


def _split(paths: Any) -> tuple[list[str], np.ndarray, Strings]:
    """``paths`` (a list of strings or a pyarrow string array) split after their last separator:
    the distinct folder parts (with that separator; ``""`` for none), each path's folder part, and the rest."""
    if hasattr(paths, "to_pylist") or len(paths) >= item_table.ARROW_ROWS:  # few paths: Python splits them
        try:
            return _split_arrow(paths)
        except (ImportError, UnicodeEncodeError, ValueError, TypeError):
            # Without pyarrow, or a path that is not UTF-8 (POSIX file names may be any bytes): one by one.
            pass
    items = paths.to_pylist() if hasattr(paths, "to_pylist") else list(paths)
    cut = [max(p.rfind(s) for s in _SEPARATORS) + 1 for p in items]
    coded = Coded.encode([p[:k] for p, k in zip(items, cut)])
    return coded.values, coded.codes, Strings.from_strings([p[k:] for p, k in zip(items, cut)])


def _split_arrow(paths: Any) -> tuple[list[str], np.ndarray, Strings]:
    import pyarrow as pa
    import pyarrow.compute as pc

    # Not pa.array(paths): it imports pandas (table.py); a name that is not UTF-8 fails the cast (ValueError).
    array = paths if isinstance(paths, (pa.Array, pa.ChunkedArray)) else \
        Strings.from_strings(paths).arrow().cast(pa.large_string())
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    found = [sep for sep in _SEPARATORS if pc.any(pc.match_substring(array, sep)).as_py()]
    if len(found) > 1:  # both of Windows' separators: a regular expression finds the last of either
        parts = pc.extract_regex(array, r"(?s)^(?P<dir>.*[/\\])?(?P<base>[^/\\]*)$")
        folders = pc.dictionary_encode(parts.field("dir"))
        return (folders.dictionary.to_pylist(), arrow_numbers(folders.indices, np.int32),
                Strings.from_arrow(parts.field("base")))
    sep = found[0] if found else "/"
    parts = pc.split_pattern(array, sep, max_splits=1, reverse=True)  # [folder, rest] or [rest]
    starts = arrow_numbers(parts.offsets, np.int32).astype(np.int64)
    values = parts.values
    rest = values.take(numbers_arrow(starts[1:] - 1))
    alone = (starts[1:] - starts[:-1]) == 1  # no separator: no folder part
    # Every path's first part, coded (a path alone gives its rest: coded, then given the code of "").
    folders = pc.dictionary_encode(values.take(numbers_arrow(starts[:-1])))
    codes = arrow_numbers(folders.indices, np.int32)
    names = folders.dictionary
    if alone.any():
        codes[alone] = len(names)
        used, inverse = np.unique(codes, return_inverse=True)  # only the folders some path has
        codes = inverse.astype(np.int32).reshape(-1)
        names = names.take(numbers_arrow(used[used < len(names)].astype(np.int64)))
    prefixes = [folder + sep for folder in names.to_pylist()]
    return [*prefixes, ""], codes, Strings.from_arrow(rest)


def _list_dir(root: Path, patterns: Sequence[str]) -> list[str]:
    """The files under ``root`` that match any of ``patterns``, sorted.

    The patterns ``**/NAME`` (the default suffixes, say) are matched in one walk of the tree, by
    file name, as ``Path.glob`` matches a name (``fnmatch``, case-insensitive where the OS is);
    each other pattern walks what it names. The walk is ``Path.glob("**/*")``'s, read from the
    directory entries (:func:`_files_under`).
    """
    found: set[str] = set()
    names: list[str] = []
    for pattern in _patterns(patterns):
        head, _, name = pattern.rpartition("/")
        if head == "**" and name and "**" not in name:
            names.append(name)
        else:
            found.update(str(p) for p in root.glob(pattern) if p.is_file())
    if names:  # fnmatch.fnmatch's rule, the patterns joined into one expression
        named = re.compile("|".join(fnmatch.translate(os.path.normcase(name)) for name in names))
        # scandir(".") names its entries "./a.wav"; the glob, as every other pattern, "a.wav"
        cut = len(os.curdir + os.sep) if str(root) == os.curdir else 0
        found.update(path[cut:] for name, path in _files_under(str(root))
                     if named.match(os.path.normcase(name)))
    return sorted(found)


def _files_under(folder: str) -> Iterator[tuple[str, str]]:
    """Each file under ``folder`` (a link to a file too), as ``(name, path)``: the files
    ``Path(folder).glob("**/*")`` finds that ``is_file()``, read from ``os.scandir``'s entries (no
    ``stat`` and no ``Path`` per file). Like the glob, it does not descend into linked folders and
    skips the folders it may not read."""
    try:
        with os.scandir(folder) as entries:
            found = list(entries)
    except PermissionError:
        return
    for entry in found:
        try:
            if entry.is_dir():
                if not entry.is_symlink():
                    yield from _files_under(entry.path)
            elif entry.is_file():
                yield entry.name, entry.path
        except OSError:  # gone meanwhile, or a link that cannot be followed
            continue


def _list_remote_dir(url: str, patterns: Sequence[str], storage: Storage) -> Listing:
    base = url.rstrip("/")
    found: set[str] = set()
    for pattern in _patterns(patterns):
        found.update(storage.glob_urls(f"{base}/{pattern}"))
        if pattern.startswith("**/"):  # fsspec's ** may or may not match no folder at all: both, to be sure
            found.update(storage.glob_urls(f"{base}/{pattern[3:]}"))
    return Listing(table_of_paths(sorted(found)), f"{url!r} (patterns {list(patterns)})")


def _patterns(patterns: Sequence[str]) -> list[str]:
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise TypeError(f"patterns must be non-empty glob strings, got {pattern!r}")
    return patterns


class _RowResolver:
    """Resolves a manifest's path values one by one (a remote manifest's, confined to its bucket)."""

    def __init__(self, resolve: Callable[[str], str], hint: str = "") -> None:
        self.resolve = resolve
        self.hint = hint

    def table(self, name: str, values: Any, **columns: Any) -> ItemTable:
        paths = []
        for n, value in enumerate(values.to_pylist() if hasattr(values, "to_pylist") else values):
            try:
                paths.append(self.resolve(value))
            except ValueError as exc:  # a path leaving a remote manifest's bucket or host
                raise SourceError(f"manifest {name!r} row {n + 1}: {exc}{self.hint}") from exc
        return table_of_paths(paths, **columns)


class _FolderResolver:
    """Resolves a local manifest's path values against its folder, once per folder named: a relative
    value joins the manifest's folder, an absolute one stays, and pathlib spells both."""

    def __init__(self, manifest: Path) -> None:
        self.manifest = manifest

    def _beside(self, value: str) -> str:
        file = Path(value)
        return str(file if file.is_absolute() else self.manifest.parent / file)

    def table(self, name: str, values: Any, **columns: Any) -> ItemTable:
        folders, folder_of, rest = _split(values)
        last = rest.arrow()
        try:
            import pyarrow.compute as pc

            # A rest that pathlib drops or reads as a drive ("", ".", "C:x") is resolved row by row.
            odd = bool(pc.any(pc.or_(pc.is_in(last, value_set=_pa_binary(["", "."])),
                                     pc.match_substring(last, ":"))).as_py()) if os.name == "nt" else \
                bool(pc.any(pc.is_in(last, value_set=_pa_binary(["", "."]))).as_py())
        except ImportError:
            names = rest.tolist()
            odd = any(n in ("", ".") or (os.name == "nt" and ":" in n) for n in names)
        if odd:
            items = values.to_pylist() if hasattr(values, "to_pylist") else list(values)
            return table_of_paths([self._beside(v) for v in items], **columns)
        prefixes = [self._beside(folder + "x")[:-1] for folder in folders]
        return ItemTable(prefixes, folder_of, rest, **columns)


def _pa_binary(values: list[str]) -> Any:
    return Strings.from_strings(values).arrow()


# -- manifests ---------------------------------------------------------------------------------

def _manifest(name: str, data: Path | bytes, kind: str, path_column: str, resolver: Any) -> Listing:
    """The items of the manifest ``name`` (a local file, or a remote one's bytes) of ``kind``."""
    try:
        if kind == "parquet":
            columns, order = _read_parquet(name, data)
        elif kind == "jsonl":
            with _text(name, data) as f:
                columns, order = _read_jsonl(name, f)
        else:
            delimiter = "\t" if kind == "tsv" else ","
            found = _read_csv_arrow(name, data, delimiter)
            if found is None:
                with _text(name, data) as f:
                    found = _read_csv_rows(name, f, delimiter)
            columns, order = found
            del found  # the parsed columns go with ``columns`` below
    except OSError as exc:
        raise SourceError(f"cannot read manifest {name!r}: {exc}") from exc
    if path_column not in columns:
        raise SourceError(f"manifest {name!r} has no path column {path_column!r}; its columns are {order}")
    paths = columns.pop(path_column)
    table = resolver.table(name, _checked_paths(name, paths, path_column), columns=order,
                           fields={k: as_column(v) for k, v in columns.items()})
    del paths, columns
    release_arrow_memory()
    return Listing(table, f"manifest {name!r}")


def _text(name: str, data: Path | bytes) -> IO[str]:
    # utf-8-sig: the byte order mark that spreadsheet programs write is not part of the first column.
    try:
        if isinstance(data, Path):
            return open(data, newline="", encoding="utf-8-sig")
        return io.StringIO(data.decode("utf-8-sig"), newline="")
    except UnicodeDecodeError as exc:
        raise SourceError(f"cannot read manifest {name!r}: {exc}") from exc


def _checked_paths(name: str, paths: Any, path_column: str) -> Any:
    """The path column, each value a non-empty string without NUL (the C libraries would open the path
    cut at the NUL); a :class:`SourceError` naming the first row that is not."""
    bad: int | None = None
    try:
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(paths, (pa.Array, pa.ChunkedArray)):
            if pa.types.is_string(paths.type) or pa.types.is_large_string(paths.type):
                # Null or empty, or holding a NUL (a null reads False in arrow_bools: it is flagged).
                flagged = np.flatnonzero(~arrow_bools(pc.binary_length(paths).cast(pa.bool_()))
                                         | arrow_bools(pc.match_substring(paths, "\0")))
                if len(flagged) == 0:
                    return paths
                bad = int(flagged[0])
            paths = paths.to_pylist()
    except ImportError:
        pass
    for n, value in enumerate(paths):
        if bad is not None and n < bad:
            continue
        if not isinstance(value, str) or not value:
            raise SourceError(f"manifest {name!r} row {n + 1}: empty or missing {path_column!r}")
        if "\0" in value:
            raise SourceError(f"manifest {name!r} row {n + 1}: the path {value[:80]!r} holds a NUL character")
    return paths


def _read_csv_arrow(name: str, data: Path | bytes, delimiter: str) -> tuple[dict[str, Any], list[str]] | None:
    """A CSV or TSV manifest's columns, every value a string, read by pyarrow; ``None`` where pyarrow
    cannot read it as the ``csv`` module would (then the caller reads it with the ``csv`` module)."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pcsv
    except ImportError:
        return None
    try:
        with _text(name, data) as f:
            header = next(csv.reader(f, delimiter=delimiter), None)
    except (csv.Error, SourceError, UnicodeDecodeError):
        return None
    if not header or len(set(header)) != len(header):
        return None  # no rows, or a repeated name (DictReader keeps its last value)
    try:
        source = str(data) if isinstance(data, Path) else pa.BufferReader(data)
        table = pcsv.read_csv(
            source, read_options=pcsv.ReadOptions(use_threads=True),
            parse_options=pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
            convert_options=pcsv.ConvertOptions(column_types={c: pa.string() for c in header},
                                                strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.column_names != header:
        return None
    return {c: table.column(c) for c in header}, header


def _read_csv_rows(name: str, f: IO[str], delimiter: str) -> tuple[dict[str, Any], list[str]]:
    """A CSV or TSV manifest's columns read by the ``csv`` module: a missing cell is ``None`` and
    cells beyond the header are a list under the key ``None``, as ``csv.DictReader`` gives them."""
    try:
        reader = csv.DictReader(f, delimiter=delimiter)
        order = list(reader.fieldnames or [])
        rows = list(reader)
    except csv.Error as exc:
        raise SourceError(f"cannot read manifest {name!r}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise SourceError(f"cannot read manifest {name!r}: {exc}") from exc
    return _columns_of_rows(rows, order), order


def _read_jsonl(name: str, f: IO[str]) -> tuple[dict[str, Any], list[str]]:
    rows: list[dict[str, Any]] = []
    try:
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
    except UnicodeDecodeError as exc:
        raise SourceError(f"cannot read manifest {name!r}: {exc}") from exc
    order = list(dict.fromkeys(k for row in rows for k in row))
    return _columns_of_rows(rows, order), order


def _columns_of_rows(rows: list[dict[Any, Any]], order: list[Any]) -> dict[Any, list[Any]]:
    keys = list(dict.fromkeys([*order, *(k for row in rows for k in row)]))
    return {key: [row.get(key, ABSENT) for row in rows] for key in keys}


def _read_parquet(name: str, data: Path | bytes) -> tuple[dict[str, Any], list[str]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise SourceError(f"manifest {name!r}: reading Parquet needs pyarrow (pip install pyarrow)") from exc
    try:
        table = pq.read_table(str(data) if isinstance(data, Path) else pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"cannot read manifest {name!r}: {exc}") from exc
    order = list(table.column_names)
    return {c: table.column(c) for c in order}, order
