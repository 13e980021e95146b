import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audiobuffer import AudioBufferError, Buffer, WorkItem
from audiobuffer._producers import Failure, ProducerPool
from helpers import JOIN_TIMEOUT, wait_no_threads


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


def test_producer_crash_reaches_consumer():
    def decode(item):
        if item.index == 2:
            raise Crash("interpreter-level failure")
        return item.index

    pool = pool_of(50, decode, producers=2)
    pool.start()
    with pytest.raises(AudioBufferError, match=r"producer audiobuffer-producer-\d crashed: Crash") as info:
        try:
            list(pool)
        finally:
            pool.close()
    assert isinstance(info.value.__cause__, Crash)


def test_close_with_producers_blocked_on_full_buffer():
    pool = pool_of(1000, lambda item: item.index, producers=4, capacity=2)
    pool.start()
    buffer = pool._buffer
    deadline = time.monotonic() + JOIN_TIMEOUT
    while len(buffer._has_pos._waiters) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(buffer._has_pos._waiters) == 4  # everyone is blocked in put()
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
