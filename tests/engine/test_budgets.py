"""One budget per duration bucket (``max_batch_seconds`` as a list or a mapping of edges): planned
and streamed, every item once, each batch within its bucket's budget, exact resume, ranks in
step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import IndexDecoder, duration_manifest, wait_no_threads
from hypothesis import given, settings
from hypothesis import strategies as st

from audiobuffer import BufferedDataset, ResumeError
from audiobuffer.config import load_config
from audiobuffer.engine.plan import batch_cost, bucket_budgets, bucket_edges, plan_batches
from audiobuffer.engine.state import pack_consumed, unpack_consumed
from audiobuffer.engine.streamed import DynamicBuckets


def corpus(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "speech":
        return np.clip(rng.lognormal(math.log(5), 0.6, n), 1, 20)
    if kind == "tail":
        return np.where(rng.random(n) < 0.05, rng.uniform(20, 40, n), rng.uniform(0.2, 2, n))
    if kind == "failed":
        d = rng.uniform(0.5, 8, n)
        d[rng.random(n) < 0.2] = np.nan
        return d
    return rng.uniform(0.0, 30.0, n).round(1)


corpora = st.builds(
    corpus,
    st.sampled_from(["speech", "tail", "failed", "mixed"]),
    st.integers(0, 300),
    st.integers(0, 2**16),
)
# per bucket: (budgets shortest first, fixed edges or None)
budgets = st.one_of(
    st.lists(st.sampled_from([4.0, 10.0, 30.0, 90.0]), min_size=1, max_size=10).map(
        lambda b: (b, None)
    ),
    st.lists(st.sampled_from([4.0, 10.0, 30.0, 90.0]), min_size=1, max_size=8).map(
        lambda b: (b, [2.0 * 1.6**i for i in range(len(b))])
    ),
)


def bucket_of(
    durations: np.ndarray, seconds: list[float], edges: list[float] | None
) -> tuple[np.ndarray, list]:
    """Each item's bucket as the plan assigns it, and each bucket's budget."""
    valid = durations[~np.isnan(durations)]
    cuts = bucket_edges(valid, len(seconds)) if edges is None else np.asarray(edges[:-1])
    which = np.searchsorted(cuts, np.nan_to_num(durations, nan=0.0), side="left")
    return which, bucket_budgets(seconds, len(cuts) + 1)


def keys(batches):
    return [tuple(int(i) for i in b) for b in batches]


@settings(deadline=None, max_examples=150)
@given(
    durations=corpora,
    given_budgets=budgets,
    world_size=st.integers(1, 6),
    sync=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 1000),
    quadratic=st.sampled_from([None, 15.0]),
)
def test_each_batch_within_its_buckets_budget_every_item_once_ranks_even(
    durations, given_budgets, world_size, sync, shuffle, seed, quadratic
):
    seconds, edges = given_budgets
    setup = dict(
        max_batch_seconds=seconds,
        buckets=len(seconds),
        edges=edges,
        shuffle=shuffle,
        seed=seed,
        epoch=1,
        quadratic_duration=quadratic,
        sync_buckets=sync,
    )
    everything = plan_batches(durations, **setup)
    plans = [
        plan_batches(durations, rank=r, world_size=world_size, **setup) for r in range(world_size)
    ]
    which, bucket_seconds = bucket_of(durations, seconds, edges)
    for batch in everything.batches:
        bucket = set(which[batch].tolist())
        assert len(bucket) == 1, "a batch spans buckets"
        cost = batch_cost(len(batch), float(durations[batch].max()), quadratic)
        assert len(batch) == 1 or cost <= bucket_seconds[bucket.pop()]
    seen = [i for b in everything.batches for i in b.tolist()]
    assert sorted(seen) == np.flatnonzero(~np.isnan(durations)).tolist()
    counts = [len(p) for p in plans]
    assert counts == [math.ceil(len(everything) / world_size)] * world_size  # even_shards="pad"
    dealt = {b for p in plans for b in keys(p.batches)}
    assert dealt == set(keys(everything.batches))


@settings(deadline=None, max_examples=80)
@given(durations=corpora, given_budgets=budgets, world_size=st.integers(1, 4), data=st.data())
def test_a_per_bucket_plan_resumes_exactly(durations, given_budgets, world_size, data):
    seconds, edges = given_budgets
    rank = data.draw(st.integers(0, world_size - 1))
    setup = dict(
        max_batch_seconds=seconds,
        buckets=len(seconds),
        edges=edges,
        shuffle=True,
        seed=5,
        epoch=2,
        rank=rank,
        world_size=world_size,
        sync_buckets=True,
    )
    full = plan_batches(durations, **setup)
    mask = data.draw(st.lists(st.booleans(), min_size=full.size, max_size=full.size))
    consumed = unpack_consumed(pack_consumed(bytes(mask)), full.size)
    resumed = plan_batches(durations, consumed=consumed, **setup)
    expected = [(p, b) for p, b in enumerate(keys(full.batches)) if not mask[p]]
    assert [(resumed.position(s), b) for s, b in enumerate(keys(resumed.batches))] == expected


def test_short_buckets_take_their_larger_budget():
    durations = np.array([1.0] * 40 + [10.0] * 42)
    plan = plan_batches(
        durations, max_batch_seconds=[20.0, 30.0], buckets=2, shuffle=False, seed=0, epoch=0
    )
    assert sorted({len(b) for b in plan.batches}) == [3, 20]  # 20 x 1 s, 3 x 10 s
    fixed = plan_batches(
        durations,
        max_batch_seconds=[20.0, 30.0],
        buckets=2,
        edges=[2.0, 10.0],
        shuffle=False,
        seed=0,
        epoch=0,
    )
    assert keys(fixed.batches) == keys(plan.batches)
    one = plan_batches(durations, max_batch_seconds=20.0, buckets=2, shuffle=False, seed=0, epoch=0)
    assert sorted({len(b) for b in one.batches}) == [2, 20]


def test_items_past_the_last_edge_take_the_last_bucket_and_budget():
    durations = np.array([1.0, 1.0, 3.0, 9.0, 9.0])
    plan = plan_batches(
        durations,
        max_batch_seconds=[10.0, 18.0],
        buckets=2,
        edges=[2.0, 4.0],
        shuffle=False,
        seed=0,
        epoch=0,
    )
    assert keys(plan.batches) == [(0, 1), (2, 3), (4,)]  # 3 s and 9 s share the last bucket


def test_fewer_buckets_than_budgets_take_the_last_ones():
    assert bucket_budgets([40.0, 30.0, 20.0], 2) == [30.0, 20.0]
    assert bucket_budgets(25.0, 3) == [25.0] * 3
    plan = plan_batches(
        np.full(10, 2.0),
        max_batch_seconds=[40.0, 30.0, 8.0],
        buckets=3,
        shuffle=False,
        seed=0,
        epoch=0,
    )  # one distinct duration: one bucket, the longest items' budget
    assert {len(b) for b in plan.batches} == {4, 2}


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(max_batch_seconds=[10.0, 20.0], buckets=3), ValueError, "2 budgets for buckets=3"),
        (
            dict(max_batch_seconds=[10.0, math.nan], buckets=2),
            ValueError,
            r"max_batch_seconds\[1\]",
        ),
        (
            dict(max_batch_seconds=[10.0, 20.0], buckets=2, edges=[3.0, 2.0]),
            ValueError,
            "must increase",
        ),
        (
            dict(max_batch_seconds=[10.0, 20.0], buckets=2, edges=[3.0]),
            ValueError,
            "one upper edge per budget",
        ),
        (dict(max_batch_seconds=[10.0, "x"], buckets=2), TypeError, r"max_batch_seconds\[1\]"),
    ],
)
def test_bad_budgets_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        plan_batches([1.0, 2.0], shuffle=False, seed=0, epoch=0, **kwargs)


@settings(deadline=None, max_examples=80)
@given(
    durations=st.lists(st.floats(0.0, 12.0), max_size=300),
    given_budgets=budgets,
    size=st.one_of(st.none(), st.integers(1, 8)),
)
def test_streamed_buckets_keep_each_buckets_budget(durations, given_budgets, size):
    seconds, edges = given_budgets
    cutter: DynamicBuckets[int] = DynamicBuckets(seconds, len(seconds), size, edges=edges)
    batches = [b for i, d in enumerate(durations) for b in cutter.add(d, i)]
    if edges is not None:
        assert cutter.held == len(durations) - sum(len(b) for b in batches) <= len(seconds) * 90
    batches += cutter.flush()
    assert sorted(i for b in batches for _, i in b) == list(range(len(durations)))
    if edges is not None:
        cuts = np.asarray(edges[:-1])
        for b in batches:
            which = {int(np.searchsorted(cuts, s, side="left")) for s, _ in b}
            assert len(which) == 1
            assert len(b) == 1 or batch_cost(len(b), max(s for s, _ in b)) <= seconds[which.pop()]
    else:
        assert all(
            len(b) == 1 or batch_cost(len(b), max(s for s, _ in b)) <= max(seconds) for b in batches
        )


def test_streamed_buckets_cut_short_ones_to_their_own_larger_budget():
    cutter: DynamicBuckets[int] = DynamicBuckets([20.0, 30.0], 2, edges=[2.0, 10.0])
    done = [b for i in range(40) for b in cutter.add(1.0, i)] + [
        b for i in range(6) for b in cutter.add(10.0, i)
    ]
    assert [len(b) for b in done] == [20, 20, 3, 3]


def test_a_loader_batches_per_bucket_and_refuses_a_state_of_other_budgets(tmp_path):
    manifest = duration_manifest(tmp_path, [1.0] * 40 + [10.0] * 12)
    budgets = {2.0: 20.0, 10.0: 30.0}
    with BufferedDataset(
        manifest,
        IndexDecoder(),
        max_batch_seconds=budgets,
        duration_column="seconds",
        num_producers=2,
    ) as ds:
        batches = list(ds)
        assert sorted(len(b) for b in batches) == [3] * 4 + [20, 20]
        state = ds.state_dict()
    with (
        BufferedDataset(
            manifest,
            IndexDecoder(),
            max_batch_seconds=[20.0, 30.0],
            duration_column="seconds",
            num_producers=2,
        ) as other,
        pytest.raises(ResumeError, match="max_batch_seconds"),
    ):
        other.load_state_dict(state)
    wait_no_threads()


def test_the_yaml_takes_a_mapping_of_edges_and_a_list(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "source:\n  root: .\nloader:\n  max_batch_seconds:\n"
        "    2.5: 120\n    8: 60.0\n    20: 30\n",
        encoding="utf-8",
    )
    assert load_config(config).loader.max_batch_seconds == {2.5: 120.0, 8.0: 60.0, 20.0: 30.0}
    config.write_text(
        "source:\n  root: .\nloader:\n  max_batch_seconds: [120, 60]\n  buckets: 2\n",
        encoding="utf-8",
    )
    assert load_config(config).loader.max_batch_seconds == [120.0, 60.0]
    config.write_text(
        "source:\n  root: .\nloader:\n  max_batch_seconds: {8: 60, 2.5: 120}\n", encoding="utf-8"
    )
    with pytest.raises(ValueError, match="edges must increase"):
        load_config(config)


def test_a_bad_budget_in_the_yaml_names_its_value_once():
    from audiobuffer import ConfigError
    from audiobuffer.config import parse_config

    with pytest.raises(ConfigError) as info:
        parse_config({"source": {"files": ["a.wav"]},
                      "loader": {"max_batch_seconds": {0.5: 6.0, 1.0: -4}}})
    message = str(info.value)
    assert "loader.max_batch_seconds:" in message and "got -4.0" in message
    assert message.count("got ") == 1, message
