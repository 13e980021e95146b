"""The epoch plan alone (no threads, no files): exactly once across ranks and workers, resume, state."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audiobuffer import ResumeError
from audiobuffer.engine.plan import (
    BLOCK_WINDOW,
    block_order,
    block_starts,
    plan_epoch,
    shard_length,
)
from audiobuffer.engine.state import decode_state, encode_state

SETUP = {"seed": 3, "shuffle": True, "rank": 0, "world_size": 1, "even_shards": "pad", "source_fingerprint": "x"}


@settings(deadline=None, max_examples=200)
@given(n=st.integers(1, 300), world_size=st.integers(1, 7), num_workers=st.integers(1, 4),
       shuffle=st.booleans(), seed=st.integers(0, 2**32), epoch=st.integers(0, 50),
       even_shards=st.sampled_from(["pad", "drop", None]))
def test_every_item_once_across_ranks_and_workers(n, world_size, num_workers, shuffle, seed, epoch, even_shards):
    per_rank = []
    for rank in range(world_size):
        items = []
        for worker in range(num_workers):
            plan = plan_epoch(n, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                              worker=worker, num_workers=num_workers, even_shards=even_shards)
            assert plan.positions is None and plan.size == len(plan)
            items += plan.indices.tolist()
        assert len(items) == shard_length(n, rank=rank, world_size=world_size, even_shards=even_shards)
        per_rank.append(items)
    everything = [i for items in per_rank for i in items]
    if world_size > 1 and even_shards is not None:
        assert len({len(items) for items in per_rank}) == 1  # equal ranks: no collective waits forever
    if world_size == 1 or even_shards is None:
        assert sorted(everything) == list(range(n))  # each item exactly once
    elif even_shards == "pad":
        assert set(everything) == set(range(n)) and len(everything) - n < world_size  # repeats only to pad
    else:
        assert len(set(everything)) == len(everything) and n - len(everything) < world_size  # drops the rest


@settings(deadline=None, max_examples=200)
@given(n=st.integers(1, 200), data=st.data())
def test_resume_leaves_out_exactly_the_consumed_positions(n, data):
    full = plan_epoch(n, shuffle=True, seed=1, epoch=2)
    mask = bytes(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    plan = plan_epoch(n, shuffle=True, seed=1, epoch=2, consumed=mask)
    rest = [p for p in range(n) if not mask[p]]
    assert plan.positions is not None and plan.positions.tolist() == rest
    assert plan.indices.tolist() == [int(full.indices[p]) for p in rest]
    assert [plan.position(seq) for seq in range(len(plan))] == rest


def _blocks(n: int, block: int, shards: int) -> np.ndarray:
    """Block starts of ``n`` members packed back to back in ``shards`` shards (100-byte members, headers between)."""
    shard_of = np.arange(n) * shards // max(n, 1)
    offsets = np.arange(n, dtype=np.int64) * 612 + 512
    return block_starts(shard_of, offsets, np.full(n, 100, dtype=np.int64), block)


@settings(deadline=None, max_examples=200)
@given(n=st.integers(1, 300), block=st.integers(1, 40), shards=st.integers(1, 4), world_size=st.integers(1, 5),
       num_workers=st.integers(1, 3), shuffle=st.booleans(), seed=st.integers(0, 2**32), epoch=st.integers(0, 50),
       even_shards=st.sampled_from(["pad", "drop", None]))
def test_a_block_order_keeps_every_item_once_and_the_shard_lengths(n, block, shards, world_size, num_workers, shuffle,
                                                                   seed, epoch, even_shards):
    starts = _blocks(n, block, shards)
    full = block_order(starts, n, shuffle=shuffle, seed=seed, epoch=epoch)
    assert sorted(full.tolist()) == list(range(n))
    per_rank = []
    for rank in range(world_size):
        items = []
        for worker in range(num_workers):
            plan = plan_epoch(n, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                              worker=worker, num_workers=num_workers, even_shards=even_shards, blocks=starts)
            items += plan.indices.tolist()
        assert len(items) == shard_length(n, rank=rank, world_size=world_size, even_shards=even_shards)
        per_rank.append(items)
    everything = [i for items in per_rank for i in items]
    if world_size == 1 or even_shards is None:
        assert sorted(everything) == list(range(n))
    elif even_shards == "pad":
        assert set(everything) == set(range(n)) and len({len(items) for items in per_rank}) == 1
    else:
        assert len(set(everything)) == len(everything) and len({len(items) for items in per_rank}) == 1
    # each rank reads its items in block runs: a block is shared only where a window straddles two ranks
    block_of = np.searchsorted(starts, np.arange(n), side="right") - 1
    read = sum(len(set(block_of[items].tolist())) for items in per_rank)
    padded = world_size if even_shards == "pad" else 0
    assert read <= len(starts) + (world_size * num_workers - 1) * BLOCK_WINDOW + padded


def test_blocks_are_cut_at_shards_every_n_members_and_at_gaps():
    shard_of = np.array([0, 0, 0, 0, 0, 1, 1, 1])
    offsets = np.array([0, 10, 20, 30, 200_000, 0, 10, 5])  # a gap before member 4; member 7 goes back
    sizes = np.full(8, 10)
    assert block_starts(shard_of, offsets, sizes, 3).tolist() == [0, 3, 4, 5, 7]
    assert block_starts(shard_of, offsets, sizes, 100).tolist() == [0, 4, 5, 7]
    with pytest.raises(ValueError, match="read_block must be an integer >= 1, got 0"):
        block_starts(shard_of, offsets, sizes, 0)


@settings(deadline=None, max_examples=100)
@given(n=st.integers(1, 400), block=st.integers(1, 20), seed=st.integers(0, 2**32))
def test_a_block_comes_within_one_window_of_the_order(n, block, seed):
    starts = _blocks(n, block, 1)
    order = block_order(starts, n, shuffle=True, seed=seed, epoch=0)
    where = np.empty(n, dtype=np.int64)
    where[order] = np.arange(n)
    for b, start in enumerate(starts.tolist()):
        end = int(starts[b + 1]) if b + 1 < len(starts) else n
        span = where[start:end]
        assert span.max() - span.min() < BLOCK_WINDOW * block
    assert np.array_equal(order, block_order(starts, n, shuffle=True, seed=seed, epoch=0))
    assert block_order(starts, n, shuffle=False, seed=seed, epoch=0).tolist() == list(range(n))


@settings(deadline=None, max_examples=100)
@given(n=st.integers(1, 200), world_size=st.integers(1, 3), data=st.data())
def test_a_block_order_resumes_exactly(n, world_size, data):
    starts = _blocks(n, 8, 2)
    setup = dict(shuffle=True, seed=4, epoch=1, rank=world_size - 1, world_size=world_size, blocks=starts)
    full = plan_epoch(n, **setup)
    mask = bytes(data.draw(st.lists(st.integers(0, 1), min_size=full.size, max_size=full.size)))
    plan = plan_epoch(n, consumed=mask, **setup)
    rest = [p for p in range(full.size) if not mask[p]]
    assert plan.indices.tolist() == [int(full.indices[p]) for p in rest]


def test_the_order_depends_on_seed_and_epoch_only():
    a = plan_epoch(100, shuffle=True, seed=5, epoch=1).indices
    assert np.array_equal(a, plan_epoch(100, shuffle=True, seed=5, epoch=1).indices)
    assert not np.array_equal(a, plan_epoch(100, shuffle=True, seed=5, epoch=2).indices)
    assert plan_epoch(5, shuffle=False, seed=5, epoch=9).indices.tolist() == [0, 1, 2, 3, 4]


def test_a_mask_of_another_length_is_refused():
    with pytest.raises(ResumeError, match="covers 3 items, this epoch's shard has 10"):
        plan_epoch(10, shuffle=False, seed=0, epoch=0, consumed=b"\0\1\0")


def test_state_round_trips_through_json_and_checks_its_setup():
    mask = bytes([1, 0, 1, 1, 0, 0, 0, 1, 1])
    state = json.loads(json.dumps(encode_state(SETUP, 4, mask)))
    assert decode_state(SETUP, state) == (4, mask)
    assert decode_state(SETUP, encode_state(SETUP, 2, None)) == (2, None)
    with pytest.raises(ResumeError, match="saved with seed=3, this dataset has seed=4"):
        decode_state({**SETUP, "seed": 4}, state)
    with pytest.raises(ResumeError, match="lacks"):
        decode_state(SETUP, {"epoch": 1})
    with pytest.raises(ResumeError, match="base64"):
        decode_state(SETUP, {**state, "consumed": "not base64!"})
    with pytest.raises(ResumeError, match="must hold 2 bytes for 9 items"):
        decode_state(SETUP, {**state, "consumed": "AAAA"})


def test_the_epoch_order_is_int32_and_the_permutation_it_always_was():
    from audiobuffer.engine.plan import epoch_order

    for n in (0, 1, 7, 100_003):
        order = epoch_order(n, shuffle=True, seed=3, epoch=2)
        assert order.dtype == np.int32
        assert order.tolist() == np.random.default_rng(5).permutation(n).tolist()  # as saved states were planned
        assert epoch_order(n, shuffle=False, seed=3, epoch=2).tolist() == list(range(n))
