import subprocess
import sys
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
import torch
from helpers import photo, write_tone

from audiobuffer import (
    IMAGE_PATTERNS,
    AudioDecoder,
    BufferedDataset,
    DecodeError,
    ImageDecoder,
    WorkItem,
)
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


def test_tensors_false_hands_the_numpy_array_over(images):
    root, pixels = images
    image = ImageDecoder(tensors=False)(root / "rgb.png")["image"]
    assert isinstance(image, np.ndarray) and np.array_equal(image, pixels.transpose(2, 0, 1))
    assert torch.equal(ImageDecoder()(root / "rgb.png")["image"], torch.from_numpy(image))
    with pytest.raises(TypeError, match=r"^tensors must be True or False, got 0$"):
        ImageDecoder(tensors=0)


# -- training crops: random_resized, center, flip, draft ------------------------------------------

@pytest.fixture
def photos(tmp_path):
    """Twenty JPEGs of 40 to 90 pixels a side, in two class folders."""
    rng = np.random.default_rng(5)
    for i in range(20):
        folder = tmp_path / ("cat" if i % 2 else "dog")
        folder.mkdir(exist_ok=True)
        h, w = (int(v) for v in rng.integers(40, 91, 2))
        Image.fromarray(photo(h, w, i)).save(folder / f"{i:02d}.jpg", quality=90)
    return tmp_path


class Scripted:
    """A generator whose uniform draws are given as fractions of their range, integers as given."""

    def __init__(self, fractions, integers):
        self.fractions, self.integers_left, self.calls = list(fractions), list(integers), []

    def uniform(self, low, high):
        self.calls.append(("uniform", low, high))
        return low + self.fractions.pop(0) * (high - low)

    def integers(self, low, high):
        self.calls.append(("integers", low, high))
        return self.integers_left.pop(0)


def test_random_resized_box_follows_torchvisions_rule():
    from audiobuffer.decoders.image import CropBox, random_resized_box

    # try 1: the whole area at aspect 1 is 141 x 141, taller than 100: refused; try 2: 8% of the
    # area at aspect 3/4 is 35 wide, 46 high; its place is drawn top then left
    rng = Scripted([1.0, 0.5, 0.0, 0.0], [7, 9])
    assert random_resized_box(100, 200, rng) == CropBox(7, 9, 46, 35)
    assert rng.calls[-2:] == [("integers", 0, 55), ("integers", 0, 166)]
    assert rng.calls[0] == ("uniform", 0.08, 1.0)
    assert rng.calls[1] == ("uniform", pytest.approx(np.log(3 / 4)), pytest.approx(np.log(4 / 3)))


@pytest.mark.parametrize("height, width, scale, expected", [
    (10, 1000, (0.08, 1.0), (0, 493, 10, 13)),  # wider than 4/3: full height at aspect 4/3, centred
    (1000, 10, (0.08, 1.0), (493, 0, 13, 10)),  # taller than 3/4: full width at aspect 3/4
    (100, 120, (1.0, 1.0), (0, 0, 100, 120)),   # in the range: the whole image
])
def test_random_resized_box_falls_back_to_the_centre_after_ten_tries(height, width, scale,
                                                                    expected):
    from audiobuffer.decoders.image import random_resized_box

    rng = np.random.default_rng(0)
    if height == 100:  # the whole area at aspect 3/4 each time: 141 high, never fits
        rng = Scripted([1.0, 0.0] * 10, [])
    assert tuple(random_resized_box(height, width, rng, scale=scale)) == expected
    assert height != 100 or not rng.fractions  # ten tries, no more


@pytest.mark.parametrize("scale, ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.3, 0.6), (0.5, 2.0))])
def test_random_resized_box_stays_in_its_ranges_over_ten_thousand_draws(scale, ratio):
    """Each box lies in the image, its area in ``scale`` and its aspect in ``ratio`` to within the
    rounding of its sides to whole pixels, and the draws cover both ranges."""
    from audiobuffer.decoders.image import random_resized_box

    shapes = [(375, 500), (500, 375), (480, 640), (300, 300), (427, 640), (600, 400)]
    areas, aspects = [], []
    for n in range(10_000):
        height, width = shapes[n % len(shapes)]
        top, left, h, w = random_resized_box(height, width, np.random.default_rng([7, 0, n]),
                                             scale=scale, ratio=ratio)
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
        least, most = (w - 0.5) * (h - 0.5), (w + 0.5) * (h + 0.5)  # the area before rounding
        assert least <= scale[1] * height * width and scale[0] * height * width <= most
        assert ratio[0] <= (w + 0.5) / (h - 0.5) and (w - 0.5) / (h + 0.5) <= ratio[1]
        areas.append(h * w / (height * width))
        aspects.append(w / h)
    # every draw fitted within the ten tries, and the draws span the ranges
    assert min(areas) < scale[0] * 1.05 and max(areas) > scale[1] * 0.95
    assert min(aspects) < ratio[0] * 1.05 and max(aspects) > ratio[1] * 0.95


@pytest.mark.parametrize("shape", [(1, 1), (3, 500), (500, 3), (37, 53), (600, 800)])
@pytest.mark.parametrize("crop", ["random_resized", "center", None])
@pytest.mark.parametrize("layout", ["chw", "hwc"])
def test_each_output_is_exactly_size(tmp_path, shape, crop, layout):
    Image.fromarray(photo(*shape)).save(tmp_path / "p.jpg", quality=90)
    decode = ImageDecoder((24, 32), crop=crop, flip=True, layout=layout)
    for index in range(20):
        image = decode(WorkItem(index=index, path=str(tmp_path / "p.jpg"), seed=1))["image"]
        assert image.dtype == torch.uint8 and image.is_contiguous()
        assert image.shape == ((3, 24, 32) if layout == "chw" else (24, 32, 3))


def test_hwc_is_chw_with_channels_last(photos):
    path = str(next(photos.rglob("*.jpg")))
    item = WorkItem(index=4, path=path, seed=2)
    chw = ImageDecoder(16, crop="random_resized", flip=True)(item)["image"]
    hwc = ImageDecoder(16, crop="random_resized", flip=True, layout="hwc")(item)["image"]
    assert torch.equal(hwc.permute(2, 0, 1), chw)


def test_center_crop_is_resize_then_center_crop(tmp_path):
    """crop="center", crop_fraction=0.5 is Resize(32) then CenterCrop(16), in one resize."""
    pixels = photo(64, 96)
    Image.fromarray(pixels).save(tmp_path / "p.png")
    image = ImageDecoder((16, 16), crop="center", crop_fraction=0.5)(tmp_path / "p.png")["image"]
    # Resize(32): 64 x 96 becomes 32 x 48; CenterCrop(16): rows 8..24, columns 16..32
    resized = np.asarray(Image.fromarray(pixels).resize((48, 32), Image.Resampling.BILINEAR))
    expected = resized[8:24, 16:32]
    np.testing.assert_array_equal(image.numpy(), expected.transpose(2, 0, 1))


def test_random_crop_is_the_box_resized(tmp_path):
    from audiobuffer.decoders.image import random_resized_box

    pixels = photo(60, 80)
    Image.fromarray(pixels).save(tmp_path / "p.png")
    item = WorkItem(index=9, path=str(tmp_path / "p.png"), seed=4, epoch=2)
    image = ImageDecoder(20, crop="random_resized")(item)["image"]
    top, left, h, w = random_resized_box(60, 80, item.rng())
    box = Image.fromarray(pixels[top:top + h, left:left + w])
    expected = box.resize((20, 20), Image.Resampling.BILINEAR)
    np.testing.assert_array_equal(image.numpy(), np.asarray(expected).transpose(2, 0, 1))


def test_flips_half_the_time(tmp_path):
    pixels = photo(6, 9)
    Image.fromarray(pixels).save(tmp_path / "p.png")
    decode, path, n = ImageDecoder(flip=True, layout="hwc"), str(tmp_path / "p.png"), 10_000
    flipped = 0
    for index in range(n):
        image = decode(WorkItem(index=index, path=path, seed=11))["image"].numpy()
        if np.array_equal(image, pixels[:, ::-1]):
            flipped += 1
        else:
            np.testing.assert_array_equal(image, pixels)
    assert abs(flipped / n - 0.5) <= 0.02, flipped


def test_draws_depend_on_seed_epoch_and_index_only(photos):
    path = str(next(photos.rglob("*.jpg")))
    decode = ImageDecoder(16, crop="random_resized", flip=True)

    def image(**where):
        return decode(WorkItem(path=path, **{"index": 0, "seed": 0, "epoch": 0, **where}))["image"]

    assert torch.equal(image(seed=3), image(seed=3))
    for other in ({"seed": 4}, {"epoch": 1}, {"index": 1}):
        assert not torch.equal(image(), image(**other)), other


def test_draft_decodes_the_same_box_at_a_reduced_scale(tmp_path):
    """A 1/8-scale decode of a large JPEG maps its box onto the reduced image: close to the full
    decode."""
    from audiobuffer.decoders.image import _draft, center_box

    Image.fromarray(photo(1200, 1600)).save(tmp_path / "big.jpg", quality=92)
    with Image.open(tmp_path / "big.jpg") as im:
        assert _draft(im, center_box(1200, 1600, (64, 64), 0.875), (64, 64)) == 8
        assert im.size == (200, 150)
    with Image.open(tmp_path / "big.jpg") as im:  # a box 300 wide scaled to 64: 1/4 at most
        assert _draft(im, center_box(300, 400, (64, 64), 1.0), (64, 64)) == 4
    for crop in ("center", "random_resized"):
        for index in range(5):
            item = WorkItem(index=index, path=str(tmp_path / "big.jpg"), seed=1)
            fast = ImageDecoder(64, crop=crop)(item)["image"].numpy().astype(int)
            full = ImageDecoder(64, crop=crop, draft=False)(item)["image"].numpy().astype(int)
            assert np.abs(fast - full).mean() < 3, (crop, index)
            assert crop != "center" or not np.array_equal(fast, full)  # the reduced decode was used


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_draft_with_exif_orientation(tmp_path, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(photo(800, 1200)).save(tmp_path / "turned.jpg", quality=92, exif=exif)
    item = WorkItem(index=2, path=str(tmp_path / "turned.jpg"), seed=5)
    for crop in ("center", "random_resized"):
        fast = ImageDecoder((40, 30), crop=crop)(item)["image"].numpy().astype(int)
        full = ImageDecoder((40, 30), crop=crop, draft=False)(item)["image"].numpy().astype(int)
        assert fast.shape == (3, 40, 30) and np.abs(fast - full).mean() < 3, crop


def test_real_photographs(tmp_path):
    """The photographs scikit-learn ships (a temple in China, a flower), where it is installed."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        pytest.skip("scikit-learn (whose sample photographs this test reads) is not installed")
    found = sorted((Path(spec.origin).parent / "datasets" / "images").glob("*.jpg"))
    if not found:
        pytest.skip("no sample photographs in this scikit-learn")
    for path in found:
        for index in range(10):
            item = WorkItem(index=index, path=str(path), seed=3)
            fast = ImageDecoder(224, crop="random_resized", flip=True)(item)["image"]
            full = ImageDecoder(224, crop="random_resized", flip=True, draft=False)(item)["image"]
            assert fast.shape == (3, 224, 224)
            assert (fast.int() - full.int()).abs().float().mean() < 4, (path.name, index)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"crop": "random_resized"}, ValueError, r"crop='random_resized' .*size=None"),
    ({"size": 8, "crop": "random"}, ValueError,
     r"crop must be one of 'random_resized', 'center', got 'random'"),
    ({"size": 8, "crop": "center", "crop_fraction": 0}, ValueError, r"crop_fraction .* got 0"),
    ({"size": 8, "crop": "center", "crop_fraction": "all"}, TypeError, r"crop_fraction .*'all'"),
    ({"size": 8, "scale": (0.5, 0.2)}, ValueError, r"scale must be a pair .* got \(0\.5, 0\.2\)"),
    ({"size": 8, "scale": (0.5, 2)}, ValueError, r"scale .*high <= 1\.0, got \(0\.5, 2\)"),
    ({"size": 8, "ratio": 1.0}, TypeError, r"ratio must be a pair .* got 1\.0"),
    ({"size": 8, "ratio": (0, 1)}, ValueError, r"ratio must be a pair .* got \(0, 1\)"),
    ({"flip": 1}, TypeError, r"flip must be True or False, got 1"),
    ({"layout": "nhwc"}, ValueError, r"layout must be one of 'chw', 'hwc', got 'nhwc'"),
])
def test_crop_option_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        ImageDecoder(**kwargs)


def test_a_decode_error_names_the_file(tmp_path):
    (tmp_path / "cut.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    with pytest.raises(DecodeError, match=r"cut\.jpg"):
        ImageDecoder(8, crop="random_resized", flip=True)(tmp_path / "cut.jpg")


# -- through the loaders: resume, ranks, the helper process, batch slots ---------------------------

def by_index(samples):
    return {int(s["index"]): s["image"].clone() for s in samples}


def crop_dataset(root, **kwargs):
    kwargs = {"shuffle": True, "seed": 3, "num_producers": 2, "buffer_size": 4, **kwargs}
    return BufferedDataset(root, ImageDecoder(16, crop="random_resized", flip=True), **kwargs)


def test_identical_after_resume(photos):
    reference = crop_dataset(photos)
    reference.set_epoch(1)
    expected = by_index(reference)
    ds = crop_dataset(photos)
    ds.set_epoch(1)
    it = iter(ds)
    first = [next(it) for _ in range(7)]
    state = ds.state_dict()
    it.close()
    again = crop_dataset(photos)
    again.load_state_dict(state)
    got = {**by_index(first), **by_index(again)}
    assert sorted(got) == sorted(expected) == list(range(20))
    for index, image in got.items():
        assert torch.equal(image, expected[index]), index


def test_each_rank_crops_its_items_as_one_process_would(photos):
    whole = by_index(crop_dataset(photos))
    shares = [by_index(crop_dataset(photos, rank=rank, world_size=2)) for rank in (0, 1)]
    assert not set(shares[0]) & set(shares[1])
    assert sorted({**shares[0], **shares[1]}) == list(range(20))
    for share in shares:
        for index, image in share.items():
            assert torch.equal(image, whole[index])
    other_seed = by_index(crop_dataset(photos, seed=4))
    assert sum(torch.equal(other_seed[i], whole[i]) for i in whole) <= 2


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", ["pillow", "torch"])
def test_isolated_loader_and_batch_slots_give_the_same_crops(photos, monkeypatch, backend):
    """The helper process (numpy output; with backend="torch" it imports torch) and the slots
    give the crops BufferedDataset gives, each image once."""
    from helpers import isolated_leftovers

    from audiobuffer import IsolatedLoader
    from audiobuffer.loaders.slots import BatchSlotLoader

    if backend == "torch":
        pytest.importorskip("simplejpeg", reason="backend='torch' decodes JPEGs with simplejpeg")
    decoder = ImageDecoder(16, crop="random_resized", flip=True, layout="hwc", backend=backend)
    expected = {int(s["index"]): s["image"] for s in
                BufferedDataset(photos, decoder, seed=3, num_producers=1)}
    with isolated_leftovers(monkeypatch):
        with IsolatedLoader(photos, decoder, batch_size=4, shuffle=True, seed=3, num_producers=2,
                            key="image") as loader:
            batches = list(loader)
    slots = list(BatchSlotLoader(photos, decoder, batch_size=4, shuffle=True, seed=3,
                                 num_producers=2))
    for batches_of in (batches, slots):
        seen = []
        for batch in batches_of:
            assert batch["image"].shape == (4, 16, 16, 3) and batch["image"].dtype == torch.uint8
            for row, index in enumerate(batch["index"].tolist()):
                assert torch.equal(batch["image"][row], expected[index])
                seen.append(index)
        assert sorted(seen) == list(range(20))


def test_device_decoding_leaves_the_tuner_its_small_start(tmp_path, monkeypatch):
    """``jpeg="device"``: a producer reads a JPEG's bytes and header, Python that holds the GIL,
    so the tuner starts inline as for any such decoder; decoding here starts at the cores."""
    from audiobuffer.engine import pool

    monkeypatch.setattr(pool, "usable_cores", lambda: 2)
    for n in range(8):
        Image.fromarray(photo(30, 40, n)).save(tmp_path / f"{n}.jpg", quality=90)
    for jpeg, start in (("device", 0), ("host", 2)):
        decoder = ImageDecoder(16, crop="random_resized", jpeg=jpeg)
        assert decoder.releases_gil is (jpeg == "host")
        with BufferedDataset(tmp_path, decoder, seed=0) as dataset:
            assert len(list(dataset)) == 8
            assert dataset.stats().producer_history[0][1:] == (start, "start"), jpeg
