import threading
import time

import numpy as np
import pytest
from helpers import JOIN_TIMEOUT, wait_until_blocked
from hypothesis import given, settings
from hypothesis import strategies as st

from audiobuffer import Buffer, BufferClosed, payload_nbytes
from audiobuffer.buffer import WAIT_SLICE


def run_thread(target, *args):
    """Start ``target`` in a thread; return (thread, result dict with 'value' or 'error')."""
    result = {}

    def body():
        try:
            result["value"] = target(*args)
        except BaseException as exc:  # recorded for the test to check
            result["error"] = exc

    thread = threading.Thread(target=body, name="test-helper", daemon=True)  # a failed test must not hang exit
    thread.start()
    return thread, result


def finish(thread):
    thread.join(JOIN_TIMEOUT)
    assert not thread.is_alive()


def test_fifo_and_none_items():
    buf = Buffer(4)
    for item in [1, None, "x", None]:
        buf.put(item)
    assert len(buf) == 4
    assert [buf.get() for _ in range(4)] == [1, None, "x", None]


def test_get_blocks_until_put():
    buf = Buffer(1)
    thread, result = run_thread(buf.get)
    assert wait_until_blocked(buf._has_data)
    assert "value" not in result
    buf.put("item")
    finish(thread)
    assert result == {"value": "item"}
    assert buf.stats.get_wait_s > 0


def test_put_blocks_until_get():
    buf = Buffer(1)
    buf.put("a")
    thread, result = run_thread(buf.put, "b")
    assert wait_until_blocked(buf._has_pos)
    assert len(buf) == 1
    assert buf.get() == "a"
    finish(thread)
    assert "error" not in result
    assert buf.get() == "b"
    assert buf.stats.put_wait_s > 0


@pytest.mark.parametrize("timeout", [0, 0.05])
def test_get_timeout(timeout):
    buf = Buffer(1)
    with pytest.raises(TimeoutError):
        buf.get(timeout=timeout)
    assert buf.stats.get_wait_s >= timeout


def test_put_timeout():
    buf = Buffer(1)
    buf.put(1)
    with pytest.raises(TimeoutError):
        buf.put(2, timeout=0.05)
    assert buf.stats.put_wait_s >= 0.05
    assert list(buf._items) == [1]


def test_negative_timeout_rejected():
    buf = Buffer(1)
    with pytest.raises(ValueError, match="timeout"):
        buf.get(timeout=-1)


@pytest.mark.parametrize("timeout", [float("nan"), -0.5])
def test_nan_and_negative_timeouts_rejected(timeout):
    buf = Buffer(1)
    with pytest.raises(ValueError, match="timeout must be None or a number of seconds >= 0"):
        buf.get(timeout=timeout)
    buf.put(1)
    with pytest.raises(ValueError, match="timeout"):
        buf.put(2, timeout=timeout)


@pytest.mark.parametrize("timeout", [float("nan"), -0.5])
@pytest.mark.parametrize("max_bytes", [None, 10])
def test_bad_timeouts_rejected_up_front_even_when_no_wait_is_needed(timeout, max_bytes):
    buf = Buffer(4, max_bytes=max_bytes)
    message = "timeout must be None or a number of seconds >= 0"
    with pytest.raises(ValueError, match=message):
        buf.put(b"a", timeout=timeout)  # there is room
    with pytest.raises(ValueError, match=message):
        buf.put_many([b"a"], timeout=timeout)
    assert len(buf) == 0  # nothing placed
    buf.put(b"a")
    with pytest.raises(ValueError, match=message):
        buf.get(timeout=timeout)  # there is an item
    with pytest.raises(ValueError, match=message):
        buf.get_many(timeout=timeout)
    assert len(buf) == 1  # nothing taken


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", [float("inf"), 1e12, 1e300])
@pytest.mark.parametrize("max_bytes", [None, 10])
def test_infinite_and_huge_timeouts_wait_as_long_as_it_takes(timeout, max_bytes):
    # Condition.wait(1e12) raises OverflowError: such a timeout must just mean "no limit".
    buf = Buffer(1, max_bytes=max_bytes)
    getter, got = run_thread(buf.get, timeout)
    assert wait_until_blocked(buf._has_data)
    buf.put("a")
    finish(getter)
    assert got == {"value": "a"}
    buf.put("b")
    putter, put = run_thread(buf.put, "c", timeout)
    assert wait_until_blocked(buf._has_pos)
    many, took = run_thread(buf.get_many, None, timeout)
    finish(many)
    finish(putter)
    assert took == {"value": ["b"]} and put == {"value": None}
    assert buf.get(timeout=timeout) == "c"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", [None, float("inf"), 60.0])
def test_waits_wake_in_slices_so_ctrl_c_can_break_them(timeout):
    # NOTE [ Interruptible waits ]: on Windows before 3.14 an untimed lock acquire cannot be interrupted,
    # so no wait may be longer than WAIT_SLICE, whatever the caller's timeout.
    buf = Buffer(1)
    seen = []
    for cond in (buf._has_data, buf._has_pos):
        def wait(t=None, real=cond.wait):
            seen.append(t)
            return real(t)

        cond.wait = wait

    def blocks_then_ends(blocked, unblock):
        seen.clear()
        thread, result = run_thread(blocked)
        deadline = time.monotonic() + JOIN_TIMEOUT
        while len(seen) < 3 and time.monotonic() < deadline:  # it woke and waited again, twice
            time.sleep(0.01)
        unblock()
        finish(thread)
        assert "error" not in result
        assert len(seen) >= 3
        assert all(t is not None and t <= WAIT_SLICE for t in seen), seen

    blocks_then_ends(lambda: buf.get(timeout), lambda: buf.put("a"))  # a consumer waiting for an item
    buf.put("b")
    blocks_then_ends(lambda: buf.put("c", timeout), buf.get)  # a producer waiting for room


def test_repr():
    buf = Buffer(4)
    buf.put(1)
    assert repr(buf) == "Buffer(capacity=4, max_bytes=None, items=1, state='open')"
    bounded = Buffer(2, max_bytes=100)
    bounded.put(np.zeros(10, dtype=np.uint8))
    bounded.close()
    assert repr(bounded) == "Buffer(capacity=2, max_bytes=100, items=1, nbytes=10, state='closed')"
    bounded.abort(RuntimeError("stop"))
    assert repr(bounded) == "Buffer(capacity=2, max_bytes=100, items=0, nbytes=0, state='aborted')"


def test_close_drains_then_raises():
    buf = Buffer(3)
    buf.put(1)
    buf.put(2)
    buf.close()
    buf.close()  # idempotent
    with pytest.raises(BufferClosed):
        buf.put(3)
    assert buf.get() == 1
    assert list(buf) == [2]
    with pytest.raises(BufferClosed):
        buf.get()


def test_close_wakes_blocked_consumers_and_producers():
    empty = Buffer(1)
    getters = [run_thread(empty.get) for _ in range(3)]
    assert wait_until_blocked(empty._has_data, 3)
    full = Buffer(1)
    full.put(0)
    putters = [run_thread(full.put, i) for i in range(3)]
    assert wait_until_blocked(full._has_pos, 3)
    empty.close()
    full.close()
    for thread, result in getters + putters:
        finish(thread)
        assert isinstance(result["error"], BufferClosed)


def test_abort_wakes_everyone_and_drops_items():
    buf = Buffer(1)
    buf.put("kept?")
    putter, put_result = run_thread(buf.put, "blocked")
    assert wait_until_blocked(buf._has_pos)
    empty = Buffer(1)
    getter, get_result = run_thread(empty.get)
    assert wait_until_blocked(empty._has_data)
    error = RuntimeError("producer failed")
    buf.abort(error)
    empty.abort(error)
    finish(putter)
    finish(getter)
    assert isinstance(put_result["error"], BufferClosed)
    assert put_result["error"].__cause__ is error
    assert get_result["error"] is error
    assert len(buf) == 0
    with pytest.raises(RuntimeError, match="producer failed"):
        buf.get()  # the dropped item is not handed out
    buf.abort(ValueError("second"))
    with pytest.raises(RuntimeError, match="producer failed"):
        buf.get()  # the first abort's error is kept


def test_abort_needs_an_exception():
    with pytest.raises(TypeError, match=r"abort\(\) needs an exception instance, got 'oops'"):
        Buffer(1).abort("oops")


def test_byte_bound_blocks_and_admits_oversized_item_when_empty():
    buf = Buffer(10, max_bytes=100)
    buf.put(np.zeros(12, dtype=np.float32))  # 48 bytes
    buf.put(np.zeros(12, dtype=np.float32))  # 96 bytes
    with pytest.raises(TimeoutError):
        buf.put(np.zeros(2, dtype=np.float32), timeout=0.02)  # 104 > 100
    assert buf.nbytes == 96
    buf.get()
    buf.put(np.zeros(2, dtype=np.float32))
    assert buf.nbytes == 56
    buf.get()
    buf.get()
    big = np.zeros(1000, dtype=np.uint8)
    buf.put(big)  # alone it may exceed the bound, or it would wait forever
    with pytest.raises(TimeoutError):
        buf.put(np.zeros(1, dtype=np.uint8), timeout=0.02)
    assert buf.get() is big
    assert buf.stats.peak_bytes == 1000


def test_byte_bound_get_wakes_every_producer_that_now_fits():
    # One get frees room for both waiting items (60 + 30 <= 100): both puts must complete. With
    # notify() instead of notify_all(), one producer would stay asleep although its item fits.
    buf = Buffer(10, max_bytes=100)
    buf.put(np.zeros(100, dtype=np.uint8))
    first, first_result = run_thread(buf.put, np.zeros(60, dtype=np.uint8))
    assert wait_until_blocked(buf._has_pos, 1)
    second, second_result = run_thread(buf.put, np.zeros(30, dtype=np.uint8))
    assert wait_until_blocked(buf._has_pos, 2)
    buf.get()
    finish(first)
    finish(second)
    assert "error" not in first_result and "error" not in second_result
    assert buf.nbytes == 90 and len(buf) == 2


def test_payload_nbytes_counts_numpy_torch_and_containers():
    import torch  # the one test of this module that needs it

    sample = {"audio": torch.zeros(10, dtype=torch.float32), "spec": np.zeros((2, 3), dtype=np.float64),
              "raw": b"abcd", "meta": ["x", 3, (np.zeros(1, dtype=np.int16),)]}
    assert payload_nbytes(sample) == 40 + 48 + 4 + 2


def test_stats():
    buf = Buffer(4)
    for i in range(3):
        buf.put(i)
    buf.get()  # sees 3 items
    buf.get()  # sees 2
    stats = buf.stats
    assert (stats.capacity, stats.puts, stats.gets, stats.peak_fill) == (4, 3, 2, 3)
    assert stats.mean_fill == pytest.approx(2.5)
    assert stats.as_dict()["puts"] == 3


@pytest.mark.parametrize("capacity, error", [(0, ValueError), (-1, ValueError), ("8", TypeError),
                                             (True, TypeError), (2.0, TypeError)])
def test_capacity_validation(capacity, error):
    with pytest.raises(error, match="capacity must be an integer >= 1"):
        Buffer(capacity)


@pytest.mark.parametrize("max_bytes, error", [(0, ValueError), ("1MB", TypeError)])
def test_max_bytes_validation(max_bytes, error):
    with pytest.raises(error, match=r"^max_bytes must be an integer >= 1 or None, got (0|'1MB')$"):
        Buffer(1, max_bytes=max_bytes)


@settings(deadline=None, max_examples=30)
@given(producers=st.integers(1, 4), consumers=st.integers(1, 3), capacity=st.integers(1, 8),
       items=st.integers(0, 300))
def test_many_producers_and_consumers_move_each_item_once(producers, consumers, capacity, items):
    buf = Buffer(capacity)
    received = [[] for _ in range(consumers)]
    peak = []

    def produce(p):
        for i in range(p, items, producers):
            buf.put(i)
            peak.append(len(buf))

    def consume(c):
        for item in buf:
            received[c].append(item)

    workers = [threading.Thread(target=produce, args=(p,), daemon=True) for p in range(producers)]
    readers = [threading.Thread(target=consume, args=(c,), daemon=True) for c in range(consumers)]
    for t in workers + readers:
        t.start()
    for t in workers:
        finish(t)
    buf.close()
    for t in readers:
        finish(t)
    got = sorted(x for r in received for x in r)
    assert got == list(range(items))
    assert buf.stats.peak_fill <= capacity
    assert max(peak, default=0) <= capacity


def test_get_many_takes_everything_ready_in_order():
    buf = Buffer(8)
    for i in range(5):
        buf.put(i)
    assert buf.get_many(max_items=2) == [0, 1]
    assert buf.get_many() == [2, 3, 4]
    buf.put(None)
    buf.close()
    assert buf.get_many() == [None]
    with pytest.raises(BufferClosed):
        buf.get_many()
    stats = buf.stats
    assert (stats.gets, stats.puts) == (6, 6)


def test_get_many_waits_and_wakes_every_producer_it_made_room_for():
    buf = Buffer(2)
    buf.put("a")
    buf.put("b")
    putters = [run_thread(buf.put, x) for x in "cd"]
    assert wait_until_blocked(buf._has_pos, 2)
    assert buf.get_many() == ["a", "b"]
    for thread, result in putters:
        finish(thread)
        assert "error" not in result
    assert sorted(buf.get_many()) == ["c", "d"]
    with pytest.raises(TimeoutError):
        buf.get_many(timeout=0.01)
    getter, result = run_thread(buf.get_many)
    assert wait_until_blocked(buf._has_data)
    buf.abort(RuntimeError("stop"))
    finish(getter)
    assert isinstance(result["error"], RuntimeError)


def test_get_many_with_byte_bound():
    buf = Buffer(4, max_bytes=100)
    buf.put(np.zeros(60, dtype=np.uint8))
    buf.put(np.zeros(40, dtype=np.uint8))
    assert len(buf.get_many()) == 2 and buf.nbytes == 0
    with pytest.raises(ValueError, match="max_items"):
        buf.get_many(max_items=0)


# -- Buffer as a state machine against a model ---------------------------------------------------------

from collections import deque  # noqa: E402

from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402


class BufferModel(RuleBasedStateMachine):
    """Single-threaded, every wait with timeout=0: each step's outcome is determined, so the Buffer
    must match a plain model (a deque, a closed flag, an abort error) step by step."""

    def __init__(self):
        super().__init__()
        self.capacity = 3
        self.buf = Buffer(self.capacity)
        self.items = deque()
        self.closed = False
        self.error = None
        self.puts = self.gets = 0

    @rule(item=st.one_of(st.none(), st.integers()))
    def put(self, item):
        if self.closed:
            with pytest.raises(BufferClosed):
                self.buf.put(item, timeout=0)
        elif len(self.items) >= self.capacity:
            with pytest.raises(TimeoutError):
                self.buf.put(item, timeout=0)
        else:
            self.buf.put(item, timeout=0)
            self.items.append(item)
            self.puts += 1

    def _expect_take(self, take, n):
        if self.error is not None:
            with pytest.raises(type(self.error)):
                take()
        elif self.items:
            got = take()
            expected = [self.items.popleft() for _ in range(min(n, len(self.items)))]
            assert (got if isinstance(got, list) else [got]) == expected
            self.gets += len(expected)
        elif self.closed:
            with pytest.raises(BufferClosed):
                take()
        else:
            with pytest.raises(TimeoutError):
                take()

    @rule()
    def get(self):
        self._expect_take(lambda: self.buf.get(timeout=0), 1)

    @rule(n=st.integers(1, 4))
    def get_many(self, n):
        self._expect_take(lambda: self.buf.get_many(n, timeout=0), n)

    @rule()
    def close(self):
        self.buf.close()
        self.closed = True

    @precondition(lambda self: self.error is None)
    @rule()
    def abort(self):
        self.error = RuntimeError("aborted")
        self.buf.abort(self.error)
        self.items.clear()
        self.closed = True

    @invariant()
    def matches_the_model(self):
        assert len(self.buf) == len(self.items) <= self.capacity
        assert self.buf.closed == self.closed
        stats = self.buf.stats
        assert (stats.puts, stats.gets) == (self.puts, self.gets)
        assert stats.peak_fill <= self.capacity


TestBufferModel = BufferModel.TestCase
TestBufferModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_put_many_fills_room_as_it_comes_and_keeps_order():
    buf = Buffer(3)
    putter, result = run_thread(buf.put_many, list(range(8)))  # more than fits at once
    got = []
    while len(got) < 8:
        got.extend(buf.get_many())
    finish(putter)
    assert "error" not in result and got == list(range(8))
    assert buf.stats.peak_fill <= 3 and buf.stats.puts == 8


def test_put_many_on_a_closed_buffer_and_with_a_byte_bound():
    buf = Buffer(2)
    buf.close()
    with pytest.raises(BufferClosed):
        buf.put_many([1])
    bounded = Buffer(4, max_bytes=100)
    bounded.put_many([np.zeros(40, dtype=np.uint8), np.zeros(40, dtype=np.uint8)])
    assert bounded.nbytes == 80
    with pytest.raises(TimeoutError):
        bounded.put_many([np.zeros(40, dtype=np.uint8)], timeout=0.01)
