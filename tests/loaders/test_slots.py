import json
import threading
import time

import numpy as np
import pytest
import torch
from helpers import JOIN_TIMEOUT, IndexDecoder, fake_paths, make_corpus, wait_no_threads
from hypothesis import given, settings
from hypothesis import strategies as st

from audiobuffer import (
    AudioBufferError,
    AudioDecoder,
    DecodeError,
    ImageDecoder,
    SampleError,
    WorkItem,
    pad_collate,
)
from audiobuffer.loaders.device import DevicePrefetcher
from audiobuffer.loaders.slots import BatchSlotLoader, Slot
from audiobuffer.loaders.slots import convert as convert_row


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
    def ragged(item):  # items 8, 13 and 18 come out one longer (the first sample decoded sets the shape)
        return {"audio": torch.zeros(11 if item.index in (8, 13, 18) else 10), "index": item.index}

    with pytest.raises(SampleError, match=r"'audio' has shape \(11,\), the batch slot \(10,\)"):
        list(BatchSlotLoader(fake_paths(20), ragged, batch_size=4, num_producers=1))
    loader = BatchSlotLoader(fake_paths(20), ragged, batch_size=4, num_producers=2, on_error="skip")
    assert sum(len(b["index"]) for b in loader) == 17 and loader.stats().failed == 3


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


@pytest.mark.slow
def test_timeout_reaches_the_slot_loader():
    import threading

    from audiobuffer import StallError

    gate = threading.Event()

    def stalling(item):
        if item.index == 2:
            gate.wait(3.0)  # 10 times the timeout: the error comes first; close() joins after it
        return {"audio": torch.zeros(4), "index": item.index}

    loader = BatchSlotLoader(fake_paths(8), stalling, batch_size=4, num_producers=1, timeout=0.3)
    try:
        with pytest.raises(StallError, match=r"item_00002\.wav"):
            list(loader)
    finally:
        gate.set()
    assert not wait_no_threads()


# -- an epoch left early ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_slots", [2, 4])
@pytest.mark.parametrize("timeout", [None, 5.0])
def test_every_epoch_runs_in_full_after_epochs_left_early(num_slots, timeout, caplog):
    # The full slots in the buffer when a loop is left used to be dropped by the pool's abort and
    # never came back: with 2 slots the next epoch hung, with 4 the fourth one (a StallError with timeout=).
    loader = BatchSlotLoader(fake_paths(64), fixed, batch_size=8, num_slots=num_slots, num_producers=2,
                             timeout=timeout)
    for epoch, leave_early in enumerate([True, True, True, False, True, False, True, True, False]):
        loader.set_epoch(epoch)
        seen = []
        for batch in loader:
            check_batch(batch)
            seen.extend(batch["index"].tolist())
            if leave_early:
                break
        assert not wait_no_threads(), "a producer outlived the end of the epoch"
        stats = loader.stats()
        if leave_early:
            assert len(seen) == 8 and not stats.done
        else:
            assert sorted(seen) == list(range(64)) and stats.done and stats.yielded == 64
    assert "still running" not in caplog.text  # no producer sat out the join


@pytest.mark.timeout(60)
def test_producers_waiting_for_a_slot_wake_when_the_pool_closes(caplog):
    # The pool can close on its own (an error raised in the epoch, dataset.close()): the producers
    # blocked in the slot writer must wake then, not sit out the pool's 10 s join.
    taken = [threading.Event() for _ in range(8)]

    def decode(item):
        taken[item.index].set()
        return fixed(item)

    loader = BatchSlotLoader(fake_paths(8), decode, batch_size=1, num_slots=2, num_producers=2)
    kept = []
    for batch in loader:
        kept.append(batch)  # held: its slot cannot be refilled
        if len(kept) == 1:
            # One slot held here, the other full on its way to the consumer: the producers that
            # took items 2 and 3 find no slot and wait for one.
            assert taken[2].wait(JOIN_TIMEOUT) and taken[3].wait(JOIN_TIMEOUT)
            loader._epochs.close()  # the pool alone: it must wake the producers waiting for a slot
    assert len(kept) == 1 and not wait_no_threads()
    assert "still running" not in caplog.text


def test_a_second_epoch_while_one_runs_is_refused():
    loader = BatchSlotLoader(fake_paths(40), fixed, batch_size=4, num_producers=2)
    first = iter(loader)
    next(first)
    with pytest.raises(RuntimeError, match="already running an epoch"):
        next(iter(loader))
    first.close()
    assert sorted(i for b in loader for i in b["index"].tolist()) == list(range(40))


def test_a_slot_is_not_refilled_while_its_batch_is_being_made(monkeypatch):
    # A producer woken by a hand-out used to find the slot unreferenced before the batch's views
    # were made, and refill it under them (rows lost and others yielded twice).
    make_batch = Slot.batch

    def slow_batch(slot, rows):
        time.sleep(0.02)  # a slow moment between the hand-out and the views
        return make_batch(slot, rows)

    monkeypatch.setattr(Slot, "batch", slow_batch)
    loader = BatchSlotLoader(fake_paths(48), fixed, batch_size=4, num_slots=2, num_producers=3)
    seen = []
    for batch in loader:
        check_batch(batch)
        seen.extend(batch["index"].tolist())
    assert sorted(seen) == list(range(48))


# -- rows that fail --------------------------------------------------------------------------------


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def with_age(item):
    return {"audio": torch.full((4,), float(item.index)), "index": item.index, "age": item.fields["age"]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad", [5, 21], ids=["in-a-full-batch", "in-the-last-short-batch"])
def test_a_row_that_does_not_fit_is_reported_and_its_batch_mates_kept(tmp_path, bad):
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"path": f"f{i}.wav", "age": None if i == bad else i}
                                                  for i in range(22)])
    loader = BatchSlotLoader(manifest, with_age, batch_size=4, num_slots=2, num_producers=2, on_error="skip",
                             timeout=30)
    for epoch in range(3):
        loader.set_epoch(epoch)
        seen = []
        for batch in loader:
            for row, index in enumerate(batch["index"].tolist()):
                assert torch.all(batch["audio"][row] == index) and batch["age"][row] == index
            seen.extend(batch["index"].tolist())
        assert sorted(seen) == [i for i in range(22) if i != bad]  # none lost, none twice
        stats = loader.stats()
        assert (stats.yielded, stats.failed, stats.items) == (21, 1, 22)
        [(index, path, message)] = stats.failures
        assert index == bad and path.endswith(f"f{bad}.wav")
        assert "'age' is None (NoneType)" in message and f"f{bad}.wav" in message and "int64" in message


@pytest.mark.parametrize("first, bad, kind", [
    (3, 2.5, "float"), (3, 3.0, "float"), (3, True, "bool"), (3, None, "NoneType"), (3, "7", "str"),
    (3, 2 ** 70, "int"), (3, np.float32(2.0), "float32"), (1.5, True, "bool"), (True, 1, "int"),
    (np.zeros(2, np.int16), np.ones(2), "ndarray of dtype float64"),
])
def test_a_value_of_another_type_is_a_sample_error_naming_key_type_and_file(first, bad, kind):
    # Used to be coerced silently (2.5 -> 2, True -> 1, "7" -> 7) or to fail after its row was claimed.
    def decode(item):
        return {"audio": torch.zeros(4), "value": bad if item.index == 3 else first, "index": item.index}

    with pytest.raises(SampleError, match=r"item_00003\.wav") as info:
        list(BatchSlotLoader(fake_paths(8), decode, batch_size=4, num_producers=1))
    cause = info.value.__cause__
    assert isinstance(cause, SampleError) and cause.path.endswith("item_00003.wav") and cause.index == 3
    assert str(cause).startswith("'value' is ") and f"{kind}" in str(cause) and "item_00003.wav" in str(cause)


def test_values_of_a_kind_the_column_takes_are_converted_exactly():
    def decode(item):
        if item.index == 0:
            return {"f": 1.5, "i": 3, "b": True, "wave": torch.zeros(4), "big": np.zeros(2, np.int64)}
        return {"f": 2, "i": np.int32(5), "b": np.bool_(False), "wave": np.full(4, 0.25), "big": np.int8([1, -2])}

    batches = list(BatchSlotLoader(fake_paths(2), decode, batch_size=2, num_producers=1))
    [batch] = batches
    assert batch["f"].tolist() == [1.5, 2.0] and batch["i"].tolist() == [3, 5] and batch["b"].tolist() == [True, False]
    assert batch["wave"].dtype == torch.float32 and batch["wave"][1].tolist() == [0.25] * 4
    assert batch["big"].tolist() == [[0, 0], [1, -2]]


def test_a_row_write_that_fails_ends_the_epoch_and_leaves_no_stale_row(monkeypatch):
    # NOTE [ Slot rows ]: a claimed row cannot fail to be written; if it does, the epoch ends loudly
    # (whatever on_error says) and the next epoch gets none of that slot's rows.
    class Unwritable:
        def __array__(self, *args, **kwargs):
            raise RuntimeError("injected write failure")

    def failing_convert(sample, fields, item):
        values = convert_row(sample, fields, item)
        if item.index == 5:
            values[0] = Unwritable()  # the 'audio' column
        return values

    monkeypatch.setattr("audiobuffer.loaders.slots.convert", failing_convert)
    loader = BatchSlotLoader(fake_paths(24), fixed, batch_size=4, num_slots=2, num_producers=2, on_error="skip")
    with pytest.raises(AudioBufferError, match=r"item_00005\.wav"):
        for batch in loader:
            check_batch(batch)
    monkeypatch.undo()
    seen = []
    for batch in loader:
        check_batch(batch)
        seen.extend(batch["index"].tolist())
    assert sorted(seen) == list(range(24))


# -- keys and counts like BufferedDataset + pad_collate --------------------------------------------


def test_an_unknown_keyword_names_the_closest_ones():
    with pytest.raises(TypeError, match="BatchSlotLoader got an unexpected keyword argument 'shufle'.*did you mean "
                                        "'shuffle'"):
        BatchSlotLoader(fake_paths(4), IndexDecoder(), batch_size=2, shufle=True)


def test_a_folder_is_listed_with_the_decoders_patterns(tmp_path):
    image = pytest.importorskip("PIL.Image", reason="ImageDecoder needs Pillow")
    for i in range(5):
        image.new("RGB", (6, 4)).save(tmp_path / f"{i}.png")
    loader = BatchSlotLoader(tmp_path, ImageDecoder(size=(4, 4)), batch_size=2, num_producers=1)
    assert len(loader.source) == 5 and len(loader) == 3
    assert sorted(i for batch in loader for i in batch["index"].tolist()) == list(range(5))


def test_batches_have_the_keys_and_lengths_pad_collate_gives(tmp_path):
    make_corpus(tmp_path, 12, seconds=0.1, sample_rate=8000)  # 800 frames each
    decoder = AudioDecoder(8000, crop_seconds=0.15, crop="start")  # padded to 1200 frames
    loader = BatchSlotLoader(tmp_path, decoder, batch_size=5, labels="parent", num_producers=2)
    source = loader.source
    for batch in loader:
        expected = pad_collate([decoder(source.item(i)) for i in batch["index"].tolist()])
        assert set(batch) == set(expected)
        assert batch["lengths"].dtype == torch.int64 and batch["lengths"].tolist() == [800] * len(batch["path"])
        for key in ("lengths", "num_frames", "audio", "label"):
            assert torch.equal(batch[key], expected[key]), key


def test_lengths_without_num_frames_are_the_audio_length():
    batches = list(BatchSlotLoader(fake_paths(10), fixed, batch_size=4, num_producers=2))
    for batch in batches:
        expected = pad_collate([fixed(WorkItem(i, p)) for i, p in zip(batch["index"].tolist(), batch["path"])])
        assert set(batch) == set(expected) and torch.equal(batch["lengths"], expected["lengths"])
        assert batch["lengths"].tolist() == [50] * len(batch["path"])


@pytest.mark.parametrize("drop_last", [False, True])
def test_stats_count_samples_as_buffered_dataset_does(drop_last):
    loader = BatchSlotLoader(fake_paths(103), IndexDecoder(fail={3, 50, 51}), batch_size=10, on_error="skip",
                             num_producers=3, drop_last=drop_last)
    rows = sum(len(b["path"]) for b in loader)
    stats = loader.stats()
    assert stats.done and stats.items == 103 and stats.failed == 3 and stats.yielded == rows
    if drop_last:
        assert rows == 100 and loader.slot_stats.batches == 10
    else:
        assert rows + stats.failed == stats.items and loader.slot_stats.batches == 10
    assert loader.slot_stats.samples == rows


def test_repr_names_source_decoder_and_setup():
    loader = BatchSlotLoader(fake_paths(12), fixed, batch_size=4, num_slots=3, num_producers=2, on_error="skip")
    text = repr(loader)
    assert text.startswith("BatchSlotLoader(a list of 12 paths, <function fixed")
    for part in ("items=12", "batch_size=4", "num_slots=3", "num_producers=2", "on_error='skip'"):
        assert part in text


def test_a_producer_that_outlived_its_epoch_gets_no_row_in_the_next():
    from audiobuffer import Buffer, BufferClosed
    from audiobuffer.engine.pool import Chunk
    from audiobuffer.loaders.slots import SlotStats, SlotWriter

    writer = SlotWriter(2, 2, False, SlotStats())
    buffer = Buffer(4)
    chunk = Chunk(buffer, 1, "audiobuffer-producer-0")
    old = writer.begin_epoch()
    writer.end_epoch()  # its producers joined, but one stuck in a decoder outlived the join
    new = writer.begin_epoch()
    item = WorkItem(index=0, path="late.wav")
    with pytest.raises(BufferClosed):
        old.deliver(0, item, {"x": 1}, chunk)  # the late producer writes through its epoch's port
    new.deliver(0, WorkItem(index=1, path="a.wav"), {"x": 1}, chunk)
    new.deliver(1, WorkItem(index=2, path="b.wav"), {"x": 2}, chunk)
    (seq, slot), = buffer.get_many(timeout=0)
    assert seq == 1 and slot.batch(2)["x"].tolist() == [1, 2]  # no row of the late item
