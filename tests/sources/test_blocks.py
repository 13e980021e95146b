"""Block reads of an index's members (sources/blocks.py): one request a block, the same bytes as member
reads, every member once, memory bounded, failures reported per member; in process and in the helper."""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import numpy as np
import pytest
import torch
from helpers import make_corpus

from audiobuffer import AudioDecoder, BufferedDataset, IsolatedLoader, Source, StorageError
from audiobuffer.engine.plan import block_starts, plan_epoch
from audiobuffer.sources import pack, storage
from audiobuffer.sources.blocks import BlockReads
from audiobuffer.sources.storage import Retry, Storage

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("blocks")
    make_corpus(root / "src", 40, seconds=0.05)
    pack(root / "src", root / "out", shard_size=30_000, labels="parent", progress=False)
    return Source(root / "out" / "index.json", labels="label")


def _reads(source: Source, block: int, indices: np.ndarray, capacity: int = 64) -> BlockReads:
    t = source.table
    starts = block_starts(t.shard_of, t.offsets, t.sizes, block)
    return BlockReads(t, starts, indices, storage=source.storage, capacity=capacity)


def _member(source: Source, i: int) -> bytes:
    t = source.table
    return storage.read_range(t.shards[t.shard_of[i]], int(t.offsets[i]), int(t.sizes[i]))


@pytest.mark.parametrize("block", [1, 3, 8, 1000])
def test_every_member_once_the_same_bytes_and_one_request_a_block(packed, block, monkeypatch):
    n = len(packed)
    t = packed.table
    starts = block_starts(t.shard_of, t.offsets, t.sizes, block)
    order = plan_epoch(n, shuffle=True, seed=2, epoch=0, blocks=starts).indices
    reads = _reads(packed, block, order)
    calls = []
    real = Storage.read_range
    monkeypatch.setattr(Storage, "read_range",
                        lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    got: dict[int, bytes] = {}
    lock = threading.Lock()
    queue = iter(order.tolist())

    def producer() -> None:
        while True:
            with lock:
                i = next(queue, None)
            if i is None:
                return
            data = reads.read(i)
            with lock:
                assert i not in got
                got[i] = data

    threads = [threading.Thread(target=producer, name=f"audiobuffer-test-{k}") for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    assert sorted(got) == list(range(n))
    assert reads.requests == len(calls) == len(starts)  # one request a block, none twice
    assert all(got[i] == _member(packed, i) for i in range(n))
    assert reads.held() == 0  # every block dropped once its members were read


def test_an_evicted_block_is_read_again_and_memory_stays_bounded(packed):
    n = len(packed)
    order = np.arange(n)[::-1].copy()
    reads = _reads(packed, 4, np.concatenate([order, order]), capacity=1)
    for i in order.tolist():
        reads.read(i)
        assert reads.held() <= 1
    for i in np.arange(n).tolist():  # another pass: every block again
        assert reads.read(i) == _member(packed, i)
    assert reads.held() == 0


def test_a_failing_block_fails_each_of_its_members_and_no_one_waits(packed, monkeypatch):
    reads = _reads(packed, 1000, np.arange(len(packed)))
    started = threading.Event()

    def fail(storage, url, *args, **kwargs):
        started.wait(5)
        raise StorageError("cannot read: gone", url=url, attempts=3, transient=True)

    monkeypatch.setattr(Storage, "read_range", fail)
    errors: list[BaseException] = []

    def read(i: int) -> None:
        try:
            reads.read(i)
        except StorageError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(i,), name=f"audiobuffer-test-{i}") for i in range(4)]
    for thread in threads:
        thread.start()
    started.set()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    assert len(errors) == 4 and len({e.member for e in errors}) == 4
    assert all(e.attempts == 3 and e.transient and "gone" in str(e) for e in errors)


def test_a_waiter_gives_up_on_a_block_that_never_comes(packed, monkeypatch):
    t = packed.table
    starts = block_starts(t.shard_of, t.offsets, t.sizes, 1000)
    reads = BlockReads(t, starts, np.arange(len(packed)), capacity=4,
                       storage=Storage(retry=Retry(attempts=1, timeout=0.01)))
    reads._wait = 0.2  # as the retry's bound would be, shortened
    release = threading.Event()
    monkeypatch.setattr(Storage, "read_range", lambda *a, **k: release.wait(10) and b"")

    def fetch() -> None:
        with contextlib.suppress(StorageError):  # the empty block it is given is not the member's
            reads.read(0)

    fetcher = threading.Thread(target=fetch, name="audiobuffer-test")  # hangs until released
    fetcher.start()
    try:
        for _ in range(1000):
            if reads.requests:
                break
            release.wait(0.01)
        with pytest.raises(StorageError, match=r"was still being read after 0 s"):
            reads.read(1)
    finally:
        release.set()
        fetcher.join(10)


def test_local_data_keeps_its_order_unless_asked(packed):
    plain = BufferedDataset(packed, AudioDecoder(8000), shuffle=True, seed=1, ordered=True)
    assert plain.pipeline.read_block() is None
    order = [s["index"] for s in plain]
    assert order == plan_epoch(len(packed), shuffle=True, seed=1, epoch=0).indices.tolist()
    blocked = BufferedDataset(packed, AudioDecoder(8000), shuffle=True, seed=1, ordered=True, read_block=4)
    assert blocked.pipeline.read_block() == 4
    samples = list(blocked)
    assert [s["index"] for s in samples] == plan_epoch(len(packed), shuffle=True, seed=1, epoch=0,
                                                        blocks=blocked.pipeline.read_blocks()).indices.tolist()
    by_index = {s["index"]: s["audio"] for s in plain}
    assert all(torch.equal(s["audio"], by_index[s["index"]]) for s in samples)


def test_read_block_is_refused_with_batches_by_duration(packed):
    with pytest.raises(ValueError, match=r"read_block=4 with max_batch_seconds"):
        BufferedDataset(packed, AudioDecoder(8000), read_block=4, max_batch_seconds=1.0)
    with pytest.raises(ValueError, match=r"read_block must be an integer >= 1 or 'auto' or None, got 0"):
        BufferedDataset(packed, AudioDecoder(8000), read_block=0)


def test_read_block_auto_follows_the_mode_in_the_helpers_copy(packed):
    # An IsolatedLoader's helper gets the pipeline without its durations (the trainer plans the
    # batches): it must still read one member a request, as the trainer's state dict says.
    dataset = BufferedDataset(packed, AudioDecoder(8000), max_batch_seconds=1.0)
    dataset.pipeline.source.__dict__["_urls"] = True  # read as if from an object store
    helpers = dataclasses.replace(dataset.pipeline, batching=None)
    assert dataset.pipeline.read_block() is None
    assert helpers.read_block() is None


@pytest.mark.subprocess
def test_blocks_in_the_isolated_helper(packed):
    decoder = AudioDecoder(8000, crop_seconds=0.05, crop="start")
    with IsolatedLoader(packed, decoder, batch_size=4, shuffle=True, read_block=4) as loader:
        batches = list(loader)
    got = [int(i) for b in batches for i in b["index"]]
    assert sorted(got) == list(range(len(packed)))
