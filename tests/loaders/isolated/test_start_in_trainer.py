"""``IsolatedLoader(start_in_trainer=True)``: the first batches decoded in the trainer while the
helper warms up, then the rest in the helper (NOTE [ Starting in the trainer ] in
loaders/isolated/loader.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import duration_manifest, fake_paths
from plain_decoders import IndexDecoder, SlowWarmUp

from audiobuffer import IsolatedLoader, SampleError

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_helper_left_behind")]


def epoch(loader, epoch=0):
    loader.set_epoch(epoch)
    return [(tuple(int(i) for i in b["index"]), b["audio"].clone(), tuple(int(p) for p in b["pid"]))
            for b in loader]


def same_batches(a, b):
    return [k for k, _, _ in a] == [k for k, _, _ in b] and all(
        x.shape == y.shape and bool((x == y).all()) for (_, x, _), (_, y, _) in zip(a, b))


def test_the_trainer_starts_the_epoch_and_the_helper_takes_the_rest_exactly():
    me = os.getpid()
    options = dict(batch_size=5, shuffle=True, seed=3, num_producers=1)
    decoder = SlowWarmUp(me, 0.5, home_delay=0.05)  # 6 s in the trainer: the warm-up ends mid-epoch
    with IsolatedLoader(fake_paths(120), decoder, start_in_trainer=True, **options) as loader:
        first = epoch(loader)
        stats = loader.stats()
        second = epoch(loader, 1)
    with IsolatedLoader(fake_paths(120), decoder, **options) as plain:
        want_first, want_second = epoch(plain), epoch(plain, 1)
    assert same_batches(first, want_first) and same_batches(second, want_second)
    here = [me in pids for _, _, pids in first]
    assert 0 < sum(here) < len(first), "the hand-over came mid-epoch"
    assert here == sorted(here, reverse=True), "the trainer's batches come first, then the helper's"
    one_place = all(set(pids) == {me} or me not in pids for _, _, pids in first)
    assert one_place, "a batch is made in one place"
    assert stats.transfer["trainer_batches"] == sum(here)
    assert stats.done and stats.yielded == 120 and stats.failed == 0
    assert all(me not in pids for _, _, pids in second), "a warm helper makes the whole next epoch"


def test_an_epoch_that_ends_before_the_helper_is_warm_runs_in_the_trainer():
    me = os.getpid()
    with IsolatedLoader(fake_paths(12), SlowWarmUp(me, 3.0), batch_size=4,
                        start_in_trainer=True) as loader:
        got = epoch(loader)
        assert [k for k, _, _ in got] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
        assert all(set(pids) == {me} for _, _, pids in got)
        assert loader.stats().transfer["trainer_batches"] == 3 and loader.stats().done


def test_failures_are_counted_once_across_the_hand_over():
    me = os.getpid()
    fail = tuple(range(3, 120, 7))
    options = dict(batch_size=4, on_error="skip", num_producers=1)
    decoder = SlowWarmUp(me, 0.5, home_delay=0.05, fail=fail)
    with IsolatedLoader(fake_paths(120), decoder, start_in_trainer=True, **options) as loader:
        got = epoch(loader)
        stats = loader.stats()
        state = loader.state_dict()
    with IsolatedLoader(fake_paths(120), IndexDecoder(fail=fail), **options) as plain:
        plain.set_epoch(0)
        want = [tuple(int(i) for i in b["index"]) for b in plain]
        want_state = plain.state_dict()
    assert [k for k, _, _ in got] == want
    assert state == want_state  # every item consumed once, as in the helper alone
    assert 0 < stats.transfer["trainer_batches"] < len(got)
    assert (stats.failed, stats.yielded) == (len(fail), 120 - len(fail))
    assert sorted(index for index, _, _ in stats.failures) == list(fail)


def test_a_failure_under_raise_in_the_trainer_raises_as_in_the_helper():
    with IsolatedLoader(fake_paths(20), SlowWarmUp(os.getpid(), 3.0, fail=(6,)), batch_size=4,
                        start_in_trainer=True) as loader:
        with pytest.raises(SampleError, match="item 6"):
            list(loader)


def test_batches_by_duration_hand_over_the_rest_of_the_plan(tmp_path):
    me = os.getpid()
    durations = np.random.default_rng(7).uniform(0.2, 5.0, 120).round(2)
    options = dict(max_batch_seconds=6.0, buckets=3, shuffle=True, seed=4, num_producers=1,
                   duration_column="seconds")
    manifest = duration_manifest(tmp_path, durations)
    decoder = SlowWarmUp(me, 0.5, home_delay=0.05)
    with IsolatedLoader(manifest, decoder, start_in_trainer=True, **options) as loader:
        got = epoch(loader, 2)
        stats = loader.stats()
    with IsolatedLoader(manifest, IndexDecoder(), **options) as plain:
        plain.set_epoch(2)
        want = [tuple(int(i) for i in b["index"]) for b in plain]
    assert [k for k, _, _ in got] == want
    assert 0 < stats.transfer["trainer_batches"] < len(got)
    assert stats.yielded == 120 and stats.batches == len(want) and stats.done


def test_leaving_the_epoch_early_in_the_trainer_stops_it_and_the_next_epoch_runs():
    me = os.getpid()
    with IsolatedLoader(fake_paths(40), SlowWarmUp(me, 2.0, delay=0.01), batch_size=4,
                        start_in_trainer=True) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        it.close()
        loader.load_state_dict(state)
        rest = [tuple(int(i) for i in b["index"]) for b in loader]
    assert [i for b in rest for i in b] == list(range(4, 40))


def test_start_in_trainer_must_be_a_bool():
    with pytest.raises(TypeError, match="start_in_trainer must be True or False, got 1"):
        IsolatedLoader(fake_paths(4), IndexDecoder(), batch_size=2, start_in_trainer=1)
