import subprocess
import sys

import numpy as np
import pytest
import torch

from audiobuffer import BufferedDataset, DecodeError, ImageDecoder, WorkItem

Image = pytest.importorskip("PIL.Image", reason="ImageDecoder needs Pillow (pip install 'audiobuffer[image]')")


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "rgb.png")
    Image.fromarray(pixels[..., 0]).save(tmp_path / "gray.png")
    Image.fromarray(pixels).convert("RGBA").save(tmp_path / "rgba.png")
    Image.fromarray(pixels).save(tmp_path / "photo.jpg", quality=95)
    return tmp_path, pixels


def test_decode_to_chw_uint8(images):
    root, pixels = images
    sample = ImageDecoder()(WorkItem(index=3, path=str(root / "rgb.png"), label=1, label_name="cat"))
    image = sample["image"]
    assert image.dtype == torch.uint8 and image.shape == (3, 12, 20) and image.is_contiguous()
    np.testing.assert_array_equal(image.numpy(), pixels.transpose(2, 0, 1))
    assert (sample["index"], sample["label"], sample["label_name"]) == (3, 1, "cat")


def test_gray_and_rgba_become_rgb(images):
    root, pixels = images
    gray = ImageDecoder()(root / "gray.png")["image"]
    assert gray.shape == (3, 12, 20)
    np.testing.assert_array_equal(gray[1].numpy(), pixels[..., 0])
    rgba = ImageDecoder()(root / "rgba.png")["image"]
    np.testing.assert_array_equal(rgba.numpy(), pixels.transpose(2, 0, 1))


@pytest.mark.parametrize("size, shape", [(8, (3, 8, 8)), ((6, 10), (3, 6, 10))])
def test_resize(images, size, shape):
    assert ImageDecoder(size=size)(images[0] / "photo.jpg")["image"].shape == shape


def test_corrupt_and_missing_files(images, tmp_path):
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(DecodeError, match=r"broken\.png"):
        ImageDecoder()(tmp_path / "broken.png")
    with pytest.raises(DecodeError, match=r"missing\.png"):
        ImageDecoder()(tmp_path / "missing.png")


@pytest.mark.parametrize("kwargs", [{"size": 0}, {"size": (3, 4, 5)}, {"size": "big"}, {"resample": "cubic"}])
def test_validation(kwargs):
    with pytest.raises((ValueError, TypeError)):
        ImageDecoder(**kwargs)


def test_through_buffered_dataset(images):
    root, _ = images
    ds = BufferedDataset(root, ImageDecoder(size=16), patterns=["*.png", "*.jpg"], num_producers=2)
    shapes = [s["image"].shape for s in ds]
    assert shapes == [(3, 16, 16)] * 4


def test_import_audiobuffer_does_not_import_pillow():
    code = "import sys, audiobuffer; assert 'PIL' not in sys.modules, 'PIL imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
