"""Resume on another world size: merge_states and the dealt epoch (audiobuffer/engine/resize.py),
on the plans alone (100k items) and through the loaders."""

import json
from collections import Counter

import numpy as np
import pytest
from helpers import IndexDecoder, duration_manifest, fake_paths, wait_no_threads
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from audiobuffer import BufferedDataset, IsolatedLoader, ResumeError, merge_states, mix
from audiobuffer.engine.plan import epoch_order, plan_batches, plan_epoch
from audiobuffer.engine.resize import deal_batches, deal_items, done_mask
from audiobuffer.prepare.durations import CACHE_ENV

EVEN = st.sampled_from(["pad", "drop", None])


@pytest.fixture(autouse=True)
def duration_cache(tmp_path, monkeypatch):
    """Header durations are cached under the test's folder, never in the user's cache."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))


def stops(seed, sizes):
    """A random consumed mask per shard: each shard stopped after a random number of its units,
    taken in any order (a buffer hands samples out unordered)."""
    rng = np.random.default_rng(seed)
    masks = []
    for size in sizes:
        mask = np.zeros(size, dtype=np.uint8)
        mask[rng.permutation(size)[:rng.integers(0, size + 1)]] = 1
        masks.append(mask.tobytes())
    return masks


def check_deal(before, shares, everything, even, world):
    """Each unit once over before and after (padding apart), shares equal (pad) or one apart."""
    after = np.concatenate(shares)
    assert not set(before.tolist()) & set(after.tolist())
    left_out = everything - set(before.tolist()) - set(after.tolist())
    lengths = [len(s) for s in shares]
    repeats = len(after) - len(set(after.tolist()))
    if even == "drop" and world > 1:  # no more left out than a fresh epoch of `world` ranks leaves
        assert len(set(lengths)) == 1 and repeats == 0 and len(left_out) < world
        return
    assert not left_out
    if even == "pad" and world > 1:
        assert len(set(lengths)) == 1 and repeats < world
    else:
        assert max(lengths) - min(lengths) <= 1 and repeats == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(n=100_000, old=8, new=3, even="pad", seed=1)
@example(n=100_000, old=3, new=8, even=None, seed=2)
@given(n=st.integers(1, 100_000), old=st.integers(1, 8), new=st.integers(1, 8), even=EVEN,
       seed=st.integers(0, 2**32 - 1))
def test_plan_items_each_once_after_another_world_size(n, old, new, even, seed):
    order = epoch_order(n, shuffle=True, seed=5, epoch=2)
    shards = [plan_epoch(n, shuffle=True, seed=5, epoch=2, rank=r, world_size=old,
                         even_shards=even).indices for r in range(old)]
    masks = stops(seed, [len(s) for s in shards])
    before = np.concatenate([s[np.frombuffer(m, np.uint8) == 1] for s, m in zip(shards, masks)])
    done = done_mask(n, list(zip(shards, masks)))
    shares = [deal_items(order, done, rank=j, world_size=new, even_shards=even)
              for j in range(new)]
    check_deal(before, shares, set(range(n)), even, new)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5_000), old=st.integers(1, 8), new=st.integers(1, 8), even=EVEN)
def test_plan_a_merge_with_nothing_delivered_deals_a_fresh_epoch(n, old, new, even):
    """What a fresh epoch of ``new`` ranks deals, each rank the same items in the same order; under
    ``even_shards="drop"`` the items the old world left out are dealt again, and those a fresh epoch
    of ``new`` ranks leaves out are left out."""
    order = epoch_order(n, shuffle=True, seed=5, epoch=2)
    shards = [plan_epoch(n, shuffle=True, seed=5, epoch=2, rank=r, world_size=old,
                         even_shards=even).indices for r in range(old)]
    done = done_mask(n, [(s, None) for s in shards])
    for j in range(new):
        fresh = plan_epoch(n, shuffle=True, seed=5, epoch=2, rank=j, world_size=new,
                           even_shards=even).indices
        dealt = deal_items(order, done, rank=j, world_size=new, even_shards=even)
        assert dealt.tolist() == fresh.tolist()


def batch_units(durations, epoch, **setup):
    """The epoch's batches as one rank plans them, and each item's batch number."""
    batches = plan_batches(durations, epoch=epoch, **setup).batches
    unit_of = np.full(len(durations), -1, dtype=np.int64)
    for unit, batch in enumerate(batches):
        unit_of[batch] = unit
    return batches, unit_of


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(n=100_000, old=8, new=5, even="pad", sync=True, seed=3)
@example(n=100_000, old=2, new=7, even=None, sync=False, seed=4)
@given(n=st.integers(1, 100_000), old=st.integers(1, 8), new=st.integers(1, 8), even=EVEN,
       sync=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_plan_batches_each_once_after_another_world_size(n, old, new, even, sync, seed):
    durations = np.random.default_rng(n).uniform(0.5, 12.0, n)
    setup = dict(max_batch_seconds=60.0, buckets=6, shuffle=True, seed=5)
    batches, unit_of = batch_units(durations, 1, **setup)
    shards = [np.array([unit_of[b[0]] for b in plan_batches(
        durations, epoch=1, rank=r, world_size=old, even_shards=even, sync_buckets=sync,
        **setup).batches], dtype=np.int64) for r in range(old)]
    masks = stops(seed, [len(s) for s in shards])
    before = np.concatenate([s[np.frombuffer(m, np.uint8) == 1] for s, m in zip(shards, masks)])
    done = done_mask(len(batches), list(zip(shards, masks)))
    longest = np.array([durations[b].max() for b in batches])
    shares = [deal_batches(done, longest, rank=j, world_size=new, even_shards=even, synced=sync,
                           rng=np.random.default_rng((5, 1))) for j in range(new)]
    check_deal(before, shares, set(range(len(batches))), even, new)


# -- through the loaders -------------------------------------------------------------------------


def samples(n, rank, world, **kwargs):
    kwargs = {"decoder": IndexDecoder(), "seed": 3, **kwargs}
    return BufferedDataset(kwargs.pop("source", fake_paths(n)), kwargs.pop("decoder"), shuffle=True,
                           num_producers=2, buffer_size=4, rank=rank, world_size=world, **kwargs)


def units(batch_or_sample):
    """A sample's index, or a batch by duration's indices as one tuple."""
    if isinstance(batch_or_sample, list):
        return tuple(int(s["index"]) for s in batch_or_sample)
    return int(batch_or_sample["index"])


def stop_all(make, old, epoch, stops_at):
    """Run ``old`` ranks of ``epoch``, each stopped after ``stops_at[rank]`` units: what they
    yielded, and their states through JSON."""
    before, states = [], []
    for rank in range(old):
        with make(rank, old) as ds:
            ds.set_epoch(epoch)
            it = iter(ds)
            for _ in range(min(stops_at[rank], len(ds))):
                before.append(units(next(it)))
            states.append(json.loads(json.dumps(ds.state_dict())))
            it.close()
    return before, states


def resume_all(make, new, merged):
    """Each of ``new`` ranks loads ``merged`` and runs the rest of the epoch, then the next one."""
    after, following = [], []
    merged = json.loads(json.dumps(merged))  # plain builtins
    for rank in range(new):
        with make(rank, new) as ds:
            ds.load_state_dict(merged)
            after.append([units(u) for u in ds])
            ds.set_epoch(ds.epoch + 1)
            following.append(sorted(units(u) for u in ds))
    return after, following


def fresh_epoch(make, new, epoch):
    out = []
    for rank in range(new):
        with make(rank, new) as ds:
            ds.set_epoch(epoch)
            out.append(sorted(units(u) for u in ds))
    return out


def check_loaders(before, after, everything, even, new):
    """Each unit once before and after the resume (the padding of the two worlds apart)."""
    flat = [u for share in after for u in share]
    assert not set(before) & set(flat)
    left_out = everything - set(before) - set(flat)
    lengths = [len(share) for share in after]
    if even == "drop" and new > 1:  # no more left out than a fresh epoch of `new` ranks leaves
        assert len(set(lengths)) == 1 and len(flat) == len(set(flat)) and len(left_out) < new
        return
    assert not left_out
    if even == "pad" and new > 1:
        assert len(set(lengths)) == 1 and len(flat) - len(set(flat)) < new
    else:
        assert max(lengths) - min(lengths) <= 1 and len(flat) == len(set(flat))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(5, 60), old=st.integers(1, 8), new=st.integers(1, 8), even=EVEN,
       stops_at=st.lists(st.integers(0, 60), min_size=8, max_size=8))
def test_samples_resume_on_another_world_size(n, old, new, even, stops_at):
    def make(rank, world):
        return samples(n, rank, world, even_shards=even)

    before, states = stop_all(make, old, 4, stops_at)
    after, following = resume_all(make, new, merge_states(states))
    check_loaders(before, after, set(range(n)), even, new)
    assert following == fresh_epoch(make, new, 5)
    assert not wait_no_threads()


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(n=st.integers(5, 80), old=st.integers(1, 8), new=st.integers(1, 8), even=EVEN,
       sync=st.booleans(), stops_at=st.lists(st.integers(0, 20), min_size=8, max_size=8))
def test_duration_batches_resume_on_another_world_size(tmp_path, n, old, new, even, sync,
                                                       stops_at):
    durations = np.random.default_rng(n).uniform(0.5, 6.0, n)
    manifest = duration_manifest(tmp_path, durations, f"m{n}.csv")

    def make(rank, world):
        return samples(n, rank, world, source=manifest, duration_column="seconds",
                       max_batch_seconds=12.0, buckets=3, sync_buckets=sync, even_shards=even)

    before, states = stop_all(make, old, 2, stops_at)
    after, following = resume_all(make, new, merge_states(states))
    with make(0, 1) as one:
        one.set_epoch(2)
        everything = {units(b) for b in one}
    check_loaders(before, after, everything, even, new)
    assert following == fresh_epoch(make, new, 3)
    assert not wait_no_threads()


@pytest.mark.parametrize("even, n", [(None, 90), ("drop", 95)])
def test_a_state_saved_in_a_dealt_epoch_resumes_there_and_merges_again(even, n):
    def make(rank, world):
        return samples(n, rank, world, even_shards=even)

    first, states = stop_all(make, 3, 1, [10, 3, 25])
    merged = merge_states(states)
    second, dealt = [], []
    for rank in range(2):
        with make(rank, 2) as ds:
            ds.load_state_dict(merged)
            it = iter(ds)
            second += [units(next(it)) for _ in range(7 + rank)]
            dealt.append(json.loads(json.dumps(ds.state_dict())))
            it.close()
    assert {s["version"] for s in dealt} == {4} and all("dealt" in s for s in dealt)
    with make(1, 2) as ds:  # the same rank of the same world resumes its share
        ds.load_state_dict(dealt[1])
        rest_of_one = [units(u) for u in ds]
    with make(1, 2) as ds:
        ds.load_state_dict(merged)
        share = [units(u) for u in ds]
    assert sorted(second[7:] + rest_of_one) == sorted(share)
    after, following = resume_all(make, 4, merge_states(dealt))  # merged again, onto 4 ranks
    check_loaders(first + second, after, set(range(n)), even, 4)
    assert following == fresh_epoch(make, 4, 2)


def test_merge_states_names_what_does_not_fit():
    def state(rank, world=3, **kwargs):
        with samples(30, rank, world, **kwargs) as ds:
            return ds.state_dict()

    states = [state(r) for r in range(3)]
    with pytest.raises(ResumeError, match=r"rank\(s\) \[1\] of 3 are missing"):
        merge_states([states[0], states[2]])
    with pytest.raises(ResumeError, match=r"rank\(s\) \[2\] given more than once"):
        merge_states([*states, states[2]])
    with pytest.raises(ResumeError, match="differ in seed: rank 0 has 3, rank 1 has 4"):
        merge_states([states[0], {**states[1], "seed": 4}, states[2]])
    with pytest.raises(ResumeError, match="differ in epoch"):
        merge_states([states[0], {**states[1], "epoch": 1}, states[2]])
    with pytest.raises(ResumeError, match="differ in world_size"):
        merge_states([*states, state(3, 4)])
    with pytest.raises(ResumeError, match="merged already"):
        merge_states([merge_states(states)])
    with pytest.raises(TypeError, match="list of every rank"):
        merge_states(states[0])
    with samples(31, 0, 2) as other, pytest.raises(ResumeError, match="source_fingerprint"):
        other.load_state_dict(merge_states(states))
    with samples(30, 0, 2, seed=9) as other, pytest.raises(ResumeError, match="seed=3"):
        other.load_state_dict(merge_states(states))


@pytest.mark.parametrize("even, old, new", [("pad", 2, 3), ("drop", 3, 2), ("drop", 2, 3),
                                             (None, 3, 2)])
def test_a_merged_state_at_the_start_of_an_epoch_is_a_fresh_epoch(even, old, new):
    """Also what ``even_shards="drop"`` leaves out: the old world's cut is dealt again."""
    def make(rank, world):
        return samples(40, rank, world, even_shards=even)

    _, states = stop_all(make, old, 3, [0] * old)
    after, _ = resume_all(make, new, merge_states(states))
    assert [sorted(a) for a in after] == fresh_epoch(make, new, 3)


@pytest.mark.subprocess
def test_isolated_loader_resumes_a_merged_state():
    from plain_decoders import IndexDecoder as PlainIndexDecoder

    before, states = stop_all(lambda r, w: samples(50, r, w, even_shards=None), 2, 0, [9, 14])
    after = []
    for rank in range(3):
        with IsolatedLoader(fake_paths(50), PlainIndexDecoder(), batch_size=4, rank=rank,
                            world_size=3, shuffle=True, seed=3, even_shards=None) as loader:
            loader.load_state_dict(merge_states(states))
            after.append([int(i) for batch in loader for i in batch["index"]])
    check_loaders(before, after, set(range(50)), None, 3)


def test_a_mixture_resumes_on_another_world_size(tmp_path):
    paths = []
    for k, n in enumerate([30, 50]):
        (tmp_path / f"c{k}").mkdir()
        paths.append(duration_manifest(tmp_path / f"c{k}", [1.0] * n))

    def make(rank, world):
        return samples(0, rank, world, source=mix(*paths, weights=[1, 3], size=70),
                       even_shards=None)

    with make(0, 1) as one:
        one.set_epoch(2)
        full = sorted(units(u) for u in one)
    before, states = stop_all(make, 2, 2, [11, 20])
    after, following = resume_all(make, 3, merge_states(states))
    assert sorted(before + [u for a in after for u in a]) == full
    assert following == fresh_epoch(make, 3, 3)


def _streamed_shards(tmp_path):
    """30 short recordings packed into tar shards of about 20 kB: the files, the index, and
    ``make(rank, world)``, a ``BufferedDataset`` streaming them for ``rank`` of ``world`` ranks."""
    from helpers import make_corpus

    from audiobuffer import AudioDecoder
    from audiobuffer.sources import pack

    files = make_corpus(tmp_path / "src", 30, seconds=0.05)
    index = pack(tmp_path / "src", tmp_path / "out", shard_size=20_000, labels="parent",
                 progress=False)
    pattern = str(tmp_path / "out" / f"shard-{{000000..{len(index.shards) - 1:06d}}}.tar")

    def make(rank, world):
        return BufferedDataset(pattern, AudioDecoder(sample_rate=8000), shuffle=True, seed=2,
                               num_producers=1, buffer_size=1, rank=rank, world_size=world,
                               even_shards=None)

    return files, index, make


def test_streamed_shards_resume_on_another_world_size_at_shard_boundaries(tmp_path):
    """A tar shard every sample of which was handed on is done; the others stream again whole."""
    files, index, make = _streamed_shards(tmp_path)
    def shard_of(sample):
        return sample["path"].split(".tar/")[0] + ".tar"

    first, states = [], []
    for rank in range(2):
        with make(rank, 2) as ds:
            it = iter(ds)
            first += [next(it) for _ in range(7)]
            states.append(ds.state_dict())
            it.close()
    sizes = Counter(m.shard for m in index.members)
    taken = Counter(shard_of(s) for s in first)
    done = {shard for shard, n in taken.items() if n == sizes[shard]}
    assert done
    rest = []
    for rank in range(3):
        with make(rank, 3) as ds:
            ds.load_state_dict(merge_states(states))
            rest += list(ds)
    assert not {shard_of(s) for s in rest} & done
    assert len(rest) == len(files) - sum(sizes[s] for s in done)
    names = {s["path"].split(".tar/", 1)[1] for s in first + rest}
    assert len(names) == len(files)


@pytest.mark.timeout(60)
def test_a_forged_world_size_is_refused_without_allocating_for_it():
    """A state names its world size: a forged one (a million ranks, one state) is refused with
    the missing ranks named in a short message, with no memory spent on ranks that are not there."""
    import tracemalloc

    with samples(30, 0, 1) as ds:
        state = ds.state_dict()
    merged = merge_states([state])
    tracemalloc.start()
    try:
        with pytest.raises(ResumeError, match=r"rank\(s\) \[1, 2, .*, \.\.\.\] of 1000000 are "
                                              r"missing \(999999 ranks\)") as forged:
            merge_states([{**state, "world_size": 10**6}])
        with samples(30, 0, 2) as other, pytest.raises(ResumeError, match="ranks must be"):
            other.load_state_dict({**merged, "world_size": 10**6})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(str(forged.value)) < 300
    assert peak < 4 * 2**20

    class Scanned(int):
        """An integer that is not an ``int`` exactly (as NumPy's): counts its comparisons."""

        compared = 0

        def __eq__(self, other):
            Scanned.compared += 1
            if Scanned.compared > 1000:
                raise AssertionError("the ranks of world_size are compared one by one")
            return int(self) == other

        __hash__ = int.__hash__

    with pytest.raises(ResumeError, match=r"rank\(s\) \[-1\] outside 0\.\.999999999999"):
        merge_states([{**state, "rank": Scanned(-1), "world_size": 10**12}])


def test_a_malformed_merged_state_or_rank_state_is_a_resume_error_naming_it():
    """Values of the wrong type in the states or in a merged state (untrusted, read from a file)
    are refused by name, before the loader changes; never a TypeError or KeyError of the code."""
    states = []
    for rank in range(3):
        with samples(30, rank, 3) as ds:
            it = iter(ds)
            next(it)
            states.append(ds.state_dict())
            it.close()
    merged = merge_states(states)
    forged_states = [({"rank": 1.0}, r"states\[1\]'s rank must be an integer"),
                     ({"rank": True}, r"states\[1\]'s rank must be an integer"),
                     ({"epoch": b"1"}, r"states\[1\]'s epoch must be an integer"),
                     ({"version": 9}, r"states\[1\]'s format 9 is not")]
    for change, message in forged_states:
        with pytest.raises(ResumeError, match=message):
            merge_states([states[0], {**states[1], **change}, states[2]])
    numpy_ints = merge_states([states[0], {**states[1], "rank": np.int64(1), "epoch": np.int64(0)},
                               states[2]])
    assert json.loads(json.dumps(numpy_ints)) == merged

    def entry(change):
        ranks = [dict(e) for e in merged["ranks"]]
        ranks[1] = {k: v for k, v in {**ranks[1], **change}.items() if v is not None}
        return {**merged, "ranks": ranks}

    forged = [({"rank": 1.0}, "ranks must be 0..2"),
              ({"items": 10.0}, r"rank 1's items must be an integer >= 0 or None, got 10\.0"),
              ({"items": "10"}, r"rank 1's items must be an integer >= 0 or None, got '10'"),
              ({"consumed": None}, r"rank 1 lacks \['consumed'\]"),
              ({"items": None, "consumed": None}, r"rank 1 lacks \['items', 'consumed'\]")]
    for change, message in forged:
        with samples(30, 0, 2) as ds, pytest.raises(ResumeError, match=message):
            ds.load_state_dict(entry(change))
    with samples(30, 0, 2) as ds, pytest.raises(ResumeError, match="ranks must be 0..2"):
        ds.load_state_dict({**merged, "ranks": [*merged["ranks"][:2], "rank 2"]})
    with samples(30, 0, 2) as ds:
        ds.load_state_dict(merged)  # the refusals left nothing behind
        assert len(list(ds)) == 14
    assert not wait_no_threads()


def test_len_of_streamed_shards_after_a_merged_state_is_the_dealt_share(tmp_path):
    """``len()`` of a loader that loaded a merged state counts its share of the rest, in samples,
    for streamed tar shards too (not the samples of a fresh epoch's shard)."""
    _, _, make = _streamed_shards(tmp_path)
    states = []
    for rank in range(2):
        with make(rank, 2) as ds:
            it = iter(ds)
            for _ in range(7):
                next(it)
            states.append(ds.state_dict())
            it.close()
    merged = merge_states(states)
    for rank in range(3):
        with make(rank, 3) as ds:
            ds.load_state_dict(merged)
            length = len(ds)
            assert length == len(list(ds))
    assert not wait_no_threads()


@pytest.mark.parametrize("merged", [True, False])
def test_a_state_loaded_at_an_epochs_start_is_what_state_dict_says(merged):
    """A loader that ran part of epoch 4, then loaded a state of epoch 4's start (every old rank
    at the start: merged, or one rank's), says that start, not its own run's progress: saved
    again, its state resumes the whole epoch."""
    def make(rank=0, world=1):
        return samples(30, rank, world)

    if merged:
        starts = []
        for rank in range(2):
            with make(rank, 2) as ds:
                ds.set_epoch(4)
                starts.append(ds.state_dict())
        start = merge_states(starts)
    else:
        with make() as ds:
            ds.set_epoch(4)
            start = ds.state_dict()
    with make() as ds:
        ds.set_epoch(4)
        it = iter(ds)
        for _ in range(5):
            next(it)
        it.close()
        ds.load_state_dict(start)
        saved = ds.state_dict()
    assert saved["epoch"] == 4 and saved["items"] is None
    with make() as again:
        again.load_state_dict(saved)
        assert sorted(units(s) for s in again) == list(range(30))
    assert not wait_no_threads()


@pytest.mark.parametrize("dealt", [True, False])
def test_a_mask_that_does_not_fit_the_shard_is_refused_at_load(dealt):
    """A state whose consumed mask (or dealt epoch) has another length than this rank's share is
    refused by load_state_dict, which leaves the loader as it was: not at the next iter(), after
    which a fresh epoch would deliver again what the saved epoch had delivered."""
    _, states = stop_all(lambda r, w: samples(30, r, w), 3, 1, [3, 0, 10])
    merged = merge_states(states)
    with samples(30, 0, 2) as ds:
        ds.load_state_dict(merged)
        it = iter(ds)
        for _ in range(3):
            next(it)
        saved = ds.state_dict()
        it.close()
    with samples(30, 0, 2) as ds:
        ds.load_state_dict(merged)
        share = sorted(units(s) for s in ds)
    if dealt:
        forged = [{**saved, "items": 3, "consumed": "4A=="},
                  {**saved, "dealt": {"units": 8, "done": "AA=="}}]
        world = 2
    else:
        forged = [{**states[0], "items": 3, "consumed": "4A=="}]
        world = 3
    for state in forged:
        with samples(30, 0, world) as ds:
            ds.load_state_dict(merged)
            with pytest.raises(ResumeError, match="covers"):
                ds.load_state_dict(state)
            if world == 2:  # the merged state loaded before is still the one to resume
                assert sorted(units(s) for s in ds) == share
    assert not wait_no_threads()
