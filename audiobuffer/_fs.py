"""The fsspec filesystems of remote URLs: built once per process and options, shared by all threads.

s3fs, gcsfs and fsspec's HTTP filesystem serve concurrent calls from their own event loop thread, so
requests from many producer threads overlap. fsspec is imported on first remote use.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["filesystem"]

_FS_LOCK = threading.Lock()
_FILESYSTEMS: dict[tuple[int, str, str], Any] = {}


def filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
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

