"""The options every loader shares, validated once: :class:`LoaderOptions`.

``BufferedDataset``, ``BatchSlotLoader``, ``IsolatedLoader`` and the YAML config all describe the same
pipeline (source, producers, buffer, order, errors, shards, stalls, batches by duration). Their keywords are this frozen
dataclass's fields, checked here and nowhere else, so a new loader adds no copy of them.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from ._checks import MAX_SECONDS, check_choice, check_int, check_seconds, short_repr

if TYPE_CHECKING:
    from .sources.source import LabelSpec

__all__ = ["DEFAULT_READ_BLOCK", "DEFAULT_WARN_AFTER", "ErrorPolicy", "EvenShards", "LoaderOptions", "ProducerCount",
           "ReadBlock", "check_keywords", "gil_enabled", "usable_cores"]

ErrorPolicy = Literal["raise", "warn", "skip"]
EvenShards = Literal["pad", "drop"] | None
#: ``num_producers``: a pinned count of threads, or ``"auto"`` (tuned as the epoch runs).
ProducerCount = int | Literal["auto"]
#: The most producer threads a loader accepts.
MAX_PRODUCERS = 1024
#: The largest buffer (items).
MAX_BUFFER = 1 << 20
#: Duration buckets when ``max_batch_seconds`` is set and ``buckets`` is not.
DEFAULT_BUCKETS = 10
#: ``read_block``: a pinned count of index members a request reads, ``"auto"`` or ``None`` (one a request).
ReadBlock = int | Literal["auto"] | None
#: ``read_block="auto"``'s members per request, for an index read from a URL (benchmarks/bench_storage.py).
DEFAULT_READ_BLOCK = 32
#: ``warn_after``'s default, in Python and YAML alike: a loop starved this long says so in the log.
DEFAULT_WARN_AFTER = 5.0


def usable_cores() -> int:
    """The cores this process may run on: Python's own count where it has one (3.13+:
    ``os.process_cpu_count``, the affinity where the OS tells it, and ``-X cpu_count``), else the
    affinity on Linux, else every core."""
    process_cpu_count = getattr(os, "process_cpu_count", None)
    if process_cpu_count is not None:
        count = process_cpu_count()
    elif sys.platform.startswith("linux"):
        count = len(os.sched_getaffinity(0))
    else:
        count = os.cpu_count()
    return count or os.cpu_count() or 1


def gil_enabled() -> bool:
    """Whether the GIL is enabled in this process (always, before Python 3.13's free-threaded build)."""
    return bool(getattr(sys, "_is_gil_enabled", lambda: True)())


@dataclass(frozen=True)
class LoaderOptions:
    """How a loader runs its pipeline; every field is one of ``BufferedDataset``'s keywords.

    ``num_producers=None`` is stored as ``"auto"``, so that a reader finds one spelling.

    Raises (on construction):
        TypeError: a value of the wrong type.
        ValueError: a value out of range, or an unknown choice.
    """

    num_producers: ProducerCount | None = "auto"  # None: "auto" too
    buffer_size: int = 64
    max_bytes: int | None = None
    shuffle: bool = False
    seed: int = 0
    ordered: bool = False
    on_error: ErrorPolicy = "raise"
    transform: Callable[[Any], Any] | None = None
    labels: LabelSpec = None
    patterns: Sequence[str] | None = None
    path_column: str = "path"
    rank: int | None = None
    world_size: int | None = None
    even_shards: EvenShards = "pad"
    warn_after: float | None = DEFAULT_WARN_AFTER
    timeout: float | None = None
    max_batch_seconds: float | None = None
    buckets: int | None = None
    max_batch_size: int | None = None
    duration_column: str | None = None
    start_column: str | None = None
    quadratic_duration: float | None = None
    sync_buckets: bool | None = None
    storage_options: Mapping[str, Any] | None = None
    read_block: ReadBlock = "auto"

    def __post_init__(self) -> None:
        if self.num_producers is None:
            object.__setattr__(self, "num_producers", "auto")  # frozen: the one place it is set
        if self.num_producers != "auto":
            check_int("num_producers", self.num_producers, 1, MAX_PRODUCERS, also="or 'auto'")
        check_int("buffer_size", self.buffer_size, 1, MAX_BUFFER)
        if self.max_bytes is not None:
            check_int("max_bytes", self.max_bytes, 1, also="or None")
        check_int("seed", self.seed, 0)  # numpy takes any integer >= 0
        for name in ("shuffle", "ordered"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        check_choice("on_error", self.on_error, ErrorPolicy)
        check_choice("even_shards", self.even_shards, EvenShards)
        if self.transform is not None and not callable(self.transform):
            raise TypeError(f"transform must be None or callable, got {self.transform!r}")
        if not isinstance(self.path_column, str):
            raise TypeError(f"path_column must be a string, got {self.path_column!r}")
        if (self.rank is None) != (self.world_size is None):
            raise ValueError(f"give rank and world_size together, got rank={self.rank!r}, "
                             f"world_size={self.world_size!r}")
        if self.world_size is not None:
            check_int("world_size", self.world_size, 1)
            check_int("rank", self.rank, 0, self.world_size - 1)
        for name in ("warn_after", "timeout"):
            check_seconds(name, getattr(self, name))  # None or float("inf"): never
        check_seconds("max_batch_seconds", self.max_batch_seconds, maximum=MAX_SECONDS)
        if self.buckets is not None:
            check_int("buckets", self.buckets, 1, also="or None")
        if self.max_batch_size is not None:
            check_int("max_batch_size", self.max_batch_size, 1, also="or None")
        check_seconds("quadratic_duration", self.quadratic_duration, maximum=MAX_SECONDS)
        if self.sync_buckets is not None and not isinstance(self.sync_buckets, bool):
            raise TypeError(f"sync_buckets must be True, False or None (with more than one rank), got "
                            f"{short_repr(self.sync_buckets)}")
        if self.duration_column is not None and not isinstance(self.duration_column, str):
            raise TypeError(f"duration_column must be a manifest column name or None, got "
                            f"{short_repr(self.duration_column)}")
        if self.start_column is not None and not isinstance(self.start_column, str):
            raise TypeError(f"start_column must be a manifest column name or None, got "
                            f"{short_repr(self.start_column)}")
        if self.max_batch_seconds is None:
            # duration_column also bounds the segments of start_column
            shaping = ("buckets", "max_batch_size", "quadratic_duration", "sync_buckets",
                       *(("duration_column",) if self.start_column is None else ()))
            given = [name for name in shaping if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} shape batches by duration: give max_batch_seconds too, "
                                 f"got {given[0]}={short_repr(getattr(self, given[0]))}")
        if self.read_block not in (None, "auto"):
            check_int("read_block", self.read_block, 1, also="or 'auto' or None")
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise TypeError(f"storage_options must be a mapping of fsspec options or None, got "
                            f"{self.storage_options!r}")

    def most_producers(self) -> int:
        """The most producer threads these options allow: the pinned count, or the usable cores for "auto"."""
        return usable_cores() if self.num_producers in (None, "auto") else int(self.num_producers)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names (the keywords a loader passes on to this class)."""
        return tuple(f.name for f in fields(cls))


def check_keywords(owner: str, keywords: Collection[str], own: Sequence[str]) -> None:
    """Refuse a keyword that is neither an option nor one of ``owner``'s ``own``, naming the closest ones.

    Raises:
        TypeError: ``IsolatedLoader got an unexpected keyword argument 'num_producer' (...); did you mean
            'num_producers'?``
    """
    known = LoaderOptions.names()
    for name in keywords:
        if name not in known:
            close = difflib.get_close_matches(name, [*known, *own], n=2)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise TypeError(f"{owner} got an unexpected keyword argument {name!r} (it takes BufferedDataset's "
                            f"keywords and {', '.join(own)}){hint}")
