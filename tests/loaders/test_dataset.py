import gc
import logging
import pickle
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from helpers import (
    JOIN_TIMEOUT,
    IndexDecoder,
    audiobuffer_threads,
    fake_paths,
    make_corpus,
    wait_no_threads,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from audiobuffer import (
    AudioDecoder,
    BufferClosed,
    BufferedDataset,
    DecodeError,
    SampleError,
    pad_collate,
)
from audiobuffer._checks import MAX_SEED
from audiobuffer.engine.plan import epoch_order


def indices(samples):
    return [s["index"] for s in samples]


@settings(deadline=None, max_examples=20)
@given(n=st.integers(1, 80), producers=st.sampled_from([1, 2, 8]), ordered=st.booleans(),
       shuffle=st.booleans(), seed=st.integers(0, 2**31),
       slow=st.dictionaries(st.integers(0, 79), st.sampled_from([0.001, 0.004]), max_size=10))
def test_each_item_once_per_epoch(n, producers, ordered, shuffle, seed, slow):
    ds = BufferedDataset(fake_paths(n), IndexDecoder(delays=slow), num_producers=producers,
                         buffer_size=4, ordered=ordered, shuffle=shuffle, seed=seed)
    for epoch in range(2):
        ds.set_epoch(epoch)
        got = indices(ds)
        if ordered:
            assert got == epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch).tolist()
        else:
            assert sorted(got) == list(range(n))
        stats = ds.stats()
        assert (stats.items, stats.yielded, stats.failed, stats.done) == (n, n, 0, True)
    assert not wait_no_threads()


def test_options_are_read_only_views_of_the_pipeline():
    ds = BufferedDataset(fake_paths(4), IndexDecoder(), shuffle=True, seed=7, num_producers=None, timeout=5.0)
    assert (ds.shuffle, ds.seed, ds.num_producers, ds.even_shards, ds.timeout) == (True, 7, "auto", "pad", 5.0)
    assert ds.options is ds.pipeline.options and ds.source is ds.pipeline.source
    assert ds.decoder is ds.pipeline.decoder and ds.batching is None and ds.transform is None
    for name in ("shuffle", "seed", "num_producers", "source", "decoder", "batching", "options"):
        with pytest.raises(AttributeError):
            setattr(ds, name, None)
    assert ds.shuffle is True


def test_shuffle_changes_with_epoch_and_is_reproducible():
    ds = BufferedDataset(fake_paths(50), IndexDecoder(), shuffle=True, seed=3, ordered=True)
    first = indices(ds)
    again = indices(ds)
    ds.set_epoch(1)
    other = indices(ds)
    assert first == again != other
    assert first != list(range(50)) and sorted(other) == list(range(50))


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("ordered", [False, True])
def test_rank_shards_are_disjoint_and_cover(world_size, ordered):
    n = 31
    seen = []
    for rank in range(world_size):
        ds = BufferedDataset(fake_paths(n), IndexDecoder(), shuffle=True, seed=5, ordered=ordered,
                             rank=rank, world_size=world_size, num_producers=3, even_shards=None)
        got = indices(ds)
        assert len(got) == len(ds)
        seen.extend(got)
    assert sorted(seen) == list(range(n))


@pytest.mark.subprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [1, 2])
def test_dataloader_workers_shard_exactly_once(world_size):
    n = 45
    seen = []
    for rank in range(world_size):
        ds = BufferedDataset(fake_paths(n), IndexDecoder(), shuffle=True, rank=rank, world_size=world_size,
                             num_producers=2, even_shards=None)
        loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=pad_collate)
        for batch in loader:
            seen.extend(batch["index"].tolist())
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("mode, per_rank", [("pad", 11), ("drop", 10)])
def test_even_shards(mode, per_rank):
    seen = []
    for rank in range(3):
        ds = BufferedDataset(fake_paths(31), IndexDecoder(), shuffle=True, rank=rank, world_size=3, even_shards=mode)
        got = indices(ds)
        assert len(got) == len(ds) == per_rank
        seen.extend(got)
    if mode == "pad":
        assert set(seen) == set(range(31)) and len(seen) == 33  # two items repeated
    else:
        assert len(set(seen)) == len(seen) == 30  # one left out


@pytest.mark.subprocess
def test_workers_do_not_unbalance_ranks():
    # 6 items, 2 ranks, 2 DataLoader workers each: every rank must still get 3 items.
    for rank in range(2):
        ds = BufferedDataset(fake_paths(6), IndexDecoder(), rank=rank, world_size=2, even_shards=None)
        loader = DataLoader(ds, batch_size=1, num_workers=2, collate_fn=pad_collate)
        assert sum(len(b["index"]) for b in loader) == 3


def test_torch_distributed_gives_the_shard(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ds = BufferedDataset(fake_paths(5), IndexDecoder())
        assert ds.shard_info() == (0, 1)
        assert sorted(indices(ds)) == list(range(5))
        assert BufferedDataset(fake_paths(5), IndexDecoder(), rank=1, world_size=2).shard_info() == (1, 2)
    finally:
        dist.destroy_process_group()


# -- faults -------------------------------------------------------------------------------------------

FAIL = {3, 17, 18}


def test_raise_policy_names_file_and_chains_cause():
    ds = BufferedDataset(fake_paths(30), IndexDecoder(fail=FAIL), on_error="raise", ordered=True)
    with pytest.raises(DecodeError) as info:
        list(ds)
    err = info.value
    assert err.path == fake_paths(30)[3] and err.index == 3
    assert "item_00003.wav" in str(err) and "audiobuffer-producer-" in str(err)
    assert isinstance(err.__cause__, DecodeError) and "injected failure on item 3" in str(err.__cause__)


def test_bug_in_user_decoder_surfaces_as_sample_error():
    ds = BufferedDataset(fake_paths(10), IndexDecoder(fail={4}, exc_type=ZeroDivisionError))
    with pytest.raises(SampleError, match=r"item 4 .*ZeroDivisionError") as info:
        list(ds)
    assert not isinstance(info.value, DecodeError)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_bug_in_transform_surfaces_as_sample_error():
    def transform(sample):
        if sample["index"] == 2:
            raise KeyError("missing field")
        sample["doubled"] = sample["index"] * 2
        return sample

    ds = BufferedDataset(fake_paths(5), IndexDecoder(), transform=transform, on_error="skip", ordered=True)
    got = list(ds)
    assert [s["doubled"] for s in got] == [0, 2, 6, 8]
    assert ds.stats().failures[0][:2] == (2, fake_paths(5)[2])
    assert "KeyError" in ds.stats().failures[0][2]


@pytest.mark.parametrize("policy", ["warn", "skip"])
@pytest.mark.parametrize("ordered", [False, True])
def test_warn_and_skip_count_every_item(policy, ordered, caplog):
    n = 40
    ds = BufferedDataset(fake_paths(n), IndexDecoder(fail=FAIL), on_error=policy, ordered=ordered,
                         num_producers=4, buffer_size=3)
    with caplog.at_level(logging.WARNING, logger="audiobuffer"):
        got = indices(ds)
    assert sorted(got) == sorted(set(range(n)) - FAIL)
    stats = ds.stats()
    assert stats.yielded + stats.failed == stats.items == n
    assert sorted(f[0] for f in stats.failures) == sorted(FAIL)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    if policy == "warn":
        assert len(warnings) == len(FAIL)
        assert all("injected failure" in r.getMessage() and "item_000" in r.getMessage() for r in warnings)
    else:
        assert not warnings


def test_slow_item_in_ordered_mode():
    ds = BufferedDataset(fake_paths(20), IndexDecoder(delays={0: 0.3, 7: 0.1}), ordered=True,
                         num_producers=4, buffer_size=2)
    assert indices(ds) == list(range(20))


# -- leaving early -----------------------------------------------------------------------------------

def slow_dataset(n=500, **kwargs):
    return BufferedDataset(fake_paths(n), IndexDecoder(), buffer_size=4, num_producers=4, **kwargs)


def test_break_stops_producers():
    ds = slow_dataset()
    loader = DataLoader(ds, batch_size=2, collate_fn=pad_collate)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    assert audiobuffer_threads() == [] or not wait_no_threads()
    stats = ds.stats()
    assert not stats.done and stats.yielded < 500


def test_exception_in_training_loop_stops_producers():
    ds = slow_dataset()

    def train():
        for _batch in DataLoader(ds, batch_size=2, collate_fn=pad_collate):
            raise RuntimeError("loss is nan")

    with pytest.raises(RuntimeError, match="loss is nan"):
        train()
    assert not wait_no_threads()


def test_garbage_collection_without_close_stops_producers():
    ds = slow_dataset()
    it = iter(ds)
    next(it)
    assert len(audiobuffer_threads()) == 4
    del it
    gc.collect()
    assert not wait_no_threads()


def test_close_from_another_thread_ends_the_loop():
    gate = threading.Event()

    def decode(item):
        gate.wait(JOIN_TIMEOUT)  # nothing arrives until the test opens the gate
        return {"index": item.index}

    def close_then_open_gate():
        threading.Timer(0.05, gate.set).start()  # the stuck decoders finish soon after close()
        ds.close()

    ds = BufferedDataset(fake_paths(10), decode, num_producers=2)
    closer = threading.Timer(0.05, close_then_open_gate)
    closer.start()
    got = list(ds)  # blocked in get() until close() wakes it
    closer.join(JOIN_TIMEOUT)
    assert got == [] and ds.stats().done is False
    with pytest.raises(BufferClosed, match="closed BufferedDataset"):
        list(ds)


def test_context_manager_closes_running_epochs():
    with slow_dataset() as ds:
        it = iter(ds)
        next(it)
    assert not wait_no_threads()
    assert list(it) == []  # the running epoch ended with the dataset
    assert ds.stats().done is False


def test_two_epochs_at_once():
    ds = BufferedDataset(fake_paths(30), IndexDecoder(), shuffle=True)
    a, b = iter(ds), iter(ds)
    got_a, got_b = [], []
    for x, y in zip(a, b):
        got_a.append(x["index"])
        got_b.append(y["index"])
    got_a += indices(a)
    got_b += indices(b)
    assert sorted(got_a) == sorted(got_b) == list(range(30))


# -- real decoding through a DataLoader --------------------------------------------------------------

def test_audio_corpus_through_dataloader_with_pin_memory(tmp_path):
    paths = make_corpus(tmp_path, 24, classes=4, seconds=0.1)
    ds = BufferedDataset(tmp_path, AudioDecoder(sample_rate=16000), labels=r"^(\d+)_", shuffle=True,
                         num_producers=3)
    loader = DataLoader(ds, batch_size=5, collate_fn=pad_collate, pin_memory=True)
    seen = {}
    for batch in loader:
        assert batch["audio"].dtype == torch.float32 and batch["audio"].shape[1] == 1600
        for path, label, name in zip(batch["path"], batch["label"].tolist(), batch["label_name"]):
            seen[path] = (label, name)
    assert sorted(seen) == sorted(str(p) for p in paths)
    for path, (label, name) in seen.items():
        assert name == path.rsplit("/", 1)[1].split("_")[0] and ds.classes[label] == name


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_audio_corpus_through_dataloader_workers(tmp_path):
    paths = make_corpus(tmp_path, 20, seconds=0.05)
    ds = BufferedDataset(tmp_path, AudioDecoder(), num_producers=2)
    loader = DataLoader(ds, batch_size=3, num_workers=2, collate_fn=pad_collate)
    got = [p for batch in loader for p in batch["path"]]
    assert sorted(got) == sorted(str(p) for p in paths)


def test_pickles_without_runtime_state(tmp_path):
    make_corpus(tmp_path, 4)
    ds = BufferedDataset(tmp_path, AudioDecoder(sample_rate=8000), labels="parent")
    list(ds)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.stats() is None and len(copy) == 4
    assert sorted(s["path"] for s in copy) == sorted(s["path"] for s in ds)


# -- validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    ({"num_producers": 0}, ValueError, r"num_producers must be an integer in \[1, 1024\] or 'auto', got 0"),
    ({"num_producers": "eight"}, TypeError, r"num_producers must be an integer in \[1, 1024\] or 'auto', got 'eight'"),
    ({"buffer_size": 0}, ValueError, "buffer_size"),
    ({"max_bytes": -5}, ValueError, "max_bytes"),
    ({"on_error": "ignore"}, ValueError, "on_error must be one of"),
    ({"rank": 0}, ValueError, "give rank and world_size together"),
    ({"rank": 2, "world_size": 2}, ValueError, r"rank must be an integer in \[0, 1\], got 2"),
    ({"transform": 3}, TypeError, "transform"),
    # Values that used to pass and fail mid-epoch.
    ({"seed": -1}, ValueError, r"seed must be an integer in \[0, 9223372036854775807\], got -1"),
    ({"timeout": float("nan")}, ValueError, "timeout must be None or a number of seconds > 0"),
    ({"warn_after": float("-inf")}, ValueError, "warn_after"),
    ({"timeout": "30"}, TypeError, "timeout must be None or a number of seconds > 0, got '30'"),
])
def test_validation(kwargs, error, message):
    with pytest.raises(error, match=message):
        BufferedDataset(fake_paths(3), IndexDecoder(), **kwargs)


def test_decoder_must_be_callable():
    with pytest.raises(TypeError, match="decoder must be callable"):
        BufferedDataset(fake_paths(3), "AudioDecoder")
    # The class for an instance: refused when the dataset is made, not at the first sample.
    with pytest.raises(TypeError, match=r"got the class AudioDecoder: pass an instance, AudioDecoder\(\.\.\.\)"):
        BufferedDataset(fake_paths(3), AudioDecoder)


def test_set_epoch_validation():
    ds = BufferedDataset(fake_paths(3), IndexDecoder())
    with pytest.raises(ValueError, match="epoch"):
        ds.set_epoch(-1)


def test_waiting_for_data_warning_is_logged_and_rate_limited(caplog):
    ds = BufferedDataset(fake_paths(3), IndexDecoder(delays={0: 0.3, 1: 0.3, 2: 0.3}), num_producers=1,
                         warn_after=0.05, ordered=True)
    with caplog.at_level(logging.WARNING, logger="audiobuffer"):
        assert indices(ds) == [0, 1, 2]
    waits = [r.getMessage() for r in caplog.records if "waiting for data" in r.getMessage()]
    assert len(waits) == 1  # three long waits, one warning within the 30 s interval
    assert "items decoded, 1 producers" in waits[0]


def test_warn_after_validation():
    with pytest.raises(ValueError, match="warn_after"):
        BufferedDataset(fake_paths(3), IndexDecoder(), warn_after=0)



# -- large values ----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("timeout, warn_after", [(float("inf"), 1e12), (1e12, float("inf")), (1e300, None)])
def test_infinite_and_huge_waits_mean_no_limit(ordered, timeout, warn_after):
    # They raised OverflowError at the consumer's first wait (here, for the slow first item).
    ds = BufferedDataset(fake_paths(12), IndexDecoder(delays={0: 0.05}), num_producers=2, buffer_size=4,
                         ordered=ordered, timeout=timeout, warn_after=warn_after)
    got = indices(ds)
    assert sorted(got) == list(range(12))
    assert ds.stats().done


def test_the_largest_seed_works():
    ds = BufferedDataset(fake_paths(10), IndexDecoder(), shuffle=True, seed=MAX_SEED, num_producers=2)
    ds.set_epoch(3)  # seed + epoch past an int64
    assert sorted(indices(ds)) == list(range(10))


# -- a failed start --------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_thread_that_cannot_start_leaves_no_thread(monkeypatch):
    real_start = threading.Thread.start
    started = []

    def start(thread):
        if thread.name.startswith("audiobuffer-producer-"):
            if len(started) == 2:
                raise RuntimeError("can't start new thread")
            started.append(thread)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    ds = BufferedDataset(fake_paths(500), IndexDecoder(), num_producers=6, buffer_size=2)
    it = iter(ds)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        next(it)
    assert len(started) == 2 and not any(t.is_alive() for t in started)
    assert audiobuffer_threads() == []
    assert not ds._epochs.running  # the epoch is over
    monkeypatch.undo()
    assert sorted(indices(ds)) == list(range(500))  # the next epoch starts normally


# -- max_bytes in ordered mode ---------------------------------------------------------------------

class SizedDecoder:
    """Samples of ``size`` bytes; item 0 takes ``first_s`` seconds; counts samples alive (decoded, not consumed)."""

    def __init__(self, size, first_s):
        self.size, self.first_s = size, first_s
        self.lock = threading.Lock()
        self.live = self.peak = 0

    def __call__(self, item):
        if item.index == 0:
            time.sleep(self.first_s)  # a slow first file: everything after it waits for its turn
        sample = {"index": item.index, "audio": np.zeros(self.size, np.uint8)}
        with self.lock:
            self.live += 1
            self.peak = max(self.peak, self.live)
        return sample

    def consumed(self):
        with self.lock:
            self.live -= 1


@pytest.mark.timeout(60)
def test_ordered_max_bytes_bounds_the_samples_waiting_for_their_turn():
    size, producers = 100_000, 4
    decoder = SizedDecoder(size, first_s=0.3)
    ds = BufferedDataset(fake_paths(120), decoder, num_producers=producers, buffer_size=64, max_bytes=4 * size,
                         ordered=True)
    got = []
    for sample in ds:
        got.append(sample["index"])
        del sample
        decoder.consumed()
    assert got == list(range(120))
    # At most max_bytes admitted, one next-in-order item over it, one finished item per producer.
    # Before, all of the 64-item window piled up behind the slow first item.
    assert decoder.peak <= 4 + 1 + producers
    assert ds.stats().yielded == 120


# -- stats() and state_dict() with DataLoader workers ----------------------------------------------

@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_stats_and_state_dict_warn_once_after_epochs_in_dataloader_workers():
    ds = BufferedDataset(fake_paths(20), IndexDecoder(), num_producers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ds.stats() is None and ds.state_dict()[ds.STATE_ITEMS] is None  # before any epoch: no warning
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=pad_collate)
    assert sorted(i for batch in loader for i in batch["index"].tolist()) == list(range(20))
    with pytest.warns(UserWarning, match=r"BufferedDataset.stats\(\) in the main process: this dataset's epochs "
                                         r"ran in DataLoader worker processes"):
        assert ds.stats() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per dataset
        assert ds.state_dict()[ds.STATE_ITEMS] is None
        assert ds.stats() is None
    other = BufferedDataset(fake_paths(20), IndexDecoder(), num_producers=2)
    list(DataLoader(other, batch_size=4, num_workers=1, collate_fn=pad_collate))
    with pytest.warns(UserWarning, match=r"state_dict\(\) in the main process.*marks the start of the epoch"):
        other.state_dict()


def test_no_warning_for_epochs_run_in_the_main_process():
    ds = BufferedDataset(fake_paths(20), IndexDecoder(), num_producers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(DataLoader(ds, batch_size=4, collate_fn=pad_collate))
        assert ds.stats().yielded == 20 and ds.state_dict()[ds.STATE_ITEMS] == 20
        copy = pickle.loads(pickle.dumps(ds))  # a copy has its own worker count
        list(copy)
        assert copy.stats().yielded == 20


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_an_epoch_in_the_main_process_after_worker_epochs_does_not_warn():
    ds = BufferedDataset(fake_paths(8), IndexDecoder(), num_producers=2)
    list(DataLoader(ds, batch_size=4, num_workers=1, collate_fn=pad_collate))
    list(ds)  # here: stats() describes this epoch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ds.stats().yielded == 8


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_the_warning_also_comes_with_spawned_workers():
    # Spawned workers get the shared counter as they start (Windows and macOS start workers this way).
    ds = BufferedDataset(fake_paths(8), IndexDecoder(), num_producers=2)
    loader = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=pad_collate, multiprocessing_context="spawn")
    assert sorted(i for batch in loader for i in batch["index"].tolist()) == list(range(8))
    with pytest.warns(UserWarning, match="ran in DataLoader worker processes"):
        ds.state_dict()
