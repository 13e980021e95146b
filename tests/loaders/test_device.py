import collections
import threading
import time

import pytest
import torch
from helpers import JOIN_TIMEOUT, IndexDecoder, audiobuffer_threads, fake_paths, wait_no_threads
from torch.utils.data import DataLoader, Dataset, TensorDataset

from audiobuffer import BatchSlotLoader, BufferClosed, BufferedDataset, pad_collate
from audiobuffer.engine.cancel import CancelScope, cancel_scope, on_cancel
from audiobuffer.loaders.device import (
    DevicePrefetcher,
    DeviceTensorLoader,
    map_tensors,
    resolve_device,
    to_device,
)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
Pair = collections.namedtuple("Pair", "x y")


def test_map_tensors_walks_nested_batches_and_keeps_the_rest():
    batch = {"a": torch.ones(2), "b": [torch.zeros(1), "path.wav", (torch.ones(1), 3)], "c": Pair(torch.ones(1), None)}
    out = map_tensors(batch, lambda t: t + 1)
    assert out["a"].tolist() == [2, 2] and out["b"][0].tolist() == [1] and out["b"][1] == "path.wav"
    assert isinstance(out["b"][2], tuple) and out["b"][2][1] == 3 and out["b"][2][0].tolist() == [2]
    assert isinstance(out["c"], Pair) and out["c"].x.tolist() == [2] and out["c"].y is None
    assert to_device(batch, torch.device("cpu"))["a"] is batch["a"]  # already there: no copy


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")


def loader_of(n=20, batch_size=3):
    return DataLoader(TensorDataset(torch.arange(n).float(), torch.arange(n)), batch_size=batch_size)


def test_prefetcher_yields_the_loaders_batches_in_order():
    loader = loader_of()
    got = [[t.tolist() for t in batch] for batch in DevicePrefetcher(loader, "cpu")]
    assert got == [[t.tolist() for t in batch] for batch in loader]


def test_prefetcher_passes_len_dataset_and_sampler_through():
    loader = loader_of()
    prefetcher = DevicePrefetcher(loader, "cpu", queue_size=3)
    assert len(prefetcher) == 7 and prefetcher.dataset is loader.dataset and prefetcher.sampler is loader.sampler


def test_prefetcher_second_iter_is_a_new_epoch():
    prefetcher = DevicePrefetcher(loader_of(), "cpu")
    assert len(list(prefetcher)) == len(list(prefetcher)) == 7


class Exploding(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 6:
            raise KeyError(f"bad item {i}")
        return torch.tensor(i)


def test_loader_errors_reach_the_consumer():
    got = []
    with pytest.raises(KeyError, match="bad item 6"):
        for batch in DevicePrefetcher(DataLoader(Exploding(), batch_size=2), "cpu"):
            got.append(batch.tolist())
    assert got == [[0, 1], [2, 3], [4, 5]]
    assert not wait_no_threads()


def test_early_exit_stops_the_thread_and_the_producers():
    ds = BufferedDataset(fake_paths(400), IndexDecoder(), num_producers=3, buffer_size=4)
    prefetcher = DevicePrefetcher(DataLoader(ds, batch_size=4, collate_fn=pad_collate), "cpu")
    for i, _batch in enumerate(prefetcher):
        if i == 2:
            break
    assert not wait_no_threads()
    assert ds.stats().done is False


class SlowAfterFirstBatch:
    """Items of the first batch decode at once, the rest take ``seconds`` each while ``slow`` is set.

    Counts the slow decodes started, so a test can tell whether the next batch was collected after
    the consumer left (each producer may finish the item in hand, no more).
    """

    def __init__(self, batch_size, seconds=0.4):
        self.batch_size = batch_size
        self.seconds = seconds
        self.slow = threading.Event()
        self.slow.set()
        self.lock = threading.Lock()
        self.slow_started = 0
        self.inner = IndexDecoder()

    def __call__(self, item):
        if item.index >= self.batch_size and self.slow.is_set():
            with self.lock:
                self.slow_started += 1
            time.sleep(self.seconds)  # stands for a slow decode: the prefetch thread cannot be interrupted in it
        return self.inner(item)


def leave(prefetcher, how):
    """Take the first batch, then leave the loop as ``how`` says; returns the batch."""
    if how == "break":
        for batch in prefetcher:  # noqa: B007 - the batch is returned after the loop
            break
    elif how == "exception":
        with pytest.raises(KeyboardInterrupt):
            for batch in prefetcher:  # noqa: B007 - the batch is returned after the loop
                raise KeyboardInterrupt  # Ctrl-C in the training step
    elif how == "close":
        it = iter(prefetcher)
        batch = next(it)
        it.close()
    elif how == "gc":
        it = iter(prefetcher)
        batch = next(it)
        del it  # the generator's finally runs when it is collected
    else:
        raise AssertionError(how)
    return batch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["break", "exception", "close", "gc"])
def test_leaving_the_loop_stops_a_slow_loader_and_the_next_epoch_runs(how):
    # A decoder taking 0.4 s per item, batches of 64: the whole next batch would take seconds. Leaving
    # the loop after the first batch stops the epoch the prefetch thread reads: the producers finish
    # the item in hand and the next batch is never built (NOTE [ Prefetch cancellation ]).
    batch_size, producers = 64, 4
    decoder = SlowAfterFirstBatch(batch_size)
    ds = BufferedDataset(fake_paths(4 * batch_size), decoder, num_producers=producers, buffer_size=batch_size)
    prefetcher = DevicePrefetcher(DataLoader(ds, batch_size=batch_size, collate_fn=pad_collate), "cpu")
    first = leave(prefetcher, how)
    assert len(first["index"]) == batch_size
    assert not wait_no_threads(), "the prefetch thread or the producers outlived the loop"
    assert decoder.slow_started < batch_size, "the next batch was collected after the consumer left"
    assert ds.stats().done is False
    # The user's dataset was stopped, not closed: the next epoch runs in full.
    decoder.slow.clear()
    ds.set_epoch(1)
    indices = [i for batch in prefetcher for i in batch["index"].tolist()]
    assert sorted(indices) == list(range(4 * batch_size))


@pytest.mark.timeout(120)
def test_leaving_the_loop_stops_a_slow_batch_slot_loader():
    batch_size = 64
    decoder = SlowAfterFirstBatch(batch_size)
    loader = BatchSlotLoader(fake_paths(4 * batch_size), decoder, batch_size=batch_size, num_producers=4,
                             pin_memory=False)
    batch = leave(DevicePrefetcher(loader, "cpu"), "break")
    assert len(batch["index"]) == batch_size
    assert not wait_no_threads()
    assert decoder.slow_started < batch_size


@pytest.mark.timeout(60)
def test_leaving_the_loop_does_not_wait_for_a_loader_that_cannot_be_stopped():
    # A plain iterable blocked in a slow item cannot be stopped: leaving the loop stops waiting for it,
    # the thread ends as soon as the item returns without asking for another, and the next epoch
    # starts only once it has ended (one epoch in the loader at a time).
    release, asked, active, most_active = threading.Event(), [], [0], [0]

    class Loader:
        def __iter__(self):
            active[0] += 1
            most_active[0] = max(most_active[0], active[0])
            try:
                yield torch.zeros(1)
                asked.append(1)
                release.wait(JOIN_TIMEOUT)  # stands for a decode that takes long
                yield torch.ones(1)
                asked.append(2)
                yield torch.ones(1)
            finally:
                active[0] -= 1

    prefetcher = DevicePrefetcher(Loader(), "cpu")
    for batch in prefetcher:  # noqa: B007 - the batch is read after the loop
        break
    assert batch.tolist() == [0.0]
    assert [t.name for t in audiobuffer_threads()] == ["audiobuffer-prefetch"]  # still in the slow item
    assert "running=1" in repr(prefetcher)
    releaser = threading.Timer(0.2, release.set)
    releaser.start()
    assert [b.tolist() for b in prefetcher] == [[0.0], [1.0], [1.0]]  # waited for the left thread first
    releaser.join(JOIN_TIMEOUT)
    assert asked == [1, 1, 2] and most_active[0] == 1
    assert not wait_no_threads()


@pytest.mark.timeout(60)
def test_leaving_nested_prefetchers_stops_the_inner_ones_loader():
    batch_size = 64
    decoder = SlowAfterFirstBatch(batch_size)
    ds = BufferedDataset(fake_paths(4 * batch_size), decoder, num_producers=4, buffer_size=batch_size)
    inner = DevicePrefetcher(DataLoader(ds, batch_size=batch_size, collate_fn=pad_collate), "cpu")
    batch = leave(DevicePrefetcher(inner, "cpu", queue_size=1), "break")
    assert len(batch["index"]) == batch_size
    assert not wait_no_threads()
    assert decoder.slow_started < batch_size


def test_cancel_scope_runs_each_stop_once_late_ones_at_once_and_survives_a_failing_one(caplog):
    scope, calls = CancelScope(), []
    remove = scope.add(lambda: calls.append("removed"))
    scope.add(lambda: calls.append("a"))
    scope.add(lambda: 1 / 0)  # logged, not raised into the consumer's cleanup
    remove()
    scope.cancel()
    scope.cancel()
    assert calls == ["a"] and "stop callback" in caplog.text
    scope.add(lambda: calls.append("late"))  # made after the consumer left: stopped at once
    assert calls == ["a", "late"]
    assert on_cancel(lambda: calls.append("no scope"))() is None and calls == ["a", "late"]
    with cancel_scope(CancelScope()) as inner:
        on_cancel(lambda: calls.append("inner"))
    inner.cancel()
    assert calls == ["a", "late", "inner"]


def test_close_from_another_thread():
    gate = threading.Event()

    class Slow(Dataset):
        def __len__(self):
            return 100

        def __getitem__(self, i):
            if i >= 4:
                gate.wait(JOIN_TIMEOUT)
            return torch.tensor(i)

    prefetcher = DevicePrefetcher(DataLoader(Slow(), batch_size=2), "cpu")

    def close_then_release():
        threading.Timer(0.05, gate.set).start()
        prefetcher.close()

    got = []
    closer = threading.Timer(0.1, close_then_release)
    closer.start()
    for batch in prefetcher:
        got.append(batch.tolist())
    closer.join(JOIN_TIMEOUT)
    assert got[:2] == [[0, 1], [2, 3]] and len(got) < 50
    assert not wait_no_threads()


class ClosableLoader:
    """Yields batches until ``close()`` from another thread, then raises ``BufferClosed`` in the reader's
    thread, as ``IsolatedLoader`` does."""

    def __init__(self):
        self.closed = threading.Event()

    def __iter__(self):
        yield torch.zeros(2)
        self.closed.wait(JOIN_TIMEOUT)
        raise BufferClosed("the loader was closed")

    def close(self):
        self.closed.set()


@pytest.mark.timeout(60)
def test_the_loaders_own_close_reaches_the_consumer_instead_of_hanging_it():
    # A BufferClosed from the loader is the loader's: only the prefetcher's own buffer closing means
    # that the consumer has gone.
    loader = ClosableLoader()
    closer = threading.Timer(0.1, loader.close)
    closer.start()
    got = []
    with pytest.raises(BufferClosed, match="the loader was closed"):
        for batch in DevicePrefetcher(loader, "cpu"):
            got.append(batch)
    closer.join(JOIN_TIMEOUT)
    assert len(got) == 1
    assert not wait_no_threads()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", [0.0, 0.3])
def test_closing_an_isolated_loader_from_another_thread_ends_the_prefetchers_loop(when):
    from plain_decoders import IndexDecoder as PlainIndexDecoder

    from audiobuffer import IsolatedLoader

    decoder = PlainIndexDecoder(slow_from=8, slow=2.0)  # the helper gets stuck after two batches
    with IsolatedLoader(fake_paths(40), decoder, batch_size=4, num_producers=1) as loader:
        got = []
        closer = threading.Timer(when, loader.close)
        with pytest.raises(BufferClosed):
            for batch in DevicePrefetcher(loader, "cpu"):
                got.append(batch)
                if len(got) == 1:
                    closer.start()
        closer.join(JOIN_TIMEOUT)
    assert 1 <= len(got) <= 2
    assert not wait_no_threads()


def test_prefetcher_validation():
    with pytest.raises(ValueError, match="queue_size"):
        DevicePrefetcher([], "cpu", queue_size=0)


def test_prefetcher_repr():
    assert repr(DevicePrefetcher(loader_of(), "cpu", queue_size=3)) == (
        "DevicePrefetcher(DataLoader, device='cpu', queue_size=3, running=0)")


def test_prefetcher_thread_is_named_and_reads_ahead():
    seen = []

    class Recording(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            seen.append(i)
            return torch.tensor(i)

    it = iter(DevicePrefetcher(DataLoader(Recording(), batch_size=1), "cpu", queue_size=2))
    next(it)
    assert [t.name for t in audiobuffer_threads()] == ["audiobuffer-prefetch"]
    deadline = threading.Event()
    for _ in range(200):
        if len(seen) >= 3:
            break
        deadline.wait(0.01)
    assert len(seen) >= 3  # the batch handed out plus the two queued behind it
    it.close()


# -- DeviceTensorLoader ------------------------------------------------------------------------------

def test_tensor_loader_unshuffled_batches_are_views():
    x = torch.arange(20).reshape(10, 2)
    loader = DeviceTensorLoader(x, torch.arange(10), batch_size=4, shuffle=False, device="cpu")
    batches = list(loader)
    assert len(loader) == len(batches) == 3 and [len(b[0]) for b in batches] == [4, 4, 2]
    assert batches[1][0].data_ptr() == loader.tensors[0][4:8].data_ptr()
    assert torch.equal(torch.cat([b[0] for b in batches]), x)


def test_tensor_loader_shuffles_every_row_once_reproducibly():
    x, y = torch.randn(103, 5), torch.arange(103)
    loader = DeviceTensorLoader(x, y, batch_size=10, device="cpu", seed=7)
    epoch0 = torch.cat([b[1] for b in loader])
    epoch1 = torch.cat([b[1] for b in loader])
    assert sorted(epoch0.tolist()) == list(range(103)) and not torch.equal(epoch0, epoch1)
    for batch_x, batch_y in loader:
        assert torch.equal(batch_x, x[batch_y])  # rows stay paired
    loader.set_epoch(0)
    assert torch.equal(torch.cat([b[1] for b in loader]), epoch0)
    other_seed = DeviceTensorLoader(x, y, batch_size=10, device="cpu", seed=8)
    assert not torch.equal(torch.cat([b[1] for b in other_seed]), epoch0)


def test_tensor_loader_repr():
    loader = DeviceTensorLoader(torch.zeros(10, 3), torch.arange(10), batch_size=4, device="cpu", seed=3)
    assert repr(loader) == ("DeviceTensorLoader(tensors=[(10, 3) float32, (10,) int64], batch_size=4, shuffle=True, "
                            "drop_last=False, device='cpu', seed=3, epoch=0)")


def test_tensor_loader_drop_last():
    loader = DeviceTensorLoader(torch.arange(10), batch_size=4, drop_last=True, device="cpu")
    assert len(loader) == 2 and [len(b[0]) for b in loader] == [4, 4]


@pytest.mark.parametrize("args, kwargs, error", [
    ((), {"batch_size": 2}, ValueError),
    ((torch.zeros(3), torch.zeros(4)), {"batch_size": 2}, ValueError),
    ((torch.zeros(3),), {"batch_size": 0}, ValueError),
    (([1, 2, 3],), {"batch_size": 1}, TypeError),
])
def test_tensor_loader_validation(args, kwargs, error):
    with pytest.raises(error):
        DeviceTensorLoader(*args, device="cpu", **kwargs)


# -- CUDA --------------------------------------------------------------------------------------------

@cuda
def test_cuda_prefetcher_values_equal_the_cpu_path():
    loader = DataLoader(TensorDataset(torch.randn(64, 1000), torch.arange(64)), batch_size=8)
    for (gx, gy), (cx, cy) in zip(DevicePrefetcher(loader, "cuda"), loader):
        assert gx.is_cuda and gy.is_cuda
        assert torch.equal(gx.cpu(), cx) and torch.equal(gy.cpu(), cy)


@cuda
def test_cuda_no_use_after_reuse_under_a_slow_consumer_kernel():
    loader = DataLoader(TensorDataset(torch.arange(32).float().repeat_interleave(4096).view(32, 4096)), batch_size=2)
    expected = [b[0].sum().item() for b in loader]
    sums = []
    for (x,) in DevicePrefetcher(loader, "cuda", queue_size=2):
        torch.cuda._sleep(20_000_000)  # a slow kernel on the consumer stream before x is read
        sums.append(x.sum())
        del x  # freed on the host while the kernel may still run: record_stream keeps it safe
    assert [s.item() for s in sums] == expected


@cuda
@pytest.mark.timeout(120)
def test_cuda_copy_overlaps_compute():
    # Batch k+1 may start loading only once step k is queued on the GPU: the loader waits for a gate
    # the loop opens right after it queues the step. The prefetcher hands a batch out only once its
    # copy has finished, so a batch handed out while step k's kernel still runs was pinned and copied
    # during that step. A copy queued on the consumer's stream waits behind the step, and one made in
    # the loop comes after it: either makes the step finished by hand-out time, and this fails.
    n, rows = 8, 1 << 22  # 16 MiB per batch
    gates = [threading.Event() for _ in range(n)]

    class Gated:
        def __len__(self):
            return n

        def __iter__(self):
            for j in range(n):
                if not gates[j].wait(JOIN_TIMEOUT):
                    return
                yield torch.full((rows,), float(j))

    probe = torch.cuda.Stream()  # reads a handed-out batch without waiting for the step
    step_running_at_handout, heads = [], []
    gates[0].set()
    it = iter(DevicePrefetcher(Gated(), "cuda", queue_size=2))
    x = next(it)
    for k in range(n):
        torch.cuda._sleep(200_000_000)  # step k: about 0.1 s of compute on the consumer's stream
        step_end = torch.cuda.Event()
        step_end.record()
        if k + 1 < n:
            gates[k + 1].set()
            x = next(it)
            step_running_at_handout.append(not step_end.query())
            with torch.cuda.stream(probe):  # the copy is complete: its data can be read at once
                heads.append(x[:1].clone())
            probe.synchronize()
        step_end.synchronize()
    assert next(it, None) is None
    assert [h.item() for h in heads] == [float(k) for k in range(1, n)]
    # The first copy in the loop needs a new device block, and CUDA lets an allocation wait for running
    # kernels; from then on the allocator reuses the block freed two batches before (nothing allocates).
    assert all(step_running_at_handout[1:]), f"batches copied after the step they follow: {step_running_at_handout}"
