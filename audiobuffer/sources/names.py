"""Names of files and objects: URLs, brace patterns, and names relative to another file. No I/O.

:func:`expand_braces` turns ``shard-{000000..000011}.tar`` into twelve names; :func:`sibling` resolves a
name against the folder of a file or object, and :func:`inside_folder` and :func:`inside_bucket` do so
for names found in data, refusing those that leave the index's folder or the manifest's bucket.
:mod:`audiobuffer.sources.storage` re-exports the public names and lists globs.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import re
from typing import Any

__all__ = ["MAX_EXPANSION", "expand_braces", "inside_bucket", "inside_folder", "is_url",
           "sibling"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_BRACE_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
GLOB_CHARS = re.compile(r"[*?\[]")
#: The most names one brace pattern may expand to (a typo like {0..99999999} fails instead of filling memory).
MAX_EXPANSION = 1_000_000
#: The rules of local paths (``ntpath`` on Windows); tests swap in ``ntpath`` to check Windows' on Linux.
_LOCAL: Any = os.path


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL read through fsspec (``protocol://...`` or a ``::`` chain), not a local path."""
    return isinstance(path, str) and (bool(_URL.match(path)) or "::" in path)


def sibling(base: str, name: str) -> str:
    """``name`` resolved against the folder that holds ``base`` (a path or URL).

    An absolute ``name`` (a URL, or an absolute local path for a local ``base``) is returned as is;
    ``..`` steps up. For a URL ``base``, a ``name`` starting with ``/`` starts at the bucket or host.

    Example:
        >>> sibling("s3://bucket/fsdd/index.json", "shard-000000.tar")
        's3://bucket/fsdd/shard-000000.tar'
    """
    if is_url(name):
        return name
    if not is_url(base):
        if os.path.isabs(name):
            return name
        return os.path.normpath(os.path.join(os.path.dirname(base), name))
    scheme, rest = base.split("://", 1)
    root, _, key = rest.partition("/")
    if name.startswith("/"):
        joined = name.lstrip("/")
    else:
        joined = posixpath.join(posixpath.dirname(key), name.replace("\\", "/"))
    joined = posixpath.normpath(joined) if joined else ""
    if joined in (".", "") or joined.startswith(".."):
        raise ValueError(f"{name!r} relative to {base!r} leaves the bucket or host {root!r}")
    return f"{scheme}://{root}/{joined}"


def inside_folder(base: str, name: str) -> str:
    """``name`` resolved against the folder that holds ``base`` (a path or URL), which it must not leave.

    What an index names is confined so (an index is data, maybe from elsewhere): a relative name,
    subfolders allowed.

    Raises:
        ValueError: ``name`` is outside that folder: an absolute path (a drive or share on Windows), a
            URL of another scheme, bucket, host or folder, or a name that steps out with ``..``.
    """
    if is_url(base):
        scheme, root, key = _split_url(base)
        folder = f"{scheme}://{root}/{posixpath.dirname(key)}".rstrip("/")
        try:
            resolved = _resolve_url(base, name, scheme, root)
        except ValueError as exc:
            raise ValueError(f"{name!r} is outside the folder {folder!r}") from exc
        if name.startswith("/") or not resolved.startswith(folder + "/"):
            raise ValueError(f"{name!r} is outside the folder {folder!r}")
        return resolved
    path = _LOCAL
    folder = path.dirname(base)
    why = None
    relative = path.normpath(name)
    if is_url(name):
        why = "a URL"
    elif path.isabs(name) or path.splitdrive(name)[0] or name.startswith((path.sep, path.altsep or path.sep)):
        why = "an absolute path"
    elif relative == path.pardir or relative.startswith(path.pardir + path.sep):
        why = f"it steps out with {path.pardir!r}"
    elif relative == path.curdir:
        why = "the folder itself"
    if why is not None:
        raise ValueError(f"{name!r} is outside the folder {folder!r} ({why})")
    return path.normpath(path.join(folder, relative)) if folder else relative  # as sibling() spells it


def inside_bucket(base: str, name: str) -> str:
    """``name`` resolved as :func:`sibling` does against the URL ``base``, which must stay in its bucket or host.

    What a remote manifest names is confined so: relative names (``..`` included) and names starting
    with ``/`` resolve inside the bucket; a URL must have the same scheme and bucket or host.

    Raises:
        ValueError: ``name`` is a URL of another scheme, bucket or host, or steps out of the bucket.
    """
    scheme, root, _ = _split_url(base)
    return _resolve_url(base, name, scheme, root)


def _split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, bucket or host, key)`` of a URL (the scheme of a ``::`` chain is the whole chain)."""
    scheme, rest = url.split("://", 1) if "://" in url else (url, "")
    root, _, key = rest.partition("/")
    return scheme, root, key


def _resolve_url(base: str, name: str, scheme: str, root: str) -> str:
    if is_url(name):
        other, other_root, key = _split_url(name)
        if other.lower() != scheme.lower() or other_root != root:
            raise ValueError(f"{name!r} is outside the bucket or host {f'{scheme}://{root}'!r}")
        name = "/" + key
    return sibling(base, name)  # a ValueError for ".." out of the bucket


def expand_braces(pattern: str) -> list[str]:
    """Every name a brace pattern stands for, in order.

    ``{000..011}`` is a numeric range (bounds included, zero padding kept when a bound has a leading
    zero, descending when the first bound is larger), ``{a,b,c}`` a list (items may hold ranges and
    lists themselves); several groups give every combination, the last one varying fastest. A
    pattern without braces is itself.

    Example:
        >>> expand_braces("shard-{000..002}.tar")
        ['shard-000.tar', 'shard-001.tar', 'shard-002.tar']
        >>> expand_braces("{train,test}-{0..1}")
        ['train-0', 'train-1', 'test-0', 'test-1']

    Raises:
        TypeError: ``pattern`` is not a string.
        ValueError: unbalanced braces, an empty group, a range that is not numeric, or more than
            :data:`MAX_EXPANSION` names.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"a brace pattern must be a string, got {pattern!r}")
    names = _expand(pattern, pattern)
    return names


def _expand(text: str, pattern: str) -> list[str]:
    start = text.find("{")
    if start < 0:
        if "}" in text:
            raise ValueError(f"brace pattern {pattern!r} has a '}}' without its '{{'")
        return [text]
    if "}" in text[:start]:
        raise ValueError(f"brace pattern {pattern!r} has a '}}' without its '{{'")
    depth, end, commas = 0, -1, []
    for i in range(start, len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                end = i
                break
        elif char == "," and depth == 1:
            commas.append(i)
    if end < 0:
        raise ValueError(f"brace pattern {pattern!r} has a '{{' without its '}}'")
    body = text[start + 1:end]
    if commas:
        bounds = [start, *commas, end]
        choices: list[str] = []
        for a, b in zip(bounds, bounds[1:]):
            choices.extend(_expand(text[a + 1:b], pattern))
    else:
        match = _BRACE_RANGE.match(body)
        if match is None:
            raise ValueError(
                f"brace pattern {pattern!r}: {{{body}}} is neither a numeric range like {{000..011}} "
                f"nor a list like {{a,b}}")
        choices = _numeric_range(match.group(1), match.group(2), pattern)
    rest = _expand(text[end + 1:], pattern)
    if len(choices) * len(rest) > MAX_EXPANSION:
        raise ValueError(f"brace pattern {pattern!r} expands to more than {MAX_EXPANSION} names")
    prefix = text[:start]
    return [prefix + choice + tail for choice, tail in itertools.product(choices, rest)]


def _numeric_range(first: str, last: str, pattern: str) -> list[str]:
    lo, hi = int(first), int(last)
    if abs(hi - lo) + 1 > MAX_EXPANSION:
        raise ValueError(f"brace pattern {pattern!r} expands to more than {MAX_EXPANSION} names")
    padded = any(len(b.lstrip("-")) > 1 and b.lstrip("-").startswith("0") for b in (first, last))
    width = max(len(first), len(last)) if padded else 0
    step = 1 if hi >= lo else -1
    out = []
    for n in range(lo, hi + step, step):
        if width:
            digits = str(abs(n)).zfill(width - (n < 0))
            out.append(("-" if n < 0 else "") + digits)
        else:
            out.append(str(n))
    return out
