"""The resume state format: a state dict's keys, its consumed mask packed as base64, and the check
that a state was saved under the setup it is loaded into.

A pure format of plain builtins (no threads, files or torch); ``loaders/_state.py`` writes and reads
it for every loader. The mask is a plan's (``plan.py``): one byte per unit of a shard's epoch.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ResumeError

__all__ = ["DEALT_FORMAT", "FORMATS", "SETUP_KEYS", "STATE_BATCHING", "STATE_CONSUMED",
           "STATE_DEALT", "STATE_EPOCH", "STATE_EVEN_SHARDS", "STATE_FORMAT", "STATE_ITEMS",
           "STATE_RANK", "STATE_READ_BLOCK", "STATE_SEED", "STATE_SHUFFLE", "STATE_SOURCE",
           "STATE_VERSION", "STATE_WORLD_SIZE", "decode_dealt", "decode_state", "encode_state",
           "pack_consumed", "unpack_consumed"]

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
#: The batches by duration a state's mask counts (their budget, buckets and a digest of the
#: durations), or ``None`` where it counts items; part of the setup (a setup without the key means
#: ``None``).
STATE_BATCHING = "batching"
#: The members a read block holds (``read_block`` resolved), where the order is a block order
#: (NOTE [ Block order ] in ``plan.py``); part of the setup, written only where not ``None``
#: (a state without the key means ``None``).
STATE_READ_BLOCK = "read_block"
#: An epoch dealt from merged states (``engine/resize.py``): ``{"units": U, "done": mask}``, the
#: units of the epoch delivered before the merge (packed as the consumed mask); the consumed mask
#: then counts this rank's share of the rest. Written only where not ``None``.
STATE_DEALT = "dealt"
#: The setup a state was saved under; a state loads only into the same setup (and batching).
SETUP_KEYS = (STATE_SEED, STATE_SHUFFLE, STATE_RANK, STATE_WORLD_SIZE, STATE_EVEN_SHARDS,
              STATE_SOURCE)
#: 3: with the batching key (the consumed mask counts batches where it is not None); 2 (still
#: loaded): the consumed bitmap as a base64 str (JSON-serialisable); 1 (still loaded): as bytes.
#: 1 and 2 count items.
STATE_FORMAT = 3
#: A state with :data:`STATE_DEALT` (format 3 otherwise, so that older readers load the rest).
DEALT_FORMAT = 4
#: Every format a state may have: the older item counts (1, 2) read as ever.
FORMATS = (1, 2, STATE_FORMAT, DEALT_FORMAT)


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
        raise ResumeError(f"consumed must hold {(items + 7) // 8} bytes for {items} items, "
                          f"got {len(raw)}")
    return np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[:items].tobytes()


def encode_state(setup: Mapping[str, Any], epoch: int, consumed: bytes | bytearray | None,
                 dealt: bytes | None = None) -> dict[str, Any]:
    """A state dict of plain builtins: ``setup`` (see :data:`SETUP_KEYS` and
    :data:`STATE_BATCHING`), the epoch and its consumed mask (of items, or of batches where
    ``setup``'s batching is not ``None``); ``dealt``: the done mask of a dealt epoch
    (:data:`STATE_DEALT`)."""
    version = STATE_FORMAT if dealt is None else DEALT_FORMAT
    state: dict[str, Any] = {STATE_VERSION: version, STATE_EPOCH: epoch}
    state.update((key, setup[key]) for key in SETUP_KEYS)
    state[STATE_BATCHING] = setup.get(STATE_BATCHING)
    if setup.get(STATE_READ_BLOCK) is not None:  # a block order: another order of the items
        state[STATE_READ_BLOCK] = setup[STATE_READ_BLOCK]
    state[STATE_ITEMS] = None if consumed is None else len(consumed)
    state[STATE_CONSUMED] = "" if consumed is None else pack_consumed(consumed)
    if dealt is not None:
        state[STATE_DEALT] = {"units": len(dealt), "done": pack_consumed(dealt)}
    return state


def decode_dealt(state: Mapping[str, Any]) -> bytes | None:
    """The done mask of a dealt epoch's state (:data:`STATE_DEALT`), or ``None``: not dealt.

    Raises:
        ResumeError: the key is malformed, or present in a state of another format.
    """
    dealt = state.get(STATE_DEALT)
    if (dealt is None) != (state.get(STATE_VERSION) != DEALT_FORMAT):
        raise ResumeError(f"a state of format {DEALT_FORMAT} has the key {STATE_DEALT!r} and "
                          f"others do not; got format {state.get(STATE_VERSION)!r}")
    if dealt is None:
        return None
    units = dealt.get("units") if isinstance(dealt, Mapping) else None
    if isinstance(units, bool) or not isinstance(units, int) or units < 0:
        raise ResumeError(f"the state's {STATE_DEALT} must be {{'units': integer >= 0, 'done': "
                          f"mask}}, got {dealt!r:.80}")
    return unpack_consumed(dealt.get("done"), units)


def decode_state(setup: Mapping[str, Any], state: Any) -> tuple[int, bytes | None]:
    """``(epoch, consumed mask or None)`` of a state dict, checked against ``setup``; nothing is
    changed.

    Raises:
        ResumeError: the state is malformed or was saved under another setup.
    """
    if not isinstance(state, Mapping):
        raise ResumeError(f"a state dict is a dict, got {type(state).__name__}")
    required = (STATE_VERSION, STATE_EPOCH, *SETUP_KEYS, STATE_ITEMS, STATE_CONSUMED)
    missing = [k for k in required if k not in state]
    if missing:
        raise ResumeError(f"the state dict lacks {missing}")
    if state[STATE_VERSION] not in FORMATS:
        raise ResumeError(f"state format {state[STATE_VERSION]!r} is not one of {list(FORMATS)}")
    if state[STATE_VERSION] >= STATE_FORMAT and STATE_BATCHING not in state:
        raise ResumeError(f"the state dict lacks {[STATE_BATCHING]}")
    saved = {**state, STATE_BATCHING: state.get(STATE_BATCHING),  # formats 1 and 2 count items
             STATE_READ_BLOCK: state.get(STATE_READ_BLOCK)}
    wanted = {**setup, STATE_BATCHING: setup.get(STATE_BATCHING),
              STATE_READ_BLOCK: setup.get(STATE_READ_BLOCK)}
    for key in (*SETUP_KEYS, STATE_BATCHING, STATE_READ_BLOCK):
        if saved[key] != wanted[key]:
            raise ResumeError(f"the state was saved with {key}={saved[key]!r}, this dataset has "
                              f"{key}={wanted[key]!r}; resume with the setup it was saved under")
    epoch, items = state[STATE_EPOCH], state[STATE_ITEMS]
    for key, value in ((STATE_EPOCH, epoch), (STATE_ITEMS, items)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise ResumeError(f"the state's {key} must be an integer >= 0, got {value!r}")
    if epoch is None:
        raise ResumeError("the state's epoch must be an integer >= 0, got None")
    if items is None:
        return epoch, None
    return epoch, unpack_consumed(state[STATE_CONSUMED], items)
