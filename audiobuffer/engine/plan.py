"""The epoch plan: which items one shard of one epoch yields, and in what order.

A pure function of the corpus size and the setup, with no threads, files or torch, so that every
process computes the same plan and exactly-once can be tested on the plan alone. The steps, in order:

1. the epoch's order: ``0 .. n-1``, or a permutation seeded by ``seed + epoch``; with read blocks
   (``read_block``), a block order: blocks of consecutive items shuffled, then the items within
   windows of a few blocks (NOTE [ Block order ]);
2. even shards: with ``world_size > 1``, padded (repeating from the start) or cut to a multiple of
   ``world_size``, so that every rank gets as many items and none waits forever in a collective;
3. the rank's shard, then the DataLoader worker's shard of it (interleaved: ``order[i::count]``; in a
   block order, consecutive runs of the same lengths, so that each keeps whole blocks), by rank
   first so that every rank gets the same share whatever its workers do;
4. the resume mask: positions of the shard already consumed before a saved state are left out, and
   the rest keep the positions they had in the full epoch.

With batches by duration the plan's unit is a batch instead of an item: :func:`plan_batches` cuts
the epoch into batches from the items' durations and then takes the same steps 2-4 over the batch
order (with this module's :func:`even_out` and :func:`shard`); with ``sync_buckets`` the order puts
batches of like length at the same step of every rank (NOTE [ Ranks in step ]). A state dict
(``state.py``) records which of the two plans its consumed mask counts.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ResumeError

__all__ = ["EpochShard",
    "BLOCK_WINDOW",
    "BatchPlan",
    "block_order",
    "block_starts",
    "batch_cost",
    "EpochPlan",
    "bucket_budgets",
    "bucket_edges",
    "cut_batches",
    "epoch_order",
    "even_out",
    "padding_fraction",
    "plan_batches",
    "plan_epoch",
    "shard",
    "split",
    "shard_length",
    "step_rounds",
]


@dataclass(frozen=True)
class EpochShard:
    """Which epoch one consumer runs, and its part of it: the rank's shard, then its DataLoader worker's."""

    number: int
    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1


@dataclass(frozen=True)
class EpochPlan:
    """One shard's epoch.

    Attributes:
        indices: the source indices to decode, in order (sequence number ``seq`` decodes
            ``indices[seq]``).
        positions: the shard position of each sequence number (``None``: ``seq`` itself; a resumed
            epoch skips the positions already consumed).
        size: the shard's full length, the consumed mask's length.
        consumed: one byte per shard position, 1 where it was consumed before this epoch started.
    """

    indices: np.ndarray
    positions: np.ndarray | None
    size: int
    consumed: bytes

    def __len__(self) -> int:
        return len(self.indices)

    def position(self, seq: int) -> int:
        """The shard position of sequence number ``seq``."""
        return seq if self.positions is None else int(self.positions[seq])


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The order of the source's ``n`` indices for ``epoch``: a permutation seeded by ``seed + epoch``.

    Every rank and worker computes the same order, so their shards are disjoint. Under 2**31 items the
    order is int32 (the same permutation: shuffling an int32 ``arange`` draws as ``permutation(n)`` does),
    half the memory of a plan held by the trainer and by a helper process.
    """
    order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    if not shuffle:
        return order
    return np.random.default_rng(seed + epoch).permutation(order)


# NOTE [ Block order ]
# =====================
# An object store answers a request in tens of milliseconds whatever its size up to megabytes, so
# reading an index member by member costs a request per member. With ``read_block=N`` the items are
# cut into blocks of up to N consecutive index members of one shard (:func:`block_starts`), and the
# epoch's order shuffles the blocks, then the items within each window of BLOCK_WINDOW consecutive
# blocks of that order (:func:`block_order`): the items of a block come close together, so one
# ranged request reads the whole block (``sources/blocks.py``), and an item still lands anywhere in
# its window. It is a permutation of ``0 .. n-1`` like the plain order, so exactly-once, even shards
# and the consumed mask are unchanged; only the rank and worker shards differ: consecutive runs of
# the order instead of interleaved items (:func:`split`), of the same lengths as interleaving gives,
# so each keeps whole blocks and :func:`shard_length` still holds.

#: Blocks whose items the block order shuffles among themselves (NOTE [ Block order ]).
BLOCK_WINDOW = 4


def block_starts(shard_of: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, block: int) -> np.ndarray:
    """The first item of each read block: a new block every ``block`` items, at a new shard, and where
    an item does not follow the one before it in its shard (a block is one contiguous byte range)."""
    n = len(shard_of)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"read_block must be an integer >= 1, got {block!r}")
    if n == 0:
        return np.empty(0, dtype=np.int64)
    ends = offsets + sizes
    cut = np.ones(n, dtype=bool)
    cut[1:] = (shard_of[1:] != shard_of[:-1]) | (offsets[1:] < ends[:-1]) | (offsets[1:] - ends[:-1] > _MAX_GAP)
    starts = np.flatnonzero(cut)
    # every ``block`` items within each run between cuts
    run = np.repeat(starts, np.diff(np.append(starts, n)))
    cut |= (np.arange(n) - run) % block == 0
    return np.flatnonzero(cut).astype(np.int64)


#: The most bytes between two members that still share a block (a tar header is 512).
_MAX_GAP = 1 << 16


def block_order(starts: np.ndarray, n: int, *, shuffle: bool, seed: int, epoch: int,
                window: int = BLOCK_WINDOW) -> np.ndarray:
    """The block order of ``n`` items cut into blocks at ``starts`` (NOTE [ Block order ]): the blocks
    shuffled, then the items within each window of ``window`` blocks; ``0 .. n-1`` without ``shuffle``."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed + epoch)
    lengths = np.diff(np.append(starts, n))
    chosen = rng.permutation(len(starts))
    taken = lengths[chosen]
    first = np.concatenate(([0], np.cumsum(taken)[:-1])) if len(taken) else taken
    order = np.arange(n, dtype=np.int64) + np.repeat(starts[chosen] - first, taken)
    windows = np.repeat(np.arange(len(chosen)) // window, taken)
    return order[np.lexsort((rng.random(n), windows))]


def split(order: np.ndarray, index: int, count: int) -> np.ndarray:
    """The ``index``-th of ``count`` consecutive runs of ``order``, as long as :func:`shard`'s."""
    if not 0 <= index < count:
        raise ValueError(f"shard index must be in [0, {count}), got {index}")
    n = len(order)
    start = sum(len(range(i, n, count)) for i in range(index))
    return order[start:start + len(range(index, n, count))]


def even_out(order: np.ndarray, count: int, mode: str) -> np.ndarray:
    """``order`` made divisible by ``count``: ``"pad"`` repeats items from its start, ``"drop"`` cuts the rest."""
    n = len(order)
    if mode == "pad":
        total = -(-n // count) * count
        return np.resize(order, total) if total != n else order  # np.resize repeats cyclically
    if mode == "drop":
        return order[: n // count * count]
    raise ValueError(f"even_shards must be 'pad', 'drop' or None, got {mode!r}")


def shard(order: np.ndarray, index: int, count: int) -> np.ndarray:
    """The ``index``-th of ``count`` interleaved shards of ``order`` (every item in exactly one)."""
    if not 0 <= index < count:
        raise ValueError(f"shard index must be in [0, {count}), got {index}")
    return order[index::count]


def shard_length(n: int, *, rank: int = 0, world_size: int = 1, even_shards: str | None = "pad") -> int:
    """Items of rank ``rank`` per epoch (its DataLoader workers together), without planning the epoch."""
    if world_size > 1 and even_shards == "pad":
        return -(-n // world_size)
    if world_size > 1 and even_shards == "drop":
        return n // world_size
    return len(range(rank, n, world_size))


def plan_epoch(n: int, *, shuffle: bool, seed: int, epoch: int, rank: int = 0, world_size: int = 1,
               worker: int = 0, num_workers: int = 1, even_shards: str | None = "pad",
               consumed: bytes | bytearray | None = None, blocks: np.ndarray | None = None) -> EpochPlan:
    """The plan of one shard (``rank``, ``worker``) of ``epoch`` over a corpus of ``n`` items.

    Args:
        n: the corpus size.
        shuffle, seed, epoch: the order (seeded by ``seed + epoch`` when shuffled).
        rank, world_size: this process's shard of the ranks.
        worker, num_workers: this DataLoader worker's shard of the rank's items.
        even_shards: ``"pad"``, ``"drop"`` or ``None`` (ranks may differ by one item).
        consumed: the saved mask of a resumed epoch (one byte per shard position), or ``None``.
        blocks: the first item of each read block (:func:`block_starts`): a block order, split in
            consecutive runs (NOTE [ Block order ]); ``None``: the plain order, interleaved.

    Raises:
        ResumeError: ``consumed`` does not have one byte per position of this shard.
    """
    if blocks is None:
        order, cut = epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch), shard
    else:
        order, cut = block_order(blocks, n, shuffle=shuffle, seed=seed, epoch=epoch), split
    if world_size > 1 and even_shards is not None:
        order = even_out(order, world_size, even_shards)
    indices = cut(cut(order, rank, world_size), worker, num_workers)
    size = len(indices)
    if consumed is None:
        return EpochPlan(indices, None, size, bytes(size))
    if len(consumed) != size:
        raise ResumeError(f"the saved state covers {len(consumed)} items, this epoch's shard has {size} "
                          f"(DataLoader workers: {num_workers}); resume with the setup it was saved under")
    mask = np.frombuffer(bytes(consumed), dtype=np.uint8)
    positions = np.flatnonzero(mask == 0)
    return EpochPlan(indices[positions], positions, size, bytes(consumed))


#: Candidate bucket edges: the corpus's quantiles at multiples of ``1 / _EDGE_GRID``.
_EDGE_GRID = 512


@dataclass(frozen=True)
class BatchPlan:
    """One shard's epoch of duration batches.

    Attributes:
        batches: the batches to decode, in order, each an array of source indices (sequence number
            ``seq`` decodes ``batches[seq]``).
        positions: the shard position of each sequence number (``None``: ``seq`` itself; a resumed
            epoch skips the positions already consumed).
        size: the shard's full number of batches, the consumed mask's length.
        consumed: one byte per shard position, 1 where it was consumed before this epoch started.
    """

    batches: list[np.ndarray]
    positions: np.ndarray | None
    size: int
    consumed: bytes

    def __len__(self) -> int:
        return len(self.batches)

    def position(self, seq: int) -> int:
        """The shard position of sequence number ``seq``."""
        return seq if self.positions is None else int(self.positions[seq])

    def padding_fraction(self, durations: Sequence[float] | np.ndarray) -> float:
        """The share of padding in this plan's batches: see :func:`padding_fraction`."""
        return padding_fraction(self.batches, durations)


def padding_fraction(batches: Sequence[np.ndarray], durations: Sequence[float] | np.ndarray) -> float:
    """Padded frames / frames in ``batches``, each batch padded to its longest item.

    That is ``(sum of count x longest - sum of durations) / (sum of count x longest)`` over the
    batches (an item in two batches counts twice); 0.0 when the batches hold no audio.
    """
    durations = np.asarray(durations, dtype=np.float64)
    padded = real = 0.0
    for batch in batches:
        if len(batch):
            seconds = durations[batch]
            padded += len(batch) * float(seconds.max())
            real += float(seconds.sum())
    return (padded - real) / padded if padded > 0 else 0.0


def bucket_edges(durations: np.ndarray, buckets: int) -> np.ndarray:
    """The upper edges of the first ``buckets - 1`` duration buckets (an item of duration ``d`` goes
    to bucket ``np.searchsorted(edges, d, side="left")``: the first whose edge is ``>= d``).

    The edges are quantiles of ``durations`` (at multiples of 1/512), chosen so that batches padded
    to their bucket's longest item would pad least: the optimal split of the sorted durations into
    ``buckets`` runs, found by dynamic programming over the candidate quantiles. Equal-count
    quantiles put a long tail (a few utterances much longer than the rest) into one wide bucket
    whose batches pad a lot; these edges give the tail narrower buckets. A pure function of the
    durations: every epoch and rank gets the same edges. Fewer edges come back where the corpus has
    fewer distinct durations than buckets.

    Args:
        durations: the items' durations (finite, no ``NaN``), in any order.
        buckets: the number of buckets, >= 1.
    """
    values = np.sort(np.asarray(durations, dtype=np.float64))
    n = len(values)
    if buckets <= 1 or n < 2:
        return np.empty(0, dtype=np.float64)
    # Candidate cuts: positions between two different durations, at the grid's quantiles (a cut
    # between equal durations is impossible, since buckets are assigned by value).
    grid = np.unique(np.round(np.arange(1, _EDGE_GRID) * (n / _EDGE_GRID)).astype(np.int64))
    grid = grid[(grid > 0) & (grid < n)]
    grid = grid[values[grid - 1] < values[grid]]
    if not len(grid):
        return np.empty(0, dtype=np.float64)
    points = np.concatenate(([0], grid, [n]))  # bucket j covers values[points[a]:points[b]]
    total = np.concatenate(([0.0], np.cumsum(values)))
    m = len(points)
    lo, hi = np.meshgrid(points, points, indexing="ij")  # cost[a, b]: one bucket from point a to b
    with np.errstate(invalid="ignore"):
        cost = (hi - lo) * values[np.maximum(hi - 1, 0)] - (total[hi] - total[lo])
    cost[np.tril_indices(m)] = np.inf  # a bucket ends after it starts
    # best[j]: least padding of values[:points[j]] in k buckets; splitting never adds padding, so
    # using as many buckets as there are candidate runs (up to ``buckets``) is optimal.
    count = min(buckets, m - 1)
    best = np.full(m, np.inf)
    best[0] = 0.0
    previous = np.zeros((count + 1, m), dtype=np.int64)
    for k in range(1, count + 1):
        options = best[:, None] + cost
        previous[k] = np.argmin(options, axis=0)
        best = options[previous[k], np.arange(m)]
    ends = []
    j = m - 1
    for k in range(count, 0, -1):
        j = int(previous[k][j])
        ends.append(j)
    cuts = sorted(points[e] for e in ends if e > 0)
    return values[np.asarray(cuts, dtype=np.int64) - 1]


def batch_cost(count: int, longest: float, quadratic_duration: float | None = None) -> float:
    """What a batch of ``count`` items, the longest ``longest`` seconds, costs against ``max_batch_seconds``:
    ``count x longest`` (its padded length), or with ``quadratic_duration=Q`` (attention, whose cost grows
    with the square of the length) ``count x (longest + longest**2 / Q)``, as Lhotse counts it. In
    Python floats: a cost past the largest float is infinity (over any budget), without numpy's warning."""
    if quadratic_duration is None:
        return count * float(longest)
    longest = float(longest)
    return count * (longest + longest * longest / float(quadratic_duration))


def cut_batches(indices: np.ndarray, durations: np.ndarray, max_batch_seconds: float,
                max_batch_size: int | None = None, quadratic_duration: float | None = None) -> list[np.ndarray]:
    """``indices``, in their order, cut into consecutive batches within the budget.

    A batch grows while its :func:`batch_cost` stays within ``max_batch_seconds`` and ``count <=
    max_batch_size``; an item over ``max_batch_seconds`` on its own forms a batch of one.
    """
    batches: list[np.ndarray] = []
    start = count = 0
    longest = 0.0
    limit = math.inf if max_batch_size is None else max_batch_size
    for i, seconds in enumerate(durations[indices].tolist()):
        grown = max(longest, seconds)
        if count and (batch_cost(count + 1, grown, quadratic_duration) > max_batch_seconds or count + 1 > limit):
            batches.append(indices[start:i])
            start, count, grown = i, 0, seconds
        count += 1
        longest = grown
    if count:
        batches.append(indices[start:])
    return batches


def bucket_budgets(max_batch_seconds: float | Sequence[float], count: int) -> list[float]:
    """The budget of each of ``count`` buckets, shortest first: one budget for all, or one per
    bucket.

    Where the corpus gives fewer buckets than budgets (fewer distinct durations than buckets), the
    buckets take the last ``count`` budgets: the longest bucket always takes the last one, the
    budget
    of the longest items, and each shorter one a budget meant for longer items than its own.
    """
    if isinstance(max_batch_seconds, (int, float)):
        return [float(max_batch_seconds)] * count
    budgets = [float(seconds) for seconds in max_batch_seconds]
    if count > len(budgets):
        raise ValueError(f"max_batch_seconds gives {len(budgets)} budgets for {count} buckets: "
                         f"give one "
                         f"per bucket")
    return budgets[len(budgets) - count:]


def plan_batches(durations: Sequence[float] | np.ndarray, *,
                 max_batch_seconds: float | Sequence[float], buckets: int,
                 max_batch_size: int | None = None, quadratic_duration: float | None = None, shuffle: bool,
                 seed: int, epoch: int, rank: int = 0, world_size: int = 1, worker: int = 0, num_workers: int = 1,
                 even_shards: str | None = "pad", sync_buckets: bool = False,
                 consumed: bytes | bytearray | None = None,
                 edges: Sequence[float] | None = None) -> BatchPlan:
    """The duration batches of one shard (``rank``, ``worker``) of ``epoch``.

    Args:
        durations: each source item's duration in seconds; ``NaN`` leaves an item out.
        max_batch_seconds: the budget of a batch's cost (:func:`batch_cost`: its padded duration,
            count x longest item, without ``quadratic_duration``), or one per bucket, shortest
            first (:func:`bucket_budgets`), as many as ``buckets``.
        buckets: the number of duration buckets (1: batches of any mix of lengths).
        max_batch_size: the most items in a batch, or ``None``.
        quadratic_duration: with a number of seconds ``Q``, a batch costs ``count x (longest +
            longest**2 / Q)``: long items make smaller batches (attention models); ``None``: no such term.
        shuffle, seed, epoch: without ``shuffle``, buckets keep the source order and batches come
            bucket by bucket (shortest first); with it, both are shuffled by ``seed + epoch``.
        rank, world_size: this process's shard of the ranks.
        worker, num_workers: this DataLoader worker's shard of the rank's batches.
        even_shards: ``"pad"`` (repeat batches from the start of the order), ``"drop"`` (leave the
            remainder out) or ``None`` (ranks may differ by one batch).
        sync_buckets: with ``world_size > 1``, the ranks take their batches of each step from the same
            bucket (:func:`step_rounds`); the same batches as without, in another order.
        consumed: the saved mask of a resumed epoch (one byte per batch position of this shard), or
            ``None``.
        edges: fixed upper edges of the buckets, increasing, one per budget (the last bucket also
            takes the items longer than its edge); ``None``: :func:`bucket_edges` of the durations.

    Raises:
        TypeError, ValueError: an option of the wrong type or value (the message names it).
        ResumeError: ``consumed`` does not have one byte per batch position of this shard.
    """
    values = _check_durations(durations)
    _check_int("buckets", buckets, 1)
    if not isinstance(max_batch_seconds, (list, tuple)):
        _check_number("max_batch_seconds", max_batch_seconds)
    else:
        for i, seconds in enumerate(max_batch_seconds):
            _check_number(f"max_batch_seconds[{i}]", seconds)
        if len(max_batch_seconds) != buckets:
            raise ValueError(f"max_batch_seconds gives {len(max_batch_seconds)} budgets for "
                             f"buckets={buckets}: "
                             f"give one per bucket")
    if edges is not None:
        for edge in edges:
            _check_number("a bucket edge", edge)
        if not isinstance(max_batch_seconds, (list, tuple)) or len(edges) != len(max_batch_seconds):
            raise ValueError(f"edges must give one upper edge per budget of max_batch_seconds, "
                             f"got {len(edges)}")
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"bucket edges must increase, got {list(edges)!r}")
    if max_batch_size is not None:
        _check_int("max_batch_size", max_batch_size, 1)
    if quadratic_duration is not None:
        _check_number("quadratic_duration", quadratic_duration)
    _check_int("world_size", world_size, 1)
    _check_int("num_workers", num_workers, 1)
    if even_shards not in ("pad", "drop", None):
        raise ValueError(f"even_shards must be 'pad', 'drop' or None, got {even_shards!r}")
    items = np.flatnonzero(~np.isnan(values))
    cuts = bucket_edges(values[items], buckets) if edges is None \
        else np.asarray(edges[:-1], dtype=np.float64)
    budgets = bucket_budgets(max_batch_seconds, len(cuts) + 1)
    rng = np.random.default_rng(seed + epoch) if shuffle else None
    which = np.searchsorted(cuts, values[items], side="left")
    batches: list[np.ndarray] = []
    for bucket in range(len(cuts) + 1):
        members = items[which == bucket]
        if rng is not None:
            members = rng.permutation(members)
        batches.extend(cut_batches(members, values, budgets[bucket], max_batch_size,
                                   quadratic_duration))
    if sync_buckets and world_size > 1:
        longest = np.array([values[b].max() for b in batches], dtype=np.float64)
        order = step_rounds(longest, world_size, rng, pad=even_shards == "pad")
    else:
        order = rng.permutation(len(batches)) if rng is not None else np.arange(len(batches), dtype=np.int64)
    if world_size > 1 and even_shards is not None:
        order = even_out(order, world_size, even_shards)
    mine = shard(shard(order, rank, world_size), worker, num_workers)
    size = len(mine)
    if consumed is None:
        return BatchPlan([batches[b] for b in mine], None, size, bytes(size))
    if len(consumed) != size:
        raise ResumeError(f"the saved state covers {len(consumed)} batches, this epoch's shard has {size} "
                          f"(DataLoader workers: {num_workers}); resume with the setup it was saved under")
    mask = np.frombuffer(bytes(consumed), dtype=np.uint8)
    positions = np.flatnonzero(mask == 0)
    return BatchPlan([batches[mine[p]] for p in positions], positions, size, bytes(consumed))


def step_rounds(longest: np.ndarray, world_size: int, rng: np.random.Generator | None, *,
                pad: bool = False) -> np.ndarray:
    """An order of the batches (``longest``: each batch's longest item) in which every run of ``world_size``
    consecutive batches, one step of every rank once sharded, holds batches of like length; with ``pad``,
    a short last round is filled up with the batches next shorter than its own (repeated), so the order
    divides by ``world_size``.

    NOTE [ Ranks in step ]
    ======================
    Under DDP every step waits for the slowest rank, so the ranks' batches of one step should pad to like
    lengths. The batches (cut bucket by bucket, as without sync) are sorted by their longest item and cut
    into rounds of ``world_size``: a round holds batches of one bucket, or of two neighbouring buckets where
    a bucket's batches do not divide by ``world_size``. Shuffled, the rounds' order and each round's
    batches among the ranks are seeded by ``seed + epoch`` (``rng``), so every rank computes the same
    rounds with no communication; unshuffled, rounds go shortest first. A short last round (the longest
    batches, left over) is filled up with the batches next shorter than its own under
    ``even_shards="pad"`` (those repeat, as padding repeats batches), and otherwise stays last for
    ``even_shards`` to drop or leave short. The batches are the same as without sync, so the padding is
    too, and exactly-once, equal counts and resume are those of any order.
    """
    n = len(longest)
    if rng is None:
        ranked = np.argsort(longest, kind="stable")
    else:
        ranked = np.lexsort((rng.random(n), longest))  # ties in a seeded order
    full = n // world_size * world_size
    short = ranked[full:]
    if pad and len(short) and n >= world_size:
        ranked = np.concatenate((ranked[:full], ranked[full - (world_size - len(short)):]))
        full, short = len(ranked), short[:0]
    rounds = ranked[:full].reshape(-1, world_size)
    if rng is not None:
        rounds = rounds[rng.permutation(len(rounds))]
        rounds = rng.permuted(rounds, axis=1)  # which rank takes which batch of its round
    return np.concatenate((rounds.reshape(-1), short)).astype(np.int64)


def _check_durations(durations: Sequence[float] | np.ndarray) -> np.ndarray:
    try:
        values = np.asarray(durations, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"durations must be a sequence of numbers (seconds), got {durations!r:.80}") from exc
    if values.ndim != 1:
        raise ValueError(f"durations must be one-dimensional, got shape {values.shape}")
    bad = np.flatnonzero(np.isinf(values) | (values < 0))
    if len(bad):
        raise ValueError(f"durations must be finite and >= 0 (NaN leaves an item out), got "
                         f"{float(values[bad[0]])!r} for item {int(bad[0])}")
    return values


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds > 0, got {value!r}")
    if not (math.isfinite(float(value)) and float(value) > 0):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")


def _check_int(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {least}, got {value!r}")
    if int(value) < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
