"""The duration-batch plan (audiobuffer/engine/plan.py), tested on the plan alone."""

import math
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from audiobuffer import ResumeError
from audiobuffer.engine.plan import (
    BatchPlan,
    batch_cost,
    bucket_edges,
    cut_batches,
    padding_fraction,
    plan_batches,
)
from audiobuffer.engine.state import pack_consumed, unpack_consumed


def keys(batches):
    return [tuple(int(i) for i in b) for b in batches]


def corpus(kind, n, seed):
    """Durations of ``n`` items: ``kind`` picks the mix."""
    rng = np.random.default_rng(seed)
    if kind == "equal":
        return np.full(n, 2.0)
    if kind == "speech":
        return np.clip(rng.lognormal(math.log(5), 0.6, n), 1, 20)
    if kind == "tail":  # mostly short, a few very long
        return np.where(rng.random(n) < 0.05, rng.uniform(20, 40, n), rng.uniform(0.2, 2, n))
    if kind == "failed":  # some headers unreadable: NaN
        d = rng.uniform(0.5, 8, n)
        d[rng.random(n) < 0.2] = np.nan
        return d
    return rng.uniform(0.0, 30.0, n).round(1)  # "mixed", ties and zero lengths included


corpora = st.builds(corpus, st.sampled_from(["equal", "speech", "tail", "failed", "mixed"]),
                    st.integers(0, 300), st.integers(0, 2**16))
setups = st.fixed_dictionaries({
    "max_batch_seconds": st.sampled_from([5.0, 20.0, 60.0, 120.0]),
    "buckets": st.integers(1, 12),
    "max_batch_size": st.one_of(st.none(), st.integers(1, 16)),
    "quadratic_duration": st.one_of(st.none(), st.sampled_from([2.0, 15.0, 300.0])),
    "sync_buckets": st.booleans(),
    "shuffle": st.booleans(),
    "seed": st.integers(0, 1000),
    "epoch": st.integers(0, 5),
})


def all_ranks(durations, world_size, even_shards, **setup):
    return [plan_batches(durations, rank=r, world_size=world_size, even_shards=even_shards, **setup)
            for r in range(world_size)]


@settings(deadline=None, max_examples=150)
@given(durations=corpora, setup=setups, world_size=st.integers(1, 7),
       even_shards=st.sampled_from(["pad", "drop", None]))
def test_each_item_once_budget_kept_equal_ranks(durations, setup, world_size, even_shards):
    plans = all_ranks(durations, world_size, even_shards, **setup)
    everything = plan_batches(durations, **setup)  # the epoch's batches, before sharding (one rank: no sync)
    total = len(everything)
    counts = [len(p) for p in plans]
    if even_shards == "pad" and world_size > 1:
        assert counts == [math.ceil(total / world_size)] * world_size
    elif even_shards == "drop" and world_size > 1:
        assert counts == [total // world_size] * world_size
    else:
        assert sum(counts) == total and max(counts) - min(counts) <= 1
    batches = [b for p in plans for b in keys(p.batches)]
    distinct = set(batches)
    assert distinct <= set(keys(everything.batches))
    seen = [i for b in distinct for i in b]
    assert len(seen) == len(set(seen)), "an item is in two different batches"
    valid = set(np.flatnonzero(~np.isnan(durations)).tolist())
    if even_shards == "drop" and world_size > 1:
        assert set(seen) <= valid and len(batches) == len(distinct)
    else:
        assert set(seen) == valid  # every item with a duration, NaN ones left out
        assert len(distinct) == total, "every batch of the epoch is dealt; only padding repeats one"
    for batch in everything.batches:
        assert len(batch) >= 1
        longest = durations[batch].max()
        cost = batch_cost(len(batch), longest, setup["quadratic_duration"])
        assert cost <= setup["max_batch_seconds"] or (
            len(batch) == 1 and cost > setup["max_batch_seconds"]), (len(batch), longest)
        if setup["max_batch_size"] is not None:
            assert len(batch) <= setup["max_batch_size"]


@settings(deadline=None, max_examples=100)
@given(durations=corpora, setup=setups, world_size=st.integers(1, 5), data=st.data())
def test_resume_yields_exactly_the_batches_not_consumed(durations, setup, world_size, data):
    rank = data.draw(st.integers(0, world_size - 1))
    full = plan_batches(durations, rank=rank, world_size=world_size, **setup)
    mask = data.draw(st.lists(st.booleans(), min_size=full.size, max_size=full.size))
    consumed = bytes(mask)
    # The mask travels in a state dict as _plan's packed bitmap.
    consumed = unpack_consumed(pack_consumed(consumed), full.size)
    resumed = plan_batches(durations, rank=rank, world_size=world_size, consumed=consumed, **setup)
    expected = [(p, b) for p, b in enumerate(keys(full.batches)) if not mask[p]]
    assert [(resumed.position(s), b) for s, b in enumerate(keys(resumed.batches))] == expected
    assert resumed.size == full.size and resumed.consumed == consumed


def step_gap(durations, plans):
    """The mean over steps of (longest - shortest) / longest of the ranks' padded lengths at that step."""
    gaps = []
    for step in zip(*(p.batches for p in plans)):
        lengths = [float(durations[b].max()) for b in step]
        gaps.append((max(lengths) - min(lengths)) / max(lengths))
    return float(np.mean(gaps))


@pytest.mark.parametrize("world_size", [2, 4])
def test_synced_ranks_take_each_steps_batches_of_like_length(world_size):
    durations = np.clip(np.random.default_rng(world_size).lognormal(math.log(6.2), 0.55, 800), 1.1, 22.4)
    setup = dict(max_batch_seconds=60.0, buckets=10, shuffle=True, seed=3, epoch=2)
    synced = all_ranks(durations, world_size, "pad", sync_buckets=True, **setup)
    apart = all_ranks(durations, world_size, "pad", sync_buckets=False, **setup)
    assert step_gap(durations, synced) <= 0.10 < 0.30 <= step_gap(durations, apart)
    assert len({len(p) for p in synced}) == 1 and len(synced[0]) == len(apart[0])
    padding = [np.mean([p.padding_fraction(durations) for p in plans]) for plans in (synced, apart)]
    assert padding[0] <= 0.10 and padding[0] == pytest.approx(padding[1], abs=0.01)


@pytest.mark.parametrize("shuffle", [False, True])
def test_sync_deals_the_same_batches_in_another_order(shuffle):
    durations = corpus("speech", 300, 2)
    setup = dict(max_batch_seconds=40.0, buckets=6, shuffle=shuffle, seed=1, epoch=0)
    synced = all_ranks(durations, 3, None, sync_buckets=True, **setup)
    apart = all_ranks(durations, 3, None, sync_buckets=False, **setup)
    assert sorted(b for p in synced for b in keys(p.batches)) == sorted(b for p in apart for b in keys(p.batches))
    assert [b for p in synced for b in keys(p.batches)] != [b for p in apart for b in keys(p.batches)]
    if not shuffle:  # shortest first, step by step
        longest = [max(float(durations[b].max()) for b in step) for step in zip(*(p.batches for p in synced))]
        assert longest == sorted(longest)


def test_sync_with_one_rank_changes_nothing():
    durations = corpus("speech", 200, 5)
    setup = dict(max_batch_seconds=40.0, buckets=6, shuffle=True, seed=1, epoch=0)
    assert keys(plan_batches(durations, sync_buckets=True, **setup).batches) == \
        keys(plan_batches(durations, **setup).batches)


def test_batch_cost_is_the_padded_length_plus_lhotses_quadratic_term():
    assert batch_cost(4, 5.0) == 20.0
    assert batch_cost(4, 5.0, 10.0) == pytest.approx(4 * (5.0 + 25.0 / 10.0))
    assert batch_cost(1, 30.0, 30.0) == pytest.approx(60.0)


def test_quadratic_duration_gives_long_items_smaller_batches_within_the_budget():
    durations = corpus("speech", 600, 4)
    setup = dict(max_batch_seconds=120.0, buckets=10, shuffle=True, seed=1, epoch=0)
    linear = plan_batches(durations, **setup)
    quadratic = plan_batches(durations, quadratic_duration=15.0, **setup)

    def mean_size(plan, longer_than):
        sizes = [len(b) for b in plan.batches if durations[b].max() > longer_than]
        return sum(sizes) / len(sizes)

    assert sorted(i for b in quadratic.batches for i in b) == list(range(600))
    for batch in quadratic.batches:
        longest = float(durations[batch].max())
        assert len(batch) == 1 or len(batch) * (longest + longest**2 / 15.0) <= 120.0
    assert len(quadratic) > len(linear)
    # The quadratic term weighs most on the longest items: their batches shrink the most.
    long_ratio = mean_size(quadratic, 12.0) / mean_size(linear, 12.0)
    short_ratio = mean_size(quadratic, 0.0) / mean_size(linear, 0.0)
    assert long_ratio < short_ratio < 1.0


@pytest.mark.parametrize("value, error", [(0.0, ValueError), (math.inf, ValueError), ("15", TypeError)])
def test_quadratic_duration_is_a_number_of_seconds(value, error):
    with pytest.raises(error, match="quadratic_duration must be"):
        plan_batches([1.0, 2.0], max_batch_seconds=4.0, buckets=1, quadratic_duration=value, shuffle=False, seed=0,
                     epoch=0)


def test_resume_mask_of_the_wrong_length_is_refused():
    durations = corpus("speech", 100, 0)
    full = plan_batches(durations, max_batch_seconds=60, buckets=4, shuffle=True, seed=0, epoch=0)
    with pytest.raises(ResumeError, match=f"covers {full.size + 1} batches, this epoch's shard has {full.size}"):
        plan_batches(durations, max_batch_seconds=60, buckets=4, shuffle=True, seed=0, epoch=0,
                     consumed=bytes(full.size + 1))


def test_same_seed_and_epoch_same_plan_another_epoch_another_order():
    durations = corpus("speech", 500, 1)
    setup = dict(max_batch_seconds=60.0, buckets=10, shuffle=True, seed=7)
    first = plan_batches(durations, epoch=3, **setup)
    assert keys(first.batches) == keys(plan_batches(list(durations), epoch=3, **setup).batches)
    other = plan_batches(durations, epoch=4, **setup)
    assert keys(other.batches) != keys(first.batches)
    assert {frozenset(b) for b in keys(other.batches)} != {frozenset(b) for b in keys(first.batches)}, \
        "each bucket is shuffled anew: the batches themselves change, not only their order"
    assert sorted(i for b in other.batches for i in b) == list(range(500))  # the same items
    reseeded = plan_batches(durations, epoch=3, **{**setup, "seed": 8})
    assert keys(reseeded.batches) != keys(first.batches)


def test_without_shuffle_batches_follow_the_source_order_bucket_by_bucket():
    durations = np.array([1.0, 9.0, 1.0, 9.0, 1.0, 9.0])
    plan = plan_batches(durations, max_batch_seconds=20, buckets=2, shuffle=False, seed=0, epoch=0)
    assert keys(plan.batches) == [(0, 2, 4), (1, 3), (5,)]
    again = plan_batches(durations, max_batch_seconds=20, buckets=2, shuffle=False, seed=5, epoch=9)
    assert keys(again.batches) == keys(plan.batches)


def test_equal_lengths_fill_the_budget_exactly():
    plan = plan_batches(np.full(100, 1.5), max_batch_seconds=15, buckets=10, shuffle=True, seed=0, epoch=0)
    assert sorted(len(b) for b in plan.batches) == [10] * 10
    assert plan.padding_fraction(np.full(100, 1.5)) == 0.0
    capped = plan_batches(np.full(100, 1.5), max_batch_seconds=15, buckets=1, max_batch_size=4,
                          shuffle=False, seed=0, epoch=0)
    assert [len(b) for b in capped.batches] == [4] * 25


def test_an_item_over_the_budget_is_a_batch_of_one():
    durations = np.array([1.0, 1.0, 50.0, 1.0, 70.0])
    plan = plan_batches(durations, max_batch_seconds=10, buckets=1, shuffle=False, seed=0, epoch=0)
    assert keys(plan.batches) == [(0, 1), (2,), (3,), (4,)]
    assert keys(cut_batches(np.array([0, 1, 3]), durations, 10.0)) == [(0, 1, 3)]


def test_speech_like_corpus_pads_little_with_full_batches():
    # The goal: at most 10 % padding with 10 buckets, against about 50 % for random batches.
    durations = corpus("speech", 5000, 0)
    plan = plan_batches(durations, max_batch_seconds=60, buckets=10, shuffle=True, seed=0, epoch=0)
    fill = np.mean([len(b) * durations[b].max() for b in plan.batches]) / 60
    assert plan.padding_fraction(durations) <= 0.10 and fill >= 0.85
    order = np.random.default_rng(0).permutation(5000)
    size = round(5000 / len(plan))
    random_batches = [order[i:i + size] for i in range(0, 5000, size)]
    assert padding_fraction(random_batches, durations) >= 0.4


def test_bucket_edges_split_a_long_tail_and_are_quantiles():
    durations = corpus("tail", 2000, 3)
    edges = bucket_edges(durations, 6)
    assert len(edges) == 5 and np.all(np.diff(edges) > 0)
    assert set(edges.tolist()) <= set(durations.tolist())  # each edge is one of the durations
    assert edges[-1] > 2.0, "the long tail gets a bucket of its own"
    assert bucket_edges(np.full(10, 3.0), 4).size == 0  # one distinct duration: one bucket
    assert bucket_edges(np.array([1.0, 2.0, 3.0]), 10).tolist() == [1.0, 2.0]
    assert bucket_edges(durations, 1).size == 0


def test_padding_fraction_counts_padded_frames():
    durations = np.array([1.0, 3.0, 2.0, 2.0])
    # batch (0, 1): 2 x 3 = 6 s of which 4 real; batch (2, 3): 4 s, all real.
    assert padding_fraction([np.array([0, 1]), np.array([2, 3])], durations) == pytest.approx(2 / 10)
    assert padding_fraction([], durations) == 0.0


def test_no_items_no_batches():
    plans = all_ranks(np.full(5, np.nan), 3, "pad", max_batch_seconds=10, buckets=3, shuffle=True, seed=0,
                      epoch=0)
    assert [len(p) for p in plans] == [0, 0, 0]
    assert isinstance(plans[0], BatchPlan) and plans[0].padding_fraction(np.full(5, np.nan)) == 0.0


def test_workers_split_the_ranks_batches():
    durations = corpus("speech", 400, 2)
    setup = dict(max_batch_seconds=30.0, buckets=5, shuffle=True, seed=1, epoch=2, rank=1, world_size=2)
    rank = keys(plan_batches(durations, **setup).batches)
    workers = [keys(plan_batches(durations, worker=w, num_workers=3, **setup).batches) for w in range(3)]
    assert sorted(b for w in workers for b in w) == sorted(rank)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(max_batch_seconds=0), ValueError, "max_batch_seconds must be a finite number of seconds > 0, got 0"),
    (dict(max_batch_seconds="60"), TypeError, "max_batch_seconds must be a number"),
    (dict(max_batch_seconds=math.inf), ValueError, "max_batch_seconds must be a finite"),
    (dict(buckets=0), ValueError, "buckets must be an integer >= 1, got 0"),
    (dict(buckets=2.5), TypeError, "buckets must be an integer"),
    (dict(max_batch_size=True), TypeError, "max_batch_size must be an integer"),
    (dict(even_shards="even"), ValueError, "even_shards must be 'pad', 'drop' or None, got 'even'"),
    (dict(rank=2, world_size=2), ValueError, r"shard index must be in \[0, 2\), got 2"),
    (dict(durations=[1.0, -1.0]), ValueError, "durations must be finite and >= 0.*-1.0 for item 1"),
    (dict(durations=[1.0, math.inf]), ValueError, "durations must be finite"),
    (dict(durations=[[1.0]]), ValueError, "one-dimensional"),
    (dict(durations=["a"]), TypeError, "durations must be a sequence of numbers"),
])
def test_bad_options_are_named(kwargs, error, match):
    setup = dict(durations=[1.0, 2.0], max_batch_seconds=10, buckets=2, shuffle=True, seed=0, epoch=0)
    setup.update(kwargs)
    with pytest.raises(error, match=match):
        plan_batches(setup.pop("durations"), **setup)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_padding_bench_runs_and_meets_the_goal():
    script = REPO / "benchmarks" / "bench_padding.py"
    done = subprocess.run([sys.executable, str(script), "--items", "3000", "--epochs", "2", "--budgets", "60"],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| speech-like (3000, log-normal 1-20 s) | 60 |" in done.stdout
    assert "At most 10% padding with batches by duration on every corpus: yes." in done.stdout
