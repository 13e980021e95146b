"""A Ray Data bridge: :func:`read` makes one epoch of a pipeline a ``ray.data.Dataset`` whose blocks
audiobuffer's sources and decoders decode in Ray's workers, on any node of a Ray cluster.

Ray is an optional extra (``pip install "audiobuffer[ray]"``); nothing else in the package imports
this module. :class:`PadCollate` and :class:`BatchCollate` turn its rows into tensor batches for
``Dataset.iter_torch_batches``.

NOTE [ Ray epochs ]
===================
Plan. The driver builds the pipeline (lists the source; with ``max_batch_seconds`` reads the
durations) and lays out one shard of one epoch (``Pipeline.lay_out``), as a loader's epoch starts.
The layout is cut into blocks of consecutive units (samples, or whole batches by duration); the
dataset starts as the blocks' bounds (``ray.data.from_items``), one row and one Ray block each.

Spec. What a worker needs goes into Ray's object store once (``ray.put`` of a :class:`_Spec`): the
pipeline as the isolated loader's helper gets it (the source listed, no durations: the batches are
in the layout), the shard and its layout. Tasks carry the reference only; a worker process
unpickles a spec once and keeps the last few (:data:`_KEPT_SPECS`).

Decode. A task runs the engine over its block's slice of the layout (``set_up_epoch`` with that
layout, the consumer and its error policy as in process), so every random draw is the same
function of seed, epoch and item as in the other loaders, and each work item keeps its place
(``seq``) in the full epoch. A failed item raises, warns or is skipped per ``on_error``; a warning
is logged in the worker, whose output Ray forwards to the driver.

Rows. Samples: a row per sample, arrays as numpy. Batches by duration: a row per batch, its samples
collated and padded on ``key`` (``collate_numpy``): each row a whole batch as audiobuffer planned
it; a batch whose samples all failed has no row.

Exactly once. Each unit is in one block and each block is decoded by one task, so each item is in
the dataset once per epoch (per shard, with ``rank`` and ``world_size``). ``ordered=True`` keeps the
plan's order (an ordered pool in each task and Ray's ``preserve_order``), and so do ranks in step
(their batches by duration: each task's assembler, and ``preserve_order``, NOTE [ Ranks in step ]
in ``engine/plan.py``); otherwise blocks, and the samples within them, come as they are decoded.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import numbers
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import pyarrow
    import pyarrow.compute
    import ray
    import ray.data
    from ray.data.block import BlockAccessor
    from ray.data.collate_fn import ArrowBatchCollateFn
except ImportError as exc:  # pragma: no cover - where the extra is installed
    raise ImportError(f"audiobuffer.ray cannot import Ray Data ({exc}); it needs ray[data] 2.47 "
                      f"or later: pip install 'audiobuffer[ray]'") from exc

from ._checks import check_int, short_repr
from ._numpy_collate import collate_numpy
from .decoders._common import numpy_output
from .engine.epoch import BatchEpochRun, EpochRun, set_up_epoch
from .engine.pipeline import EpochLayout, Pipeline
from .engine.plan import EpochShard
from .options import LoaderOptions, check_keywords
from .sources.source import Source, SourceSpec, WorkItem

if TYPE_CHECKING:
    import torch

__all__ = ["BatchCollate", "PadCollate", "read"]

#: Blocks per CPU of the cluster, by default: each CPU decodes a few long tasks (a task costs Ray
#: milliseconds whatever its size), and none waits long on the last one.
BLOCKS_PER_CPU = 2
#: Samples a block holds at most by default (batches by duration: about as many samples, whole
#: batches), which bounds what a task holds in memory.
BLOCK_ITEMS = 1024
#: The specs a worker process keeps unpickled (NOTE [ Ray epochs ], Spec): this epoch's and the
#: last.
_KEPT_SPECS = 2
#: ``Dataset.map_batches`` keywords that :func:`read` sets itself.
_OWN_MAP_KEYWORDS = ("fn", "batch_size", "batch_format", "fn_args", "fn_kwargs",
                     "fn_constructor_args", "fn_constructor_kwargs", "zero_copy_batch", "compute",
                     "udf_modifying_row_count")
#: A task turns one row (its block's bounds) into the block's rows: where ``map_batches`` can be
#: told whether it keeps the count (``udf_modifying_row_count``; a few releases assumed it kept
#: it), it is told not, or ``count()`` counted blocks and ``limit()`` ran before the decoding.
_ROW_COUNT = ({"udf_modifying_row_count": True} if "udf_modifying_row_count"
              in inspect.signature(ray.data.Dataset.map_batches).parameters else {})
_OWN = ("epoch", "key", "rows_per_block", "map_options")


def read(source: SourceSpec | Source, decoder: Callable[[WorkItem], Any], *, epoch: int = 0,
         key: str = "audio", rows_per_block: int | None = None,
         map_options: Mapping[str, Any] | None = None, **options: Any) -> ray.data.Dataset:
    """One epoch of ``source`` decoded by ``decoder`` as a Ray dataset, decoded in Ray's workers.

    Each row is a sample (a dict of numpy arrays and values), or, with ``max_batch_seconds``, a
    whole batch planned by duration (its samples padded on ``key``, with ``lengths``). Every item
    of the epoch is in it once (NOTE [ Ray epochs ]); the order and every random draw are those of
    ``BufferedDataset``'s epoch ``epoch`` with the same options. Nothing is decoded until the
    dataset is iterated; make one dataset per epoch (planning is cheap). Iterate with
    ``ds.iter_torch_batches(batch_size=..., collate_fn=PadCollate())``, or for batches by duration
    ``ds.iter_torch_batches(batch_size=1, collate_fn=BatchCollate())``.

    Example:
        >>> import audiobuffer.ray
        >>> from audiobuffer import AudioDecoder
        >>> for epoch in range(3):  # doctest: +SKIP
        ...     ds = audiobuffer.ray.read("data/fsdd/recordings", AudioDecoder(sample_rate=8000),
        ...                               epoch=epoch, shuffle=True, labels=r"^(\\d+)_")
        ...     for batch in ds.iter_torch_batches(batch_size=32,
        ...                                        collate_fn=audiobuffer.ray.PadCollate()):
        ...         ...

    Args:
        source: what ``BufferedDataset`` takes: a folder, a manifest, an ``index.json``, a list of
            paths or a ``Source`` (tar shards streamed without an index are not read here).
        decoder: a callable from :class:`~audiobuffer.WorkItem` to a sample dict; it and the
            ``transform`` travel to the workers by Ray's pickling.
        epoch: the epoch (its shuffle and random draws).
        key: the sample key padded into a batch by duration.
        rows_per_block: rows (samples, or batches by duration) per Ray block, each decoded by one
            task; ``None``: ``BLOCKS_PER_CPU`` blocks per CPU of the Ray cluster, of at most about
            ``BLOCK_ITEMS`` samples.
        map_options: keywords of ``Dataset.map_batches`` for the decoding tasks (``num_cpus``,
            ``concurrency``, ``memory``, ``resources``, ...).
        **options: ``BufferedDataset``'s options (``audiobuffer.options.LoaderOptions``): they act
            in each task as in a loader's epoch; ``rank`` and ``world_size`` plan that rank's share
            (without them, as ``BufferedDataset``: this process's in ``torch.distributed``'s group,
            where it is in one, as a Ray Train worker is).

    Raises:
        TypeError, ValueError: an option of the wrong type or value, or tar shards without an index.
        SourceError: the source cannot be listed.
    """
    check_keywords("audiobuffer.ray.read", options, _OWN)
    check_int("epoch", epoch, 0)
    if not isinstance(key, str):
        raise TypeError(f"key must be a string, got {short_repr(key)}")
    if rows_per_block is not None:
        check_int("rows_per_block", rows_per_block, 1, also="or None")
    remote = _map_options(map_options)
    loader_options = LoaderOptions(**options)
    pipeline = Pipeline.build(source, decoder, loader_options)
    if not isinstance(pipeline.source, Source):  # a ShardStream: its epochs are not plans of items
        raise ValueError(f"audiobuffer.ray.read reads files or an index, not "
                         f"{pipeline.source.description}: {pipeline.source.random_access_hint}")
    o = pipeline.options
    rank, world_size = (o.rank, o.world_size) if o.world_size is not None else _process_group()
    shard = EpochShard(epoch, rank or 0, world_size)
    layout = pipeline.lay_out(shard)
    # The workers' copy (as the isolated loader's helper gets it): the source listed, so no listing
    # options (labels may be a lambda); the batches planned here, in the layout.
    listed = dataclasses.replace(o, labels=None, patterns=None, path_column="path",
                                 storage_options=None)
    worker = dataclasses.replace(pipeline, options=listed, batching=None)
    spec = ray.put(_Spec(worker, shard, layout, key))  # starts Ray here if it is not running
    units = len(layout.sizes) if layout.sizes is not None else len(layout)
    per_block = rows_per_block or default_rows_per_block(
        units, len(layout) / units if layout.sizes is not None and units else 1.0)
    blocks = [{"first": first, "last": min(first + per_block, units)}
              for first in range(0, units, per_block)]
    dataset = ray.data.from_items(blocks, override_num_blocks=max(1, len(blocks)))
    context = dataset.context  # this dataset's (and those made from it), not Ray's default
    # a failed item raises its own error (DecodeError, SampleError), as from the other loaders
    context.raise_original_map_exception = True
    # with the per-operator reservation, Ray Data ran a fraction of the decoding tasks at once
    # (one on 2 CPUs, about 3 on 8): the one operator here takes the whole cluster
    context.op_resource_reservation_enabled = False
    if o.ordered or layout.in_step:  # ranks in step: each step's batches from one bucket
        context.execution_options.preserve_order = True
    return dataset.map_batches(_decode_blocks, batch_size=1, batch_format="numpy",
                               fn_kwargs={"spec": spec}, zero_copy_batch=True, **_ROW_COUNT,
                               **remote)


def _process_group() -> tuple[int, int]:
    """This process's rank and world size in ``torch.distributed``'s group (a Ray Train worker's),
    where there is one, else ``(0, 1)``: what ``BufferedDataset`` shards by without ``rank``."""
    torch = sys.modules.get("torch")  # a group needs torch imported: no import here
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return 0, 1


def _map_options(given: Mapping[str, Any] | None) -> dict[str, Any]:
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise TypeError(f"map_options must be a mapping of Dataset.map_batches keywords or None, "
                        f"got {short_repr(given)}")
    for name in given:
        if not isinstance(name, str):
            raise TypeError(f"map_options' keys must be map_batches keyword names, got "
                            f"{short_repr(name)}")
    taken = [name for name in given if name in _OWN_MAP_KEYWORDS]
    if taken:
        raise ValueError(f"map_options sets {taken[0]!r}, which audiobuffer.ray.read sets itself; "
                         f"give rows_per_block for the rows a task decodes, or leave it out")
    return dict(given)


def default_rows_per_block(units: int, samples_per_unit: float = 1.0) -> int:
    """The rows a block of :func:`read` holds when ``rows_per_block`` is not given, for ``units``
    rows of ``samples_per_unit`` samples each on average (batches by duration: more than one):
    ``BLOCKS_PER_CPU`` blocks per CPU of the running Ray cluster, of at most about
    ``BLOCK_ITEMS`` samples.

    Raises:
        TypeError, ValueError: ``units`` is not an integer >= 0, or ``samples_per_unit`` not a
            finite number > 0.
    """
    check_int("units", units, 0)
    wanted = f"samples_per_unit must be a finite number > 0, got {short_repr(samples_per_unit)}"
    if isinstance(samples_per_unit, bool) or not isinstance(samples_per_unit, numbers.Real):
        raise TypeError(wanted)
    if not 0 < samples_per_unit < math.inf:  # NaN too
        raise ValueError(wanted)
    if units == 0:
        return 1
    most = max(1, int(BLOCK_ITEMS / max(1.0, samples_per_unit)))
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    return max(1, min(most, math.ceil(units / (BLOCKS_PER_CPU * cpus))))


# -- in the workers ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Spec:
    """What the tasks of one dataset decode (NOTE [ Ray epochs ], Spec).

    Attributes:
        pipeline: the workers' copy of the pipeline (source listed, no durations).
        shard: the epoch and the rank's share of it.
        layout: the shard's layout, planned by the driver.
        key: the key padded into a batch by duration.
    """

    pipeline: Pipeline
    shard: EpochShard
    layout: EpochLayout
    key: str

    def block(self, first: int, last: int) -> EpochLayout:
        """The slice of the layout of units ``first`` to ``last`` (samples, or batches by duration):
        its own consumed mask, each item's place in the full epoch kept (``seqs``)."""
        layout = self.layout
        if layout.sizes is None:
            return EpochLayout(layout.indices[first:last], None, bytes(last - first),
                               seqs=np.arange(first, last, dtype=np.int64))
        starts = np.concatenate(([0], np.cumsum(layout.sizes, dtype=np.int64)))
        begin, end = int(starts[first]), int(starts[last])
        seqs = layout.seqs if layout.seqs is not None else np.arange(len(layout), dtype=np.int64)
        return EpochLayout(layout.indices[begin:end], None, bytes(last - first),
                           sizes=list(layout.sizes[first:last]), seqs=seqs[begin:end],
                           in_step=layout.in_step)

    def decode(self, first: int, last: int) -> list[dict[str, Any]]:
        """Units ``first`` to ``last`` decoded: their samples, or their batches by duration
        collated."""
        pipeline, layout = self.pipeline, self.block(first, last)
        epoch = set_up_epoch(pipeline, self.shard, layout=layout)
        run = EpochRun(epoch) if layout.sizes is None else BatchEpochRun(epoch, None)
        epoch.pool.start()
        try:
            outputs = list(run.consume(pipeline.options.on_error))
        finally:
            epoch.pool.close()
        if layout.sizes is None:
            return [_plain_sample(sample) for sample in outputs]
        return [collate_numpy([_plain_sample(s) for s in batch], key=self.key) for batch in outputs]


_specs: dict[str, _Spec] = {}
_specs_lock = threading.Lock()


def _load_spec(reference: Any) -> _Spec:
    """The spec ``reference`` names, unpickled once per worker process."""
    name = reference.hex()
    with _specs_lock:
        found = _specs.get(name)
    if found is not None:
        return found
    spec: _Spec = ray.get(reference)
    if spec.pipeline.options.transform is None:
        # rows hold numpy arrays: no tensors made (nor torch imported) in the workers; a transform
        # gets what it gets in BufferedDataset (the decoder's tensors), its output made numpy
        numpy_output(spec.pipeline.decoder)
    _log_to_stderr()
    with _specs_lock:
        while len(_specs) >= _KEPT_SPECS:
            del _specs[next(iter(_specs))]
        _specs[name] = spec
    return spec


def _log_to_stderr() -> None:
    """Have the package's warnings (``on_error="warn"``) reach the worker's stderr, which Ray
    forwards to the driver, where nothing else in the worker handles them."""
    package = logging.getLogger("audiobuffer")
    handled = any(not isinstance(h, logging.NullHandler) for h in package.handlers)
    if handled or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    package.addHandler(handler)


def _decode_blocks(batch: Mapping[str, np.ndarray], *, spec: Any) -> dict[str, Any]:
    """The ``map_batches`` function: the rows of the blocks ``batch`` names (``first``,
    ``last``)."""
    found = _load_spec(spec)
    rows: list[dict[str, Any]] = []
    for first, last in zip(batch["first"].tolist(), batch["last"].tolist()):
        rows.extend(found.decode(int(first), int(last)))
    return _columns(rows)


def _plain(value: Any) -> Any:
    """``value``, a CPU tensor as its numpy array."""
    if isinstance(value, np.ndarray) or not hasattr(value, "numpy"):
        return value
    return value.numpy()


def _plain_sample(sample: Any) -> dict[str, Any]:
    if not isinstance(sample, Mapping):
        raise TypeError(f"audiobuffer.ray.read makes rows of sample dicts; the decoder (or "
                        f"transform) returned {type(sample).__name__}")
    return {name: _plain(value) for name, value in sample.items()}


def _columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """``rows`` as columns (lists, which Ray makes its columns of); a key some rows lack is ``None``
    there."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    return {name: [row.get(name) for row in rows] for name in names}


# -- on the trainer's side ------------------------------------------------------------------------


def _tensor(array: np.ndarray, *, copy: bool) -> torch.Tensor:
    """``array`` as a tensor; ``copy``: of a copy (an array of Ray's is a read-only view of its
    block)."""
    import torch

    return torch.from_numpy(np.array(array, copy=True) if copy else array)


def _numbers(column: Any) -> np.ndarray | None:
    """``column`` (a Ray batch's column) as an array of numbers, or ``None`` (strings, objects)."""
    array = np.asarray(column)
    if array.dtype.kind in "biufc":
        return array
    if array.dtype == object and len(array) and all(isinstance(v, np.ndarray) for v in array):
        return array  # arrays of unequal shapes: the padded key
    return None


def _from_arrow(batch: Any) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """A Ray batch (an Arrow table) as Ray's numpy batch, but for its columns of no value at all
    (``None`` in every row: Ray made them NaN), and the values each column lacks, as ``(missing,
    of)``: ``None`` in a sample, or a key it lacked (Ray makes those NaN too), in lists too."""
    missing: dict[str, tuple[int, int]] = {}
    for name, column in zip(batch.column_names, batch.columns):
        nulls, values = column.null_count, column
        while nulls == 0 and (pyarrow.types.is_list(values.type)
                              or pyarrow.types.is_large_list(values.type)
                              or pyarrow.types.is_fixed_size_list(values.type)):
            values = pyarrow.compute.list_flatten(values)  # a batch's list of labels, say
            nulls = values.null_count
        if nulls:
            missing[name] = (nulls, len(values))
    empty = [name for name, column in zip(batch.column_names, batch.columns)
             if pyarrow.types.is_null(column.type)]
    if empty:
        batch = batch.drop_columns(empty)
    return BlockAccessor.for_block(batch).to_batch_format("numpy"), missing


def _refuse_missing(owner: str, names: Sequence[str], missing: Mapping[str, tuple[int, int]],
                    what: str) -> None:
    """Raise ValueError for the first of ``names`` (columns of numbers) with missing values."""
    for name in names:
        if name in missing:
            nulls, of = missing[name]
            raise ValueError(f"{owner}: {name!r} has no value in {nulls} of {of} {what} (a sample "
                             f"held None or lacked the key), which Ray makes NaN: give every "
                             f"sample a number there (in the decoder or a transform), or none")


class PadCollate(ArrowBatchCollateFn):
    """``iter_torch_batches``' ``collate_fn`` for rows that are samples: ``key`` padded along its
    last axis into one tensor with ``lengths``, as :func:`~audiobuffer.pad_collate` does; other
    columns of numbers become tensors, and columns of strings (``path``, ``label_name``) are left
    out, so that the batch is a mapping of tensors, which Ray moves to the device (``index`` names
    each item).

    Example:
        >>> collate = PadCollate()
        >>> for batch in ds.iter_torch_batches(batch_size=32, collate_fn=collate):  # doctest: +SKIP
        ...     audio, lengths = batch["audio"], batch["lengths"]

    Raises:
        TypeError: ``key`` is not a string, or ``pad_value`` not a number.

    Raises (when called):
        KeyError: the rows have no ``key``.
        TypeError: ``key`` holds no numbers (strings, objects).
        ValueError: a column of numbers has no value in a row (a sample held ``None`` there, or
            lacked the key others have), which Ray's numpy batch would make NaN; or a column other
            than ``key`` holds arrays of unequal shapes (only ``key`` is padded).
    """

    key: str
    pad_value: float

    def __init__(self, key: str = "audio", pad_value: float = 0.0) -> None:
        if not isinstance(key, str):
            raise TypeError(f"key must be a string, got {short_repr(key)}")
        if isinstance(pad_value, (bool, np.bool_)) or not isinstance(pad_value, numbers.Real):
            raise TypeError(f"pad_value must be a number, got {short_repr(pad_value)}")
        self.key = key
        self.pad_value = float(pad_value)

    def __call__(self, batch: Any) -> dict[str, torch.Tensor]:
        """``batch``: Ray's (an Arrow table), or a mapping of numpy columns."""
        missing: dict[str, tuple[int, int]] = {}
        if not isinstance(batch, Mapping):
            batch, missing = _from_arrow(batch)
        if self.key not in batch:
            raise KeyError(f"PadCollate: the rows have no {self.key!r} (columns: {sorted(batch)}); "
                           f"set key=")
        columns = {name: found for name, column in batch.items()
                   if (found := _numbers(column)) is not None}
        if self.key not in columns:
            raise TypeError(f"PadCollate: {self.key!r} must hold arrays of numbers, got a column "
                            f"of {np.asarray(batch[self.key]).dtype}; set key= to the audio's")
        _refuse_missing("PadCollate", list(columns), missing, "rows")
        rows = len(columns[self.key])
        samples = [{name: column[i] for name, column in columns.items()} for i in range(rows)]
        collated = collate_numpy(samples, key=self.key, pad_value=self.pad_value)
        for name in columns:
            if not isinstance(collated[name], np.ndarray):  # arrays collate_numpy cannot stack
                shapes = tuple(dict.fromkeys(np.shape(v) for v in collated[name]))
                raise ValueError(f"PadCollate: {name!r} holds arrays of unequal shapes "
                                 f"{short_repr(shapes)} and only {self.key!r} is padded: make "
                                 f"them one shape in the decoder or a transform, or leave it out")
        # collate_numpy's arrays are new: no copy
        return {name: _tensor(value, copy=False) for name, value in collated.items()
                if isinstance(value, np.ndarray)}


class BatchCollate(ArrowBatchCollateFn):
    """``iter_torch_batches``' ``collate_fn`` for rows that are whole batches by duration
    (``max_batch_seconds``): with ``batch_size=1``, each batch as audiobuffer planned it, its
    columns of numbers as tensors (``key`` padded, ``lengths``, ``index``, ``label``, ...) and its
    columns of strings left out, so that Ray moves the batch to the device.

    Example:
        >>> collate = BatchCollate()
        >>> for batch in ds.iter_torch_batches(batch_size=1, collate_fn=collate):  # doctest: +SKIP
        ...     audio, lengths = batch["audio"], batch["lengths"]

    Raises (when called):
        ValueError: a Ray batch of more than one row (give ``iter_torch_batches(batch_size=1)``),
            or a column of numbers with no value for a sample (``None``), which Ray's numpy batch
            would make NaN.
    """

    def __call__(self, batch: Any) -> dict[str, torch.Tensor]:
        """``batch``: Ray's (an Arrow table), or a mapping of numpy columns."""
        missing: dict[str, tuple[int, int]] = {}
        if not isinstance(batch, Mapping):
            batch, missing = _from_arrow(batch)
        rows = {len(column) for column in batch.values()}
        if rows != {1}:
            raise ValueError(f"BatchCollate takes one row at a time (each row is a whole batch "
                             f"planned by duration), got {max(rows, default=0)}: give "
                             f"iter_torch_batches(batch_size=1)")
        out: dict[str, torch.Tensor] = {}
        for name, column in batch.items():
            value = np.asarray(column[0])
            if value.dtype.kind in "biufc":
                _refuse_missing("BatchCollate", [name], missing, "samples")
                out[name] = _tensor(value, copy=True)
        return out
