"""The epoch plan alone (no threads, no files): exactly once across ranks and workers, resume, state."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audiobuffer import ResumeError
from audiobuffer.engine.plan import decode_state, encode_state, plan_epoch, shard_length

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
