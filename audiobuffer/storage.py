"""Reading files and objects wherever they live: local paths directly, URLs through fsspec.

Every remote access of audiobuffer goes through this module: whole objects (:func:`read_bytes`),
byte ranges (:func:`read_range`, one request sized to the range), sequential streams
(:func:`open_stream`, read in blocks of ranged requests) and sizes (:func:`size`). A local path is
read with plain file I/O and needs no fsspec; a URL (``s3://``, ``gs://``, ``https://``, any
``protocol://`` fsspec knows) is read through an fsspec filesystem built from ``storage_options``
(``{"endpoint_url": ..., "key": ..., "secret": ...}`` for an S3-compatible server, say). fsspec is
imported on first remote use: ``pip install 'audiobuffer[remote]'`` brings it with s3fs; add gcsfs
for ``gs://``.

Names: :func:`expand_braces` turns ``shard-{000000..000011}.tar`` into twelve names (numeric ranges
keep zero padding; ``{a,b}`` lists; several groups multiply), :func:`expand_urls` adds globs
(``*``, ``?``, ``[...]``, listed through fsspec for URLs), and :func:`sibling` resolves a name
relative to the folder of a file or object (the shards of an index, the files of a remote manifest).

Failures (see :class:`Retry`). A transient failure (a timeout, a reset or refused connection, an
HTTP 5xx, 408 or 429) is retried with exponential backoff; when the attempts run out, a
:class:`~audiobuffer.StorageError` names the URL, the member of a shard when known, the attempts
and the last cause. A missing object or a refused access (404, 403) fails at once. For ``s3://``,
this policy replaces s3fs's and botocore's own retries (``retries`` in ``config_kwargs`` of the
storage options keeps botocore's), so a dead server is given up on after ``attempts`` tries, not
after the product of three retry layers.

Thread safety: every function may be called from any number of threads at once; filesystems are
built once per process and options, and shared (s3fs, gcsfs and fsspec's HTTP filesystem serve
concurrent calls from their own event loop thread, so requests from many producers overlap).
"""

from __future__ import annotations

import glob as _glob
import itertools
import json
import logging
import os
import posixpath
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar, cast

from .errors import SourceError, StorageError

__all__ = [
    "Retry",
    "RetrySpec",
    "as_retry",
    "expand_braces",
    "expand_urls",
    "is_transient",
    "is_url",
    "open_stream",
    "read_bytes",
    "read_range",
    "sibling",
    "size",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_BRACE_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_GLOB_CHARS = re.compile(r"[*?\[]")
#: The most names one brace pattern may expand to (a typo like {0..99999999} fails instead of filling memory).
MAX_EXPANSION = 1_000_000
#: Bytes per request of a remote sequential stream (:func:`open_stream`).
STREAM_BLOCK = 8 << 20


@dataclass(frozen=True)
class Retry:
    """How transient failures are retried: ``attempts`` tries, waits growing from ``base_delay``.

    The wait before try ``k + 1`` (``k`` = 1, 2, ...) is ``min(max_delay, base_delay * 2 ** (k - 1))``
    seconds: 0.25, 0.5, 1, 2 s by default, so a read that keeps failing gives up after about 4 s.

    Args:
        attempts: tries in all (1: no retry).
        base_delay: seconds to wait after the first failure.
        max_delay: the longest wait between two tries.

    Example:
        >>> Retry(attempts=3, base_delay=0.1).delay(2)
        0.2
    """

    attempts: int = 5
    base_delay: float = 0.25
    max_delay: float = 8.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"retry attempts must be an integer >= 1, got {self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(f"retry attempts must be an integer >= 1, got {self.attempts!r}")
        for name in ("base_delay", "max_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"retry {name} must be a number of seconds >= 0, got {value!r}")
            if not 0 <= value < float("inf"):
                raise ValueError(f"retry {name} must be a number of seconds >= 0, got {value!r}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failed try."""
        return min(self.max_delay, self.base_delay * 2 ** (failures - 1))


#: What the ``retry=`` options take: a :class:`Retry`, a mapping of its fields (from YAML), or ``None``.
RetrySpec = Retry | Mapping[str, Any] | None


def as_retry(retry: RetrySpec) -> Retry:
    """``retry`` as a :class:`Retry` (``None``: the defaults; a mapping: its fields)."""
    if retry is None:
        return _DEFAULT_RETRY
    if isinstance(retry, Retry):
        return retry
    if isinstance(retry, Mapping):
        unknown = set(retry) - {"attempts", "base_delay", "max_delay"}
        if unknown:
            raise ValueError(f"retry takes attempts, base_delay and max_delay, got unknown keys {sorted(unknown)}")
        return Retry(**retry)
    raise TypeError(f"retry must be a Retry, a mapping of its fields or None, got {retry!r}")


_DEFAULT_RETRY = Retry()


# -- names ---------------------------------------------------------------------------------------

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


def expand_urls(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                storage_options: Mapping[str, Any] | None = None, retry: RetrySpec = None) -> list[str]:
    """The paths or URLs a brace pattern, a glob or a list of them names, in order.

    Braces expand first (:func:`expand_braces`); a name with glob characters (``*``, ``?``, ``[``)
    is then listed (sorted; through fsspec for a URL) and must match something. Names without glob
    characters are not checked for existence here: a missing one fails when it is read.

    Raises:
        SourceError: a glob that matches nothing, or a listing that failed (the cause chained).
    """
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    out: list[str] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"a shard list must hold paths or URLs, got {item!r}")
        for name in expand_braces(os.fspath(item)):
            if not _GLOB_CHARS.search(name.split("://", 1)[-1]):
                out.append(name)
                continue
            matches = _glob_one(name, storage_options, retry)
            if not matches:
                raise SourceError(f"{name!r} matches no file")
            out.extend(matches)
    return out


def _glob_one(pattern: str, storage_options: Mapping[str, Any] | None, retry: RetrySpec) -> list[str]:
    if not is_url(pattern):
        return sorted(p for p in _glob.glob(pattern, recursive=True) if os.path.isfile(p))
    fs, path = _filesystem(pattern, storage_options)
    protocol = pattern.split("://", 1)[0]
    try:
        found = _with_retry(lambda: fs.glob(path), url=pattern, retry=retry, action="list")
    except StorageError as exc:
        raise SourceError(str(exc)) from exc
    prefix = f"{protocol}://"
    return sorted(p if is_url(p) else prefix + p.lstrip("/") for p in found)


# -- reading -------------------------------------------------------------------------------------

def read_bytes(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
               retry: RetrySpec = None, member: str | None = None) -> bytes:
    """The whole content of a file or object.

    Args:
        url: a local path or a URL.
        storage_options: options for the fsspec filesystem of a URL (ignored for local paths).
        retry: the retry policy for transient failures (:class:`Retry`).
        member: the shard member this read is for, named in errors.

    Raises:
        StorageError: the file is missing or forbidden, or still failing after the retries.
    """
    url = os.fspath(url)
    if not is_url(url):
        return _with_retry(lambda: _read_local(url, 0, None), url=url, retry=retry, member=member)
    fs, path = _filesystem(url, storage_options)
    return _with_retry(lambda: fs.cat_file(path), url=url, retry=retry, member=member)


def read_range(url: str | os.PathLike[str], offset: int, size: int, *,
               storage_options: Mapping[str, Any] | None = None, retry: RetrySpec = None,
               member: str | None = None) -> bytes:
    """``size`` bytes of a file or object from byte ``offset``: one ranged request for a URL.

    Raises:
        StorageError: the file is missing or forbidden, still failing after the retries, or shorter
            than ``offset + size`` (a truncated shard: the error names ``member``).
        ValueError: a negative ``offset`` or ``size``.
    """
    url = os.fspath(url)
    for name, value in (("offset", offset), ("size", size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an integer >= 0, got {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if size == 0:
        return b""
    if is_url(url):
        fs, path = _filesystem(url, storage_options)
        data = _with_retry(lambda: fs.cat_file(path, start=offset, end=offset + size), url=url,
                           retry=retry, member=member)
    else:
        data = _with_retry(lambda: _read_local(url, offset, size), url=url, retry=retry, member=member)
    if len(data) != size:
        raise StorageError(
            f"{_where(url, member)} ends early: bytes {offset}..{offset + size} asked, {len(data)} read "
            f"(a truncated or replaced file)", url=url, member=member)
    return data


def size(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
         retry: RetrySpec = None) -> int:
    """The size in bytes of a file or object.

    Raises:
        StorageError: the file is missing or forbidden, or still failing after the retries.
    """
    url = os.fspath(url)
    if not is_url(url):
        return _with_retry(lambda: os.stat(url).st_size, url=url, retry=retry)
    fs, path = _filesystem(url, storage_options)
    return int(_with_retry(lambda: fs.size(path), url=url, retry=retry))


def open_stream(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
                retry: RetrySpec = None, block_size: int = STREAM_BLOCK) -> BinaryIO:
    """A binary file object that reads a file or object from start to end.

    A local path is opened directly. A URL is read in ranged requests of ``block_size`` bytes, each
    retried on its own (:func:`read_range`), so a transient failure in the middle of a long shard
    costs one block, not the shard. Close it (or use ``with``) when done.

    Raises:
        StorageError: the file is missing or forbidden (at once), or a block still failing after
            the retries (from ``read``).
    """
    url = os.fspath(url)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer of bytes, got {block_size!r}")
    if not is_url(url):
        return _with_retry(lambda: open(url, "rb"), url=url, retry=retry)
    total = size(url, storage_options=storage_options, retry=retry)
    # A duck-typed binary file: read, tell, close and ``with``, what tarfile's stream mode uses.
    return cast(BinaryIO, _RangeStream(url, total, storage_options, retry, block_size))


class _RangeStream:
    """Sequential reads of a remote object through ranged requests of one block each."""

    def __init__(self, url: str, total: int, storage_options: Mapping[str, Any] | None, retry: RetrySpec,
                 block_size: int) -> None:
        self.url = url
        self.size = total
        self._options = storage_options
        self._retry = retry
        self._block_size = block_size
        self._block = b""
        self._block_pos = 0  # read position inside _block
        self._next = 0  # object offset of the byte after _block
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        if self.closed:
            raise ValueError(f"read of closed stream {self.url!r}")
        if n is None or n < 0:
            n = self.size
        parts = []
        while n > 0:
            if self._block_pos >= len(self._block):
                if self._next >= self.size:
                    break
                length = min(self._block_size, self.size - self._next)
                self._block = read_range(self.url, self._next, length, storage_options=self._options,
                                         retry=self._retry)
                self._block_pos = 0
                self._next += length
            take = self._block[self._block_pos:self._block_pos + n]
            self._block_pos += len(take)
            n -= len(take)
            parts.append(take)
        return b"".join(parts)

    def tell(self) -> int:
        return self._next - (len(self._block) - self._block_pos)

    def close(self) -> None:
        self.closed = True
        self._block = b""

    def __enter__(self) -> _RangeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_local(path: str, offset: int, size: int | None) -> bytes:
    with open(path, "rb") as f:
        if offset:
            f.seek(offset)
        return f.read() if size is None else f.read(size)


# -- filesystems ---------------------------------------------------------------------------------

_FS_LOCK = threading.Lock()
_FILESYSTEMS: dict[tuple[int, str, str], Any] = {}


def _filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` with ``storage_options`` (built once per process) and its path."""
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a mapping of fsspec options or None, got {storage_options!r}")
    options = dict(storage_options or {})
    try:
        import fsspec
        import fsspec.core
    except ImportError as exc:
        raise ImportError(f"reading {url!r} needs fsspec: pip install 'audiobuffer[remote]'") from exc
    if "::" in url:  # a chained URL ("simplecache::s3://..."): fsspec's own parsing and cache
        return fsspec.core.url_to_fs(url, **options)
    protocol = url.split("://", 1)[0].lower()
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        raise ImportError(f"reading {url!r} needs fsspec's {protocol!r} support ({exc}); "
                          f"pip install 'audiobuffer[remote]' (s3fs) or the package it names") from exc
    path = cls._strip_protocol(url)
    options = {**cls._get_kwargs_from_urls(url), **options}
    key = (os.getpid(), protocol, json.dumps(options, sort_keys=True, default=repr))
    with _FS_LOCK:
        fs = _FILESYSTEMS.get(key)
        if fs is None:
            fs = _FILESYSTEMS[key] = _make_filesystem(cls, protocol, options)
    return fs, path


def _make_filesystem(cls: Any, protocol: str, options: dict[str, Any]) -> Any:
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})  # audiobuffer's Retry replaces botocore's
        options = {**options, "config_kwargs": config}
    fs = cls(skip_instance_cache=True, **options)  # our own instance: its retry setting is ours to change
    if protocol in ("s3", "s3a"):
        fs.retries = 1  # s3fs's retry loop: one try, then audiobuffer's Retry decides
    return fs


# -- failures ------------------------------------------------------------------------------------

# Exception classes (by name, so that botocore and aiohttp need not be imported) whose failures a
# retry may cure: dropped, reset or refused connections, timeouts, bodies cut short.
_TRANSIENT_NAMES = frozenset({
    "HTTPClientError", "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
    "ConnectTimeoutError", "ProxyConnectionError", "ResponseStreamingError", "IncompleteReadError",
    "IncompleteRead", "ResponseParserError", "ClientConnectionError", "ClientPayloadError",
    "ServerDisconnectedError", "ServerTimeoutError", "FSTimeoutError",
})
_PERMANENT_OS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def _status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (botocore's ClientError, aiohttp's ClientResponseError)."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and 100 <= status < 600 else None


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_transient(exc: BaseException) -> bool:
    """Whether a failed read may succeed if tried again (timeouts, resets, HTTP 5xx/408/429)."""
    if isinstance(exc, _PERMANENT_OS):
        return False
    for link in _chain(exc):
        status = _status(link)
        if status is not None:
            return status >= 500 or status in (408, 429)
        if isinstance(link, _PERMANENT_OS):
            return False
        if isinstance(link, (ConnectionError, TimeoutError)):
            return True
        if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(link).__mro__):
            return True
    return False


def _where(url: str, member: str | None) -> str:
    return f"member {member!r} of {url!r}" if member else repr(url)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file or object"
    if isinstance(exc, PermissionError):
        return "access denied"
    status = next((s for s in map(_status, _chain(exc)) if s is not None), None)
    text = f"{type(exc).__name__}: {exc}"
    return f"HTTP {status} ({text})" if status is not None else text


def _with_retry(op: Callable[[], T], *, url: str, retry: RetrySpec, member: str | None = None,
                action: str = "read") -> T:
    """``op()``, tried again on transient failures as ``retry`` says; a :class:`StorageError` otherwise."""
    policy = as_retry(retry)
    started = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        try:
            return op()
        except StorageError:
            raise
        except Exception as exc:
            transient = is_transient(exc)
            if transient and attempt < policy.attempts:
                wait = policy.delay(attempt)
                logger.info("cannot %s %s (try %d of %d, retrying in %.2f s): %s", action,
                            _where(url, member), attempt, policy.attempts, wait, _reason(exc))
                time.sleep(wait)
                continue
            if transient:
                message = (f"cannot {action} {_where(url, member)}: {_reason(exc)}; gave up after "
                           f"{attempt} tries in {time.monotonic() - started:.1f} s (raise retry "
                           f"attempts or base_delay if the store is slow to recover)")
            else:
                message = f"cannot {action} {_where(url, member)}: {_reason(exc)}"
            raise StorageError(message, url=url, member=member, attempts=attempt,
                               transient=transient) from exc
    raise AssertionError("unreachable")  # the loop returns or raises
