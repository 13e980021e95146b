"""Batches by duration through BufferedDataset (audiobuffer/engine/epoch.py): exactly once, within the budget,
resumable, equal per rank, with failures leaving their batch, on generated and real (FSDD) files."""

import json
import math
import warnings

import numpy as np
import pytest
from helpers import IndexDecoder, duration_manifest, fake_paths, wait_no_threads, write_tone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plain_decoders import FramesDecoder
from torch.utils.data import DataLoader

from audiobuffer import (
    AudioDecoder,
    BatchSlotLoader,
    BufferedDataset,
    DecodeError,
    IsolatedLoader,
    ResumeError,
    SampleError,
    SourceError,
    WorkItem,
    pad_collate,
)
from audiobuffer.engine.pipeline import DurationBudget
from audiobuffer.engine.plan import batch_cost, plan_batches
from audiobuffer.engine.streamed import DynamicBuckets, TimedDecode
from audiobuffer.prepare.durations import CACHE_ENV


@pytest.fixture(autouse=True)
def duration_cache(tmp_path, monkeypatch):
    """Header durations are cached under the test's folder, never in the user's cache."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))


def dataset(source, durations=None, **kwargs):
    kwargs.setdefault("decoder", IndexDecoder())
    if durations is not None:
        kwargs.setdefault("duration_column", "seconds")
    return BufferedDataset(source, kwargs.pop("decoder"), **kwargs)


def keys(batches):
    """Each batch as the tuple of its items' source indices."""
    return [tuple(int(s["index"]) for s in batch) for batch in batches]


def plan_keys(durations, epoch=0, **kwargs):
    plan = plan_batches(durations, epoch=epoch, **kwargs)
    return [tuple(int(i) for i in b) for b in plan.batches]


def within_budget(batch_keys, durations, budget):
    return all(len(b) == 1 or len(b) * max(durations[i] for i in b) <= budget for b in batch_keys)


# -- generated durations: exactly once, within the budget, as planned ------------------------------

@settings(deadline=None, max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 120), budget=st.sampled_from([3.0, 10.0, 40.0]), buckets=st.integers(1, 6),
       ordered=st.booleans(), producers=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
def test_each_item_once_in_batches_within_the_budget(tmp_path, n, budget, buckets, ordered, producers, seed):
    durations = np.random.default_rng(seed).uniform(0.2, 8.0, n).round(2)
    ds = dataset(duration_manifest(tmp_path, durations), durations, max_batch_seconds=budget, buckets=buckets,
                 ordered=ordered, num_producers=producers, buffer_size=4, shuffle=True, seed=seed)
    ds.set_epoch(3)
    got = keys(ds)
    assert sorted(i for b in got for i in b) == list(range(n))
    assert within_budget(got, durations, budget)
    planned = plan_keys(durations, epoch=3, max_batch_seconds=budget, buckets=buckets, shuffle=True, seed=seed)
    if ordered:
        assert got == planned  # batches in the plan's order, samples in the batch's
    else:
        assert sorted(got) == sorted(planned)  # the same batches, whole, in the order they completed
    assert len(ds) == len(planned) == ds.stats().batches
    assert not wait_no_threads()


def test_the_batch_mode_is_decided_once_with_one_budget(tmp_path):
    durations = [1.0, 2.0, 3.0]
    ds = dataset(duration_manifest(tmp_path, durations), durations, max_batch_seconds=4, buckets=2,
                 quadratic_duration=30)
    budget = ds.pipeline.budget
    assert budget == DurationBudget(4.0, 2, None, 30.0, None)
    assert ds.batching.budget is budget and ds.batching.max_batch_seconds == 4.0
    plain = dataset(duration_manifest(tmp_path, durations, "plain.csv"))
    assert plain.pipeline.budget is None and plain.batching is None


def test_through_a_dataloader_each_element_is_one_padded_batch(tmp_path):
    durations = [0.5, 1.0, 1.5, 2.0, 0.5, 1.0, 3.0, 0.25] * 5
    ds = dataset(duration_manifest(tmp_path, durations), durations, max_batch_seconds=4.0, buckets=3, shuffle=True)
    loader = DataLoader(ds, batch_size=None, collate_fn=pad_collate)
    seen = []
    for batch in loader:
        assert batch["audio"].shape[0] == len(batch["index"]) == len(batch["lengths"])
        seen.extend(batch["index"].tolist())
    assert sorted(seen) == list(range(len(durations)))
    assert len(loader) == len(ds)


@pytest.mark.subprocess
def test_dataloader_workers_split_the_batches(tmp_path):
    durations = np.random.default_rng(1).uniform(0.5, 5.0, 90)
    ds = dataset(duration_manifest(tmp_path, durations), durations, max_batch_seconds=12.0, shuffle=True, seed=2,
                 ordered=True)
    batches = [tuple(b["index"].tolist()) for b in DataLoader(ds, batch_size=None, collate_fn=pad_collate,
                                                               num_workers=2)]
    assert sorted(batches) == sorted(plan_keys(durations, max_batch_seconds=12.0, buckets=10, shuffle=True, seed=2))


@pytest.mark.parametrize("mode", ["pad", "drop", None])
def test_every_rank_gets_its_share_of_the_batches(tmp_path, mode):
    durations = np.random.default_rng(5).uniform(0.3, 6.0, 101)
    source = duration_manifest(tmp_path, durations)
    per_rank = [keys(dataset(source, durations, max_batch_seconds=9.0, buckets=4, shuffle=True, seed=1, rank=r,
                             world_size=3, even_shards=mode)) for r in range(3)]
    planned = plan_keys(durations, max_batch_seconds=9.0, buckets=4, shuffle=True, seed=1)
    counts = [len(batches) for batches in per_rank]
    together = [b for batches in per_rank for b in batches]
    if mode is None:
        assert max(counts) - min(counts) <= 1 and sorted(together) == sorted(planned)
    elif mode == "pad":  # a few batches repeated to even out
        assert counts == [math.ceil(len(planned) / 3)] * 3 and set(together) == set(planned)
    else:  # the remainder left out
        assert counts == [len(planned) // 3] * 3 and len(set(together)) == len(together)
        assert set(together) <= set(planned)
    assert counts == [len(dataset(source, durations, max_batch_seconds=9.0, buckets=4, shuffle=True, seed=1,
                                  rank=r, world_size=3, even_shards=mode)) for r in range(3)]


# -- real files: headers, crops, padding ------------------------------------------------------------

def tones(folder, seconds, sample_rate=8000):
    return [write_tone(folder / f"t{i:03d}.wav", seconds=s, sample_rate=sample_rate) for i, s in enumerate(seconds)]


def test_generated_files_batch_within_the_budget_with_little_padding(tmp_path):
    seconds = np.clip(np.random.default_rng(0).lognormal(math.log(1.0), 0.6, 80), 0.2, 4.0).round(3)
    tones(tmp_path / "audio", seconds)
    ds = BufferedDataset(tmp_path / "audio", AudioDecoder(8000), max_batch_seconds=10.0, buckets=8, shuffle=True)
    frames = padded = 0
    seen = []
    for batch in DataLoader(ds, batch_size=None, collate_fn=pad_collate):
        count, longest = batch["audio"].shape
        assert count * longest <= 10.0 * 8000 or count == 1
        frames += int(batch["lengths"].sum())
        padded += count * longest
        seen.extend(batch["path"])
    assert sorted(seen) == sorted(ds.source.paths)
    stats = ds.stats()
    assert stats.padding == pytest.approx((padded - frames) / padded, abs=1e-9)  # frames / rate are the durations
    assert stats.padding < 0.10 and stats.yielded == 80 and stats.done


def test_padding_fraction_in_stats_is_padded_over_batch_seconds(tmp_path):
    durations = [1.0, 2.0, 1.0, 2.0]  # unshuffled, one bucket, 4 s: [0, 1] and [2, 3], each padded to 2 s
    ds = dataset(duration_manifest(tmp_path, durations), durations, max_batch_seconds=4.0, buckets=1)
    assert sorted(keys(ds)) == [(0, 1), (2, 3)]
    stats = ds.stats()
    assert (stats.batches, stats.empty_batches, stats.padding) == (2, 0, 0.25)  # (8 - 6) / 8
    assert stats.as_dict()["padding"] == 0.25
    by_samples = dataset(duration_manifest(tmp_path, durations))
    list(by_samples)
    assert (by_samples.stats().batches, by_samples.stats().padding) == (None, None)


CROP_AND_PAD = "ignore:max_batch_seconds with a decoder that crops and pads:UserWarning"


@pytest.mark.filterwarnings(CROP_AND_PAD)
@pytest.mark.parametrize("pad", [False, True])
def test_a_crop_caps_the_durations(tmp_path, pad):
    tones(tmp_path / "audio", [0.3, 2.0, 2.5, 0.4, 3.0, 1.0])
    decoder = AudioDecoder(8000, crop_seconds=1.0, crop="start", pad=pad)
    ds = BufferedDataset(tmp_path / "audio", decoder, max_batch_seconds=2.0, buckets=1)
    expected = [1.0] * 6 if pad else [0.3, 1.0, 1.0, 0.4, 1.0, 1.0]  # a padded crop is always the crop long
    assert ds.batching.durations.tolist() == pytest.approx(expected)
    for batch in DataLoader(ds, batch_size=None, collate_fn=pad_collate):
        assert batch["audio"].shape[0] * batch["audio"].shape[1] <= 2.0 * 8000


@pytest.mark.subprocess
@pytest.mark.filterwarnings(CROP_AND_PAD)
@pytest.mark.parametrize("isolate", [False, True])
def test_padding_counts_the_zeros_a_decoder_pads_a_crop_with(tmp_path, isolate):
    # Padded to a 1 s crop, a 0.25 s file is three quarters zeros: the figure must say so.
    seconds = [0.25, 0.5, 2.0, 0.25, 1.5, 0.5]
    tones(tmp_path / "audio", seconds)
    decoder = AudioDecoder(8000, crop_seconds=1.0, crop="start", pad=True)
    options = dict(max_batch_seconds=3.0, buckets=1)
    real = padded = 0
    if isolate:
        with IsolatedLoader(tmp_path / "audio", decoder, **options) as loader:
            for batch in loader:
                real += int(batch["lengths"].sum())
                padded += batch["audio"].numel()
            stats = loader.stats()
    else:
        ds = BufferedDataset(tmp_path / "audio", decoder, **options)
        for batch in DataLoader(ds, batch_size=None, collate_fn=pad_collate):
            real += int(batch["lengths"].sum())
            padded += batch["audio"].numel()
        stats = ds.stats()
    assert real == 8000 * sum(min(s, 1.0) for s in seconds)
    assert stats.padding == pytest.approx(1 - real / padded) and stats.padding == pytest.approx(1 - 3.5 / 6)


@pytest.mark.subprocess
@pytest.mark.parametrize("isolate", [False, True])
def test_padding_counts_each_samples_real_frames_not_the_durations(tmp_path, isolate):
    # The manifest says every item lasts 2 s (no padding by durations); the samples hold 0.5-2 s of audio
    # padded to 2 s: the figure is what the samples hold.
    frames = [500, 2000, 1000, 1500, 2000, 250]
    source = duration_manifest(tmp_path, [2.0] * len(frames))
    options = dict(max_batch_seconds=4.0, buckets=1, duration_column="seconds")
    decoder = FramesDecoder(frames, 2000)
    if isolate:
        with IsolatedLoader(source, decoder, **options) as loader:
            rows = [len(batch["index"]) for batch in loader]
            stats = loader.stats()
    else:
        ds = BufferedDataset(source, decoder, **options)
        rows = [len(batch) for batch in ds]
        stats = ds.stats()
    assert rows == [2, 2, 2]
    assert stats.padding == pytest.approx(1 - sum(frames) / (2000 * len(frames)))


def test_padding_falls_back_to_the_durations_when_a_transform_changes_the_audio(tmp_path):
    durations = [1.0, 2.0, 1.0, 2.0]
    features = lambda sample: {**sample, "audio": np.zeros((40, 3), dtype=np.float32)}  # noqa: E731
    ds = BufferedDataset(duration_manifest(tmp_path, durations), FramesDecoder([1000, 2000, 1000, 2000], 2000),
                         transform=features, max_batch_seconds=4.0, buckets=1, duration_column="seconds")
    list(ds)
    assert ds.stats().padding == 0.25  # (8 - 6) / 8 from the durations: 3 feature frames are no audio frames


def test_crop_and_pad_with_max_batch_seconds_warn_that_every_item_lasts_the_crop(tmp_path):
    tones(tmp_path / "audio", [0.3, 2.0, 0.5])
    with pytest.warns(UserWarning, match=r"crop_seconds=1.*every item lasts the crop.*batches of 3 items.*pad=False"):
        BufferedDataset(tmp_path / "audio", AudioDecoder(8000, crop_seconds=1.0, pad=True), max_batch_seconds=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BufferedDataset(tmp_path / "audio", AudioDecoder(8000, crop_seconds=1.0, pad=False), max_batch_seconds=3.0)
        BufferedDataset(tmp_path / "audio", AudioDecoder(8000, crop_seconds=1.0, pad=True))


def test_durations_are_read_once_per_dataset_and_cached(tmp_path, monkeypatch):
    tones(tmp_path / "audio", [0.5, 1.0, 1.5])
    BufferedDataset(tmp_path / "audio", AudioDecoder(8000), max_batch_seconds=2.0)  # fills the cache
    import audiobuffer.prepare.durations as durations_module

    def refuse(path):
        raise AssertionError(f"header read again: {path}")

    monkeypatch.setattr(durations_module, "header_seconds", refuse)
    ds = BufferedDataset(tmp_path / "audio", AudioDecoder(8000), max_batch_seconds=2.0)
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert sorted(i for b in keys(ds) for i in b) == [0, 1, 2]


@pytest.mark.timeout(120)
def test_fsdd_each_recording_once_within_the_budget_padding_under_ten_percent(fsdd):
    ds = BufferedDataset(fsdd, AudioDecoder(8000), labels=r"^(\d+)_", max_batch_seconds=30.0, buckets=10,
                         shuffle=True, seed=0, num_producers=2)
    seen = []
    for batch in DataLoader(ds, batch_size=None, collate_fn=pad_collate):
        count, longest = batch["audio"].shape
        assert count * longest <= 30.0 * 8000
        assert batch["label"].shape == (count,)
        seen.extend(batch["path"])
    assert sorted(seen) == sorted(ds.source.paths) and len(seen) == 3000
    stats = ds.stats()
    assert stats.batches == len(ds) and stats.failed == 0 and stats.padding < 0.10


# -- resume -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("k", [0, 1, 5, "all"])
def test_resumed_epoch_yields_exactly_the_batches_not_yet_yielded(tmp_path, ordered, k):
    durations = np.random.default_rng(3).uniform(0.2, 5.0, 70).round(2)
    source = duration_manifest(tmp_path, durations)
    options = dict(max_batch_seconds=8.0, buckets=4, shuffle=True, seed=3, ordered=ordered, num_producers=3,
                   buffer_size=4, decoder=IndexDecoder(delays={i: 0.002 for i in range(0, 70, 9)}))
    ds = dataset(source, durations, **options)
    ds.set_epoch(1)
    total = len(ds)
    k = total if k == "all" else k
    it = iter(ds)
    first = keys(next(it) for _ in range(k))
    state = json.loads(json.dumps(ds.state_dict()))  # JSON-ready
    it.close()
    assert state["batching"]["max_batch_seconds"] == 8.0
    assert state["items"] == (total if k else None)  # counts batches; None before the epoch started
    again = dataset(source, durations, **options)
    again.load_state_dict(state)
    rest = keys(again)
    planned = plan_keys(durations, epoch=1, max_batch_seconds=8.0, buckets=4, shuffle=True, seed=3)
    assert sorted(first + rest) == sorted(planned) and not set(first) & set(rest)
    if ordered:
        assert first + rest == planned
    stats = again.stats()
    assert (stats.epoch, stats.batches, stats.resumed) == (1, total - k, sum(len(b) for b in first))
    assert stats.items + stats.resumed == 70


def test_a_state_loads_only_into_the_same_batching(tmp_path):
    durations = [1.0] * 10
    source = duration_manifest(tmp_path, durations)
    state = dataset(source, durations, max_batch_seconds=3.0).state_dict()
    for other, key in ((dict(max_batch_seconds=4.0), "batching"), (dict(), "batching")):
        ds = dataset(source, durations if other else None, **other)
        with pytest.raises(ResumeError, match=f"saved with {key}="):
            ds.load_state_dict(state)
    by_items = dataset(source).state_dict()
    with pytest.raises(ResumeError, match="saved with batching=None"):
        dataset(source, durations, max_batch_seconds=3.0).load_state_dict(by_items)
    old = {**by_items, "version": 2}
    del old["batching"]  # format 2 has no batching key: it counts items, and still loads
    dataset(source).load_state_dict(old)
    with pytest.raises(ResumeError, match="saved with batching=None"):
        dataset(source, durations, max_batch_seconds=3.0).load_state_dict(old)


def test_quadratic_duration_shapes_the_batches_and_is_part_of_a_states_batching(tmp_path):
    durations = np.random.default_rng(6).uniform(1.0, 20.0, 60).round(2)
    source = duration_manifest(tmp_path, durations)
    ds = dataset(source, durations, max_batch_seconds=60.0, quadratic_duration=10.0, shuffle=True, seed=2)
    got = keys(ds)
    assert sorted(i for b in got for i in b) == list(range(60))
    assert sorted(got) == sorted(plan_keys(durations, max_batch_seconds=60.0, buckets=10, quadratic_duration=10.0,
                                           shuffle=True, seed=2))
    assert all(len(b) == 1 or batch_cost(len(b), max(durations[i] for i in b), 10.0) <= 60.0 for b in got)
    state = ds.state_dict()
    assert state["batching"]["quadratic_duration"] == 10.0
    for other in (dict(), dict(quadratic_duration=20.0)):
        with pytest.raises(ResumeError, match="saved with batching="):
            dataset(source, durations, max_batch_seconds=60.0, shuffle=True, seed=2, **other).load_state_dict(state)
    dataset(source, durations, max_batch_seconds=60.0, quadratic_duration=10.0, shuffle=True,
            seed=2).load_state_dict(state)
    assert "quadratic_duration" not in dataset(source, durations, max_batch_seconds=60.0).state_dict()["batching"]


@pytest.mark.parametrize("sync", [None, True, False])
def test_ranks_in_step_by_default_with_exact_resume(tmp_path, sync):
    durations = np.clip(np.random.default_rng(8).lognormal(math.log(6.0), 0.55, 200), 1.0, 22.0).round(2)
    source = duration_manifest(tmp_path, durations)
    slow = IndexDecoder(delays={i: 0.01 for i in range(0, 200, 7)})  # batches complete out of plan order
    options = dict(max_batch_seconds=40.0, shuffle=True, seed=4, world_size=2, sync_buckets=sync, num_producers=3)
    ranks = [dataset(source, durations, rank=r, decoder=slow, **options) for r in range(2)]
    for ds in ranks:
        ds.set_epoch(1)
    got = [keys(ds) for ds in ranks]
    planned = [plan_keys(durations, epoch=1, max_batch_seconds=40.0, buckets=10, shuffle=True, seed=4, rank=r,
                         world_size=2, sync_buckets=sync is not False) for r in range(2)]
    if sync is False:
        assert [sorted(g) for g in got] == [sorted(p) for p in planned]
    else:  # in step: in plan order, unordered pool or not
        assert got == planned
    assert len(got[0]) == len(got[1]) == len(ranks[0])
    state = ranks[1].state_dict()
    assert state["batching"].get("sync_buckets", False) == (sync is not False)
    # Resume rank 1 after its first 3 batches: exactly the rest, in step with rank 0.
    resumed = dataset(source, durations, rank=1, **options)
    partial = resumed.state_dict()
    partial["epoch"] = 1
    partial["items"] = len(got[1])
    from audiobuffer.engine.state import pack_consumed
    partial["consumed"] = pack_consumed(bytes([1, 1, 1] + [0] * (len(got[1]) - 3)))
    resumed.load_state_dict(partial)
    assert sorted(keys(resumed)) == sorted(planned[1][3:])
    other = dataset(source, durations, rank=1, **{**options, "sync_buckets": sync is False})
    with pytest.raises(ResumeError, match="saved with batching="):
        other.load_state_dict(state)


def test_changed_durations_refuse_a_state(tmp_path):
    state = dataset(duration_manifest(tmp_path, [1.0, 2.0, 3.0]), [1.0], max_batch_seconds=3.0).state_dict()
    changed = dataset(duration_manifest(tmp_path, [1.0, 2.0, 2.5]), [1.0], max_batch_seconds=3.0)
    with pytest.raises(ResumeError, match="saved with batching="):
        changed.load_state_dict(state)


# -- errors -------------------------------------------------------------------------------------------

UNIT = [1.0] * 12  # unshuffled, one bucket, 3 s: batches [0 1 2] [3 4 5] [6 7 8] [9 10 11]


@pytest.mark.parametrize("ordered", [False, True])
def test_a_failed_sample_leaves_its_batch_and_an_all_failed_batch_is_skipped(tmp_path, ordered, caplog):
    ds = dataset(duration_manifest(tmp_path, UNIT), UNIT, max_batch_seconds=3.0, buckets=1, ordered=ordered,
                 decoder=IndexDecoder(fail={1, 6, 7, 8}), on_error="warn")
    got = keys(ds)
    assert sorted(got) == [(0, 2), (3, 4, 5), (9, 10, 11)]
    stats = ds.stats()
    assert (stats.failed, stats.empty_batches, stats.batches, stats.yielded) == (4, 1, 3, 8)
    assert sorted(i for i, _, _ in stats.failures) == [1, 6, 7, 8]
    assert "injected failure on item 6" in caplog.text
    state = ds.state_dict()  # every batch counts as consumed, the skipped one too
    again = dataset(duration_manifest(tmp_path, UNIT), UNIT, max_batch_seconds=3.0, buckets=1)
    again.load_state_dict(state)
    assert keys(again) == []


def test_a_failed_sample_raises_under_raise(tmp_path):
    ds = dataset(duration_manifest(tmp_path, UNIT), UNIT, max_batch_seconds=3.0, buckets=1,
                 decoder=IndexDecoder(fail={4}))
    with pytest.raises(SampleError, match="item 4"):
        keys(ds)
    assert not wait_no_threads()


def bad_file(folder):
    path = folder / "t999.wav"
    path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")  # a header libsndfile refuses
    return path


def test_a_bad_file_header_raises_before_any_epoch(tmp_path):
    tones(tmp_path / "audio", [0.5, 1.0])
    bad = bad_file(tmp_path / "audio")
    with pytest.raises(DecodeError, match="t999.wav") as info:
        BufferedDataset(tmp_path / "audio", AudioDecoder(8000), max_batch_seconds=2.0)
    assert info.value.path == str(bad)


@pytest.mark.parametrize("policy", ["warn", "skip"])
def test_a_bad_file_is_left_out_of_the_batches_and_counted(tmp_path, policy, caplog):
    tones(tmp_path / "audio", [0.5, 1.0, 0.7, 0.2])
    bad = bad_file(tmp_path / "audio")
    ds = BufferedDataset(tmp_path / "audio", AudioDecoder(8000), max_batch_seconds=1.5, on_error=policy)
    assert ("could not be read" in caplog.text) == (policy == "warn")  # reported before the epoch
    seen = [p for batch in DataLoader(ds, batch_size=None, collate_fn=pad_collate) for p in batch["path"]]
    assert sorted(seen) == sorted(p for p in ds.source.paths if p != str(bad))
    stats = ds.stats()
    assert stats.failed == 1 and stats.failures[0][1] == str(bad)
    assert stats.yielded + stats.failed == stats.items == 5  # the file left out is one of the items
    other_rank = BufferedDataset(tmp_path / "audio", AudioDecoder(8000), max_batch_seconds=1.5, on_error=policy,
                                 rank=1, world_size=2)
    list(other_rank)
    assert other_rank.stats().failed == 0  # counted once, on rank 0


@pytest.mark.subprocess
def test_a_bad_file_is_a_failed_item_of_the_isolated_loader_too(tmp_path):
    """The isolated loader counts a file whose header failed as the dataset does: yielded + failed == items."""
    tones(tmp_path / "audio", [0.5, 1.0, 0.7, 0.2])
    bad_file(tmp_path / "audio")
    with IsolatedLoader(tmp_path / "audio", AudioDecoder(8000), max_batch_seconds=1.5, on_error="skip") as loader:
        rows = sum(len(batch["path"]) for batch in loader)
        stats = loader.stats()
    assert (rows, stats.yielded, stats.failed, stats.items) == (4, 4, 1, 5)


# -- options ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(max_batch_seconds=0), ValueError, "max_batch_seconds must be None or a number of seconds > 0"),
    (dict(max_batch_seconds="2"), TypeError, "max_batch_seconds must be None or a number of seconds"),
    (dict(max_batch_seconds=1e9), ValueError, "max_batch_seconds must be .* <= 86400, got 1000000000.0"),
    (dict(max_batch_seconds=2, buckets=0), ValueError, "buckets must be an integer >= 1 or None, got 0"),
    (dict(max_batch_seconds=2, max_batch_size=2.5), TypeError,
     r"max_batch_size must be an integer in \[1, 1048576\] or None"),
    (dict(max_batch_seconds=2, duration_column=3), TypeError, "duration_column must be a manifest column"),
    (dict(buckets=4), ValueError, "buckets shape batches by duration: give max_batch_seconds too, got buckets=4"),
    (dict(duration_column="d"), ValueError, "duration_column shape batches by duration"),
])
def test_bad_batch_options_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        BufferedDataset(fake_paths(4), IndexDecoder(), **kwargs)


def test_max_batch_size_caps_the_count(tmp_path):
    durations = [0.1] * 20
    ds = dataset(duration_manifest(tmp_path, durations), durations, max_batch_seconds=100.0, max_batch_size=6)
    assert sorted(len(b) for b in keys(ds)) == [2, 6, 6, 6]


def test_an_epoch_is_planned_once_for_len_and_iter(tmp_path, monkeypatch):
    import audiobuffer.engine.pipeline as batched

    calls = []
    real = batched.plan_batches
    monkeypatch.setattr(batched, "plan_batches", lambda *a, **k: calls.append(k["epoch"]) or real(*a, **k))
    durations = np.random.default_rng(0).uniform(0.5, 3.0, 40)
    ds = dataset(duration_manifest(tmp_path, durations), durations, max_batch_seconds=5.0, shuffle=True)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert len(ds) == len(keys(ds)) == len(ds)
    assert calls == [0, 1]


def test_a_delivering_decoder_takes_no_max_batch_seconds():
    with pytest.raises(ValueError, match="no max_batch_seconds"):
        BatchSlotLoader(fake_paths(4), IndexDecoder(), batch_size=2, max_batch_seconds=2.0)


# -- batches cut as samples arrive (streamed shards) --------------------------------------------------

@settings(deadline=None, max_examples=60)
@given(durations=st.lists(st.floats(0.0, 12.0), max_size=300), budget=st.sampled_from([1.0, 5.0, 20.0]),
       buckets=st.integers(1, 6), size=st.one_of(st.none(), st.integers(1, 8)),
       quadratic=st.one_of(st.none(), st.sampled_from([2.0, 20.0])))
def test_dynamic_buckets_hand_on_each_sample_once_within_the_budget(durations, budget, buckets, size, quadratic):
    cutter = DynamicBuckets(budget, buckets, size, quadratic)
    batches = [b for i, d in enumerate(durations) for b in cutter.add(d, i)]
    assert cutter.held == len(durations) - sum(len(b) for b in batches)
    batches += cutter.flush()
    assert cutter.held == 0 and cutter.flush() == []
    assert sorted(i for b in batches for _, i in b) == list(range(len(durations)))
    assert all(seconds == durations[i] for b in batches for seconds, i in b)
    assert all(len(b) == 1 or batch_cost(len(b), max(s for s, _ in b), quadratic) <= budget for b in batches)
    assert all(size is None or len(b) <= size for b in batches)


def test_dynamic_buckets_take_a_huge_duration_without_overflow_warnings():
    """A duration whose square overflows (a numpy float, as a sidecar gives) costs infinity: a batch of its own."""
    cutter = DynamicBuckets(8.0, 1, None, 5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches = [b for i, d in enumerate([1.0, 1.0, np.float64(1e200)]) for b in cutter.add(d, i)]
        batches += cutter.flush()
        assert batch_cost(2, np.float64(1e200), 5.0) == math.inf
    assert sorted(len(b) for b in batches) == [1, 2]


def test_dynamic_buckets_put_like_lengths_together():
    """Edges come from the first samples; then a short sample never waits in a batch of long ones."""
    cutter = DynamicBuckets(8.0, 2)
    batches = [b for i in range(40) for b in cutter.add(1.0 if i % 2 else 4.0, i)] + cutter.flush()
    assert all(len({s for s, _ in b}) == 1 for b in batches)
    assert sorted(len(b) for b in batches if b[0][0] == 4.0) == [2] * 10
    assert sorted(len(b) for b in batches if b[0][0] == 1.0) == [4] + [8] * 2


def test_timed_decode_reads_the_sidecar_field_before_decoding():
    """A streamed sample's length is its field's seconds capped by the crop (the crop itself when the decoder
    pads to it); a sample without a duration there fails before it is decoded."""
    decoded = []

    def decode(item):
        decoded.append(item.path)
        return item.path

    def item(value):
        return WorkItem(index=0, path="s.tar/a.wav", fields={} if value is None else {"seconds": value})

    assert TimedDecode(decode, "seconds", crop=None, pad=False)(item("2.5")) == (2.5, 2.5, "s.tar/a.wav")
    assert TimedDecode(decode, "seconds", crop=1.0, pad=False)(item(2.5)) == (1.0, 1.0, "s.tar/a.wav")
    assert TimedDecode(decode, "seconds", crop=1.0, pad=True)(item(0.25)) == (1.0, 0.25, "s.tar/a.wav")
    decoded.clear()
    for value, match in ((None, r"no 'seconds' \(duration_column\), only \[\]"), ("x", "holds 'x'"),
                         (-1, "holds -1"), (True, "holds True")):
        with pytest.raises(SourceError, match=match):
            TimedDecode(decode, "seconds", crop=None, pad=False)(item(value))
    assert decoded == []
