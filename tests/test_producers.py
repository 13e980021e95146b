import threading
import time

import numpy as np
import pytest
from helpers import JOIN_TIMEOUT, wait_no_threads, wait_until_blocked
from hypothesis import given, settings
from hypothesis import strategies as st

from audiobuffer import AudioBufferError, Buffer, SampleError, WorkItem
from audiobuffer._producers import Failure, ProducerPool


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


# -- a failed start (issue 9, item 7) ------------------------------------------------------------

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


# -- ordered mode with a byte bound (issue 9, item 6) ---------------------------------------------

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


# -- validation (issue 9, item 8) -----------------------------------------------------------------

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
