"""Images through each loader: BufferedDataset, IsolatedLoader, BatchSlotLoader and
DevicePrefetcher (on the CPU), from packed shards (by index and streamed); each sample the crop
that BufferedDataset gives the same item. The images are a few pixels, made by Pillow here."""

from __future__ import annotations

import pytest
import torch
from helpers import wait_no_threads
from torch.utils.data import DataLoader

from audiobuffer import IMAGE_PATTERNS, BufferedDataset, DevicePrefetcher, ImageDecoder
from audiobuffer.collate import image_collate
from audiobuffer.prepare.pack import pack
from audiobuffer.sources.index import INDEX_NAME

np = pytest.importorskip("numpy")
Image = pytest.importorskip("PIL.Image", reason="ImageDecoder needs Pillow: pip install Pillow")

N = 8  # images, two classes
SIZE = 8  # the crops' side


def decoder() -> ImageDecoder:
    return ImageDecoder(SIZE, crop="random_resized", flip=True)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A folder of two classes, ``N`` JPEGs of 20 x 24, packed into two shards with an index."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(N):
        folder = root / "tree" / ("cat", "dog")[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(folder / f"{i}.jpg")
    pack(root / "tree", root / "packed", shard_size=16000, labels="parent", patterns=IMAGE_PATTERNS,
         progress=False)
    assert (root / "packed" / "shard-000001.tar").exists()
    return root / "packed"


def reference(spec: str) -> dict[int, dict]:
    """Each item's sample as BufferedDataset decodes it (seed 3, epoch 0), by item index."""
    ds = BufferedDataset(spec, decoder(), labels="label", seed=3, num_producers=1)
    samples = {int(s["index"]): s for s in ds}
    ds.close()
    return samples


def check_batches(batches: list[dict], expected: dict[int, dict]) -> None:
    seen = []
    for batch in batches:
        images = batch["image"]
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIZE, SIZE)
        for row, index in enumerate(batch["index"].tolist()):
            assert torch.equal(images[row], expected[index]["image"]), index
            assert int(batch["label"][row]) == expected[index]["label"]
            seen.append(index)
    assert sorted(seen) == sorted(expected)


@pytest.mark.parametrize("read", ["index", "streamed"])
def test_buffered_dataset_batches_images(packed, read):
    spec = str(packed / (INDEX_NAME if read == "index" else "shard-*.tar"))
    expected = reference(spec)
    assert len(expected) == N
    ds = BufferedDataset(spec, decoder(), labels="label", seed=3, shuffle=True, num_producers=2)
    assert ds.classes == ["cat", "dog"]
    batches = list(DataLoader(ds, batch_size=4, collate_fn=image_collate))
    ds.close()
    assert [b["image"].shape[0] for b in batches] == [4, 4]
    check_batches(batches, expected)
    assert wait_no_threads() == []


def test_isolated_loader_stacks_images_without_being_told_the_key(packed, no_helper_left_behind):
    from audiobuffer import IsolatedLoader

    spec = str(packed / INDEX_NAME)
    with IsolatedLoader(spec, decoder(), batch_size=4, labels="label", seed=3, shuffle=True,
                        num_producers=2) as loader:
        assert loader.key == "image"
        batches = list(loader)
    check_batches(batches, reference(spec))


def test_batch_slot_loader_fills_fixed_shape_crops(packed):
    from audiobuffer.loaders.slots import BatchSlotLoader

    spec = str(packed / INDEX_NAME)
    with BatchSlotLoader(spec, decoder(), batch_size=4, labels="label", seed=3, shuffle=True,
                         num_producers=2) as loader:
        batches = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                   for b in loader]
    check_batches(batches, reference(spec))
    assert wait_no_threads() == []


def test_device_prefetcher_on_the_cpu(packed):
    spec = str(packed / INDEX_NAME)
    ds = BufferedDataset(spec, decoder(), labels="label", seed=3, shuffle=True, num_producers=2)
    loader = DataLoader(ds, batch_size=4, collate_fn=image_collate)
    prefetcher = DevicePrefetcher(loader, "cpu")
    assert len(prefetcher) == 2
    batches = list(prefetcher)
    ds.close()
    assert all(b["image"].device.type == "cpu" for b in batches)
    check_batches(batches, reference(spec))
    assert wait_no_threads() == []


def test_the_isolated_loader_refuses_jpegs_left_for_the_device(tmp_path):
    from audiobuffer import IsolatedLoader

    with pytest.raises(ValueError, match=r"cannot take ImageDecoder\(jpeg='device'\).*jpeg='host'"):
        IsolatedLoader([str(tmp_path / "a.jpg")], ImageDecoder(32, jpeg="device"), batch_size=2)
    assert wait_no_threads() == []


@pytest.mark.parametrize("drop_last", [False, True])
def test_buffered_dataset_stacks_batches_as_samples_arrive(packed, drop_last):
    """BufferedDataset.stacked_batches: pad_collate's batches of the epoch's samples, in their
    order, each item once; len() counts them; the last, short one dropped with drop_last."""
    from audiobuffer import pad_collate

    spec = str(packed / INDEX_NAME)
    ds = BufferedDataset(spec, decoder(), labels="label", seed=3, shuffle=True, ordered=True,
                         num_producers=2)
    batches = ds.stacked_batches(3, drop_last=drop_last)
    assert batches.key == "image" and len(batches) == (N // 3 if drop_last else -(-N // 3))
    got = list(DataLoader(batches, batch_size=None))
    samples = list(ds)  # the same epoch (epoch 0), one sample at a time
    ds.close()
    assert len(got) == len(batches)
    for k, batch in enumerate(got):
        expected = pad_collate(samples[3 * k:3 * k + 3], key="image")
        assert list(batch) == list(expected)
        for name, value in expected.items():
            same = torch.equal(batch[name], value) if isinstance(value, torch.Tensor) else None
            assert same if same is not None else batch[name] == value, name
    kept = {int(i) for batch in got for i in batch["index"]}
    assert len(kept) == (N // 3 * 3 if drop_last else N)
    check_batches(got, {i: s for i, s in reference(spec).items() if i in kept})
    assert wait_no_threads() == []


def test_stacked_batches_resume_where_the_state_was_taken(packed):
    spec = str(packed / INDEX_NAME)
    ds = BufferedDataset(spec, decoder(), labels="label", seed=3, shuffle=True, num_producers=2)
    seen = []
    for batch in ds.stacked_batches(3):
        seen += batch["index"].tolist()
        state = ds.state_dict()
        break
    ds.close()
    resumed = BufferedDataset(spec, decoder(), labels="label", seed=3, shuffle=True,
                              num_producers=2)
    resumed.load_state_dict(state)
    rest = [i for batch in resumed.stacked_batches(3) for i in batch["index"].tolist()]
    resumed.close()
    assert len(seen) == 3 and sorted(seen + rest) == list(range(N))
    assert wait_no_threads() == []


def test_stacked_batches_refuse_what_they_cannot_batch(packed, tmp_path):
    ds = BufferedDataset(str(packed / INDEX_NAME), decoder(), labels="label")
    for kwargs, error, match in (({"batch_size": 0}, ValueError, "batch_size"),
                                 ({"batch_size": 2, "drop_last": 1}, TypeError, "drop_last"),
                                 ({"batch_size": 2, "key": 5}, TypeError, "key")):
        with pytest.raises(error, match=match):
            ds.stacked_batches(**kwargs)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.jpg")
    device = BufferedDataset(str(tmp_path), ImageDecoder(SIZE, jpeg="device"))
    with pytest.raises(ValueError, match="image_collate"):
        device.stacked_batches(2)


def test_batches_by_duration_are_not_batched_again(tmp_path):
    from helpers import IndexDecoder, duration_manifest

    ds = BufferedDataset(duration_manifest(tmp_path, [1.0] * 4), IndexDecoder(),
                         max_batch_seconds=2.0, duration_column="seconds")
    with pytest.raises(ValueError, match=r"max_batch_seconds=2\.0"):
        ds.stacked_batches(2)
