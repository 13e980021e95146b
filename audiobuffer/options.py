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
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from ._checks import (
    MAX_SECONDS,
    MAX_SEED,
    check_budgets,
    check_choice,
    check_int,
    check_seconds,
    short_repr,
)

if TYPE_CHECKING:
    from .sources.source import LabelSpec

__all__ = ["DEFAULT_READ_BLOCK", "DEFAULT_WARN_AFTER", "OPTIONS", "BatchSeconds", "ErrorPolicy", "EvenShards",
           "LoaderOptions", "Option", "ProducerCount", "ReadBlock", "check_keywords", "gil_enabled",
           "usable_cores"]

ErrorPolicy = Literal["raise", "warn", "skip"]
EvenShards = Literal["pad", "drop"] | None
#: ``num_producers``: a pinned count of threads, or ``"auto"`` (tuned as the epoch runs).
ProducerCount = int | Literal["auto"]
#: ``max_batch_seconds``: one budget for every bucket, one per bucket (shortest first), or a mapping
#: from each bucket's upper edge in seconds to its budget (fixed buckets).
BatchSeconds = float | Sequence[float] | Mapping[float, float]
#: The most producer threads a loader accepts.
MAX_PRODUCERS = 1024
#: The largest buffer (items).
MAX_BUFFER = 1 << 20
#: The largest batch: a bigger one only allocates (or spins) until memory runs out.
MAX_BATCH_SIZE = 1 << 20
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
class Option:
    """One option's rule, written once: what it takes, its YAML key and a line of documentation.

    The loaders' checks (:meth:`check`), the YAML schema's bounds (``config/schema.py``'s
    ``option_field``) and the reference's descriptions all read this.

    Attributes:
        doc: what the option does, in one line.
        yaml: its key in a YAML pipeline (``"buffer.num_producers"``); ``None``: Python only.
        kind: ``"int"`` (an integer in [minimum, maximum]), ``"seconds"`` (a number of seconds > 0, at
            most ``maximum``; without one, ``float("inf")`` means never), ``"budgets"`` (seconds, a
            list of seconds or a mapping of edges to seconds: ``_checks.check_budgets``), ``"bool"``,
            ``"choice"`` (one of the field's ``Literal`` values), ``"str"`` (a name), or ``"other"``
            (checked by hand below).
        minimum: the least integer (``"int"``).
        maximum: the largest integer or number of seconds, or ``None``.
        nullable: ``None`` is a value of its own (``max_bytes=None``: no byte bound).
        auto: ``"auto"`` is a value too.
        literal: the ``Literal`` type of a ``"choice"``.
        takes: the message's words for what else an ``"int"`` takes (``"or 'auto'"``), or for what a
            ``"str"`` is (``"a manifest column name or None"``).
    """

    doc: str
    yaml: str | None = None
    kind: Literal["int", "seconds", "budgets", "bool", "choice", "str", "other"] = "other"
    minimum: int | None = None
    maximum: float | None = None
    nullable: bool = False
    auto: bool = False
    literal: Any = None
    takes: str = ""

    def check(self, name: str, value: Any) -> None:
        """Refuse a value this option does not take.

        Raises:
            TypeError: a value of the wrong type.
            ValueError: a value out of range, or not one of the choices.
        """
        if (value is None and self.nullable) or (self.auto and isinstance(value, str) and value == "auto"):
            return
        if self.kind == "int":
            maximum = None if self.maximum is None else int(self.maximum)
            check_int(name, value, self.minimum, maximum, also=self.takes)
        elif self.kind == "seconds":
            check_seconds(name, value, maximum=self.maximum)
        elif self.kind == "budgets":
            check_budgets(name, value, maximum=self.maximum)
        elif self.kind == "bool" and not isinstance(value, bool):
            allowed = "True, False or None" if self.nullable else "True or False"
            raise TypeError(f"{name} must be {allowed}, got {short_repr(value)}")
        elif self.kind == "choice":
            check_choice(name, value, self.literal)
        elif self.kind == "str" and not isinstance(value, str):
            raise TypeError(f"{name} must be {self.takes}, got {short_repr(value)}")


def _option(default: Any, doc: str, **rule: Any) -> Any:
    """A ``LoaderOptions`` field: its default and its :class:`Option` rule."""
    return field(default=default, metadata={"option": Option(doc, **rule)})


@dataclass(frozen=True)
class LoaderOptions:
    """How a loader runs its pipeline; every field is one of ``BufferedDataset``'s keywords.

    Each field's rule (:class:`Option`: bounds, YAML key, one-line doc) is written once, in its
    metadata; :data:`OPTIONS` maps each name to it. ``num_producers=None`` is stored as ``"auto"``,
    so that a reader finds one spelling.

    Raises (on construction):
        TypeError: a value of the wrong type.
        ValueError: a value out of range, or an unknown choice.
    """

    num_producers: ProducerCount | None = _option(
        "auto", "Decoding threads per epoch, or 'auto' (tuned as the epoch runs).",
        yaml="buffer.num_producers", kind="int", minimum=1, maximum=MAX_PRODUCERS, auto=True, nullable=True,
        takes="or 'auto'")
    buffer_size: int = _option(64, "The most samples decoded ahead (the buffer's capacity).",
                               yaml="buffer.buffer_size", kind="int", minimum=1, maximum=MAX_BUFFER)
    max_bytes: int | None = _option(None, "Also bound the buffer by payload bytes (None: no byte bound).",
                                    yaml="buffer.max_bytes", kind="int", minimum=1, nullable=True,
                                    takes="or None")
    shuffle: bool = _option(False, "Shuffle the items each epoch (seeded by seed + epoch).",
                            yaml="loader.shuffle", kind="bool")
    seed: int = _option(0, "The base seed of shuffles and random draws.", yaml="seed", kind="int", minimum=0,
                        maximum=MAX_SEED)
    ordered: bool = _option(False, "Yield in the epoch's order rather than as decoded.", yaml="buffer.ordered",
                            kind="bool")
    on_error: ErrorPolicy = _option("raise", "What a failed item does: raise, warn (then skip) or skip.",
                                    yaml="buffer.on_error", kind="choice", literal=ErrorPolicy)
    transform: Callable[[Any], Any] | None = _option(None, "A callable applied to each sample in the producers.")
    labels: LabelSpec = _option(None, "Where labels come from (see Source).", yaml="source.labels")
    patterns: Sequence[str] | None = _option(None, "Glob patterns of a directory source.", yaml="source.patterns")
    path_column: str = _option("path", "The path column of a manifest.", yaml="source.path_column",
                               kind="str", takes="a string")
    rank: int | None = _option(None, "This process's rank; with world_size, overrides torch.distributed.",
                               kind="int", minimum=0, nullable=True,
                               takes="or None")
    world_size: int | None = _option(None, "The number of ranks.", kind="int", minimum=1, nullable=True,
                                     takes="or None")
    even_shards: EvenShards = _option("pad", "Equal items per rank: pad, drop, or None (ranks differ by one).",
                                      yaml="buffer.even_shards", kind="choice", literal=EvenShards)
    warn_after: float | None = _option(
        DEFAULT_WARN_AFTER, "Log a warning when the loop has waited this many seconds (None, inf: never).",
        yaml="buffer.warn_after", kind="seconds", nullable=True)
    timeout: float | None = _option(
        None, "Raise StallError when no sample arrives for this many seconds (None, inf: never).",
        yaml="buffer.timeout", kind="seconds", nullable=True)
    max_batch_seconds: BatchSeconds | None = _option(
        None, "Batch by duration: each batch's padded length within this many seconds (or one per "
        "bucket).",
        yaml="loader.max_batch_seconds", kind="budgets", maximum=MAX_SECONDS, nullable=True)
    buckets: int | None = _option(None, "Duration buckets batches are cut from (default 10).",
                                  yaml="loader.buckets", kind="int", minimum=1, nullable=True,
                                  takes="or None")
    max_batch_size: int | None = _option(None, "Also at most this many samples in a batch.",
                                         yaml="loader.max_batch_size", kind="int", minimum=1,
                                         maximum=MAX_BATCH_SIZE, nullable=True, takes="or None")
    duration_column: str | None = _option(None, "A manifest column of each item's duration in seconds.",
                                          yaml="source.duration_column", kind="str", nullable=True,
                                          takes="a manifest column name or None")
    start_column: str | None = _option(None, "A manifest column of where each item starts in its file.",
                                       yaml="source.start_column", kind="str", nullable=True,
                                       takes="a manifest column name or None")
    quadratic_duration: float | None = _option(
        None, "A batch costs n x (L + L*L / quadratic_duration) seconds (attention models).",
        yaml="loader.quadratic_duration", kind="seconds", maximum=MAX_SECONDS, nullable=True)
    sync_buckets: bool | None = _option(None, "Ranks take each step's batches from one bucket (None: with ranks).",
                                        yaml="loader.sync_buckets", kind="bool", nullable=True)
    storage_options: Mapping[str, Any] | None = _option(
        None, "fsspec options of the URLs read (endpoint_url, key, secret, ...).", yaml="source.storage_options")
    read_block: ReadBlock = _option("auto", "Index members read a request: a count, 'auto' or None (one).",
                                    yaml="loader.read_block", kind="int", minimum=1, auto=True, nullable=True,
                                    takes="or 'auto' or None")
    blas_threads: int | None = _option(
        1, "BLAS threads (numpy, scipy) while producers run, restored after (None: leave them).",
        yaml="buffer.blas_threads", kind="int", minimum=1, maximum=MAX_PRODUCERS, nullable=True,
        takes="or None")

    def __post_init__(self) -> None:
        if self.num_producers is None:
            object.__setattr__(self, "num_producers", "auto")  # frozen: the one place it is set
        for name, rule in OPTIONS.items():
            rule.check(name, getattr(self, name))
        if self.transform is not None and not callable(self.transform):
            raise TypeError(f"transform must be None or callable, got {short_repr(self.transform)}")
        if (self.rank is None) != (self.world_size is None):
            raise ValueError(f"give rank and world_size together, got rank={self.rank!r}, "
                             f"world_size={self.world_size!r}")
        if self.world_size is not None:
            check_int("rank", self.rank, 0, self.world_size - 1)
        per_bucket = check_budgets("max_batch_seconds", self.max_batch_seconds) \
            if self.max_batch_seconds is not None else None
        if per_bucket is not None and self.buckets is not None and self.buckets != per_bucket:
            raise ValueError(f"max_batch_seconds gives {per_bucket} budgets (one per bucket) but "
                             f"buckets={self.buckets}: give as many budgets as buckets, or leave "
                             f"buckets out")
        if self.max_batch_seconds is None:
            # duration_column also bounds the segments of start_column
            shaping = ("buckets", "max_batch_size", "quadratic_duration", "sync_buckets",
                       *(("duration_column",) if self.start_column is None else ()))
            given = [name for name in shaping if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} shape batches by duration: give max_batch_seconds too, "
                                 f"got {given[0]}={short_repr(getattr(self, given[0]))}")
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise TypeError(f"storage_options must be a mapping of fsspec options or None, got "
                            f"{short_repr(self.storage_options)}")

    def most_producers(self) -> int:
        """The most producer threads these options allow: the pinned count, or the usable cores for "auto"."""
        return usable_cores() if self.num_producers in (None, "auto") else int(self.num_producers)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names (the keywords a loader passes on to this class)."""
        return tuple(f.name for f in fields(cls))


#: Each option's rule, by name, in the order of ``LoaderOptions``' fields.
OPTIONS: Mapping[str, Option] = {f.name: f.metadata["option"] for f in fields(LoaderOptions)}


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
