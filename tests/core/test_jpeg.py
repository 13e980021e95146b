"""JPEGs decoded on the device: ``ImageDecoder(jpeg="device")`` in the producers, ``DecodeJpeg``
on the batch. On the CPU the decode is injected (Pillow's, in the stored orientation, as nvjpeg
gives it), so everything but nvjpeg itself is checked against the host path to the bit."""

import importlib.util
import io
import sys
from typing import get_args

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from audiobuffer import (
    BatchSlotLoader,
    BufferedDataset,
    DecodeError,
    DecodeJpeg,
    DevicePrefetcher,
    ImageDecoder,
    WorkItem,
    pad_collate,
)
from audiobuffer.collate import image_collate
from audiobuffer.decoders.image import CropBox, EncodedImage, Resample, random_resized_box
from audiobuffer.jpeg import resized_crop

Image = pytest.importorskip("PIL.Image", reason="ImageDecoder needs Pillow")

JOIN_TIMEOUT = 10.0
CUDA = torch.cuda.is_available()


def pillow_decode(data, device):
    """A ``decode`` for ``DecodeJpeg``: Pillow's full decode, RGB, in the stored orientation."""
    out = []
    for tensor in data:
        assert tensor.dtype == torch.uint8 and tensor.dim() == 1 and tensor.device.type == "cpu"
        with Image.open(io.BytesIO(tensor.numpy().tobytes())) as im:
            pixels = np.asarray(im.convert("RGB"))
        out.append(torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous().to(device))
    return out


def picture(height, width, seed):
    """Smooth structure plus a little noise, as JPEG compresses photos."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    pixels = np.stack([x * 255 / width, y * 255 / height,
                       128 + 100 * np.sin(x / 7 + y / 11 + rng.uniform(0, 6))], axis=-1)
    pixels += rng.normal(0, 8, pixels.shape)
    return pixels.round().clip(0, 255).astype(np.uint8)


@pytest.fixture
def jpegs(tmp_path):
    """Nine JPEGs of 30 to 130 pixels a side: EXIF orientations 1 to 8, and one greyscale."""
    rng = np.random.default_rng(7)
    paths = []
    for i in range(9):
        h, w = (int(v) for v in rng.integers(30, 131, 2))
        im = Image.fromarray(picture(h, w, i))
        if i == 8:
            im = im.convert("L")
        exif = Image.Exif()
        exif[0x0112] = min(i + 1, 8)
        path = tmp_path / f"{i}.jpg"
        im.save(path, quality=90, exif=exif)
        paths.append(str(path))
    return paths


def host_and_device(paths, epoch=0, **kwargs):
    """The host path's batch (draft off: every pixel decoded) and the device path's, on the CPU."""
    host = ImageDecoder(draft=False, **kwargs)
    device = ImageDecoder(jpeg="device", **kwargs)
    items = [WorkItem(index=i, path=p, seed=11, epoch=epoch) for i, p in enumerate(paths)]
    expected = torch.stack([host(item)["image"] for item in items])
    samples = [device(item) for item in items]
    got = DecodeJpeg("cpu", decode=pillow_decode)(image_collate(samples))["image"]
    return expected, got, samples


@pytest.mark.parametrize("resample", get_args(Resample))
@pytest.mark.parametrize("crop", ["random_resized", "center", None])
def test_device_path_gives_the_host_paths_images(jpegs, crop, resample):
    for size in (20, (36, 90)):  # smaller, and a mix (test_resized_crop_is_pillows_resize: more)
        expected, got, samples = host_and_device(jpegs, size=size, crop=crop, flip=True,
                                                 resample=resample)
        assert all(isinstance(s["image"], EncodedImage) for s in samples)
        assert got.dtype == torch.uint8 and got.shape == expected.shape
        assert torch.equal(got, expected), size


def test_channels_last_layout(jpegs):
    expected, got, _ = host_and_device(jpegs, size=32, crop="random_resized", flip=True,
                                       layout="hwc")
    assert got.shape == (9, 32, 32, 3) and torch.equal(got, expected)


def test_boxes_and_flips_are_the_host_paths_draws(jpegs):
    decoder = ImageDecoder(48, crop="random_resized", flip=True, jpeg="device")
    flips = 0
    for index in range(200):
        path = jpegs[index % 8]  # orientation index % 8 + 1: 5 to 8 swap the sides
        encoded = decoder(WorkItem(index=index, path=path, seed=3, epoch=2))["image"]
        with Image.open(path) as im:
            width, height = im.size
        if index % 8 + 1 >= 5:
            width, height = height, width
        rng = WorkItem(index=index, path=path, seed=3, epoch=2).rng()
        assert encoded.box == random_resized_box(height, width, rng)
        assert encoded.flip == (rng.random() < 0.5)
        assert encoded.size == (48, 48) and encoded.crop_first
        assert encoded.data.tobytes() == open(path, "rb").read()
        flips += encoded.flip
    assert 70 < flips < 130


def test_resized_crop_is_pillows_resize():
    """Pillow's filters, rounding and order of passes, on boxes whole and fractional."""
    rng = np.random.default_rng(0)
    for trial in range(60):
        h, w = (int(v) for v in rng.integers(6, 90, 2))
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        size = tuple(int(v) for v in rng.integers(3, 120, 2))
        resample = get_args(Resample)[trial % 6]
        filt = getattr(Image.Resampling, resample.upper())
        top, left = float(rng.uniform(0, h / 2)), float(rng.uniform(0, w / 2))
        box = CropBox(top, left, float(rng.uniform(1, h - top)), float(rng.uniform(1, w - left)))
        image = torch.from_numpy(pixels).permute(2, 0, 1)
        corners = (box.left, box.top, box.left + box.width, box.top + box.height)
        expected = Image.fromarray(pixels).resize((size[1], size[0]), filt, box=corners)
        got = resized_crop(image, box, size, resample=resample, crop_first=False)
        np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), np.asarray(expected))
        whole = CropBox(*(int(v) for v in box))
        cropped = Image.fromarray(pixels).crop(
            (whole.left, whole.top, whole.left + whole.width, whole.top + whole.height))
        expected = cropped.resize((size[1], size[0]), filt)
        got = resized_crop(image, whole, size, resample=resample, crop_first=True)
        np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), np.asarray(expected))


def test_before_pillow_13_the_horizontal_pass_is_always_first(monkeypatch):
    """Older Pillow resizes the width, then the height: as two resizes of one axis each."""
    from audiobuffer import jpeg

    monkeypatch.setattr(jpeg, "_PILLOW_ORDERS", False)
    pixels = np.random.default_rng(1).integers(0, 256, (90, 40, 3), dtype=np.uint8)
    wide = Image.fromarray(pixels).resize((70, 90), Image.Resampling.BILINEAR)
    expected = np.asarray(wide.resize((70, 12), Image.Resampling.BILINEAR))
    image = torch.from_numpy(pixels).permute(2, 0, 1)
    got = resized_crop(image, CropBox(0, 0, 90, 40), (12, 70)).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(got, expected)
    assert jpeg._vertical_first(90, 40, (12, 70)) is False


def test_png_and_cmyk_are_decoded_in_the_producer(jpegs, tmp_path):
    Image.fromarray(picture(50, 40, 1)).save(tmp_path / "a.png")
    Image.fromarray(picture(45, 60, 2)).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=90)
    pictures = [Image.fromarray(picture(40, 60, n)) for n in (3, 4)]
    pictures[0].save(tmp_path / "camera.jpg", format="MPO", save_all=True,
                     append_images=pictures[1:])  # several pictures: some cameras' JPEGs
    paths = [str(tmp_path / "a.png"), jpegs[0], str(tmp_path / "cmyk.jpg"), jpegs[5],
             str(tmp_path / "camera.jpg")]
    expected, got, samples = host_and_device(paths, size=20, crop="random_resized", flip=True)
    assert [isinstance(s["image"], EncodedImage) for s in samples] == [False, True, False, True,
                                                                       False]
    assert torch.equal(got, expected)
    # a batch the producers decoded whole is stacked by image_collate and only moved
    _, got, _ = host_and_device(paths[::2], size=20, crop="center")
    assert got.shape == (3, 3, 20, 20)


def truncated(path, tmp_path):
    """A JPEG whose header reads but whose data stops half way."""
    data = open(path, "rb").read()
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(data[: len(data) // 2])
    return str(broken)


def test_a_jpeg_that_does_not_decode_names_the_file(jpegs, tmp_path):
    paths = [jpegs[0], truncated(jpegs[1], tmp_path), jpegs[2]]
    decoder = ImageDecoder(32, crop="random_resized", jpeg="device")
    samples = [decoder(WorkItem(index=i, path=p)) for i, p in enumerate(paths)]  # the header reads
    with pytest.raises(DecodeError, match=r"cannot decode .*broken\.jpg.* on cpu") as caught:
        DecodeJpeg("cpu", decode=pillow_decode)(image_collate(samples))
    assert caught.value.path == paths[1]
    (tmp_path / "noise.jpg").write_bytes(b"\xff\xd8 not a jpeg at all")
    with pytest.raises(DecodeError, match=r"noise\.jpg"):  # no header: the producer says so
        decoder(WorkItem(index=0, path=str(tmp_path / "noise.jpg")))


def test_a_decode_that_gives_another_size_is_an_error(jpegs):
    samples = [ImageDecoder(16, jpeg="device")(jpegs[0])]

    def wrong(data, device):
        return [torch.zeros(3, 5, 5, dtype=torch.uint8) for _ in data]

    with pytest.raises(DecodeError, match=r"0\.jpg' decoded to \(3, 5, 5\), not the uint8"):
        DecodeJpeg("cpu", decode=wrong)(image_collate(samples))


def test_without_torchvision_the_error_says_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # an import of it raises ImportError
    with pytest.raises(ImportError, match=r"install torchvision.*or pass decode="):
        DecodeJpeg("cpu")


@pytest.mark.skipif(CUDA, reason="checks the message where CUDA is absent")
def test_cuda_asked_for_where_there_is_none():
    with pytest.raises(ValueError, match=r"'cuda' was asked for, but CUDA is not available"):
        DecodeJpeg("cuda", decode=pillow_decode)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"size": 8, "jpeg": "gpu"}, ValueError, r"jpeg must be one of 'host', 'device', got 'gpu'"),
    ({"jpeg": "device"}, ValueError, r"jpeg='device' .*give size="),
])
def test_decoder_option_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        ImageDecoder(**kwargs)


def test_decode_jpeg_validation(jpegs):
    with pytest.raises(TypeError, match=r"key must be a str"):
        DecodeJpeg("cpu", key=1, decode=pillow_decode)
    with pytest.raises(TypeError, match=r"decode must be a callable"):
        DecodeJpeg("cpu", decode="nvjpeg")
    step = DecodeJpeg("cpu", decode=pillow_decode)
    with pytest.raises(KeyError, match=r"no 'image' \(keys: \['label'\]\); set key="):
        step({"label": torch.zeros(2)})
    with pytest.raises(TypeError, match=r"non-empty list of images"):
        step([])
    mixed = [ImageDecoder(16, jpeg="device")(jpegs[0])["image"],
             ImageDecoder(12, jpeg="device")(jpegs[1])["image"]]
    with pytest.raises(ValueError, match=r"differ in shape: \(3, 16, 16\) and \(3, 12, 12\)"):
        step(mixed)


def test_through_buffered_dataset_and_the_prefetcher(jpegs):
    """The prefetch thread decodes: batches as the host path gives them, in the same order."""
    def batches(decoder, transform=None):
        dataset = BufferedDataset(jpegs, decoder, num_producers=2, shuffle=True, seed=5,
                                  ordered=True)
        with dataset:
            loader = DataLoader(dataset, batch_size=4, collate_fn=image_collate)
            with DevicePrefetcher(loader, "cpu", transform=transform) as prefetch:
                return [(b["index"].tolist(), b["image"]) for b in prefetch]

    kwargs = {"size": 28, "crop": "random_resized", "flip": True}
    expected = batches(ImageDecoder(draft=False, **kwargs))
    got = batches(ImageDecoder(jpeg="device", **kwargs), DecodeJpeg("cpu", decode=pillow_decode))
    assert [i for i, _ in got] == [i for i, _ in expected]
    for (_, a), (_, b) in zip(got, expected):
        assert torch.equal(a, b)


def test_a_failing_transform_reaches_the_consumer(jpegs, tmp_path):
    paths = [*jpegs[:3], truncated(jpegs[3], tmp_path)]
    dataset = BufferedDataset(paths, ImageDecoder(16, jpeg="device"), shuffle=False, ordered=True)
    with dataset:
        loader = DataLoader(dataset, batch_size=2, collate_fn=image_collate)
        step = DecodeJpeg("cpu", decode=pillow_decode)
        prefetch = DevicePrefetcher(loader, "cpu", transform=step)
        with prefetch, pytest.raises(DecodeError, match=r"broken\.jpg"):
            for _ in prefetch:
                pass


def test_batch_slots_carry_encoded_images(jpegs):
    kwargs = {"size": 24, "crop": "random_resized", "flip": True}
    slots = BatchSlotLoader(jpegs, ImageDecoder(jpeg="device", **kwargs), batch_size=3,
                            shuffle=True, seed=2)
    with slots:
        step = DecodeJpeg("cpu", decode=pillow_decode)
        with DevicePrefetcher(slots, "cpu", transform=step) as prefetch:
            batches = [(b["index"].tolist(), b["image"]) for b in prefetch]
    host = ImageDecoder(draft=False, **kwargs)
    assert sorted(i for indices, _ in batches for i in indices) == list(range(9))
    for indices, images in batches:
        expected = [host(WorkItem(index=i, path=jpegs[i], seed=2))["image"] for i in indices]
        assert torch.equal(images, torch.stack(expected))


def test_a_batch_of_arrays_only_says_how_to_batch_encoded_images(jpegs):
    """The isolated loader's helper collates into shared memory, arrays only."""
    samples = [ImageDecoder(16, jpeg="device")(path) for path in jpegs[:2]]
    with pytest.raises(TypeError, match=r"got EncodedImage \(ImageDecoder\(jpeg='device'\) hands "
                                        r"JPEG bytes over .* BatchSlotLoader, or decode here with "
                                        r"jpeg='host'\)"):
        pad_collate(samples, key="image")


def test_prefetcher_transform_validation():
    with pytest.raises(TypeError, match=r"transform must be a callable"):
        DevicePrefetcher([], "cpu", transform="decode")


# -- on a GPU: nvjpeg through torchvision (optional, never required) --------------------

TORCHVISION = importlib.util.find_spec("torchvision") is not None

@pytest.mark.skipif(not CUDA or not TORCHVISION, reason="needs CUDA (nvjpeg) and torchvision")
def test_nvjpeg_gives_the_host_paths_images_within_the_decoders_difference(jpegs):
    host = ImageDecoder(64, crop="random_resized", flip=True, draft=False)
    device = ImageDecoder(64, crop="random_resized", flip=True, jpeg="device")
    items = [WorkItem(index=i, path=p, seed=1) for i, p in enumerate(jpegs)]
    expected = torch.stack([host(item)["image"] for item in items]).cuda()
    got = DecodeJpeg("cuda")(image_collate([device(item) for item in items]))["image"]
    assert got.device.type == "cuda" and got.shape == expected.shape
    diff = (got.int() - expected.int()).abs().float()
    print(f"nvjpeg vs libjpeg-turbo: mean |diff| {diff.mean():.3f}, max {diff.max():.0f}")
    assert diff.mean() < 2.0


@pytest.mark.skipif(not CUDA or not TORCHVISION, reason="needs CUDA (nvjpeg) and torchvision")
def test_nvjpeg_through_the_prefetcher(jpegs):
    dataset = BufferedDataset(jpegs, ImageDecoder(32, crop="center", jpeg="device"), ordered=True)
    with dataset:
        loader = DataLoader(dataset, batch_size=4, collate_fn=image_collate, pin_memory=True)
        with DevicePrefetcher(loader, "cuda", transform=DecodeJpeg("cuda")) as prefetch:
            images = [b["image"] for b in prefetch]
    assert [tuple(i.shape) for i in images] == [(4, 3, 32, 32), (4, 3, 32, 32), (1, 3, 32, 32)]
    assert {i.device.type for i in images} == {"cuda"}
