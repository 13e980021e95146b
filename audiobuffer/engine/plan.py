"""The epoch plan: which items one shard of one epoch yields, and in what order.

A pure function of the corpus size and the setup, with no threads, files or torch, so that every
process computes the same plan and exactly-once can be tested on the plan alone. The steps, in order:

1. the epoch's order: ``0 .. n-1``, or a permutation seeded by ``seed + epoch``;
2. even shards: with ``world_size > 1``, padded (repeating from the start) or cut to a multiple of
   ``world_size``, so that every rank gets as many items and none waits forever in a collective;
3. the rank's shard, then the DataLoader worker's shard of it (interleaved: ``order[i::count]``), by
   rank first so that every rank gets the same share whatever its workers do;
4. the resume mask: positions of the shard already consumed before a saved state are left out, and
   the rest keep the positions they had in the full epoch.

With batches by duration the plan's unit is a batch instead of an item: ``_batching.plan_batches`` cuts
the epoch into batches from the items' durations and then takes the same steps 2-4 over the batch
order (with this module's :func:`even_out` and :func:`shard`). A state dict records which of the two
plans it counts (:data:`STATE_BATCHING`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ResumeError

__all__ = ["EpochPlan", "decode_state", "encode_state", "epoch_order", "even_out", "plan_epoch", "shard",
           "shard_length"]


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

    Every rank and worker computes the same order, so their shards are disjoint.
    """
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng(seed + epoch).permutation(n)


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
               consumed: bytes | bytearray | None = None) -> EpochPlan:
    """The plan of one shard (``rank``, ``worker``) of ``epoch`` over a corpus of ``n`` items.

    Args:
        n: the corpus size.
        shuffle, seed, epoch: the order (seeded by ``seed + epoch`` when shuffled).
        rank, world_size: this process's shard of the ranks.
        worker, num_workers: this DataLoader worker's shard of the rank's items.
        even_shards: ``"pad"``, ``"drop"`` or ``None`` (ranks may differ by one item).
        consumed: the saved mask of a resumed epoch (one byte per shard position), or ``None``.

    Raises:
        ResumeError: ``consumed`` does not have one byte per position of this shard.
    """
    order = epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    if world_size > 1 and even_shards is not None:
        order = even_out(order, world_size, even_shards)
    indices = shard(shard(order, rank, world_size), worker, num_workers)
    size = len(indices)
    if consumed is None:
        return EpochPlan(indices, None, size, bytes(size))
    if len(consumed) != size:
        raise ResumeError(f"the saved state covers {len(consumed)} items, this epoch's shard has {size} "
                          f"(DataLoader workers: {num_workers}); resume with the setup it was saved under")
    mask = np.frombuffer(bytes(consumed), dtype=np.uint8)
    positions = np.flatnonzero(mask == 0)
    return EpochPlan(indices[positions], positions, size, bytes(consumed))


# -- resume: the consumed mask in a state dict ---------------------------------------------------

#: Keys of a state dict (``BufferedDataset.STATE_*`` name the same strings).
STATE_VERSION = "version"
STATE_EPOCH = "epoch"
STATE_SEED = "seed"
STATE_SHUFFLE = "shuffle"
STATE_RANK = "rank"
STATE_WORLD_SIZE = "world_size"
STATE_EVEN_SHARDS = "even_shards"
STATE_SOURCE = "source_fingerprint"
STATE_ITEMS = "items"
STATE_CONSUMED = "consumed"
#: The batches by duration a state's mask counts (their budget, buckets and a digest of the durations),
#: or ``None`` where it counts items; part of the setup (a setup without the key means ``None``).
STATE_BATCHING = "batching"
#: The setup a state was saved under; a state loads only into the same setup (and the same batching).
SETUP_KEYS = (STATE_SEED, STATE_SHUFFLE, STATE_RANK, STATE_WORLD_SIZE, STATE_EVEN_SHARDS, STATE_SOURCE)
#: 3: with the batching key (the consumed mask counts batches where it is not None); 2 (still loaded):
#: the consumed bitmap as a base64 str (JSON-serialisable); 1 (still loaded): as bytes. 1 and 2 count items.
STATE_FORMAT = 3


def pack_consumed(consumed: bytes | bytearray) -> str:
    """One byte per position (0 or 1) -> a base64 string of the bitmap (8 positions a byte)."""
    bits = np.packbits(np.frombuffer(bytes(consumed), dtype=np.uint8))
    return base64.b64encode(bits.tobytes()).decode("ascii")


def unpack_consumed(packed: Any, items: int) -> bytes:
    """The one-byte-per-position mask of :func:`pack_consumed`'s string (or format 1's ``bytes``).

    Raises:
        ResumeError: ``packed`` is not a bitmap of ``items`` positions.
    """
    if isinstance(packed, str):
        try:
            raw = base64.b64decode(packed.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise ResumeError(f"consumed must be a base64 string, got {packed[:40]!r}") from exc
    elif isinstance(packed, (bytes, bytearray)):
        raw = bytes(packed)
    else:
        raise ResumeError(f"consumed must be a base64 string, got {type(packed).__name__}")
    if len(raw) != (items + 7) // 8:
        raise ResumeError(f"consumed must hold {(items + 7) // 8} bytes for {items} items, got {len(raw)}")
    return np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[:items].tobytes()


def encode_state(setup: Mapping[str, Any], epoch: int, consumed: bytes | bytearray | None) -> dict[str, Any]:
    """A state dict of plain builtins: ``setup`` (see :data:`SETUP_KEYS` and :data:`STATE_BATCHING`), the
    epoch and its consumed mask (of items, or of batches where ``setup``'s batching is not ``None``)."""
    state: dict[str, Any] = {STATE_VERSION: STATE_FORMAT, STATE_EPOCH: epoch}
    state.update((key, setup[key]) for key in SETUP_KEYS)
    state[STATE_BATCHING] = setup.get(STATE_BATCHING)
    state[STATE_ITEMS] = None if consumed is None else len(consumed)
    state[STATE_CONSUMED] = "" if consumed is None else pack_consumed(consumed)
    return state


def decode_state(setup: Mapping[str, Any], state: Any) -> tuple[int, bytes | None]:
    """``(epoch, consumed mask or None)`` of a state dict, checked against ``setup``; nothing is changed.

    Raises:
        ResumeError: the state is malformed or was saved under another setup.
    """
    if not isinstance(state, Mapping):
        raise ResumeError(f"a state dict is a dict, got {type(state).__name__}")
    missing = [k for k in (STATE_VERSION, STATE_EPOCH, *SETUP_KEYS, STATE_ITEMS, STATE_CONSUMED) if k not in state]
    if missing:
        raise ResumeError(f"the state dict lacks {missing}")
    if state[STATE_VERSION] not in (1, 2, STATE_FORMAT):
        raise ResumeError(f"state format {state[STATE_VERSION]!r} is not 1, 2 or {STATE_FORMAT}")
    if state[STATE_VERSION] == STATE_FORMAT and STATE_BATCHING not in state:
        raise ResumeError(f"the state dict lacks {[STATE_BATCHING]}")
    saved = {**state, STATE_BATCHING: state.get(STATE_BATCHING)}  # formats 1 and 2 count items
    wanted = {**setup, STATE_BATCHING: setup.get(STATE_BATCHING)}
    for key in (*SETUP_KEYS, STATE_BATCHING):
        if saved[key] != wanted[key]:
            raise ResumeError(f"the state was saved with {key}={saved[key]!r}, this dataset has {key}={wanted[key]!r}; "
                              f"resume with the setup it was saved under")
    epoch, items = state[STATE_EPOCH], state[STATE_ITEMS]
    for key, value in ((STATE_EPOCH, epoch), (STATE_ITEMS, items)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ResumeError(f"the state's {key} must be an integer >= 0, got {value!r}")
    if epoch is None:
        raise ResumeError("the state's epoch must be an integer >= 0, got None")
    if items is None:
        return epoch, None
    return epoch, unpack_consumed(state[STATE_CONSUMED], items)
