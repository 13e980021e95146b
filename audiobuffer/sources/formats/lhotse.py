"""Lhotse manifests as sources, read without Lhotse: cuts, or recordings with their supervisions.

NOTE [ Lhotse manifests ]
=========================
Lhotse keeps a corpus as JSON lines (``.jsonl`` or ``.jsonl.gz``): a *recording* names an audio file
(``sources``) with its rate, length and channels; a *supervision* is an utterance in it (``start``,
``duration``, ``text``, ``speaker``, ``language``); a *cut* is the part of a recording a model trains on
(``start``, ``duration``, its ``recording``, its ``supervisions``). Each cut (or, given recordings and
supervisions, each supervision; given recordings alone, each recording) becomes one item: the recording's
file, the item's segment of it as ``(start, duration)`` in seconds, which :class:`~audiobuffer.AudioDecoder`
reads alone, and as fields the cut's ``id``, ``recording_id``, ``start``, ``duration`` and ``channel``
with the supervisions' ``text`` (joined by spaces when a cut holds several), ``speaker``, ``language``
and ``gender`` (the first supervision's), and the cut's ``custom`` keys. ``labels="speaker"`` and
``duration_column="duration"`` read them like any manifest's columns.

A recording's source of type ``file`` is a path (a relative path resolves against the manifest's folder
where the file is there, else against the current directory, as Lhotse opens it), ``url`` a URL read
through fsspec. A remote manifest's files must lie in its own
bucket or host (unless ``allow_outside``). Sources that run a command, live in memory or in Lhotse's own
shards, mixed and padded cuts, a cut of some of the channels of a multi-channel recording and a cut
or supervision of duration 0 are refused with a :class:`~audiobuffer.SourceError` that names the
line and what it holds. A cut that runs past the end of its recording's file by up to 0.5 s is
padded to its duration by reflection, as Lhotse's ``load_audio()`` pads it; further, it fails when
it is decoded (``SEGMENT_PAD_SECONDS`` in ``decoders/audio.py``).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from ...errors import SourceError
from ..storage import Storage, inside_bucket, is_url, sibling

__all__ = ["LhotseListing", "is_lhotse", "read_lhotse"]

_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson")


class LhotseListing(NamedTuple):
    """What a Lhotse manifest lists: one file, fields and segment per item."""

    paths: list[str]
    fields: list[dict[str, Any]]
    segments: list[tuple[float, float | None]]
    description: str


def _kind(record: Any) -> str | None:
    """``"cut"``, ``"recording"``, ``"supervision"`` for a Lhotse manifest's record, else ``None``."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("type"), str) and record["type"].endswith("Cut"):
        return "cut"
    if "recording" in record and "start" in record and "duration" in record:
        return "cut"
    if "sources" in record and "sampling_rate" in record:
        return "recording"
    if "recording_id" in record and "start" in record and "duration" in record:
        return "supervision"
    return None


def _lines(url: str, storage: Storage) -> Iterator[tuple[int, Any]]:
    """``(line number, record)`` of a JSON-lines file, gzipped or not, local or remote."""
    try:
        data = storage.read_bytes(url)
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        text = data.decode("utf-8-sig")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read Lhotse manifest {url!r}: {exc}") from exc
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise SourceError(f"Lhotse manifest {url!r} line {lineno}: invalid JSON ({exc})") from exc
        except RecursionError as exc:
            raise SourceError(f"Lhotse manifest {url!r} line {lineno}: JSON nested too deeply") from exc


def is_lhotse(spec: Any) -> bool:
    """Whether ``spec`` names a Lhotse manifest (or a list of them): JSON lines whose first record is a cut,
    a recording or a supervision. Only a local file's first line is read; a URL counts by its name
    (``.jsonl.gz``) alone."""
    specs = [spec] if isinstance(spec, (str, os.PathLike)) else spec
    if not isinstance(specs, Sequence) or not specs or not all(isinstance(s, (str, os.PathLike)) for s in specs):
        return False
    for s in specs:
        name = os.fspath(s)
        if not name.lower().endswith(_SUFFIXES):
            return False
        if is_url(name):
            if not name.lower().endswith(".jsonl.gz"):
                return False
            continue
        try:
            opener: Callable[..., Any] = gzip.open if name.lower().endswith(".gz") else open
            with opener(name, "rt", encoding="utf-8-sig") as f:
                first = next((line for line in f if line.strip()), "")
            if _kind(json.loads(first)) is None:
                return False
        except (OSError, EOFError, UnicodeDecodeError, ValueError, RecursionError):
            return False
    return True


def read_lhotse(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                storage: Storage, allow_outside: bool = False) -> LhotseListing:
    """The items of a Lhotse manifest (read through ``storage``): a cuts manifest, a recordings
    manifest, or recordings and supervisions (two manifests, in either order). See NOTE [ Lhotse
    manifests ].

    Raises:
        SourceError: a manifest cannot be read, is not Lhotse's, or holds what cannot be read as an item.
        StorageError: a remote manifest cannot be read.
    """
    urls = [os.fspath(spec)] if isinstance(spec, (str, os.PathLike)) else [os.fspath(s) for s in spec]
    by_kind: dict[str, list[tuple[str, int, dict[str, Any]]]] = {}
    for url in urls:
        for lineno, record in _lines(url, storage):
            kind = _kind(record)
            if kind is None:
                raise SourceError(f"Lhotse manifest {url!r} line {lineno}: not a cut, recording or supervision "
                                  f"(keys {sorted(record)[:8] if isinstance(record, dict) else type(record).__name__})")
            by_kind.setdefault(kind, []).append((url, lineno, record))
    if "cut" in by_kind:
        if len(by_kind) > 1:
            raise SourceError(f"Lhotse manifests {urls}: give a cuts manifest alone, or recordings with supervisions")
        items = [_cut(url, lineno, rec, allow_outside) for url, lineno, rec in by_kind["cut"]]
        what = "cuts"
    elif "recording" in by_kind:
        recordings = {rec.get("id"): (url, lineno, rec) for url, lineno, rec in by_kind["recording"]}
        if "supervision" in by_kind:
            items = []
            for url, lineno, sup in by_kind["supervision"]:
                found = recordings.get(sup.get("recording_id"))
                if found is None:
                    raise SourceError(f"Lhotse manifest {url!r} line {lineno}: supervision {sup.get('id')!r} names "
                                      f"recording {sup.get('recording_id')!r}, which no recordings manifest lists")
                start = _number(sup, "start", url, lineno)
                duration = _duration(sup, "supervision", url, lineno)
                items.append(_item(found, start, duration, sup.get("channel"), [sup],
                                   {"id": sup.get("id")}, allow_outside))
            what = "supervisions"
        else:
            items = [_item(found, 0.0, None, None, [], {"id": found[2].get("id")}, allow_outside)
                     for found in recordings.values()]
            what = "recordings"
    else:
        raise SourceError(f"Lhotse manifests {urls}: supervisions need the recordings manifest beside them")
    if not items:
        raise SourceError(f"Lhotse manifest {urls[0]!r} lists nothing")
    paths, fields, segments = (list(column) for column in zip(*items))
    return LhotseListing(paths, fields, segments, f"Lhotse {what} {urls[0]!r}" + (" ..." if len(urls) > 1 else ""))


def _number(record: Mapping[str, Any], key: str, url: str, lineno: int) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise SourceError(f"Lhotse manifest {url!r} line {lineno}: {key} {value!r} is not a number of seconds >= 0")
    return float(value)


def _duration(record: Mapping[str, Any], what: str, url: str, lineno: int) -> float:
    """A cut's or supervision's duration: a number of seconds > 0."""
    value = _number(record, "duration", url, lineno)
    if value == 0:
        raise SourceError(f"Lhotse manifest {url!r} line {lineno}: {what} {record.get('id')!r} has "
                          f"duration 0: it holds no audio; drop it from the manifest")
    return value


def _cut(url: str, lineno: int, cut: dict[str, Any],
         allow_outside: bool) -> tuple[str, dict[str, Any], tuple[float, float | None]]:
    if cut.get("type") not in (None, "MonoCut", "MultiCut", "DataCut"):
        raise SourceError(f"Lhotse manifest {url!r} line {lineno}: a {cut.get('type')} (cut {cut.get('id')!r}) "
                          f"is not read: give the cuts of recordings (MonoCut)")
    recording = cut.get("recording")
    if not isinstance(recording, dict):
        raise SourceError(f"Lhotse manifest {url!r} line {lineno}: cut {cut.get('id')!r} has no recording")
    supervisions = [s for s in cut.get("supervisions") or [] if isinstance(s, dict)]
    custom = cut.get("custom")
    extra = {"id": cut.get("id"), **(custom if isinstance(custom, dict) else {})}
    start, duration = _number(cut, "start", url, lineno), _duration(cut, "cut", url, lineno)
    return _item((url, lineno, recording), start, duration, cut.get("channel"), supervisions, extra,
                 allow_outside)


def _item(found: tuple[str, int, dict[str, Any]], start: float, duration: float | None, channel: Any,
          supervisions: list[dict[str, Any]], extra: dict[str, Any],
          allow_outside: bool) -> tuple[str, dict[str, Any], tuple[float, float | None]]:
    url, lineno, recording = found
    path = _recording_path(url, lineno, recording, allow_outside)
    channels = recording.get("channel_ids")
    if isinstance(channels, list) and len(channels) > 1 and channel is not None:
        chosen = channel if isinstance(channel, list) else [channel]
        if sorted(chosen) != sorted(channels):
            raise SourceError(f"Lhotse manifest {url!r} line {lineno}: {extra.get('id')!r} takes channels {chosen} of "
                              f"recording {recording.get('id')!r}, which has {channels}: only cuts of every "
                              f"channel are read (AudioDecoder mixes or keeps them all)")
    fields: dict[str, Any] = {"recording_id": recording.get("id"), "start": start,
                              "duration": duration if duration is not None else recording.get("duration"),
                              "channel": channel, **extra}
    texts = [s["text"] for s in supervisions if isinstance(s.get("text"), str)]
    if texts:
        fields["text"] = " ".join(texts)
    for key in ("speaker", "language", "gender"):
        value = next((s[key] for s in supervisions if s.get(key) is not None), None)
        if value is not None:
            fields[key] = value
    return path, fields, (start, duration)


def _recording_path(url: str, lineno: int, recording: dict[str, Any], allow_outside: bool) -> str:
    sources = recording.get("sources")
    source = sources[0] if isinstance(sources, list) and sources and isinstance(sources[0], dict) else None
    kind = source.get("type") if source else None
    value = source.get("source") if source else None
    where = f"Lhotse manifest {url!r} line {lineno}: recording {recording.get('id')!r}"
    if isinstance(sources, list) and len(sources) > 1:
        raise SourceError(f"{where} has {len(sources)} sources (a file per channel): only one file per "
                          f"recording is read")
    if kind not in ("file", "url") or not isinstance(value, str) or not value or "\0" in value:
        raise SourceError(f"{where} has a source of type {kind!r}: only files and URLs are read (never a "
                          f"command, never Lhotse's own shards or memory)")
    if is_url(url):
        try:
            return sibling(url, value) if allow_outside else inside_bucket(url, value)
        except ValueError as exc:
            raise SourceError(f"{where}: {exc}; pass allow_outside=True to Source to read files elsewhere") from exc
    if kind == "url" or is_url(value) or os.path.isabs(value):
        return value
    beside = os.path.join(os.path.dirname(url), value)
    # Lhotse opens a relative path from the current directory; a manifest kept beside its audio means
    # its own folder: that, where the file is there
    return beside if os.path.exists(beside) or not os.path.exists(value) else value
