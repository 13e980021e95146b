"""What a loader runs its epochs over: :class:`Pipeline` (source, decoder, options, batch mode,
durations, tuner memory), built once per loader by :meth:`Pipeline.build`, and one shard of one
epoch of it laid out for a producer pool (:class:`EpochLayout`).

Every loader holds one pipeline and reads each option from it; the engine takes the pipeline, never
a loader; the helper process of ``IsolatedLoader`` gets a copy. Whether the epochs batch by duration
is decided here, once (:class:`DurationBudget`); nothing downstream reads ``max_batch_seconds``.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .._checks import check_decoder
from ..options import DEFAULT_BUCKETS, DEFAULT_READ_BLOCK, ErrorPolicy, LoaderOptions
from ..prepare.durations import Failure as HeaderFailure
from ..prepare.durations import decoder_crop, read_durations
from ..sources.mixture import Mixture
from ..sources.source import AUDIO_PATTERNS, Source, SourceSpec, WorkItem
from ..sources.stream import ShardStream, as_source
from .plan import BatchPlan, EpochShard, block_starts, plan_batches, plan_epoch, shard_length
from .resize import Dealt, EpochUnits
from .streamed import DynamicBuckets, TimedDecode, check_streamable
from .tuner import TunerMemory

if TYPE_CHECKING:
    from .stats import PaddingMeter

__all__ = ["Compose", "DurationBatching", "DurationBudget", "EpochLayout", "EpochShard", "Pipeline",
           "decoder_crop"]

#: How many plans a :class:`DurationBatching` remembers (planning a large corpus takes a while).
_REMEMBERED_PLANS = 4


class Compose:
    """``transform(decoder(item))``, picklable when both are."""

    def __init__(self, decoder: Callable[[WorkItem], Any], transform: Callable[[Any], Any]) -> None:
        self.decoder = decoder
        self.transform = transform

    def __call__(self, item: WorkItem) -> Any:
        return self.transform(self.decoder(item))


@dataclass(frozen=True)
class EpochLayout:
    """One shard's epoch laid out for a producer pool: sequence number ``seq`` decodes source item
    ``indices[seq]`` (of streamed shards: tar shard ``indices[seq]``, all its samples).

    A *unit* is what the consumed mask counts: a sample, a streamed tar shard, or (with ``sizes``) a batch.

    Attributes:
        indices: what each sequence number decodes.
        positions: each unit's position in the shard's full epoch (``None``: its own number, in a fresh
            epoch; a resumed one skips the positions already consumed).
        consumed: the mask as the epoch starts: one byte per unit of the full epoch, 1 where consumed.
        sizes: batches by duration: the samples of each batch, consecutive sequence numbers
            (NOTE [ Batches by duration ] in ``epoch.py``, Plan); ``None``: a sequence number is a unit.
        seqs: with ``sizes``, each sample's place among the samples of the full epoch (its work item's ``seq``).
        resumed: samples (streamed: tar shards) consumed before a resume (0 in a fresh epoch).
        streamed: the units are streamed tar shards.
        in_step: batches for ranks in step (NOTE [ Ranks in step ] in ``plan.py``), handed on in plan order.
    """

    indices: np.ndarray
    positions: np.ndarray | None
    consumed: bytes
    sizes: list[int] | None = None
    seqs: np.ndarray | None = None
    resumed: int = 0
    streamed: bool = False
    in_step: bool = False

    def __len__(self) -> int:
        """The number of sequence numbers (samples; streamed: tar shards)."""
        return len(self.indices)

    def position(self, unit: int) -> int:
        """The position of ``unit`` (a sequence number, or with ``sizes`` a batch) in the full epoch."""
        return unit if self.positions is None else int(self.positions[unit])

    def seq(self, seq: int) -> int:
        """The work item ``seq`` of sequence number ``seq``: its place in the full epoch."""
        return int(self.seqs[seq]) if self.seqs is not None else self.position(seq)


@dataclass(frozen=True)
class DurationBudget:
    """What bounds a batch by duration: the options of the same names, checked by their rules in
    ``options.OPTIONS`` and held here once. A pipeline has one (:attr:`Pipeline.budget`) when it
    batches by duration, planned from the durations or cut as streamed samples arrive.

    Attributes:
        max_batch_seconds: the most a batch may cost (``plan.batch_cost``: its padded seconds): one
            budget for every bucket, or a tuple of one per bucket, shortest first.
        buckets: the duration buckets batches are cut from.
        max_batch_size: the most samples in a batch, or ``None``.
        quadratic_duration: seconds ``Q`` of the cost's quadratic term, or ``None``.
        sync_buckets: whether the ranks take each step's batches from the same bucket (NOTE [ Ranks in
            step ] in ``plan.py``); ``None``: with more than one rank.
        edges: each bucket's upper edge in seconds, fixed (``max_batch_seconds`` given as a
            mapping);
            ``None``: the edges come from the durations (``plan.bucket_edges``).
    """

    max_batch_seconds: float | tuple[float, ...]
    buckets: int = DEFAULT_BUCKETS
    max_batch_size: int | None = None
    quadratic_duration: float | None = None
    sync_buckets: bool | None = None
    edges: tuple[float, ...] | None = None

    @classmethod
    def of(cls, options: LoaderOptions) -> DurationBudget | None:
        """The budget ``options`` set, or ``None``: the epochs hand out one sample at a time."""
        given = options.max_batch_seconds
        if given is None:
            return None
        quadratic = options.quadratic_duration
        quadratic = None if quadratic is None else float(quadratic)
        edges: tuple[float, ...] | None = None
        if isinstance(given, Mapping):
            edges = tuple(float(edge) for edge in given)
            seconds: float | tuple[float, ...] = tuple(float(given[edge]) for edge in given)
        elif isinstance(given, (list, tuple)):
            seconds = tuple(float(s) for s in given)
        else:
            seconds = float(cast(float, given))
        if isinstance(seconds, tuple):
            buckets = len(seconds)
        else:
            buckets = DEFAULT_BUCKETS if options.buckets is None else options.buckets
        return cls(seconds, buckets, options.max_batch_size, quadratic, options.sync_buckets, edges)

    @property
    def largest(self) -> float:
        """The largest budget of any bucket."""
        seconds = self.max_batch_seconds
        return max(seconds) if isinstance(seconds, tuple) else seconds

    def synced(self, world_size: int) -> bool:
        """Whether ``world_size`` ranks take each step's batches from the same bucket."""
        return world_size > 1 and (self.sync_buckets is None or self.sync_buckets)

    def stream_buckets(self) -> DynamicBuckets[Any]:
        """Buckets that cut batches within this budget as streamed samples arrive."""
        return DynamicBuckets(self.max_batch_seconds, self.buckets, self.max_batch_size,
                              self.quadratic_duration, edges=self.edges)


class DurationBatching:
    """A pipeline's batches by duration, planned: the budget and each item's duration (read once).

    Attributes:
        budget: what bounds a batch; ``max_batch_seconds``, ``buckets``, ``max_batch_size``,
            ``quadratic_duration`` and ``sync_buckets`` read it.
        draw: a mixture's draws (``Mixture.draw``): an epoch's items are ``durations[draw(seed, epoch)]``
            (NOTE [ Mixtures ] in ``sources/mixture.py``); ``None``: the source's items themselves.
        durations: seconds per source item (``NaN`` where its header could not be read): a sample's
            length in its batch, the crop where the decoder pads to it.
        content: seconds of audio per source item, the rest of ``durations`` being padding (the same
            array as ``durations`` unless the decoder pads samples to its crop).
        failures: the items whose header could not be read, as ``(index, path, message)``.
        stretch: the decoder's ``stretch(seed, epoch, indices)`` (each item's duration after its
            augmentations over its duration before: NOTE [ Augmentations ] in ``decoders/_augment.py``),
            applied to ``content`` before ``crop``; ``None``: durations do not change by epoch.
        crop: the decoder's crop in seconds (caps a stretched duration), or ``None``.
    """

    def __init__(self, durations: np.ndarray, failures: list[HeaderFailure],
                 budget: DurationBudget, *, content: np.ndarray | None = None,
                 draw: Callable[[int, int], np.ndarray] | None = None,
                 stretch: Callable[[int, int, np.ndarray], np.ndarray | None] | None = None,
                 crop: float | None = None) -> None:
        self.durations = durations
        self.content = durations if content is None else content
        self.failures = failures
        self.budget = budget
        self.draw = draw
        self.stretch = stretch
        self.crop = crop
        self._stretched: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._plans: dict[tuple[Any, ...], BatchPlan] = {}  # the last few plans: len() and iter() of an epoch

    @property
    def max_batch_seconds(self) -> float | tuple[float, ...]:
        return self.budget.max_batch_seconds

    @property
    def buckets(self) -> int:
        return self.budget.buckets

    @property
    def max_batch_size(self) -> int | None:
        return self.budget.max_batch_size

    @property
    def quadratic_duration(self) -> float | None:
        return self.budget.quadratic_duration

    @property
    def sync_buckets(self) -> bool | None:
        return self.budget.sync_buckets

    @classmethod
    def read(cls, source: Source, decoder: Callable[[WorkItem], Any], budget: DurationBudget, *,
             duration_column: str | None, on_error: ErrorPolicy,
             num_threads: int) -> DurationBatching:
        """The durations of ``source``'s items, capped by ``decoder``'s crop (NOTE [ Batches by duration ]).

        Raises:
            DecodeError: a header failed with ``on_error="raise"``.
            SourceError: ``duration_column`` is missing or holds something other than durations.
        """
        crop, pad = decoder_crop(decoder)
        durations, failures = read_durations(source, duration_column=duration_column, crop_seconds=crop,
                                             num_threads=num_threads, on_error=on_error)
        content = durations
        if crop is not None and pad:
            durations = durations.copy()
            durations[~np.isnan(durations)] = crop  # padded to the crop: every sample is that long
        stretch = getattr(decoder, "stretch", None)
        return cls(durations, failures, budget, content=content,
                   draw=source.draw if isinstance(source, Mixture) else None,
                   stretch=stretch if callable(stretch) else None, crop=crop)

    def seconds(self, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(durations, content)`` of each source item in ``epoch``: stretched by the decoder's
        augmentations (a speed perturbation's factor of the epoch), then capped by the crop."""
        if self.stretch is None:
            return self.durations, self.content
        key = (seed, epoch)
        found = self._stretched.get(key)
        if found is None:
            factors = self.stretch(seed, epoch, np.arange(len(self.content), dtype=np.int64))
            content = self.content if factors is None else self.content * factors
            if self.crop is not None:
                content = np.minimum(content, self.crop)  # NaN stays NaN
            padded = self.durations is not self.content  # every sample lasts the crop
            found = (self.durations if padded else content, content)
            if len(self._stretched) >= _REMEMBERED_PLANS:
                self._stretched.clear()  # one call: safe while another thread reads
            self._stretched[key] = found
        return found

    def epoch_items(self, seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
        """The items behind an epoch's ``indices`` (a mixture's draws; else ``indices`` themselves)."""
        return indices if self.draw is None else self.draw(seed, epoch)[indices]

    def add_padding(self, meter: PaddingMeter, indices: np.ndarray, *, seed: int = 0, epoch: int = 0) -> None:
        """Count the batch of ``indices`` (source items; a mixture's draws of ``epoch``) in ``meter``."""
        items = self.epoch_items(seed, epoch, indices)
        durations, content = self.seconds(seed, epoch)
        meter.add(durations[items], content[items])

    def plan(self, *, shuffle: bool, seed: int, epoch: int, rank: int = 0, world_size: int = 1, worker: int = 0,
             num_workers: int = 1, even_shards: str | None = "pad",
             consumed: bytes | bytearray | None = None) -> BatchPlan:
        """The batches of one shard of ``epoch`` (``plan.plan_batches`` with this setup), remembered for
        the next few calls (a pure function: any thread may call it)."""
        key = (shuffle, seed, epoch, rank, world_size, worker, num_workers, even_shards,
               None if consumed is None else bytes(consumed))
        plan = self._plans.get(key)
        if plan is None:
            durations = self.seconds(seed, epoch)[0]
            durations = durations if self.draw is None else durations[self.draw(seed, epoch)]
            budget = self.budget
            plan = plan_batches(durations, max_batch_seconds=budget.max_batch_seconds,
                                buckets=budget.buckets, max_batch_size=budget.max_batch_size,
                                quadratic_duration=budget.quadratic_duration, shuffle=shuffle,
                                seed=seed, epoch=epoch,
                                rank=rank, world_size=world_size, worker=worker, num_workers=num_workers,
                                even_shards=even_shards, sync_buckets=budget.synced(world_size),
                                consumed=consumed, edges=budget.edges)
            if len(self._plans) >= _REMEMBERED_PLANS:
                self._plans.clear()  # one call: safe while another thread reads
            self._plans[key] = plan
        return plan

    def lay_out(self, *, consumed: bytes | None = None, **setup: Any) -> EpochLayout:
        """Plan a shard's epoch (``setup``: :meth:`plan`'s keywords) and lay its batches out for a pool:
        sequence numbers run through the batches in order (NOTE [ Batches by duration ], Plan)."""
        plan = self.plan(consumed=consumed, **setup)
        sizes = [len(b) for b in plan.batches]
        indices = np.concatenate(plan.batches) if sizes else np.empty(0, dtype=np.int64)
        in_step = self.budget.synced(setup.get("world_size", 1))
        if plan.positions is None:
            return EpochLayout(indices, None, plan.consumed, sizes, np.arange(len(indices), dtype=np.int64),
                               in_step=in_step)
        full = [len(b) for b in self.plan(**setup).batches]  # the epoch as it was before the resume
        starts = np.concatenate(([0], np.cumsum(full)[:-1])).astype(np.int64) if full else np.empty(0, np.int64)
        seqs = np.concatenate([starts[p] + np.arange(n) for p, n in zip(plan.positions, sizes)]) if sizes \
            else np.empty(0, dtype=np.int64)
        return EpochLayout(indices, plan.positions, plan.consumed, sizes, seqs, sum(full) - sum(sizes), in_step=in_step)

    def state(self, world_size: int = 1) -> dict[str, Any]:
        """What a state dict's batch mask was counted under (``state.STATE_BATCHING``) by one of
        ``world_size`` ranks: the setup and a digest of the durations (a changed file changes the
        batches)."""
        digest = hashlib.sha256(np.ascontiguousarray(self.durations, dtype="<f8").tobytes()).hexdigest()[:16]
        seconds = self.max_batch_seconds
        state: dict[str, Any] = {"max_batch_seconds": list(seconds) if isinstance(seconds, tuple)
                                 else seconds,
                                 "buckets": self.buckets,
                                 "max_batch_size": self.max_batch_size, "durations": f"{len(self.durations)}:{digest}"}
        if self.quadratic_duration is not None:  # only where set: a state saved without the option still loads
            state["quadratic_duration"] = self.quadratic_duration
        if self.budget.edges is not None:
            state["bucket_edges"] = list(self.budget.edges)
        if self.budget.synced(world_size):  # the batches in another order
            state["sync_buckets"] = True
        factors = None if self.stretch is None else self.stretch(0, 0, np.arange(len(self.content), dtype=np.int64))
        if factors is not None:  # the augmentations' durations (of seed 0, epoch 0: any change shows)
            state["stretch"] = hashlib.sha256(np.ascontiguousarray(factors, dtype="<f8").tobytes()).hexdigest()[:16]
        return state


@dataclass(frozen=True, eq=False)
class Pipeline:
    """What a loader runs its epochs over, one copy of each: build it with :meth:`build`.

    Attributes:
        source: the listed source (a :class:`~audiobuffer.Source`, or streamed tar shards).
        decoder: what the producers run on each work item (before ``options.transform``).
        options: the validated options.
        budget: the mode, decided once by :meth:`build`: with ``options.max_batch_seconds``, what
            bounds a batch by duration; ``None``: the epochs hand out one sample at a time.
        batching: with a budget, the items' durations, from which the batches are planned; ``None``
            without a budget, for streamed shards (their batches are cut as they stream), and in the
            helper's copy (its trainer plans the batches and sends each epoch's).
        memory: where the last epoch's producer tuner settled (NOTE [ Producer tuning ] in ``tuner.py``).

    Thread safety: read-only, but for ``memory`` and ``batching``'s plan cache, which any thread may use.
    """

    source: Source | ShardStream
    decoder: Callable[[WorkItem], Any]
    options: LoaderOptions
    budget: DurationBudget | None = None
    batching: DurationBatching | None = None
    memory: TunerMemory = field(default_factory=TunerMemory)

    @classmethod
    def build(cls, source: SourceSpec | Source | ShardStream, decoder: Callable[[WorkItem], Any],
              options: LoaderOptions) -> Pipeline:
        """List ``source`` (unless it is ready), check that the options fit it and ``decoder``, and read the
        durations of batches by duration.

        Raises:
            TypeError, ValueError: a decoder that is not one, or options that do not fit together.
            SourceError: the source cannot be listed, or (``on_error="raise"``) a duration cannot be read.
        """
        check_decoder(decoder)
        found = getattr(decoder, "patterns", None)  # ImageDecoder's, say
        patterns = options.patterns if options.patterns is not None else AUDIO_PATTERNS if found is None else found
        listed = as_source(source, patterns=patterns, labels=options.labels, path_column=options.path_column,
                           explicit_patterns=options.patterns, storage_options=options.storage_options,
                           start_column=options.start_column,
                           duration_column=options.duration_column if options.start_column else None)
        budget = DurationBudget.of(options)
        _check_combination(listed, decoder, options, budget)
        batching = None
        if budget is not None and isinstance(listed, Source):
            batching = DurationBatching.read(listed, decoder, budget,
                                             duration_column=options.duration_column,
                                             on_error=options.on_error,
                                             num_threads=max(8, options.most_producers()))
        return cls(listed, decoder, options, budget=budget, batching=batching)

    @property
    def decode(self) -> Callable[[WorkItem], Any]:
        """The decoder, then the transform; of streamed shards batched by duration, each sample's
        duration read first (NOTE [ Batches by duration ] in ``epoch.py``, Streamed shards)."""
        transform = self.options.transform
        decode = self.decoder if transform is None else Compose(self.decoder, transform)
        if self.budget is not None and self.streamed:
            crop, pad = decoder_crop(self.decoder)
            column = cast(str, self.options.duration_column)  # needed by _check_combination
            decode = TimedDecode(decode, column, crop=crop, pad=pad,
                                 stretch=getattr(self.decoder, "stretch", None))
        return decode

    def item_seconds(self, epoch: int, indices: np.ndarray) -> np.ndarray | None:
        """The seconds of an epoch's items ``indices`` where the batches are planned here by
        duration (the producer tuner's weights, NOTE [ Producer tuning ] in ``tuner.py``), else
        ``None``."""
        batching = self.batching
        if batching is None:
            return None
        items = batching.epoch_items(self.options.seed, epoch, indices)
        durations = batching.seconds(self.options.seed, epoch)[0]  # after a speed perturbation
        return np.asarray(durations[items], np.float64)

    def mask_setup(self, world_size: int) -> dict[str, Any] | None:
        """What a consumed mask of one of ``world_size`` ranks counts, for a state dict's batching
        key: the planned batches' setup (``DurationBatching.state``), or ``None``: items or streamed
        shards."""
        return None if self.batching is None else self.batching.state(world_size)

    @property
    def streamed(self) -> bool:
        """Whether the source is tar shards streamed whole (NOTE [ Streamed shards ])."""
        return isinstance(self.source, ShardStream)

    def lay_out(self, shard: EpochShard, consumed: bytes | Dealt | None = None) -> EpochLayout:
        """The plan of ``shard`` (resumed after the units ``consumed`` marks; or a dealt epoch's
        share, NOTE [ Resume on another world size ] in ``resize.py``), laid out for a pool.

        Raises:
            ResumeError: ``consumed`` does not have one byte per unit of this shard's epoch.
        """
        if isinstance(consumed, Dealt):
            return EpochLayout(**EpochUnits(self, shard.number).lay_out(shard, consumed))
        setup = self._plan_setup(shard.number, shard.rank, shard.world_size, shard.worker, shard.num_workers)
        if self.batching is not None:
            return self.batching.lay_out(consumed=consumed, **setup)
        source = self.source
        plan = plan_epoch(len(source.shards) if isinstance(source, ShardStream) else len(source), consumed=consumed,
                          blocks=self.read_blocks(), **setup)
        return EpochLayout(plan.indices, plan.positions, plan.consumed, resumed=plan.size - len(plan),
                           streamed=self.streamed)

    def read_block(self) -> int | None:
        """Index members a request reads (``options.read_block`` resolved), or ``None``: one member a request,
        in the plain order (not an index, streamed shards, a mixture, or local data under ``"auto"``)."""
        source, block = self.source, self.options.read_block
        if not isinstance(source, Source) or isinstance(source, Mixture) or source.table.offsets is None:
            return None
        if block == "auto":
            return DEFAULT_READ_BLOCK if self.budget is None and source.has_urls() else None
        return block

    def read_blocks(self) -> np.ndarray | None:
        """The first item of each read block (NOTE [ Block order ] in ``plan.py``), or ``None`` (:meth:`read_block`)."""
        block = self.read_block()
        if block is None:
            return None
        found = self.__dict__.get("_blocks")
        if found is None or found[0] != block:
            table = cast(Source, self.source).table
            found = (block, block_starts(cast(np.ndarray, table.shard_of), cast(np.ndarray, table.offsets),
                                         cast(np.ndarray, table.sizes), block))
            self.__dict__["_blocks"] = found  # frozen, but a pure function of the fields: remembered
        return cast(np.ndarray, found[1])

    def length(self, epoch: int, rank: int, world_size: int) -> int:
        """Items rank ``rank`` yields in ``epoch`` (its DataLoader workers together); batches, when it
        batches by duration.

        Raises:
            TypeError: the length is unknown: streamed shards without a listing, or batched by duration.
        """
        source, setup = self.source, self._plan_setup(epoch, rank, world_size)
        if self.batching is not None:
            return len(self.batching.plan(**setup))
        if isinstance(source, ShardStream):
            if self.budget is not None:
                raise TypeError(f"the number of batches of streamed shards is unknown before they stream (batches "
                                f"are cut as the samples arrive), so {source.description} batched by duration has "
                                f"no len(); read the shards through their index.json for planned batches")
            return source.samples_in(plan_epoch(len(source.shards), **setup).indices.tolist())
        return shard_length(len(source), rank=rank, world_size=world_size, even_shards=setup["even_shards"])

    def _plan_setup(self, epoch: int, rank: int, world_size: int, worker: int = 0,
                    num_workers: int = 1) -> dict[str, Any]:
        """The keywords that plan one shard of ``epoch`` (``plan_epoch``'s, ``DurationBatching.plan``'s)."""
        o = self.options
        return dict(shuffle=o.shuffle, seed=o.seed, epoch=epoch, rank=rank, world_size=world_size, worker=worker,
                    num_workers=num_workers, even_shards=o.even_shards)


def _check_combination(source: Source | ShardStream, decoder: Any, options: LoaderOptions,
                       budget: DurationBudget | None) -> None:
    """Refuse options that do not fit together with this source and decoder (each valid on its own), and
    warn (a ``UserWarning``, shown once per place by Python's default filter) of ``max_batch_seconds`` with
    a decoder that pads every sample to its crop.

    Raises:
        ValueError: streamed shards with ``ordered``, or ``max_batch_seconds`` without
            ``duration_column``.
    """
    if isinstance(source, ShardStream):
        check_streamable(options.ordered, source.random_access_hint, ordered_hint=source.ordered_hint)
        if budget is not None and options.duration_column is None:
            raise ValueError("max_batch_seconds on streamed shards needs duration_column: the field of each "
                             "sample's <key>.json sidecar that holds its duration in seconds (streamed shards "
                             "give no durations before they stream), or read the shards through their "
                             "index.json (audiobuffer pack writes one, with each member's duration)")
    crop, pad = decoder_crop(decoder)
    if budget is not None and pad:
        warnings.warn(f"max_batch_seconds with a decoder that crops and pads every sample to crop_seconds={crop:g}: "
                      f"every item lasts the crop, so batches by duration are batches of "
                      f"{max(1, int(budget.largest // cast(float, crop)))} items and buy "
                      f"nothing "
                      f"(batch_size does the same); give the decoder pad=False to batch the items by their own "
                      f"lengths", UserWarning, stacklevel=4)
    if budget is not None and options.read_block not in ("auto", None):
        raise ValueError(f"read_block={options.read_block!r} with max_batch_seconds: batches by duration take their "
                         f"items by duration bucket, not in blocks of neighbouring members; leave read_block "
                         f"'auto' or None")
