"""``ImageDecoder(backend="torch")``: simplejpeg decodes JPEGs, torch crops and resizes
(NOTE [ The torch backend ] in audiobuffer/decoders/_tensor_image.py)."""

import io
import struct
import warnings

import numpy as np
import pytest
import torch
from helpers import photo

from audiobuffer import BufferedDataset, DecodeError, ImageDecoder, WorkItem
from audiobuffer.decoders import _tensor_image

Image = pytest.importorskip("PIL.Image",
                            reason="ImageDecoder needs Pillow (pip install 'audiobuffer[image]')")
pytest.importorskip("simplejpeg", reason="backend='torch' decodes JPEGs with simplejpeg "
                                         "(pip install 'audiobuffer[image]')")


@pytest.fixture
def calls(monkeypatch):
    """The reductions simplejpeg was asked to decode at, one per call that returned pixels."""
    made = []
    decode = _tensor_image.decode_jpeg

    def counted(raw, height, width, reduction):
        pixels = decode(raw, height, width, reduction)
        if pixels is not None:
            made.append(reduction)
        return pixels

    monkeypatch.setattr("audiobuffer.decoders.image.decode_jpeg", counted)
    return made


def item(path, index=0, seed=1):
    return WorkItem(index=index, path=str(path), seed=seed)


def test_jpegs_decode_to_pillows_pixels(tmp_path, calls):
    Image.fromarray(photo(61, 83)).save(tmp_path / "rgb.jpg", quality=90)
    Image.fromarray(photo(40, 30)[..., 0]).save(tmp_path / "grey.jpg", quality=90)
    Image.fromarray(photo(48, 64)).save(tmp_path / "progressive.jpg", quality=80, progressive=True)
    for name in ("rgb.jpg", "grey.jpg", "progressive.jpg"):
        fast = ImageDecoder(backend="torch")(tmp_path / name)["image"]
        assert fast.dtype == torch.uint8 and fast.is_contiguous()
        assert torch.equal(fast, ImageDecoder()(tmp_path / name)["image"]), name
    assert calls == [1, 1, 1]  # each decoded by simplejpeg, at full size


def test_without_simplejpeg_pillow_decodes_the_same_pixels(tmp_path, calls, monkeypatch):
    Image.fromarray(photo(61, 83)).save(tmp_path / "rgb.jpg", quality=90)
    decoders = [ImageDecoder(size, crop=crop, flip=True, backend="torch")
                for size, crop in ((None, None), (32, "random_resized"), (32, "center"))]
    with_simplejpeg = [decode(item(tmp_path / "rgb.jpg"))["image"] for decode in decoders]
    assert calls == [1, 1, 1]
    monkeypatch.setattr(_tensor_image, "_TURBO", None)
    for decode, expected in zip(decoders, with_simplejpeg):
        assert torch.equal(decode(item(tmp_path / "rgb.jpg"))["image"], expected)
    assert calls == [1, 1, 1]


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_as_pillow_turns_it(tmp_path, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(photo(30, 44)).save(tmp_path / "turned.jpg", quality=95, exif=exif)
    fast = ImageDecoder(backend="torch")(tmp_path / "turned.jpg")["image"]
    assert torch.equal(fast, ImageDecoder()(tmp_path / "turned.jpg")["image"])
    stored = ImageDecoder(backend="torch", apply_exif_orientation=False)(tmp_path / "turned.jpg")
    assert stored["image"].shape == (3, 30, 44)
    where = item(tmp_path / "turned.jpg")
    cropped = ImageDecoder((12, 9), crop="random_resized", backend="torch",
                           draft=False)(where)
    slow = ImageDecoder((12, 9), crop="random_resized", draft=False)(where)
    assert (cropped["image"].int() - slow["image"].int()).abs().float().mean() < 0.5


@pytest.mark.parametrize("crop", ["random_resized", "center", None])
@pytest.mark.parametrize("resample", ["bilinear", "bicubic", "nearest"])
def test_crops_are_pillows_boxes_resized_by_torch(tmp_path, crop, resample):
    """The same boxes and flips as the Pillow backend (the same draws), resized alike: under half a
    level apart on average (a central box, fractional for Pillow, rounded to pixels here: under 3),
    where a different box or flip would be tens apart."""
    for n in range(4):
        Image.fromarray(photo(70 + 13 * n, 110 - 9 * n, n)).save(tmp_path / f"{n}.jpg", quality=92)
    for n in range(4):
        for index in range(6):
            where = item(tmp_path / f"{n}.jpg", index=index)
            kwargs = {"crop": crop, "flip": True, "resample": resample}
            fast = ImageDecoder((24, 32), backend="torch", draft=False, **kwargs)(where)["image"]
            slow = ImageDecoder((24, 32), draft=False, **kwargs)(where)["image"]
            assert fast.shape == slow.shape == (3, 24, 32)
            apart = (fast.int() - slow.int()).abs().float().mean()
            assert apart < (3 if crop == "center" else 0.5), (n, index, float(apart))


def test_a_reduced_decode_where_the_box_allows(tmp_path, calls):
    """A 1050-pixel central box scaled to 64 decodes at 1/8: the box on the reduced image, rounded
    to its pixels, resized as Pillow resizes it; near the full decode (a rounding moves the box by
    under half a reduced pixel, which this wavy picture shows more than photos do)."""
    from audiobuffer.decoders.image import center_box

    Image.fromarray(photo(1200, 1600)).save(tmp_path / "big.jpg", quality=92)
    box = center_box(1200, 1600, (64, 64), 0.875)
    top, left, height, width = (round(v / 8) for v in box)
    with Image.open(tmp_path / "big.jpg") as im:
        im.draft("RGB", (200, 150))
        reduced = im.convert("RGB")
    expected = np.asarray(reduced.crop((left, top, left + width, top + height)).resize(
        (64, 64), Image.Resampling.BILINEAR)).transpose(2, 0, 1).astype(int)
    fast = ImageDecoder(64, crop="center", backend="torch")(tmp_path / "big.jpg")["image"]
    assert calls == [8]
    assert np.abs(fast.numpy().astype(int) - expected).mean() < 0.1
    for crop in ("center", "random_resized"):
        calls.clear()
        for index in range(5):
            fast = ImageDecoder(64, crop=crop, backend="torch")(item(tmp_path / "big.jpg", index))
            full = ImageDecoder(64, crop=crop, draft=False)(item(tmp_path / "big.jpg", index))
            apart = (fast["image"].int() - full["image"].int()).abs().float().mean()
            assert apart < 10, (crop, index)
        assert max(calls) > 1, crop
    calls.clear()
    ImageDecoder(64, crop="center", draft=False, backend="torch")(tmp_path / "big.jpg")
    assert calls == [1]


def test_other_files_go_through_pillow(tmp_path, calls):
    pixels = photo(20, 26)
    Image.fromarray(pixels).save(tmp_path / "rgb.png")
    Image.fromarray(pixels).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=95)
    Image.fromarray(pixels[..., 0].astype(np.uint16) * 257).save(tmp_path / "deep.png")
    for name in ("rgb.png", "cmyk.jpg", "deep.png"):
        fast = ImageDecoder(backend="torch")(tmp_path / name)["image"]
        assert torch.equal(fast, ImageDecoder()(tmp_path / name)["image"]), name
        resized = ImageDecoder(10, crop="center", backend="torch")(tmp_path / name)["image"]
        assert resized.shape == (3, 10, 10)
    assert calls == []


def test_a_jpeg_libjpeg_warns_about_decodes_as_pillow_decodes_it(tmp_path, calls):
    """Bytes before the end marker: libjpeg warns, Pillow decodes it, strict simplejpeg refuses it;
    Pillow then reads it, to the same pixels."""
    buffer = io.BytesIO()
    Image.fromarray(photo(32, 40)).save(buffer, "JPEG", quality=90)
    data = buffer.getvalue()
    (tmp_path / "extra.jpg").write_bytes(data[:-2] + b"\x00\x00\x00" + data[-2:])
    fast = ImageDecoder(backend="torch")(tmp_path / "extra.jpg")["image"]
    assert torch.equal(fast, ImageDecoder()(tmp_path / "extra.jpg")["image"])
    assert calls == []


def test_broken_files_fail_alike(tmp_path):
    buffer = io.BytesIO()
    Image.fromarray(photo(64, 64)).save(buffer, "JPEG", quality=90)
    (tmp_path / "cut.jpg").write_bytes(buffer.getvalue()[:600])
    (tmp_path / "none.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    for name in ("cut.jpg", "none.jpg"):
        for decoder in (ImageDecoder(16, crop="random_resized"),
                        ImageDecoder(16, crop="random_resized", backend="torch")):
            with pytest.raises(DecodeError, match=name.replace(".", r"\.")):
                decoder(item(tmp_path / name))


def test_layouts_and_numpy_output(tmp_path):
    Image.fromarray(photo(50, 70)).save(tmp_path / "p.jpg", quality=90)
    where = item(tmp_path / "p.jpg", index=3)
    chw = ImageDecoder(16, crop="random_resized", flip=True, backend="torch")(where)["image"]
    hwc = ImageDecoder(16, crop="random_resized", flip=True, backend="torch", layout="hwc")(where)
    assert hwc["image"].shape == (16, 16, 3) and hwc["image"].is_contiguous()
    assert torch.equal(hwc["image"].permute(2, 0, 1), chw)
    array = ImageDecoder(16, crop="random_resized", flip=True, backend="torch",
                         tensors=False)(where)
    assert isinstance(array["image"], np.ndarray) and array["image"].flags.writeable
    np.testing.assert_array_equal(array["image"], chw.numpy())
    whole = ImageDecoder(backend="torch", layout="hwc", tensors=False)(where)["image"]
    assert whole.shape == (50, 70, 3) and whole.flags.writeable


def test_draws_are_of_seed_epoch_and_index_only(tmp_path):
    Image.fromarray(photo(60, 80)).save(tmp_path / "p.jpg", quality=90)
    decode = ImageDecoder(16, crop="random_resized", flip=True, backend="torch")

    def image(**where):
        return decode(WorkItem(path=str(tmp_path / "p.jpg"),
                               **{"index": 0, "seed": 0, "epoch": 0, **where}))["image"]

    assert torch.equal(image(seed=3), image(seed=3))
    for other in ({"seed": 4}, {"epoch": 1}, {"index": 1}):
        assert not torch.equal(image(), image(**other)), other


def test_option_validation():
    with pytest.raises(ValueError, match=r"backend must be one of 'pillow', 'torch', got 'cv2'"):
        ImageDecoder(backend="cv2")
    with pytest.raises(ValueError, match=r"backend='torch' resizes with .*got resample='lanczos'"):
        ImageDecoder(8, backend="torch", resample="lanczos")


def test_through_a_loader_and_yaml(tmp_path):
    from audiobuffer.config import build_decoder, load_config

    for n in range(6):
        folder = tmp_path / "photos" / ("a" if n % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo(40 + n, 50, n)).save(folder / f"{n}.jpg", quality=90)
    (tmp_path / "run.yaml").write_text(
        "source: {root: photos, labels: parent}\n"
        "decode: {kind: image, size: 16, crop: random_resized, flip: true, backend: torch}\n",
        encoding="utf-8", newline="\n")
    decoder = build_decoder(load_config(tmp_path / "run.yaml"))
    assert decoder.backend == "torch"
    with BufferedDataset(tmp_path / "photos", decoder, labels="parent", num_producers=2,
                         seed=0) as dataset:
        images = {int(s["index"]): s["image"] for s in dataset}
    assert len(images) == 6 and all(i.shape == (3, 16, 16) for i in images.values())


# -- the header, read without Pillow -------------------------------------------------------------

def jpeg_with(pixels, segments=(), **save):
    """A JPEG's bytes with ``segments`` (marker, payload) inserted after its start marker."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90, **save)
    data = buffer.getvalue()
    extra = b"".join(b"\xff" + bytes([marker]) + (len(payload) + 2).to_bytes(2, "big") + payload
                     for marker, payload in segments)
    return data[:2] + extra + data[2:]


@pytest.fixture
def opened(monkeypatch):
    """The files Pillow opened (``Image.open`` calls)."""
    calls = []
    real = Image.open

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(Image, "open", counted)
    return calls


@pytest.mark.parametrize("endian", ["<", ">"])
@pytest.mark.parametrize("orientation", [1, 3, 6, 8, 2, 5, 7, 4])
def test_the_orientation_is_read_as_pillow_reads_it(tmp_path, opened, endian, orientation):
    exif = Image.Exif()
    exif.endian = endian
    exif[0x0112] = orientation
    exif[0x010F] = "camera"  # another tag before it
    data = jpeg_with(photo(30, 44), [(0xE1, exif.tobytes())])
    assert data[12:14] == (b"II" if endian == "<" else b"MM")
    header = _tensor_image.jpeg_header(data)
    assert header == (30, 44, orientation)
    (tmp_path / "p.jpg").write_bytes(data)
    with Image.open(tmp_path / "p.jpg") as im:
        assert im.getexif().get(0x0112) == orientation
    opened.clear()
    fast = ImageDecoder(backend="torch")(tmp_path / "p.jpg")["image"]
    assert opened == []  # read without Pillow
    assert torch.equal(fast, ImageDecoder()(tmp_path / "p.jpg")["image"])


def test_headers_it_leaves_to_pillow(tmp_path, opened, monkeypatch):
    """An XMP packet (Pillow reads an orientation there too), two Exif segments, CMYK, a size past
    Pillow's bomb limit, broken segment bytes: Pillow reads the header, as under "pillow"."""
    pixels = photo(30, 44)
    exif = Image.Exif()
    exif[0x0112] = 6
    xmp = b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta><tiff:Orientation>8</tiff:Orientation>"
    assert _tensor_image.jpeg_header(jpeg_with(pixels)) == (30, 44, 1)
    files = {"xmp.jpg": jpeg_with(pixels, [(0xE1, xmp)]),
             "two.jpg": jpeg_with(pixels, [(0xE1, exif.tobytes()), (0xE1, exif.tobytes())]),
             "cmyk.jpg": None}
    Image.fromarray(pixels).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=90)
    for name, data in files.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        raw = (tmp_path / name).read_bytes()
        assert _tensor_image.jpeg_header(raw) is None, name
        opened.clear()
        fast = ImageDecoder(backend="torch")(tmp_path / name)["image"]
        assert len(opened) == 1, name
        assert torch.equal(fast, ImageDecoder()(tmp_path / name)["image"]), name
    with Image.open(tmp_path / "xmp.jpg") as im:
        assert im.getexif().get(0x0112) == 8  # what the fast reader would have missed
    plain = jpeg_with(pixels)
    assert _tensor_image.jpeg_header(plain[:2] + b"\x00" + plain[2:]) is None  # not a marker
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 30 * 44 - 1)
    assert _tensor_image.jpeg_header(plain) is None


@pytest.mark.parametrize("backend", ["pillow", "torch"])
def test_auto_starts_at_the_most_producers(tmp_path, monkeypatch, backend):
    """Images decode outside the GIL: the tuner starts at the cores, with no climb from inline."""
    from audiobuffer.engine import pool

    monkeypatch.setattr(pool, "usable_cores", lambda: 2)
    for n in range(8):
        Image.fromarray(photo(30, 40, n)).save(tmp_path / f"{n}.jpg", quality=90)
    with BufferedDataset(tmp_path, ImageDecoder(16, crop="random_resized", backend=backend),
                         seed=0) as dataset:
        assert len(list(dataset)) == 8
        assert dataset.stats().producer_history[0][1:] == (2, "start")


def tiff_ifd(order, entries):
    """An Exif segment's payload: a TIFF header of byte ``order`` (b"II" or b"MM", its magic
    number 42 in that order) and one IFD of ``entries`` (tag, type, count, value: SHORT values)."""
    end = "<" if order == b"II" else ">"
    ifd = struct.pack(f"{end}H", len(entries)) + b"".join(
        struct.pack(f"{end}HHIHH", tag, kind, count, value, 0)
        for tag, kind, count, value in entries)
    return b"Exif\x00\x00" + order + struct.pack(f"{end}HI", 42, 8) + ifd + b"\x00" * 4


@pytest.mark.parametrize("magic", [b"\x00\x00", b"\x2b\x00"])
def test_a_tiff_header_pillow_refuses_leaves_the_orientation_to_it(tmp_path, magic):
    """Pillow reads the Exif of a classic TIFF header only ("II*\\0", "MM\\0*"): with another magic
    number (none, BigTIFF's 43, 42 in the other order) it reads no orientation from it, or reads
    it otherwise; the image must not be turned where Pillow leaves it as stored."""
    payload = tiff_ifd(b"II", [(0x0112, 3, 1, 6)])
    payload = payload[:8] + magic + payload[10:]
    (tmp_path / "p.jpg").write_bytes(jpeg_with(photo(30, 44), [(0xE1, payload)]))
    fast = ImageDecoder(backend="torch")(tmp_path / "p.jpg")["image"]
    slow = ImageDecoder()(tmp_path / "p.jpg")["image"]
    assert fast.shape == slow.shape and torch.equal(fast, slow)


@pytest.mark.parametrize("marker", [0xD0, 0xD7, 0x01])
def test_a_marker_without_a_length_leaves_the_header_to_pillow(tmp_path, marker):
    """RSTn and TEM carry no length (libjpeg passes over them): the reader must not take the next
    marker's bytes for one and jump past the Exif segment that Pillow reads an orientation from
    (nor decode a file with a TEM, which Pillow refuses)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    payload = exif.tobytes()
    plain = jpeg_with(photo(30, 44))
    head = plain[:2] + b"\xff" + bytes([marker]) + b"\xff\xe1" + (len(payload) + 2).to_bytes(
        2, "big") + payload
    # a filler segment that ends where a reader taking b"\xff\xe1" for a length lands
    fill = 2 + 0xFFE1 + 2 - len(head) - 4
    data = head + b"\xff\xef" + (fill + 2).to_bytes(2, "big") + bytes(fill) + plain[2:]
    (tmp_path / "p.jpg").write_bytes(data)
    if marker == 0x01:  # TEM: Pillow knows no such marker, so neither backend reads the file
        for decoder in (ImageDecoder(), ImageDecoder(backend="torch")):
            with pytest.raises(DecodeError, match=r"p\.jpg"):
                decoder(tmp_path / "p.jpg")
        return
    slow = ImageDecoder()(tmp_path / "p.jpg")["image"]
    assert slow.shape == (3, 44, 30)  # Pillow turns it
    fast = ImageDecoder(backend="torch")(tmp_path / "p.jpg")["image"]
    assert fast.shape == slow.shape and torch.equal(fast, slow)


@pytest.mark.parametrize("height, width", [(50, 50), (33, 41), (17, 17)])
def test_a_small_jpeg_decoded_at_an_eighth_keeps_its_box(tmp_path, calls, monkeypatch, height,
                                                          width):
    """At 1/8 a side of 50 pixels decodes to ceil(50 / 8) = 7: the box is divided by 8 (Pillow's
    draft scale), not by 50 / 7 rounded (7), which moves and grows it."""
    from audiobuffer.decoders import image as image_module
    from audiobuffer.decoders.image import CropBox, center_box

    Image.fromarray(photo(height, width)).save(tmp_path / "small.jpg", quality=95)
    size = max(1, min(height, width) // 12)
    seen = []
    real = image_module.resized_crop

    def spy(pixels, box, size, resample):
        seen.append((pixels.shape[:2], box))
        return real(pixels, box, size, resample)

    monkeypatch.setattr(image_module, "resized_crop", spy)
    fast = ImageDecoder(size, crop="center", backend="torch")(tmp_path / "small.jpg")["image"]
    assert calls == [8] and fast.shape == (3, size, size)
    box = center_box(height, width, (size, size), 0.875)
    assert seen == [((-(-height // 8), -(-width // 8)), CropBox(*(v / 8 for v in box)))]


@pytest.mark.parametrize("segment", [
    (0xE0, b"JFIF\x00"),  # Pillow reads the version at bytes 5-6
    (0xEE, b"Adobe"),  # the same
    (0xE2, b"ICC_PROFILE\x00\x01"),  # the chunk count, byte 13, is read when the frame begins
    (0xED, b"Photoshop 3.0\x008BIM\x04\x04"),  # a resource cut before its name's length
], ids=["jfif", "adobe", "icc", "photoshop"])
def test_a_segment_pillow_cannot_parse_fails_alike(tmp_path, segment):
    """Pillow parses some segments in Python and refuses a file whose segment is cut short, which
    libjpeg passes over: the torch backend must refuse it too, with the same DecodeError."""
    (tmp_path / "cut.jpg").write_bytes(jpeg_with(photo(30, 44), [segment]))
    for decoder in (ImageDecoder(), ImageDecoder(backend="torch")):
        with pytest.raises(DecodeError, match=r"cut\.jpg': it is not an image Pillow reads"):
            decoder(tmp_path / "cut.jpg")


@pytest.mark.parametrize("segment", [
    (0xE0, b"JFIF\x00\x01\x02"), (0xEE, b"Adobe\x00\x64"),
    (0xE2, b"ICC_PROFILE\x00\x01\x01" + bytes(128)),
    (0xED, b"Photoshop 3.0\x008BIM\x04\x04\x00\x00\x00\x00\x00\x00"),
    (0xED, b"Photoshop 3.0\x008BIM\x04\x04\x00\x00\x00"),  # cut in its size: Pillow stops there
], ids=["jfif", "adobe", "icc", "photoshop", "photoshop-size"])
def test_segments_pillow_parses_are_read_without_it(tmp_path, opened, segment):
    (tmp_path / "p.jpg").write_bytes(jpeg_with(photo(30, 44), [segment]))
    fast = ImageDecoder(backend="torch")(tmp_path / "p.jpg")["image"]
    assert opened == []
    assert torch.equal(fast, ImageDecoder()(tmp_path / "p.jpg")["image"])


@pytest.mark.parametrize("order", [b"II", b"MM"])
def test_an_ifd_entry_whose_data_is_out_of_reach_stops_the_orientation(tmp_path, order):
    """Pillow stops reading IFD0 at an entry whose data (past the entry, at its offset) the segment
    does not hold, so it reads no orientation behind it: a camera's Make string at a wrong offset
    leaves the photo as stored, under either backend."""
    make = (0x010F, 2, 10, 0xFFF0)  # ASCII, 10 bytes at offset 0xFFF0: out of the segment
    payload = tiff_ifd(order, [make, (0x0112, 3, 1, 6)])
    (tmp_path / "p.jpg").write_bytes(jpeg_with(photo(30, 44), [(0xE1, payload)]))
    with pytest.warns(UserWarning, match="Truncated File Read"):
        slow = ImageDecoder()(tmp_path / "p.jpg")["image"]
    assert slow.shape == (3, 30, 44)  # not turned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's, where it reads the header
        fast = ImageDecoder(backend="torch")(tmp_path / "p.jpg")["image"]
    assert fast.shape == slow.shape and torch.equal(fast, slow)


@pytest.mark.parametrize("height, width, orientation", [
    (1, 40, 4), (40, 1, 2), (40, 1, 8), (1, 1, 3), (1, 1, 7)])
def test_a_one_pixel_side_turned_upright(tmp_path, height, width, orientation):
    """Mirroring a side of one pixel leaves numpy an array it calls contiguous, with a negative
    stride, which torch refuses: such a photo decodes as under Pillow, in both layouts."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(photo(height, width)).save(tmp_path / "thin.jpg", quality=95, exif=exif)
    for kwargs in ({}, {"size": (4, 6), "layout": "hwc"}, {"tensors": False}):
        fast = ImageDecoder(backend="torch", **kwargs)(tmp_path / "thin.jpg")["image"]
        slow = ImageDecoder(**kwargs)(tmp_path / "thin.jpg")["image"]
        if isinstance(fast, np.ndarray):
            np.testing.assert_array_equal(fast, slow)
        else:
            assert fast.shape == slow.shape and torch.equal(fast, slow), kwargs


@pytest.mark.parametrize("entry", [(0x0100, 2, 2, 0x0061), (0x0115, 2, 4, 0x6261)],
                         ids=["width-as-text", "samples-as-text"])
def test_exif_pillow_cannot_write_back_turns_alike(tmp_path, entry):
    """A tag Pillow knows as a number stored as text: Pillow reads it, and the orientation behind
    it, but ``ImageOps.exif_transpose``, which also writes the EXIF back, raised struct.error;
    both backends turn the photo upright."""
    payload = tiff_ifd(b"II", [entry, (0x0112, 3, 1, 6)])
    (tmp_path / "p.jpg").write_bytes(jpeg_with(photo(30, 44), [(0xE1, payload)]))
    slow = ImageDecoder()(tmp_path / "p.jpg")["image"]
    fast = ImageDecoder(backend="torch")(tmp_path / "p.jpg")["image"]
    assert slow.shape == (3, 44, 30) and torch.equal(fast, slow)
    cut = ImageDecoder(8, crop="random_resized", flip=True)(item(tmp_path / "p.jpg"))["image"]
    assert cut.shape == (3, 8, 8)
