import subprocess
import sys
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
import torch
from helpers import write_tone

from audiobuffer import IMAGE_PATTERNS, AudioDecoder, BufferedDataset, DecodeError, ImageDecoder, WorkItem
from audiobuffer.decoders.image import Resample

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


@pytest.mark.subprocess
def test_import_audiobuffer_does_not_import_pillow():
    code = "import sys, audiobuffer; assert 'PIL' not in sys.modules, 'PIL imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- 16-bit greyscale, alpha, EXIF orientation, several frames -------------------------------------

def eight_bit(values):
    return ((np.asarray(values, dtype=np.int64).clip(0, 65535) * 255 + 32767) // 65535).astype(np.uint8)


def test_16_bit_greyscale_png_is_scaled_to_8_bits(tmp_path):
    values = (np.arange(12 * 20).reshape(12, 20) * 273).astype(np.uint16)  # 0 .. 65247
    values[0, :4] = [0, 257, 32768, 65535]
    Image.fromarray(values).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    image = ImageDecoder()(tmp_path / "deep.png")["image"].numpy()
    assert image.shape == (3, 12, 20)
    expected = eight_bit(values)
    for channel in image:
        np.testing.assert_array_equal(channel, expected)
    assert list(image[0, 0, :4]) == [0, 1, 128, 255]
    assert len(np.unique(image)) > 200  # a ramp, not 0/255


def test_32_bit_integer_image_is_taken_as_16_bit(tmp_path):
    """Older Pillow opens 16-bit PNGs as mode I: values are clipped to 0..65535 and scaled."""
    values = np.array([[0, 257, 65535, 70000, -5, 32768]], dtype=np.int32)
    Image.fromarray(values).save(tmp_path / "wide.tif")
    assert Image.open(tmp_path / "wide.tif").mode == "I"
    image = ImageDecoder()(tmp_path / "wide.tif")["image"].numpy()
    assert list(image[0, 0]) == [0, 1, 255, 255, 0, 128]


def test_16_bit_greyscale_resized(tmp_path):
    Image.fromarray(np.full((10, 10), 65535, dtype=np.uint16)).save(tmp_path / "white.png")
    image = ImageDecoder(size=4)(tmp_path / "white.png")["image"]
    assert image.shape == (3, 4, 4) and bool((image == 255).all())


def test_float_image_is_a_decode_error(tmp_path):
    Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32)).save(tmp_path / "float.tif")
    with pytest.raises(DecodeError, match=r"float\.tif.*mode F"):
        ImageDecoder()(tmp_path / "float.tif")


def test_alpha_is_dropped_and_colour_kept(tmp_path):
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, (6, 7, 4), dtype=np.uint8)
    rgba[..., 3] = np.arange(7, dtype=np.uint8) * 40  # from fully transparent to nearly opaque
    Image.fromarray(rgba, "RGBA").save(tmp_path / "alpha.png")
    image = ImageDecoder()(tmp_path / "alpha.png")["image"].numpy()
    np.testing.assert_array_equal(image, rgba[..., :3].transpose(2, 0, 1))


@pytest.mark.parametrize("orientation, turn", [
    (1, lambda a: a),
    (3, lambda a: np.rot90(a, 2)),
    (6, lambda a: np.rot90(a, -1)),  # stored sideways: turn 90 degrees clockwise
    (8, lambda a: np.rot90(a, 1)),
    (2, lambda a: a[:, ::-1]),
])
def test_exif_orientation_is_applied(tmp_path, orientation, turn):
    pixels = np.arange(12 * 20 * 3, dtype=np.uint8).reshape(12, 20, 3)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(pixels).save(tmp_path / "photo.png", exif=exif)
    upright = ImageDecoder()(tmp_path / "photo.png")["image"].numpy()
    np.testing.assert_array_equal(upright, turn(pixels).transpose(2, 0, 1))
    stored = ImageDecoder(apply_exif_orientation=False)(tmp_path / "photo.png")["image"].numpy()
    np.testing.assert_array_equal(stored, pixels.transpose(2, 0, 1))
    resized = ImageDecoder(size=(5, 9))(tmp_path / "photo.png")["image"]
    assert resized.shape == (3, 5, 9)  # size applies after the rotation


def test_several_frames_give_the_first(tmp_path):
    frames = [Image.fromarray(np.full((4, 5, 3), value, dtype=np.uint8)) for value in (10, 200, 90)]
    frames[0].save(tmp_path / "pages.tif", save_all=True, append_images=frames[1:])
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:])
    assert Image.open(tmp_path / "pages.tif").n_frames == 3
    for name in ("pages.tif", "anim.gif"):
        image = ImageDecoder()(tmp_path / name)["image"]
        assert image.shape == (3, 4, 5) and bool((image == 10).all()), name


def test_exif_option_validation():
    with pytest.raises(TypeError, match="apply_exif_orientation"):
        ImageDecoder(apply_exif_orientation="yes")


def test_resample_validation_names_the_choices():
    with pytest.raises(ValueError, match=r"^resample must be one of 'nearest', 'bilinear', 'bicubic', 'lanczos', "
                                         r"'box', 'hamming', got 'cubic'$"):
        ImageDecoder(resample="cubic")
    for resample in get_args(Resample):
        assert ImageDecoder(resample=resample).resample == resample


# -- default patterns follow the decoder ----------------------------------------------------------

def test_image_directory_is_found_with_the_decoders_patterns(images):
    root, pixels = images
    (root / "sub").mkdir()
    Image.fromarray(pixels).save(root / "sub" / "CAMERA.JPG")
    Image.fromarray(pixels).save(root / "sub" / "pic.webp", lossless=True)
    (root / "notes.txt").write_text("not an image")
    write_tone(root / "sound.wav", seconds=0.1, sample_rate=8000)
    assert ImageDecoder.patterns == IMAGE_PATTERNS
    ds = BufferedDataset(root, ImageDecoder(size=16), num_producers=2)
    names = sorted(Path(s["path"]).name for s in ds)
    assert names == ["CAMERA.JPG", "gray.png", "photo.jpg", "pic.webp", "rgb.png", "rgba.png"]
    audio = BufferedDataset(root, AudioDecoder(), num_producers=1)
    assert [Path(p).name for p in audio.source.paths] == ["sound.wav"]
    plain = BufferedDataset(root, lambda item: item.path, num_producers=1)  # no patterns: audio ones
    assert [Path(p).name for p in plain.source.paths] == ["sound.wav"]
    chosen = BufferedDataset(root, ImageDecoder(), patterns=["*.png"], num_producers=1)
    assert len(chosen.source.paths) == 3


def test_yaml_image_pipeline_uses_image_patterns(images):
    from audiobuffer.config import build_source, parse_config

    root, pixels = images
    Image.fromarray(pixels).save(root / "pic.webp", lossless=True)
    config = parse_config({"source": {"root": str(root)}, "decode": {"kind": "image"}})
    assert sorted(Path(p).name for p in build_source(config).paths) == [
        "gray.png", "photo.jpg", "pic.webp", "rgb.png", "rgba.png"]
