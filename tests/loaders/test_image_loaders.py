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
