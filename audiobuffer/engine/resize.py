"""Resume on another number of ranks: the states of all ranks of a run merged into one
(:func:`merge_states`), and the epoch that the units they had not delivered make when dealt again
over a world of any size (:class:`EpochUnits`).

NOTE [ Resume on another world size ]
=====================================
A rank's consumed mask counts positions of its own shard, so it means nothing to a rank of another
world. The *units* of an epoch are numbered the same in any world: a source item (a streamed tar
shard; a mixture's draw) by its index, a batch by duration by its place in the epoch's batches as
one rank would plan them (the batches themselves do not depend on the world, only their order).

1. :func:`merge_states` checks the states of ranks ``0 .. N-1`` of one run at one point (same
   epoch and setup, none missing or twice) and keeps each rank's mask: a *merged state*, marked by
   the key :data:`STATE_MERGED` (its format number). It needs no dataset.
2. ``load_state_dict`` of a merged state, on rank ``j`` of ``M``, plans each old rank's shard,
   marks the units any of them delivered (``done``) and deals the rest again (:func:`deal_items`,
   :func:`deal_batches`): in the epoch's own order, evened out over ``M`` ranks as a fresh epoch
   is (``"pad"`` repeats units from the start of the rest, ``"drop"`` cuts the remainder, ``None``
   leaves shares one apart), each rank its interleaved share (with read blocks, consecutive runs);
   with ``sync_buckets`` the rest is ordered in rounds of like length first (NOTE [ Ranks in step ]
   in ``plan.py``, seeded by seed and epoch). Every rank computes the same deal with no
   communication. Under ``"drop"`` the units the old world left out are not delivered, so they
   are part of the rest; the deal leaves out the last ``len(rest) % M`` of it, fewer than ``M``
   units in the whole epoch, as a fresh ``M``-rank epoch does (with nothing delivered, the very
   units that epoch leaves out).
3. The dealt epoch's consumed mask counts the rank's share, and a state saved within it carries
   ``done`` (``state.STATE_DEALT``): loaded on the same rank of the same world it resumes there;
   merged again, the shares' consumed units join ``done``. The next epoch is a fresh ``M``-rank one.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ResumeError
from . import state as _format
from .plan import (
    EpochShard,
    block_order,
    epoch_order,
    even_out,
    plan_epoch,
    shard,
    split,
    step_rounds,
)

if TYPE_CHECKING:
    from .pipeline import Pipeline

__all__ = ["MERGED_FORMAT", "STATE_MERGED", "STATE_RANKS", "Dealt", "EpochUnits", "deal_batches",
           "check_ranks", "deal_items", "done_mask", "is_merged", "merge_states"]

#: The key that marks a merged state; its value is the merged format's number.
STATE_MERGED = "merged"
#: The old ranks' masks in a merged state, by rank: ``{"rank", "items", "consumed"}``.
STATE_RANKS = "ranks"
#: 1: the old ranks' masks, each with the done mask of the dealt epoch it counts, if any.
MERGED_FORMAT = 1
#: What the old ranks must agree on (the world size too; rank apart).
_COMMON = (_format.STATE_EPOCH, _format.STATE_SEED, _format.STATE_SHUFFLE,
           _format.STATE_WORLD_SIZE, _format.STATE_EVEN_SHARDS, _format.STATE_SOURCE,
           _format.STATE_BATCHING, _format.STATE_READ_BLOCK, _format.STATE_DEALT)
#: The missing ranks an error names at most.
_NAMED = 8


@dataclass(frozen=True)
class Dealt:
    """A dealt epoch to resume: ``done``, one byte per unit of the epoch, 1 where delivered before
    the deal (or left out of the epoch), and ``consumed``, this rank's progress in its share
    (``None``: none yet)."""

    done: bytes
    consumed: bytes | None = None


def is_merged(state: Any) -> bool:
    """Whether ``state`` is a merged state (:func:`merge_states`)."""
    return isinstance(state, Mapping) and STATE_MERGED in state


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``state_dict()`` of every rank of a run, merged into one state that any rank of a world
    of any size loads with ``load_state_dict`` (NOTE [ Resume on another world size ]).

    Gather the states first (``torch.distributed.all_gather_object``, or one file per rank). A
    merged state is plain builtins (JSON-ready) and needs no dataset to make.

    Example:
        >>> states = [loader.state_dict() for loader in old_ranks]  # doctest: +SKIP
        >>> new_loader.load_state_dict(audiobuffer.merge_states(states))  # doctest: +SKIP

    Raises:
        TypeError: ``states`` is not a sequence of state dicts.
        ResumeError: a rank is missing or given twice, or the states differ in epoch or setup
            (the message names the ranks and the key), or one is malformed.
    """
    if isinstance(states, (Mapping, str, bytes)) or not isinstance(states, Sequence):
        raise TypeError(f"states must be a list of every rank's state_dict(), got "
                        f"{type(states).__name__}")
    if not states:
        raise ResumeError("merge_states needs the state_dict() of every rank, got none")
    for i, state in enumerate(states):
        if not isinstance(state, Mapping):
            raise TypeError(f"states[{i}] must be a state dict, got {type(state).__name__}")
        if is_merged(state):
            raise ResumeError(f"states[{i}] is merged already; merge the states of the ranks "
                              f"themselves")
        missing = [k for k in (_format.STATE_VERSION, _format.STATE_RANK, *_COMMON[:-3],
                               _format.STATE_ITEMS, _format.STATE_CONSUMED) if k not in state]
        if missing:
            raise ResumeError(f"states[{i}] lacks {missing}: not a state_dict()")
        version = state[_format.STATE_VERSION]
        if version not in _format.FORMATS:
            raise ResumeError(f"states[{i}]'s format {version!r:.40} is not one of "
                              f"{list(_format.FORMATS)}: not a state_dict() of this version")
        for key, least in ((_format.STATE_RANK, None), (_format.STATE_EPOCH, 0)):
            if not _is_int(state[key], least):
                raise ResumeError(f"states[{i}]'s {key} must be an integer"
                                  f"{'' if least is None else f' >= {least}'}, got "
                                  f"{state[key]!r:.40}")
    world = _agree(states, _format.STATE_WORLD_SIZE)
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ResumeError(f"the states' world_size must be an integer >= 1, got {world!r}")
    ranks = [state[_format.STATE_RANK] for state in states]
    twice = sorted({r for r in ranks if ranks.count(r) > 1}, key=repr)
    if twice:
        raise ResumeError(f"rank(s) {twice} given more than once; pass each rank's state once")
    stray = [r for r in ranks if not 0 <= r < world]  # not `in range`: a scan for NumPy ints
    if stray:
        raise ResumeError(f"rank(s) {stray} outside 0..{world - 1} of world_size {world}")
    if len(ranks) < world:  # the ranks are distinct and in range: name the first few missing
        present = set(ranks)  # found among the first len(ranks) + _NAMED: a forged size costs none
        absent = list(itertools.islice((r for r in range(world) if r not in present), _NAMED))
        count = world - len(ranks)
        named = ", ".join(map(str, absent)) + (", ..." if count > len(absent) else "")
        more = f" ({count} ranks)" if count > len(absent) else ""
        raise ResumeError(f"the states of rank(s) [{named}] of {world} are missing{more}; "
                          f"gather the state_dict() of every rank")
    merged: dict[str, Any] = {STATE_MERGED: MERGED_FORMAT}
    for key in _COMMON:
        merged[key] = _agree(states, key)
    merged[_format.STATE_EPOCH] = int(merged[_format.STATE_EPOCH])  # checked: plain, for JSON
    merged[STATE_RANKS] = [_rank_entry(state) for state in
                           sorted(states, key=lambda s: s[_format.STATE_RANK])]
    return merged


def check_ranks(entries: Any, world: int) -> list[Mapping[str, Any]]:
    """A merged state's :data:`STATE_RANKS` (untrusted: read from a file), checked for ``world``
    old ranks: ranks ``0 .. world-1`` in order, each with its items and consumed mask.

    Raises:
        ResumeError: an entry is missing, given twice, out of order or malformed.
    """
    if not isinstance(entries, list) or len(entries) != world or any(
            not isinstance(e, Mapping) or not _is_int(e.get(_format.STATE_RANK), None)
            or e[_format.STATE_RANK] != r for r, e in enumerate(entries)):
        raise ResumeError(f"the merged state's ranks must be 0..{world - 1}, each once; make it "
                          f"with audiobuffer.merge_states")
    for entry in entries:
        rank = entry[_format.STATE_RANK]
        missing = [k for k in (_format.STATE_ITEMS, _format.STATE_CONSUMED) if k not in entry]
        if missing:
            raise ResumeError(f"the merged state's rank {rank} lacks {missing}; make it with "
                              f"audiobuffer.merge_states")
        items = entry[_format.STATE_ITEMS]
        if items is not None and not _is_int(items, 0):
            raise ResumeError(f"the merged state's rank {rank}'s items must be an integer >= 0 "
                              f"or None, got {items!r:.40}")
    return entries


def _is_int(value: Any, least: int | None) -> bool:
    """Whether ``value`` is an integer (a NumPy one too; not a bool) of at least ``least``
    (``None``: any)."""
    if not isinstance(value, Integral) or isinstance(value, (bool, np.bool_)):
        return False
    return least is None or int(value) >= least


def _agree(states: Sequence[Mapping[str, Any]], key: str) -> Any:
    """The value of ``key`` every state has (absent: ``None``)."""
    values = [(s.get(_format.STATE_RANK), s.get(key)) for s in states]
    for rank, value in values[1:]:
        if value != values[0][1]:
            raise ResumeError(f"the states differ in {key}: rank {values[0][0]} has "
                              f"{values[0][1]!r:.60}, rank {rank} has {value!r:.60}; merge the "
                              f"states of all ranks of one run, saved at the same step")
    return values[0][1]


def _rank_entry(state: Mapping[str, Any]) -> dict[str, Any]:
    items, rank = state[_format.STATE_ITEMS], state[_format.STATE_RANK]
    if items is not None and (isinstance(items, bool) or not isinstance(items, int) or items < 0):
        raise ResumeError(f"rank {rank}'s items must be an integer >= 0, got {items!r}")
    _format.decode_dealt(state)  # checked here, kept once in the merged state
    packed = ""
    if items is not None:
        mask = _format.unpack_consumed(state[_format.STATE_CONSUMED], items)
        packed = _format.pack_consumed(mask)
    return {_format.STATE_RANK: int(rank), _format.STATE_ITEMS: items,
            _format.STATE_CONSUMED: packed}


def done_mask(units: int, shards: Sequence[tuple[np.ndarray, bytes | None]],
              done: bytes | None = None) -> bytes:
    """One byte per unit, 1 where a shard of ``shards`` (each its units and its consumed mask, or
    ``None``: none consumed) delivered it, or where ``done`` (a dealt epoch's) has it. A unit no
    shard holds (left out by ``even_shards="drop"``) is not done: it is dealt again."""
    delivered = np.zeros(units, dtype=bool) if done is None else _mask(done).astype(bool)
    for ids, consumed in shards:
        if consumed is not None:
            delivered[ids[_mask(consumed).astype(bool)]] = True
    return delivered.astype(np.uint8).tobytes()


def deal_items(order: np.ndarray, done: bytes, *, rank: int, world_size: int, worker: int = 0,
               num_workers: int = 1, even_shards: str | None = "pad",
               blocks: bool = False) -> np.ndarray:
    """The units of ``order`` (an epoch's order of its items) not ``done``, dealt to ``rank`` of
    ``world_size`` (then ``worker`` of ``num_workers``), as ``plan.plan_epoch`` deals an epoch."""
    rest = order[_mask(done)[order] == 0]
    if world_size > 1 and even_shards is not None:
        rest = even_out(rest, world_size, even_shards)
    cut = split if blocks else shard
    return cut(cut(rest, rank, world_size), worker, num_workers)


def deal_batches(done: bytes, longest: np.ndarray, *, rank: int, world_size: int, worker: int = 0,
                 num_workers: int = 1, even_shards: str | None = "pad", synced: bool = False,
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """The batches (numbered ``0 .. len(longest)-1``, each with its longest item) not ``done``,
    dealt to ``rank`` of ``world_size`` as ``plan.plan_batches`` deals them; ``synced``: in rounds
    of like length (``plan.step_rounds`` with ``rng``)."""
    rest = np.flatnonzero(_mask(done) == 0)
    if synced and world_size > 1:
        rest = rest[step_rounds(longest[rest], world_size, rng, pad=even_shards == "pad")]
    if world_size > 1 and even_shards is not None:
        rest = even_out(rest, world_size, even_shards)
    return shard(shard(rest, rank, world_size), worker, num_workers)


def _mask(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8)


class EpochUnits:
    """The units of one epoch of ``pipeline`` (NOTE [ Resume on another world size ]): each old
    rank's shard of them, and a dealt epoch's share laid out for a pool."""

    def __init__(self, pipeline: Pipeline, epoch: int) -> None:
        self.pipeline, self.epoch = pipeline, epoch
        options = pipeline.options
        self._setup: dict[str, Any] = dict(shuffle=options.shuffle, seed=options.seed, epoch=epoch)
        self.even_shards = options.even_shards
        batching = pipeline.batching
        if batching is not None:
            self.batches = batching.plan(**self._setup, even_shards=None).batches
            self.units = len(self.batches)
            durations = batching.durations if batching.draw is None else \
                batching.durations[batching.draw(options.seed, epoch)]
            self._unit_of = np.full(len(durations), -1, dtype=np.int64)
            for unit, batch in enumerate(self.batches):
                self._unit_of[batch] = unit
            self.longest = np.array([durations[b].max() for b in self.batches], dtype=np.float64)
        else:
            source = pipeline.source
            listed: Any = source  # a ShardStream counts its tar shards (``Pipeline.lay_out``)
            self.units = len(listed.shards) if pipeline.streamed else len(listed)
            blocks = self._blocks = pipeline.read_blocks()
            self.order = epoch_order(self.units, **self._setup) if blocks is None else \
                block_order(blocks, self.units, **self._setup)

    def of_rank(self, rank: int, world_size: int) -> np.ndarray:
        """The units of ``rank``'s shard of a fresh epoch of ``world_size`` ranks, in its order."""
        batching = self.pipeline.batching
        if batching is not None:
            plan = batching.plan(**self._setup, rank=rank, world_size=world_size,
                                 even_shards=self.even_shards)
            return np.array([self._unit_of[b[0]] for b in plan.batches], dtype=np.int64)
        return plan_epoch(self.units, **self._setup, rank=rank, world_size=world_size,
                          even_shards=self.even_shards, blocks=self._blocks).indices

    def share(self, done: bytes, rank: int, world_size: int, worker: int = 0,
              num_workers: int = 1) -> np.ndarray:
        """The units a dealt epoch (``done``) gives ``rank`` of ``world_size`` (and ``worker``)."""
        if len(done) != self.units:
            raise ResumeError(f"the dealt state covers {len(done)} units, epoch {self.epoch} of "
                              f"this dataset has {self.units}; resume with the dataset it was "
                              f"saved with")
        if self.pipeline.batching is not None:
            synced = self.pipeline.batching.budget.synced(world_size)
            rng = np.random.default_rng((self._setup["seed"], self.epoch)) \
                if self._setup["shuffle"] else None
            return deal_batches(done, self.longest, rank=rank, world_size=world_size,
                                worker=worker, num_workers=num_workers,
                                even_shards=self.even_shards, synced=synced, rng=rng)
        return deal_items(self.order, done, rank=rank, world_size=world_size, worker=worker,
                          num_workers=num_workers, even_shards=self.even_shards,
                          blocks=self._blocks is not None)

    def done_of(self, merged: Mapping[str, Any]) -> bytes:
        """The done mask of a merged state's old ranks (checked by :func:`merge_states`)."""
        world = merged[_format.STATE_WORLD_SIZE]
        dealt = merged.get(_format.STATE_DEALT)
        base = None if dealt is None else _format.decode_dealt(
            {_format.STATE_VERSION: _format.DEALT_FORMAT, _format.STATE_DEALT: dealt})
        shards = []
        for entry in merged[STATE_RANKS]:
            rank, items = entry[_format.STATE_RANK], entry[_format.STATE_ITEMS]
            ids = self.of_rank(rank, world) if base is None else self.share(base, rank, world)
            consumed = None
            if items is not None:
                if items != len(ids):
                    raise ResumeError(f"rank {rank}'s state covers {items} units, its shard of "
                                      f"epoch {self.epoch} here has {len(ids)}; merge states "
                                      f"saved with this dataset and DataLoader(num_workers=0)")
                consumed = _format.unpack_consumed(entry[_format.STATE_CONSUMED], items)
            shards.append((ids, consumed))
        return done_mask(self.units, shards, base)

    def lay_out(self, shard: EpochShard, dealt: Dealt) -> dict[str, Any]:
        """``shard``'s part of the dealt epoch, resumed after ``dealt.consumed``: the fields of its
        ``EpochLayout`` (``Pipeline.lay_out`` makes it)."""
        ids = self.share(dealt.done, shard.rank, shard.world_size, shard.worker, shard.num_workers)
        size = len(ids)
        consumed = bytes(size) if dealt.consumed is None else dealt.consumed
        if len(consumed) != size:
            raise ResumeError(f"the saved state covers {len(consumed)} units, this rank's share "
                              f"of the dealt epoch has {size}; resume with the setup it was "
                              f"saved under")
        mask = _mask(consumed)
        positions = None if not mask.any() else np.flatnonzero(mask == 0)
        kept = ids if positions is None else ids[positions]
        if self.pipeline.batching is None:
            return dict(indices=kept, positions=positions, consumed=consumed,
                        resumed=size - len(kept), streamed=self.pipeline.streamed)
        full = [len(self.batches[u]) for u in ids]
        sizes = [len(self.batches[u]) for u in kept]
        indices = np.concatenate([self.batches[u] for u in kept]) if len(kept) else \
            np.empty(0, dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(full)[:-1])).astype(np.int64)
        chosen = np.arange(size) if positions is None else positions
        seqs = np.concatenate([starts[p] + np.arange(n) for p, n in zip(chosen, sizes)]) \
            if sizes else np.empty(0, dtype=np.int64)
        synced = self.pipeline.batching.budget.synced(shard.world_size)
        return dict(indices=indices, positions=positions, consumed=consumed, sizes=sizes,
                    seqs=seqs, resumed=sum(full) - sum(sizes), in_step=synced)
