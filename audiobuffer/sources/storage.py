"""Reading files and objects wherever they live: local paths directly, URLs through fsspec.

Every remote access of audiobuffer goes through here: whole objects, byte ranges, sequential
streams, sizes and glob listings, retried as :class:`Retry` says, with the name rules of
:mod:`audiobuffer.sources.names` (both re-exported here). A source holds its fsspec options and
retry policy as one :class:`Storage` and reads through it. fsspec is imported on first remote use
(``pip install 'audiobuffer[remote]'``; gcsfs for ``gs://``).

Thread safety: every function may be called from any number of threads at once; a filesystem is
built once per process and options and shared (s3fs, gcsfs and fsspec's HTTP filesystem serve
concurrent calls from their own event loop thread, so requests from many producers overlap).
"""

from __future__ import annotations

import glob as _glob
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from ..errors import SourceError, StorageError
from .names import (
    GLOB_CHARS,
    MAX_EXPANSION,
    expand_braces,
    inside_bucket,
    inside_folder,
    is_url,
    sibling,
)
from .retry import Retry, RetrySpec, as_retry, is_transient
from .retry import where as _where
from .retry import with_retry as _with_retry

__all__ = [
    "StorageUser",
    "MAX_EXPANSION",
    "Retry",
    "RetrySpec",
    "STREAM_BLOCK",
    "Storage",
    "as_retry",
    "expand_braces",
    "expand_urls",
    "filesystem",
    "glob_urls",
    "inside_bucket",
    "inside_folder",
    "is_transient",
    "is_url",
    "open_stream",
    "read_bytes",
    "read_range",
    "sibling",
    "size",
]


#: What to install for the schemes audiobuffer's extras cover.
_PACKAGES = {"s3": "'audiobuffer[remote]'", "s3a": "'audiobuffer[remote]'", "http": "'audiobuffer[remote]'",
             "https": "'audiobuffer[remote]'", "gs": "'audiobuffer[gcs]'", "gcs": "'audiobuffer[gcs]'"}
_FS_LOCK = threading.Lock()
_FILESYSTEMS: dict[tuple[int, str, str, float | None], Any] = {}


def filesystem(url: str, storage_options: Mapping[str, Any] | None,
               timeout: float | None = None) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` with ``storage_options`` (built once per process) and its path.

    ``timeout``: seconds its requests wait to connect and for each part of an answer (``None``: the
    client's defaults).
    """
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a mapping of fsspec options or None, got {storage_options!r}")
    options = dict(storage_options or {})
    try:
        import fsspec
        import fsspec.core
    except ImportError as exc:
        raise StorageError(f"cannot read {url!r}: it needs fsspec, which is not installed; pip install "
                           f"'audiobuffer[remote]'", url=url) from exc
    protocol = url.split("://", 1)[0].lower()
    try:
        if "::" in url:  # a chained URL ("simplecache::s3://..."): fsspec's own parsing and cache
            return fsspec.core.url_to_fs(url, **options)
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        package = _PACKAGES.get(protocol, "the package fsspec names")
        why = " ".join(str(exc).split())  # one line
        raise StorageError(f"cannot read {url!r}: fsspec cannot read {protocol!r} URLs here ({why}); "
                           f"pip install {package}", url=url) from exc
    path = cls._strip_protocol(url)
    options = {**cls._get_kwargs_from_urls(url), **options}
    key = (os.getpid(), protocol, json.dumps(options, sort_keys=True, default=repr), timeout)
    with _FS_LOCK:
        fs = _FILESYSTEMS.get(key)
        if fs is None:
            fs = _FILESYSTEMS[key] = _make_filesystem(cls, protocol, options, timeout)
    return fs, path


def _make_filesystem(cls: Any, protocol: str, options: dict[str, Any], timeout: float | None) -> Any:
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        # audiobuffer's Retry replaces botocore's (``retries`` in config_kwargs keeps botocore's), so a
        # dead server is given up on after ``attempts`` tries, not the product of three retry layers
        config.setdefault("retries", {"total_max_attempts": 1})
        if timeout is not None:  # botocore's defaults: 60 s each
            config.setdefault("connect_timeout", timeout)
            config.setdefault("read_timeout", timeout)
        options = {**options, "config_kwargs": config}
    elif timeout is not None and protocol in ("http", "https"):
        import aiohttp  # fsspec's HTTP filesystem's client; its default is 300 s for the whole request

        client = dict(options.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout))
        options = {**options, "client_kwargs": client}
    elif timeout is not None and protocol in ("gs", "gcs"):
        import aiohttp  # gcsfs passes requests_timeout to each aiohttp request (None there: no timeout)

        options.setdefault("requests_timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout,
                                                                     sock_read=timeout))
    fs = cls(skip_instance_cache=True, **options)  # our own instance: its retry setting is ours to change
    if protocol in ("s3", "s3a"):
        fs.retries = 1  # s3fs's retry loop: one try, then audiobuffer's Retry decides
    return fs


#: Bytes per request of a remote sequential stream (:func:`open_stream`).
STREAM_BLOCK = 8 << 20


# -- the storage context ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Storage:
    """How a source reaches its files: fsspec options, the retry policy and its timeouts, as one value.

    Made once where a source is opened (:meth:`of`, from the ``storage_options=`` and ``retry=`` it
    was given) and passed down to every read it makes, so that each remote read has its options, its
    retries and its timeout. Immutable and picklable; its methods may be called from any thread.

    Attributes:
        options: options for the fsspec filesystem of URLs (``None``: none); unused for local paths.
        retry: how transient failures are retried, and each request's timeout (:class:`Retry`).

    Example:
        >>> Storage.of({"anon": True}, {"attempts": 3}).retry.attempts
        3
    """

    options: dict[str, Any] | None = None
    retry: Retry = Retry()

    @classmethod
    def of(cls, storage_options: Mapping[str, Any] | None = None, retry: RetrySpec = None) -> Storage:
        """The context of the options a source was given (``retry``: a :class:`Retry`, a mapping of
        its fields, or ``None`` for the defaults).

        Raises:
            TypeError: ``storage_options`` is not a mapping, or ``retry`` is none of those.
        """
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"storage_options must be a mapping of fsspec options or None, got "
                            f"{storage_options!r}")
        return cls(None if storage_options is None else dict(storage_options), as_retry(retry))

    @property
    def timeout(self) -> float | None:
        """Seconds a remote request waits to connect, and for each part of the answer."""
        return self.retry.timeout

    def filesystem(self, url: str) -> tuple[Any, str]:
        """The fsspec filesystem of ``url`` with these options and timeout (:func:`filesystem`), and
        its path."""
        return filesystem(url, self.options, self.retry.timeout)

    def read_bytes(self, url: str | os.PathLike[str], *, member: str | None = None) -> bytes:
        """The whole content of a file or object (:func:`read_bytes`)."""
        url = os.fspath(url)
        retry = self.retry
        if not is_url(url):
            return _with_retry(lambda: _read_local(url, 0, None), url=url, retry=retry, member=member)
        fs, path = self.filesystem(url)
        return _with_retry(lambda: fs.cat_file(path), url=url, retry=retry, member=member)

    def read_range(self, url: str | os.PathLike[str], offset: int, size: int, *,
                   member: str | None = None) -> bytes:
        """``size`` bytes of a file or object from byte ``offset`` (:func:`read_range`)."""
        url = os.fspath(url)
        if offset.__class__ is not int or size.__class__ is not int or offset < 0 or size < 0:
            _check_range(offset, size)  # once per member read: the plain test first, the errors apart
        if size == 0:
            return b""
        retry = self.retry
        if is_url(url):
            fs, path = self.filesystem(url)
            data = _with_retry(lambda: fs.cat_file(path, start=offset, end=offset + size), url=url,
                               retry=retry, member=member)
        else:
            data = _with_retry(lambda: _read_local(url, offset, size), url=url, retry=retry,
                               member=member)
        if len(data) > size:  # a whole object (or more than asked) for a ranged request
            raise StorageError(
                f"cannot read {_where(url, member)}: the server answered a request for bytes "
                f"{offset}..{offset + size} with {len(data)} bytes: it ignores HTTP range requests "
                f"(serve the data from a server or store that honours the Range header)",
                url=url, member=member)
        if len(data) != size:
            raise StorageError(
                f"{_where(url, member)} ends early: bytes {offset}..{offset + size} asked, "
                f"{len(data)} read (a truncated or replaced file)", url=url, member=member)
        return data

    def size(self, url: str | os.PathLike[str]) -> int:
        """The size in bytes of a file or object (:func:`size`)."""
        url = os.fspath(url)
        if not is_url(url):
            return _with_retry(lambda: os.stat(url).st_size, url=url, retry=self.retry)
        fs, path = self.filesystem(url)
        return int(_with_retry(lambda: fs.size(path), url=url, retry=self.retry))

    def open_stream(self, url: str | os.PathLike[str], *, block_size: int = STREAM_BLOCK) -> BinaryIO:
        """A binary file object that reads a file or object from start to end (:func:`open_stream`)."""
        url = os.fspath(url)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer of bytes, got {block_size!r}")
        if not is_url(url):
            return _with_retry(lambda: open(url, "rb"), url=url, retry=self.retry)
        # A duck-typed binary file: read, tell, close and ``with``, what tarfile's stream mode uses.
        return cast(BinaryIO, _RangeStream(self, url, self.size(url), block_size))

    def expand_urls(self, spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
        """The paths or URLs a brace pattern, a glob or a list of them names (:func:`expand_urls`)."""
        items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
        out: list[str] = []
        for item in items:
            if not isinstance(item, (str, os.PathLike)):
                raise TypeError(f"a shard list must hold paths or URLs, got {item!r}")
            for name in expand_braces(os.fspath(item)):
                if not GLOB_CHARS.search(name.split("://", 1)[-1]):
                    out.append(name)
                    continue
                matches = self.glob_urls(name)
                if not matches:
                    raise SourceError(f"{name!r} matches no file")
                out.extend(matches)
        return out

    def glob_urls(self, pattern: str) -> list[str]:
        """The files a glob pattern matches, sorted (:func:`glob_urls`)."""
        if not is_url(pattern):
            return sorted(p for p in _glob.glob(pattern, recursive=True) if os.path.isfile(p))
        fs, path = self.filesystem(pattern)
        protocol = pattern.split("://", 1)[0]
        try:
            found = _with_retry(lambda: fs.glob(path), url=pattern, retry=self.retry, action="list")
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
    return Storage.of(storage_options, retry).read_bytes(url, member=member)


def read_range(url: str | os.PathLike[str], offset: int, size: int, *,
               storage_options: Mapping[str, Any] | None = None, retry: RetrySpec = None,
               member: str | None = None) -> bytes:
    """``size`` bytes of a file or object from byte ``offset``: one ranged request for a URL.

    Raises:
        StorageError: the file is missing or forbidden, still failing after the retries, or shorter
            than ``offset + size`` (a truncated shard: the error names ``member``).
        ValueError: a negative ``offset`` or ``size``.
    """
    return Storage.of(storage_options, retry).read_range(url, offset, size, member=member)


def _check_range(offset: Any, size: Any) -> None:
    for name, value in (("offset", offset), ("size", size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an integer >= 0, got {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def size(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
         retry: RetrySpec = None) -> int:
    """The size in bytes of a file or object.

    Raises:
        StorageError: the file is missing or forbidden, or still failing after the retries.
    """
    return Storage.of(storage_options, retry).size(url)


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
    return Storage.of(storage_options, retry).open_stream(url, block_size=block_size)


class _RangeStream:
    """Sequential reads of a remote object through ranged requests of one block each."""

    def __init__(self, storage: Storage, url: str, total: int, block_size: int) -> None:
        self.url = url
        self.size = total
        self._storage = storage
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
                self._block = self._storage.read_range(self.url, self._next, length)
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
    if size is not None and _PREAD is not None:
        # A ranged read of a shard member: pread on a file this thread keeps open, a fraction of the
        # time of open, seek, read and close (which shows when a member is as small as a short WAV).
        fd = _open_local(path)
        parts = [_PREAD(fd, size, offset)]  # one pread, almost always
        got = len(parts[0])
        while got < size and parts[-1]:  # a short read: the rest, up to the end of the file
            parts.append(_PREAD(fd, size - got, offset + got))
            got += len(parts[-1])
        return parts[0] if len(parts) == 1 else b"".join(parts)
    with open(path, "rb") as f:
        if offset:
            f.seek(offset)
        return f.read() if size is None else f.read(size)


_PREAD = getattr(os, "pread", None)  # POSIX; Windows reads with open, seek and read
#: Local files each thread keeps open for ranged reads (the least recently used is closed past this).
OPEN_PER_THREAD = 32
_OPEN = threading.local()


def close_kept_files() -> None:
    """Close the local files this thread keeps open for ranged reads (it opens them anew when it next reads).

    Each epoch's pool calls it in the consumer's thread, which decodes inline and, unlike producer
    threads, outlives the epoch: a shard replaced between epochs is read anew, and the files of an
    epoch stay open no longer than the next one's start.
    """
    _OPEN.files = {}  # the descriptors close as their dict goes


def _open_local(path: str) -> int:
    """The descriptor of ``path``, kept open by this thread (closed with the thread, or by
    :func:`close_kept_files`).

    Per thread, so no thread closes a file another is reading. A shard replaced between epochs is
    read anew: producer threads last one epoch, and every pool closes the consumer thread's files as
    it is made (that thread decodes inline and lives on).
    """
    files: dict[str, _Descriptor] | None = getattr(_OPEN, "files", None)
    if files is None:
        files = _OPEN.files = {}
    kept = files.pop(path, None)
    if kept is None:
        kept = _Descriptor(os.open(path, os.O_RDONLY))
        if len(files) >= OPEN_PER_THREAD:
            del files[next(iter(files))]  # closed as it goes
    files[path] = kept  # most recently used last
    return kept.fd


class _Descriptor:
    """An open file descriptor, closed when dropped (by the LRU, or with its thread's local data)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        os.close(self.fd)


def expand_urls(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                storage_options: Mapping[str, Any] | None = None, retry: RetrySpec = None) -> list[str]:
    """The paths or URLs a brace pattern, a glob or a list of them names, in order.

    Braces expand first (:func:`expand_braces`); a name with glob characters (``*``, ``?``, ``[``)
    is then listed (sorted; through fsspec for a URL) and must match something. Names without glob
    characters are not checked for existence here: a missing one fails when it is read.

    Raises:
        SourceError: a glob that matches nothing, or a listing that failed (the cause chained).
    """
    return Storage.of(storage_options, retry).expand_urls(spec)


def glob_urls(pattern: str, *, storage_options: Mapping[str, Any] | None = None,
              retry: RetrySpec = None) -> list[str]:
    """The files a glob pattern (``**`` recurses) matches, sorted: local ones, or objects listed through fsspec.

    Unlike :func:`expand_urls`, no match is an empty list, not an error.

    Raises:
        SourceError: the listing failed (the cause chained).
    """
    return Storage.of(storage_options, retry).glob_urls(pattern)


class StorageUser:
    """A source that reads through a :class:`Storage` (``self.storage``), and the public names
    of its parts."""

    storage: Storage

    @property
    def storage_options(self) -> dict[str, Any] | None:
        """fsspec options for the URLs this source reads (``None``: none)."""
        return self.storage.options

    @property
    def retry(self) -> Retry:
        """How this source retries transient storage failures
        (:class:`~audiobuffer.sources.storage.Retry`)."""
        return self.storage.retry
