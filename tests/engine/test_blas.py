"""BLAS thread limits (``engine/blas.py``): held while producers run, restored after, and in the
helper process."""

from __future__ import annotations

import pytest
from helpers import fake_paths
from plain_decoders import BlasProbe, blas_threads
from threadpoolctl import threadpool_limits

from audiobuffer import BufferedDataset, IsolatedLoader
from audiobuffer.engine import blas
from audiobuffer.options import LoaderOptions

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def three_threads():
    """BLAS on 3 threads during the test (a limit of 1 or 2 shows on any machine), restored after."""
    with threadpool_limits(limits=3, user_api="blas"):
        assert blas_threads() == 3
        yield


@pytest.mark.parametrize("producers", [1, 2, "auto"])
@pytest.mark.parametrize("limit, seen", [(1, 1), (2, 2), (None, 3)])
def test_producers_run_blas_on_the_threads_given_and_the_count_comes_back(producers, limit, seen):
    with BufferedDataset(fake_paths(12), BlasProbe(length=2), num_producers=producers,
                         blas_threads=limit) as dataset:
        samples = list(dataset)
        assert blas_threads() == 3  # the epoch is over: its pool gave the count back
    assert sorted(s["index"] for s in samples) == list(range(12))
    assert {s["blas_threads"] for s in samples} == {seen}


def test_the_default_is_one_thread_while_producers_run():
    assert LoaderOptions().blas_threads == 1
    with BufferedDataset(fake_paths(4), BlasProbe(length=2), num_producers=2) as dataset:
        assert {s["blas_threads"] for s in dataset} == {1}
    assert blas_threads() == 3


class BlasFreeProbe(BlasProbe):
    """A decoder that says it runs no matrix product (as ``ImageDecoder`` does)."""

    calls_blas = False


def test_producers_that_run_no_matrix_product_hold_no_limit_but_a_transform_does():
    with BufferedDataset(fake_paths(4), BlasFreeProbe(length=2), num_producers=2) as dataset:
        assert {s["blas_threads"] for s in dataset} == {3}  # nothing applied: no library scan

    def transform(sample):  # what a transform does is unknown: the limit holds again
        return {**sample, "blas_threads": blas_threads()}

    with BufferedDataset(fake_paths(4), BlasFreeProbe(length=2), num_producers=2,
                         transform=transform) as dataset:
        assert {s["blas_threads"] for s in dataset} == {1}
    assert blas_threads() == 3


def test_an_epoch_left_early_gives_the_count_back():
    with BufferedDataset(fake_paths(200), BlasProbe(length=2, delay=0.001),
                         num_producers=2) as dataset:
        epoch = iter(dataset)
        assert next(epoch)["blas_threads"] == 1
        del epoch  # the pool closes
        assert blas_threads() == 3


def test_holds_nest_the_smallest_limit_applies_and_the_last_release_restores():
    release_two = blas.hold(2)
    assert blas_threads() == 2
    release_one = blas.hold(1)
    assert blas_threads() == 1
    release_one()
    assert blas_threads() == 2
    release_one()  # idempotent: the other hold stays
    assert blas_threads() == 2
    release_two()
    assert blas_threads() == 3
    blas.hold(None)()  # no limit: nothing changes
    assert blas_threads() == 3


@pytest.mark.parametrize("value, error", [(0, ValueError), (-1, ValueError), (1025, ValueError),
                                          ("one", TypeError), (1.0, TypeError), (True, TypeError)])
def test_the_option_is_checked(value, error):
    with pytest.raises(error, match="blas_threads"):
        LoaderOptions(blas_threads=value)
    with pytest.raises(error, match="blas_threads"):
        BufferedDataset(fake_paths(2), BlasProbe(), blas_threads=value)


@pytest.mark.usefixtures("no_helper_left_behind")
@pytest.mark.parametrize("limit", [1, 2])
def test_the_helper_process_runs_blas_on_the_threads_given(limit):
    with IsolatedLoader(fake_paths(8), BlasProbe(length=2), batch_size=4, num_producers=2,
                        blas_threads=limit) as loader:
        seen = {int(n) for batch in loader for n in batch["blas_threads"]}
    assert seen == {limit}
    assert blas_threads() == 3  # the trainer's own BLAS is the helper's business only
