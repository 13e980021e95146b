import threading
import time

import numpy as np
import pytest
from helpers import (
    JOIN_TIMEOUT,
    IndexDecoder,
    ScriptedTuner,
    fake_paths,
    wait_no_threads,
    wait_until_blocked,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from audiobuffer import (
    AudioBufferError,
    BatchSlotLoader,
    Buffer,
    BufferedDataset,
    SampleError,
    WorkItem,
)
from audiobuffer.engine import pool as _producers
from audiobuffer.engine.pool import BufferPort, Failure, ProducerPool
from audiobuffer.engine.tuner import PoolTuning


def make_item(seq):
    return WorkItem(index=seq, path=f"item{seq}", seq=seq)


def pool_of(count, decode, *, producers=2, capacity=4, ordered=False):
    return ProducerPool(make_item, count, decode, Buffer(capacity), num_producers=producers, ordered=ordered)


@settings(deadline=None, max_examples=25)
@given(count=st.integers(0, 60), producers=st.sampled_from([1, 2, 8]), capacity=st.integers(1, 6),
       ordered=st.booleans(), delays=st.lists(st.sampled_from([0, 0, 0, 0.001, 0.003]), min_size=60, max_size=60))
def test_each_item_once(count, producers, capacity, ordered, delays):
    def decode(item):
        if delays[item.index]:
            time.sleep(delays[item.index])  # simulated decode time
        return item.index

    pool = pool_of(count, decode, producers=producers, capacity=capacity, ordered=ordered)
    pool.start()
    try:
        pairs = list(pool)
    finally:
        pool.close()
    got = [out for _, out in pairs]
    assert all(seq == out for seq, out in pairs)  # each sample comes with its sequence number
    if ordered:
        assert got == list(range(count))
    else:
        assert sorted(got) == list(range(count))
    assert pool.decoded == count
    assert not wait_no_threads()


def test_ordered_slow_first_item_no_deadlock_and_bounded_window():
    capacity = 4
    started = []
    lock = threading.Lock()
    release_first = threading.Event()

    def decode(item):
        with lock:
            started.append(item.index)
        if item.index == 0:
            release_first.wait(JOIN_TIMEOUT)  # item 0 is slow until every other producer is stuck
        return item.index

    pool = pool_of(40, decode, producers=8, capacity=capacity, ordered=True)
    pool.start()
    try:
        # With item 0 stuck, producers may start at most `capacity` items (0..3), however many they are.
        deadline = time.monotonic() + JOIN_TIMEOUT
        while len(started) < capacity and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # give a misbehaving pool the chance to start more
        assert sorted(started) == list(range(capacity))
        release_first.set()
        out = []
        for _, value in pool:
            out.append(value)
            # taken-but-not-yet-yielded never passes the window
            assert len(started) - len(out) <= capacity
        assert out == list(range(40))
    finally:
        release_first.set()
        pool.close()


def test_decoder_exception_becomes_failure_in_place():
    def decode(item):
        if item.index == 3:
            raise ValueError("bad item")
        return item.index

    pool = pool_of(6, decode, ordered=True)
    pool.start()
    try:
        out = [value for _, value in pool]
    finally:
        pool.close()
    assert out[:3] == [0, 1, 2] and out[4:] == [4, 5]
    failure = out[3]
    assert isinstance(failure, Failure)
    assert failure.item.index == 3 and isinstance(failure.exc, ValueError)
    assert failure.producer.startswith("audiobuffer-producer-")


class Crash(BaseException):
    pass


@pytest.mark.parametrize("exc_type", [Crash, SystemExit, KeyboardInterrupt, GeneratorExit])
def test_producer_crash_reaches_consumer_naming_the_item(exc_type):
    def decode(item):
        if item.index == 2:
            raise exc_type("interpreter-level failure")
        return item.index

    pool = pool_of(50, decode, producers=2)
    pool.start()
    with pytest.raises(SampleError, match=rf"producer audiobuffer-producer-\d crashed on item 2 \('item2'\): "
                                          rf"{exc_type.__name__}: interpreter-level failure") as info:
        try:
            list(pool)
        finally:
            pool.close()
    assert isinstance(info.value.__cause__, exc_type)
    assert (info.value.index, info.value.path) == (2, "item2")
    assert info.value.producer.startswith("audiobuffer-producer-")


def test_producer_crash_outside_the_decoder_names_the_producer():
    def make(seq):
        if seq == 3:
            raise Crash("no item")
        return make_item(seq)

    pool = ProducerPool(make, 10, lambda item: item.index, Buffer(4), num_producers=1)
    pool.start()
    with pytest.raises(AudioBufferError, match=r"producer audiobuffer-producer-0 crashed: Crash: no item") as info:
        try:
            list(pool)
        finally:
            pool.close()
    assert not isinstance(info.value, SampleError)


def test_close_with_producers_blocked_on_full_buffer():
    pool = pool_of(1000, lambda item: item.index, producers=4, capacity=2)
    pool.start()
    buffer = pool._buffer
    assert wait_until_blocked(buffer._has_pos, 4)  # everyone is blocked in put()
    pool.close()
    pool.close()  # idempotent
    assert not any(t.is_alive() for t in pool.threads)
    assert pool.stopped


def test_close_from_another_thread_ends_the_consumer():
    gate = threading.Event()

    def decode(item):
        gate.wait(JOIN_TIMEOUT)
        return item.index

    pool = pool_of(10, decode, producers=2)
    pool.start()
    closer = threading.Timer(0.05, pool.close)
    closer.start()
    out = list(pool)  # blocked in get() until close() wakes it
    gate.set()
    closer.join(JOIN_TIMEOUT)
    assert out == [] and pool.stopped


def test_start_once():
    pool = pool_of(1, lambda item: 0)
    pool.start()
    with pytest.raises(RuntimeError):
        pool.start()
    list(pool)
    pool.close()


# -- a failed start --------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_thread_that_cannot_start_stops_those_already_started(monkeypatch):
    real_start = threading.Thread.start
    started = []

    def start(thread):
        if thread.name.startswith("audiobuffer-producer-"):
            if len(started) == 3:
                raise RuntimeError("can't start new thread")
            started.append(thread)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    pool = pool_of(1000, lambda item: item.index, producers=8, capacity=2)  # the started ones block in put()
    with pytest.raises(RuntimeError, match="can't start new thread"):
        pool.start()
    assert len(started) == 3
    assert not any(t.is_alive() for t in started)  # stopped and joined before start() raised
    assert pool.stopped


# -- ordered mode with a byte bound ----------------------------------------------------------------

@pytest.mark.timeout(60)
def test_ordered_byte_bound_counts_the_items_waiting_for_their_turn():
    size, producers, count = 1000, 4, 200
    max_bytes = 4 * size
    lock = threading.Lock()
    live = [0, 0]  # items decoded and not yet consumed, and the most there were
    while_stuck = []

    def decode(item):
        if item.index == 0:
            # Stay slow until every other producer waits (for its turn or for room), then count.
            wait_until_blocked(pool._feed.turn, producers - 1)
            while_stuck.append(live[0])
        out = np.zeros(size, np.uint8)
        with lock:
            live[0] += 1
            live[1] = max(live[1], live[0])
        return out

    pool = ProducerPool(make_item, count, decode, Buffer(64, max_bytes=max_bytes), num_producers=producers,
                        ordered=True)
    pool.start()
    got = []
    try:
        for seq, _out in pool:
            got.append(seq)
            with lock:
                live[0] -= 1
    finally:
        pool.close()
    assert got == list(range(count))
    # Admitted: at most max_bytes, plus the next item in order; in hand: one item per producer.
    bound = max_bytes // size + 1 + producers
    assert while_stuck[0] <= bound, f"{while_stuck[0]} items held behind the slow first one"
    assert live[1] <= bound


@settings(deadline=None, max_examples=25)
@given(count=st.integers(0, 40), producers=st.integers(1, 4), capacity=st.integers(1, 16),
       max_units=st.integers(1, 6), sizes=st.lists(st.integers(0, 4), min_size=40, max_size=40),
       slow=st.sets(st.integers(0, 39), max_size=3))
def test_ordered_byte_bound_yields_each_item_once_in_order_and_holds(count, producers, capacity, max_units,
                                                                     sizes, slow):
    unit = 100
    lock = threading.Lock()
    live = [0, 0]  # payload bytes decoded and not yet consumed, and the most there were

    def decode(item):
        if item.index in slow:
            time.sleep(0.005)  # simulated decode time of a slow file
        out = np.zeros(sizes[item.index] * unit, np.uint8)
        with lock:
            live[0] += out.nbytes
            live[1] = max(live[1], live[0])
        return out

    pool = ProducerPool(make_item, count, decode, Buffer(capacity, max_bytes=max_units * unit),
                        num_producers=producers, ordered=True)
    pool.start()
    got = []
    try:
        for seq, out in pool:
            assert out.nbytes == sizes[seq] * unit
            got.append(seq)
            with lock:
                live[0] -= out.nbytes
    finally:
        pool.close()
    assert got == list(range(count))
    largest = max(sizes[:count], default=0) * unit
    assert live[1] <= max_units * unit + largest + producers * largest
    assert not wait_no_threads()


# -- validation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    ({"num_producers": 0}, ValueError, "num_producers must be an integer >= 1 or 'auto', got 0"),
    ({"count": -1}, ValueError, "count must be an integer >= 0"),
    ({"chunk_items": 0}, ValueError, "chunk_items"),
    ({"timeout": float("nan")}, ValueError, "timeout must be None or a number of seconds > 0"),
    ({"warn_after": -1.0}, ValueError, "warn_after"),
    ({"timeout": "10"}, TypeError, "timeout"),
    ({"buffer": object()}, TypeError, "buffer must be a Buffer"),
])
def test_pool_validation(kwargs, error, message):
    args = {"make_item": make_item, "count": 3, "decode": lambda item: 0, "buffer": Buffer(2), "num_producers": 1}
    args.update(kwargs)
    with pytest.raises(error, match=message):
        ProducerPool(**args)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [False, True])
def test_infinite_and_huge_waits_mean_no_limit(ordered):
    def decode(item):
        if item.index == 0:
            time.sleep(0.05)  # the consumer waits for the first item
        return item.index

    pool = ProducerPool(make_item, 10, decode, Buffer(2), num_producers=2, ordered=ordered,
                        timeout=float("inf"), warn_after=1e12)
    pool.start()
    try:
        got = sorted(out for _, out in pool)
    finally:
        pool.close()
    assert got == list(range(10))


# -- a changing count: num_producers="auto" --------------------------------------------------------

def auto_pool(count, decode, script, *, capacity=4, ordered=False, max_bytes=None, **kwargs):
    return ProducerPool(make_item, count, decode, Buffer(capacity, max_bytes=max_bytes), num_producers="auto",
                        ordered=ordered, tuner=ScriptedTuner(script), **kwargs)


def drain(pool):
    """Every pair of the pool; a watchdog stops a pool that hangs, so a hang fails instead."""
    fired = []
    watchdog = threading.Timer(3 * JOIN_TIMEOUT, lambda: (fired.append(True), pool.stop()))
    watchdog.name = "test-watchdog"
    watchdog.start()
    pool.start()
    try:
        pairs = list(pool)
        assert not fired, "the pool hung: the watchdog stopped it"
        return pairs
    finally:
        watchdog.cancel()
        watchdog.join(JOIN_TIMEOUT)
        pool.close()


@pytest.mark.timeout(120)
@settings(deadline=None, max_examples=40)
@given(count=st.integers(0, 80), script=st.lists(st.integers(0, 3), min_size=1, max_size=12),
       capacity=st.integers(1, 6), ordered=st.booleans(), bound=st.booleans(),
       delays=st.lists(st.sampled_from([0, 0, 0, 0.001]), min_size=80, max_size=80))
def test_each_item_once_while_the_count_changes(count, script, capacity, ordered, bound, delays):
    def decode(item):
        if delays[item.index]:
            time.sleep(delays[item.index])  # simulated decode time
        return np.full(1 + item.index % 3, item.index, np.int64)

    # A byte bound of two small items: ordered pools also hold items back for their bytes.
    pool = auto_pool(count, decode, script, capacity=capacity, ordered=ordered, max_bytes=16 if bound else None)
    pairs = drain(pool)
    got = [int(out[0]) for _, out in pairs]
    assert all(seq == int(out[0]) for seq, out in pairs)
    assert got == list(range(count)) if ordered else sorted(got) == list(range(count))
    assert pool.decoded == count
    assert not wait_no_threads()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [False, True])
def test_added_producers_start_and_every_one_ends(ordered):
    pool = auto_pool(120, lambda item: item.index, [1, 3], ordered=ordered, capacity=8)
    got = [out for _, out in drain(pool)]
    assert sorted(got) == list(range(120))
    assert [t.name for t in pool.threads] == [f"audiobuffer-producer-{i}" for i in range(3)]
    assert pool.num_producers == 3 and [c for _, c, _ in pool.history] == [1, 3]
    assert not any(t.is_alive() for t in pool.threads)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [False, True])
def test_retired_producers_exit_at_an_item_boundary_while_the_epoch_runs(ordered):
    first, second = threading.Event(), threading.Event()

    def decode(item):
        if 1 <= item.index < 50:
            first.wait(JOIN_TIMEOUT)  # held until the pool wants one producer
        elif item.index >= 50:
            second.wait(JOIN_TIMEOUT)  # held until the test has looked at the retired threads
        return item.index

    def release_when_one():
        deadline = time.monotonic() + JOIN_TIMEOUT
        while pool.num_producers != 1 and time.monotonic() < deadline:
            time.sleep(0.001)  # the consumer sets the count after it takes item 0
        first.set()

    # Chunks of one: a producer holding item 0 in its chunk while it waits on item 3 would hold it back.
    pool = auto_pool(100, decode, [3, 1], ordered=ordered, capacity=64, chunk_items=1)
    releaser = threading.Thread(target=release_when_one, name="test-releaser")
    pool.start()
    releaser.start()
    got = []
    try:
        for _, out in pool:
            got.append(out)
            if len(got) == 50:  # items 50.. are held: the epoch is still running
                retired = [p for p in pool._producers if p.retired]
                assert len(retired) == 2
                for p in retired:
                    p.thread.join(JOIN_TIMEOUT)
                assert not any(p.thread.is_alive() for p in retired)
                assert sum(p.thread.is_alive() for p in pool._producers) == 1
                second.set()
    finally:
        first.set()
        second.set()
        pool.close()
        releaser.join(JOIN_TIMEOUT)
    assert sorted(got) == list(range(100)) and (got == sorted(got) or not ordered)
    assert pool.num_producers == 1 and len(pool.threads) == 3


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [False, True])
def test_count_zero_decodes_in_the_consumers_thread(ordered):
    where = set()

    def decode(item):
        where.add(threading.current_thread().name)
        if item.index == 5:
            raise ValueError("bad item")
        return item.index

    pool = auto_pool(40, decode, [0], ordered=ordered)
    pairs = drain(pool)
    assert where == {threading.current_thread().name} and pool.threads == []
    assert [seq for seq, _ in pairs] == list(range(40))  # inline: in order even when unordered
    failure = pairs[5][1]
    assert isinstance(failure, Failure) and failure.producer == "audiobuffer-producer-inline"
    assert pool.decoded == 40 and pool.num_producers == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [False, True])
def test_inline_after_producers_drains_what_they_left(ordered):
    # Producers first, then inline, then producers again: nothing lost, nothing twice.
    where = []
    lock = threading.Lock()

    def decode(item):
        time.sleep(0.0005)  # simulated decode time, so that producers have items in hand
        with lock:
            where.append(threading.current_thread().name)
        return item.index

    pool = auto_pool(200, decode, [2, 2, 0, 0, 0, 0, 0, 0, 2, 2, 0], ordered=ordered, capacity=8)
    got = [out for _, out in drain(pool)]
    assert sorted(got) == list(range(200)) and (got == list(range(200)) or not ordered)
    assert threading.current_thread().name in where  # some decoded inline ...
    assert any(name.startswith("audiobuffer-producer-") for name in where)  # ... some by producers
    assert not wait_no_threads()


class DueEvery(ScriptedTuner):
    """A scripted tuner that is due once it has been asked ``every`` times since it last observed (as a
    clock's interval passes: it stays due until it observes)."""

    def __init__(self, counts, every):
        super().__init__(counts)
        self.every, self.asked = every, 0

    def due(self, now):
        self.asked += 1
        return self.asked >= self.every

    def observe(self, sample):
        self.asked = 0
        return super().observe(sample)


@pytest.mark.parametrize("every, observations, checks", [(1, 31, 30), (10, 4, 3), (1000, 1, 1)])
def test_inline_decoding_asks_the_tuner_only_when_it_is_due(every, observations, checks, monkeypatch):
    # Inline, the consumer decodes item after item, asking only whether the tuner is due (one question
    # per item), and lets it look (check) only then; every item still comes once.
    calls = []
    check = PoolTuning.check
    monkeypatch.setattr(PoolTuning, "check", lambda self: (calls.append(1), check(self))[1])
    tuner = DueEvery([0], every)
    pool = ProducerPool(make_item, 30, lambda item: item.index, Buffer(4), num_producers="auto", tuner=tuner)
    assert sorted(out for _, out in drain(pool)) == list(range(30))
    assert pool.threads == [] and tuner.observed == observations and len(calls) == checks


def test_inline_crash_names_the_item_and_keyboard_interrupt_stays():
    def decode(item):
        if item.index == 2:
            raise SystemExit("interpreter-level failure")
        return item.index

    with pytest.raises(SampleError, match=r"decoding inline crashed on item 2 \('item2'\): SystemExit") as info:
        drain(auto_pool(5, decode, [0]))
    assert isinstance(info.value.__cause__, SystemExit)

    def interrupted(item):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        drain(auto_pool(5, interrupted, [0]))


class EveryOther(BufferPort):
    """An output port (NOTE [ Output port ]) that puts every other item and keeps the rest."""

    in_place = False

    def deliver(self, seq, item, out, chunk):
        if item.index % 2 == 0:
            chunk.put((seq, out))


class Refusing(BufferPort):
    """An output port that refuses item 3 with an Exception and crashes on item 5 (NOTE [ Output port ])."""

    def __init__(self, crash=False):
        self.crash = crash

    def deliver(self, seq, item, out, chunk):
        if item.index == 3:
            raise ValueError("does not fit")
        if item.index == 5 and self.crash:
            raise Crash("port crash")
        chunk.put((seq, out))


@pytest.mark.parametrize("ordered", [False, True])
def test_an_output_the_port_refuses_is_the_items_failure_in_its_place(ordered):
    pool = ProducerPool(make_item, 8, lambda item: item.index, Buffer(4), num_producers=2, ordered=ordered,
                        port=Refusing())
    pairs = drain(pool)
    assert sorted(seq for seq, _ in pairs) == list(range(8))
    failed = {seq: out for seq, out in pairs if isinstance(out, Failure)}
    assert list(failed) == [3] and isinstance(failed[3].exc, ValueError)
    assert failed[3].item.index == 3 and failed[3].producer.startswith("audiobuffer-producer-")
    if ordered:
        assert [seq for seq, _ in pairs] == list(range(8))


def test_a_port_crash_reaches_the_consumer_naming_the_item():
    pool = ProducerPool(make_item, 8, lambda item: item.index, Buffer(4), num_producers=2,
                        port=Refusing(crash=True))
    pool.start()
    with pytest.raises(SampleError, match=r"crashed on item 5 \('item5'\): Crash: port crash"):
        try:
            list(pool)
        finally:
            pool.close()


@pytest.mark.parametrize("kwargs", [{"port": EveryOther()}, {"timeout": 30.0}])
def test_no_inline_for_a_port_that_is_not_in_place_or_under_a_timeout(kwargs):
    pool = auto_pool(20, lambda item: item.index, [0], **kwargs)
    got = sorted(out for _, out in drain(pool))
    assert got == (list(range(0, 20, 2)) if "port" in kwargs else list(range(20)))
    assert pool.num_producers == 1 and len(pool.threads) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [False, True])
def test_producers_asked_for_after_the_last_item_went_inline(ordered):
    # The consumer took the last item inline, then the count rose: no producer starts (nothing is
    # left to take), so the pool itself must end the epoch.
    pool = auto_pool(3, lambda item: item.index, [0, 0, 0, 2], ordered=ordered)
    assert [out for _, out in drain(pool)] == [0, 1, 2]
    assert pool.threads == [] and pool.num_producers == 2


def test_an_empty_epoch_ends_at_once_pinned_or_auto():
    for num_producers in (2, "auto"):
        pool = ProducerPool(make_item, 0, lambda item: 0, Buffer(2), num_producers=num_producers)
        assert drain(pool) == []


def test_a_pinned_count_pins():
    pool = pool_of(200, lambda item: item.index, producers=2, capacity=4)
    assert sorted(out for _, out in drain(pool)) == list(range(200))
    assert len(pool.threads) == 2 and pool.num_producers == 2 and pool.history == [(0.0, 2, "pinned")]


@pytest.mark.timeout(60)
def test_the_real_tuner_keeps_every_item_once():
    def decode(item):
        time.sleep(0.0002)  # simulated decode time that releases the GIL
        return item.index

    pool = ProducerPool(make_item, 3000, decode, Buffer(16), num_producers="auto")
    assert sorted(out for _, out in drain(pool)) == list(range(3000))
    history = pool.history
    assert history[0] == (0.0, 0, "start") and all(0 <= count <= 2 ** 10 for _, count, _ in history)
    assert not wait_no_threads()


# -- "auto" through the loaders ----------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("ordered", [False, True])
def test_buffered_dataset_defaults_to_auto_and_yields_each_item_once(monkeypatch, ordered):
    script = [0, 2, 0, 1, 3, 0, 2, 1, 0]
    monkeypatch.setattr(_producers, "default_tuner",
                        lambda most, allow_inline, memory, start: ScriptedTuner(script))
    ds = BufferedDataset(fake_paths(300), IndexDecoder(), ordered=ordered, buffer_size=8)
    assert ds.num_producers == "auto" and "num_producers='auto'" in repr(ds)
    got = [s["index"] for s in ds]
    assert got == list(range(300)) if ordered else sorted(got) == list(range(300))
    stats = ds.stats()
    assert stats.done and stats.yielded == 300
    assert [c for _, c, _ in stats.producer_history] == [0, 2, 0, 1, 3, 0, 2, 1, 0]
    assert stats.num_producers == 0 and stats.gil_enabled in (True, False)


@pytest.mark.timeout(120)
def test_each_epoch_of_a_dataset_starts_where_the_last_one_settled():
    index = IndexDecoder()

    def decode(item):
        time.sleep(0.0002)  # long enough an epoch for the tuner to judge intervals (it leaves short ones alone)
        return index(item)

    ds = BufferedDataset(fake_paths(1000), decode, buffer_size=16)
    settled = None
    for epoch in range(3):
        ds.set_epoch(epoch)
        assert sorted(s["index"] for s in ds) == list(range(1000))
        history = ds.stats().producer_history
        if epoch == 0:
            assert history[0][1:] == (0, "start")
        else:
            assert history[0][1] == settled and history[0][2].startswith("start where the last epoch settled")
        settled = ds.pipeline.memory.count
        assert settled is not None and 0 <= settled <= 2 ** 10
    assert not wait_no_threads()


def test_batch_slot_loader_with_auto_never_decodes_inline(monkeypatch):
    monkeypatch.setattr(_producers, "default_tuner",
                        lambda most, allow_inline, memory, start: ScriptedTuner([0, 2, 0]))
    where = set()
    index = IndexDecoder()

    def decode(item):
        where.add(threading.current_thread().name)
        return index(item)

    loader = BatchSlotLoader(fake_paths(64), decode, batch_size=8, num_slots=3)
    rows = [int(i) for batch in loader for i in batch["index"]]
    assert sorted(rows) == list(range(64))
    assert threading.current_thread().name not in where  # the slot writer runs in producers only
    assert loader.stats().num_producers == 1  # the tuner's 0 means 1 here


class GilFreeDecoder(IndexDecoder):
    """A decoder that says its work runs outside the GIL, as ImageDecoder does."""

    releases_gil = True


@pytest.mark.parametrize("decoder, transform, start", [
    (GilFreeDecoder(), None, 2),  # the most producers of a 2-core machine, no climb from inline
    (GilFreeDecoder(), lambda sample: sample, 0),  # a transform may hold the GIL: inline first
    (IndexDecoder(), None, 0),
])
def test_a_decoder_outside_the_gil_starts_at_the_most_producers(monkeypatch, decoder, transform,
                                                                 start):
    monkeypatch.setattr(_producers, "usable_cores", lambda: 2)
    ds = BufferedDataset(fake_paths(40), decoder, transform=transform)
    assert sorted(s["index"] for s in ds) == list(range(40))
    assert ds.stats().producer_history[0][1:] == (start, "start")
    assert not wait_no_threads()


def test_a_pinned_count_through_the_dataset():
    ds = BufferedDataset(fake_paths(50), IndexDecoder(), num_producers=3)
    assert sorted(s["index"] for s in ds) == list(range(50))
    stats = ds.stats()
    assert stats.num_producers == 3 and stats.producer_history == [(0.0, 3, "pinned")]


# -- free-threaded readiness -----------------------------------------------------------------------

class StaleView(Buffer):
    """A buffer whose unlocked reads are stale, as they may be without the GIL: closed, and empty."""

    def __len__(self):
        return 0

    @property
    def closed(self):
        return True


def test_stop_ends_the_consumer_whatever_unlocked_reads_of_the_buffer_say():
    buffer = StaleView(16)
    pool = ProducerPool(make_item, 10, lambda item: item.index, buffer, num_producers=1, ordered=True)
    pool.start()
    try:
        for thread in pool.threads:
            thread.join(JOIN_TIMEOUT)  # all ten items are in the buffer, which the producer closed
        pool.stop()
        assert list(pool) == []  # stopped: nothing more is handed out, in order or not
    finally:
        pool.close()
