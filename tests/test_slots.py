import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from audiobuffer import AudioDecoder, DecodeError, SampleError
from audiobuffer.device import DevicePrefetcher
from audiobuffer.slots import BatchSlotLoader
from helpers import IndexDecoder, fake_paths, make_corpus, wait_no_threads


def fixed(item):
    """A fixed-shape sample whose values tell which item it came from."""
    return {"audio": torch.full((50,), float(item.index)), "index": item.index, "path": item.path}


def check_batch(batch):
    for row, index in enumerate(batch["index"].tolist()):
        assert torch.all(batch["audio"][row] == index), f"row {row} holds another item's data"
        assert batch["path"][row] == fake_paths(1000)[index]


def test_every_item_once_with_correct_rows():
    loader = BatchSlotLoader(fake_paths(103), fixed, batch_size=10, num_producers=4)
    seen = []
    for batch in loader:
        check_batch(batch)
        seen.extend(batch["index"].tolist())
    assert sorted(seen) == list(range(103)) and len(loader) == 11
    assert loader.slot_stats.samples == 103 and loader.slot_stats.batches == 11


def test_slots_are_recycled_across_batches_and_epochs():
    loader = BatchSlotLoader(fake_paths(200), fixed, batch_size=8, num_slots=4, num_producers=2)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            check_batch(batch)
    stats = loader.slot_stats
    assert stats.allocated <= 4 and stats.retired == 0
    assert stats.batches == 75 and stats.reused == 75 - stats.allocated


def test_a_consumer_that_keeps_every_batch_never_sees_them_overwritten():
    loader = BatchSlotLoader(fake_paths(120), fixed, batch_size=8, num_slots=3, num_producers=4)
    kept = list(loader)
    for batch in kept:
        check_batch(batch)
    assert sum(len(b["path"]) for b in kept) == 120
    assert loader.slot_stats.retired > 0


def test_slices_and_numpy_views_of_a_batch_keep_its_slot():
    loader = BatchSlotLoader(fake_paths(96), fixed, batch_size=8, num_slots=3, num_producers=2)
    held = []
    for i, batch in enumerate(loader):
        if i % 2 == 0:
            held.append((batch["audio"][2:5], batch["index"][2:5].clone()))
        elif i % 3 == 0:
            held.append((torch.from_numpy(batch["audio"].numpy()[2:5]), batch["index"][2:5].clone()))
    for audio, index in held:
        for row, value in enumerate(index.tolist()):
            assert torch.all(audio[row] == value)


def test_drop_last_and_short_last_batch():
    sizes = [len(b["path"]) for b in BatchSlotLoader(fake_paths(21), fixed, batch_size=8)]
    assert sorted(sizes) == [5, 8, 8]
    loader = BatchSlotLoader(fake_paths(21), fixed, batch_size=8, drop_last=True)
    assert [len(b["path"]) for b in loader] == [8, 8] and len(loader) == 2


@pytest.mark.parametrize("policy", ["skip", "warn"])
def test_failed_items_leave_no_holes(policy):
    decode = IndexDecoder(fail={3, 50, 51})
    loader = BatchSlotLoader(fake_paths(60), decode, batch_size=8, on_error=policy, num_producers=3)
    seen = []
    for batch in loader:
        for row, index in enumerate(batch["index"].tolist()):
            assert torch.all(batch["audio"][row] == index)
        seen.extend(batch["index"].tolist())
    assert sorted(seen) == sorted(set(range(60)) - {3, 50, 51})
    assert loader.stats().failed == 3


def test_failure_raises_by_default():
    with pytest.raises(DecodeError, match="item_00005"):
        list(BatchSlotLoader(fake_paths(30), IndexDecoder(fail={5}), batch_size=4))
    assert not wait_no_threads()


def test_a_sample_of_another_shape_is_a_sample_error():
    def ragged(item):
        return {"audio": torch.zeros(10 if item.index != 7 else 11)}

    with pytest.raises(SampleError, match=r"'audio' has shape \(11,\), the batch slot \(10,\)"):
        list(BatchSlotLoader(fake_paths(20), ragged, batch_size=4, num_producers=1))
    loader = BatchSlotLoader(fake_paths(20), ragged, batch_size=4, on_error="skip")
    assert sum(len(b["audio"]) for b in loader) == 19


def test_early_exit_stops_producers():
    loader = BatchSlotLoader(fake_paths(1000), fixed, batch_size=4, num_slots=3, num_producers=4)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert not wait_no_threads()


def test_real_audio_through_slots_and_prefetcher(tmp_path):
    make_corpus(tmp_path, 30, seconds=0.3)
    decoder = AudioDecoder(16000, crop_seconds=0.25, crop="start")
    loader = BatchSlotLoader(tmp_path, decoder, batch_size=7, labels=r"^(\d+)_", num_producers=2)
    seen = {}
    for batch in DevicePrefetcher(loader, "cpu"):
        assert batch["audio"].shape[1:] == (4000,) and batch["audio"].dtype == torch.float32
        for row, path in enumerate(batch["path"]):
            assert torch.equal(batch["audio"][row], decoder(path)["audio"])
            seen[path] = batch["label"][row].item()
    assert len(seen) == 30 and all(int(p.rsplit("/", 1)[1][0]) == label for p, label in seen.items())


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 0}, "batch_size"), ({"batch_size": 4, "num_slots": 1}, "num_slots"),
    ({"batch_size": 4, "pin_memory": "yes"}, "pin_memory"),
])
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BatchSlotLoader(fake_paths(3), fixed, **kwargs)


@settings(deadline=None, max_examples=25)
@given(n=st.integers(1, 90), batch_size=st.integers(1, 9), num_slots=st.integers(2, 5),
       producers=st.sampled_from([1, 2, 4, 8]), hold_every=st.sampled_from([0, 1, 2, 3]),
       fail=st.sets(st.integers(0, 89), max_size=5))
def test_property_each_item_once_in_an_intact_row(n, batch_size, num_slots, producers, hold_every, fail):
    decode = IndexDecoder(fail=fail)
    loader = BatchSlotLoader(fake_paths(n), decode, batch_size=batch_size, num_slots=num_slots,
                             num_producers=producers, on_error="skip")
    held, seen = [], []
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen = []
        for i, batch in enumerate(loader):
            if hold_every and i % hold_every == 0:
                held.append(batch)  # kept past the next batches: its slot must not be refilled
            seen.extend(batch["index"].tolist())
        assert sorted(seen) == sorted(set(range(n)) - fail)
    for batch in held:
        for row, index in enumerate(batch["index"].tolist()):
            assert torch.all(batch["audio"][row] == index)
    assert not wait_no_threads()


def test_timeout_reaches_the_slot_loader():
    from audiobuffer import StallError
    import threading

    gate = threading.Event()

    def stalling(item):
        if item.index == 2:
            gate.wait(10)
        return {"audio": torch.zeros(4), "index": item.index}

    loader = BatchSlotLoader(fake_paths(8), stalling, batch_size=4, num_producers=1, timeout=0.3)
    try:
        with pytest.raises(StallError, match=r"item_00002\.wav"):
            list(loader)
    finally:
        gate.set()
    assert not wait_no_threads()
