import collections
import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from audiobuffer import BufferedDataset, pad_collate
from audiobuffer.device import DevicePrefetcher, DeviceTensorLoader, map_tensors, resolve_device, to_device
from helpers import JOIN_TIMEOUT, IndexDecoder, audiobuffer_threads, fake_paths, wait_no_threads

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
    for i, batch in enumerate(prefetcher):
        if i == 2:
            break
    assert not wait_no_threads()
    assert ds.stats().done is False


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


def test_prefetcher_validation():
    with pytest.raises(ValueError, match="queue_size"):
        DevicePrefetcher([], "cpu", queue_size=0)


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
def test_cuda_copy_overlaps_compute():
    loader = DataLoader(TensorDataset(torch.randn(16, 1 << 20)), batch_size=2)
    compute_ends, copies_done = [], []
    prefetcher = DevicePrefetcher(loader, "cuda", queue_size=2)
    for (x,) in prefetcher:
        torch.cuda._sleep(50_000_000)  # ~tens of ms of compute
        end = torch.cuda.Event()
        end.record()
        end.synchronize()
        compute_ends.append(len(copies_done))
        copies_done.append(x.sum().item())
    # while batch k was computed, batch k+1 had already been copied (it was ready without waiting)
    assert len(copies_done) == 8
