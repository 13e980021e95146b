"""The fsspec filesystems of remote URLs: built once per process, options and timeout, shared by all threads.

s3fs, gcsfs and fsspec's HTTP filesystem serve concurrent calls from their own event loop thread, so
requests from many producer threads overlap. fsspec is imported on first remote use. Each is built
with audiobuffer's retry policy in place of its client's own, and with the socket timeouts of
:attr:`~audiobuffer.sources.storage.Retry.timeout` where the options set none.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import StorageError

__all__ = ["filesystem"]

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
        config.setdefault("retries", {"total_max_attempts": 1})  # audiobuffer's Retry replaces botocore's
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

