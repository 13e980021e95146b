"""Images from the sources other than a folder: WebDataset shards (streamed and by index),
Hugging Face Parquet with an ``Image()`` column, a CSV of paths and labels, packed shards;
decoded by ImageDecoder. Every image is a few pixels, made by Pillow here."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import drain, write_tar

from audiobuffer import IMAGE_PATTERNS, BufferedDataset, DecodeError, ImageDecoder, Source
from audiobuffer.prepare.pack import index_shards, pack
from audiobuffer.sources.index import INDEX_NAME
from audiobuffer.sources.stream import ShardStream

Image = pytest.importorskip("PIL.Image", reason="ImageDecoder needs Pillow: pip install Pillow")

#: (extension, Pillow format) of each sample in turn: the extensions WebDataset images use.
FORMATS = [("jpg", "JPEG"), ("png", "PNG"), ("jpeg", "JPEG"), ("webp", "WEBP")]
NAMES = ["cat", "dog", "eel"]


def pixels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (12, 16, 3), dtype=np.uint8)


def encode(seed: int, fmt: str) -> bytes:
    out = io.BytesIO()
    lossless = {"lossless": True} if fmt == "WEBP" else {}
    Image.fromarray(pixels(seed)).save(out, format=fmt, **lossless)
    return out.getvalue()


def decoded(seed: int, suffix: str) -> np.ndarray:
    """What Pillow itself decodes of :func:`encode`'s file for ``suffix``."""
    fmt = dict(FORMATS)[suffix.lstrip(".")]
    with Image.open(io.BytesIO(encode(seed, fmt))) as im:
        return np.asarray(im.convert("RGB"))




def plain(sample: dict) -> np.ndarray:
    """The decoded image as ``(H, W, 3)``."""
    return sample["image"].numpy().transpose(1, 2, 0)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two WebDataset shards of 4 samples: an image (jpg, png, jpeg, webp), ``.cls`` (its class
    number) and ``.json`` (``{"label": its class name}``); and an index of them under another
    name, so that the shards without it are streamed from a scan."""
    root = tmp_path_factory.mktemp("wds")
    truth = {}
    for s in range(2):
        members = []
        for i in range(4):
            seed, (ext, fmt) = s * 4 + i, FORMATS[i]
            key = f"s{s}_{i:03d}"
            members += [(f"{key}.{ext}", encode(seed, fmt)), (f"{key}.cls", str(seed % 3).encode()),
                        (f"{key}.json", json.dumps({"label": NAMES[seed % 3]}).encode())]
            truth[f"{key}.{ext}"] = seed
        write_tar(root / f"shard-{s:06d}.tar", members)
    pattern = str(root / "shard-{000000..000001}.tar")
    index_shards(pattern, root / "images.json", progress=False)
    return pattern, root / "images.json", truth


@pytest.mark.parametrize("labels, classes", [("cls", ["0", "1", "2"]), ("label", NAMES)])
@pytest.mark.parametrize("read", ["streamed", "index"])
def test_webdataset_image_shards_with_cls_or_json_labels(shards, labels, classes, read):
    pattern, index, truth = shards
    spec = pattern if read == "streamed" else str(index)
    ds = BufferedDataset(spec, ImageDecoder(), labels=labels, num_producers=2)
    assert ds.classes == classes
    samples = drain(ds)
    assert sorted(Path(s["path"]).name for s in samples) == sorted(truth)
    for sample in samples:
        seed = truth[Path(sample["path"]).name]
        assert sample["label"] == seed % 3 and sample["cls"] == seed % 3
        assert sample["label_name"] == classes[seed % 3]
        np.testing.assert_array_equal(plain(sample), decoded(seed, Path(sample["path"]).suffix))


@pytest.mark.parametrize("read", ["streamed", "index"])
def test_the_image_is_the_plain_extension_before_a_dotted_one(tmp_path, read):
    """webdataset writes a sample's members in sorted order: ``depth.png`` before ``jpg``."""
    webdataset = pytest.importorskip("webdataset")
    with webdataset.TarWriter(str(tmp_path / "shard-000000.tar")) as sink:
        for i in range(2):
            sink.write({"__key__": f"k{i}", "jpg": encode(i, "JPEG"), "cls": i,
                        "depth.png": encode(10 + i, "PNG")})
    index_shards(str(tmp_path / "shard-000000.tar"), progress=False)
    spec = str(tmp_path / ("shard-000000.tar" if read == "streamed" else INDEX_NAME))
    samples = drain(BufferedDataset(spec, ImageDecoder(), labels="cls", num_producers=1))
    assert sorted(Path(s["path"]).name for s in samples) == ["k0.jpg", "k1.jpg"]
    for sample in samples:
        np.testing.assert_array_equal(plain(sample), decoded(sample["label"], ".jpg"))
        if read == "streamed":  # a field (an index records no bytes)
            assert isinstance(sample["depth.png"], bytes)


@pytest.fixture(scope="module")
def broken_shard(tmp_path_factory):
    """A shard of a good JPEG, a JPEG cut in half, a member of text named .jpg and a sample with no
    image at all, each with a ``.cls``; and its index."""
    root = tmp_path_factory.mktemp("broken")
    jpeg = encode(1, "JPEG")
    shard = write_tar(root / "shard-000000.tar", [
        ("good.jpg", jpeg), ("good.cls", b"0"),
        ("cut.jpg", jpeg[:len(jpeg) // 2]), ("cut.cls", b"1"),
        ("text.jpg", b"plain text, not an image"), ("text.cls", b"0"),
        ("bare.cls", b"1"),
    ])
    index_shards(str(shard), progress=False)
    return shard, root / INDEX_NAME


@pytest.mark.parametrize("read", ["streamed", "index"])
def test_a_member_that_is_no_image_is_an_error_naming_shard_and_member(broken_shard, read):
    shard, index = broken_shard
    spec = str(shard if read == "streamed" else index)
    ds = BufferedDataset(spec, ImageDecoder(8, crop="center"), num_producers=1, on_error="skip")
    assert [Path(s["path"]).name for s in drain(ds)] == ["good.jpg"]  # cut, text, bare: skipped
    with pytest.raises(DecodeError) as caught:
        drain(BufferedDataset(spec, ImageDecoder(8, crop="center"), num_producers=1))
    assert "shard-000000.tar/cut.jpg" in str(caught.value)
    with pytest.raises(DecodeError, match=r"shard-000000\.tar/text\.jpg.*not an image"):
        ImageDecoder()(BufferedDataset(spec, ImageDecoder(), num_producers=1).source.item(2)
                       if read == "index" else _streamed_item(shard, 2))


def _streamed_item(shard: Path, position: int):
    stream = ShardStream(str(shard))
    sample = list(stream.read_shard(0))[position]
    return stream.sample_item(stream.shard_item(0, epoch=0, seed=0, seq=0), sample, position)


# -- Hugging Face Parquet ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_images(tmp_path_factory):
    """A dataset with an ``Image()`` column and a ``ClassLabel``, written by ``datasets`` itself."""
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("hf")
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["zebra", "ant"])})
    ds = datasets.Dataset.from_dict({"image": [Image.fromarray(pixels(i)) for i in range(6)],
                                     "label": [i % 2 for i in range(6)]}, features=features)
    ds.to_parquet(str(root / "train.parquet"))
    return root / "train.parquet"


def test_parquet_image_column_is_found_and_decoded(hf_images):
    ds = BufferedDataset(str(hf_images), ImageDecoder(), labels="label", num_producers=2)
    assert ds.classes == ["zebra", "ant"]  # the ClassLabel's own order: its numbers stay
    samples = drain(ds)
    assert len(samples) == 6
    for sample in samples:
        row = int(Path(sample["path"]).name)
        assert sample["label"] == row % 2
        np.testing.assert_array_equal(plain(sample), pixels(row))  # datasets stores PNG


def test_parquet_image_column_beside_another_is_picked_by_name(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"mask": datasets.Image(), "image": datasets.Image()})
    ds = datasets.Dataset.from_dict({"mask": [Image.fromarray(pixels(9)[..., 0])] * 2,
                                     "image": [Image.fromarray(pixels(i)) for i in range(2)]},
                                    features=features)
    ds.to_parquet(str(tmp_path / "seg.parquet"))
    for sample in drain(BufferedDataset(str(tmp_path / "seg.parquet"), ImageDecoder())):
        np.testing.assert_array_equal(plain(sample), pixels(int(Path(sample["path"]).name)))


def test_parquet_image_column_of_paths_reads_the_files(tmp_path):
    """``datasets`` stores an ``Image()`` column cast from paths as paths without bytes."""
    datasets = pytest.importorskip("datasets")
    (tmp_path / "img").mkdir()
    for i in range(2):
        Image.fromarray(pixels(i)).save(tmp_path / "img" / f"{i}.png")
    paths = [str(tmp_path / "img" / f"{i}.png") for i in range(2)]
    table = datasets.Dataset.from_dict({"image": paths},
                                       features=datasets.Features({"image": datasets.Image()}))
    table.to_parquet(str(tmp_path / "paths.parquet"))
    samples = drain(BufferedDataset(str(tmp_path / "paths.parquet"), ImageDecoder()))
    assert sorted(Path(s["path"]).name for s in samples) == ["0.png", "1.png"]
    for sample in samples:
        np.testing.assert_array_equal(plain(sample), pixels(int(Path(sample["path"]).stem)))


def test_a_parquet_row_that_is_no_image_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # datasets.Image()'s
    rows = [{"bytes": encode(0, "PNG"), "path": "a.png"},
            {"bytes": b"not an image", "path": "b.png"}]
    pq.write_table(pa.table({"image": pa.array(rows, kind)}), tmp_path / "rows.parquet")
    spec = str(tmp_path / "rows.parquet")
    skipped = drain(BufferedDataset(spec, ImageDecoder(), on_error="skip", num_producers=1))
    assert [s["path"].rsplit("/", 2)[1:] for s in skipped] == [["0", "a.png"]]
    with pytest.raises(DecodeError, match=r"rows\.parquet/1/b\.png.*not an image"):
        drain(BufferedDataset(spec, ImageDecoder(), num_producers=1))


def test_parquet_with_several_image_columns_none_named_image_is_refused(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"left": datasets.Image(), "right": datasets.Image()})
    image = Image.fromarray(pixels(0))
    datasets.Dataset.from_dict({"left": [image], "right": [image]}, features=features).to_parquet(
        str(tmp_path / "pair.parquet"))
    from audiobuffer import SourceError
    from audiobuffer.sources.stream import ParquetStream

    with pytest.raises(SourceError, match=r"\['left', 'right'\].*audio_column="):
        BufferedDataset(str(tmp_path / "pair.parquet"), ImageDecoder())
    stream = ParquetStream(str(tmp_path / "pair.parquet"), audio_column="right")
    assert len(drain(BufferedDataset(stream, ImageDecoder()))) == 1


# -- a CSV of paths and labels -------------------------------------------------------------------

@pytest.fixture(scope="module")
def csv_listing(tmp_path_factory):
    root = tmp_path_factory.mktemp("csv")
    (root / "images" / "a").mkdir(parents=True)
    lines = ["path,number,name"]
    for i in range(4):
        Image.fromarray(pixels(i)).save(root / "images" / "a" / f"{i}.png")
        lines.append(f"images/a/{i}.png,{[2, 10][i % 2]},{['b', 'B'][i % 2]}")
    (root / "train.csv").write_text("\n".join(lines) + "\n", encoding="utf-8", newline="")
    return root / "train.csv"


@pytest.mark.parametrize("labels, classes", [("number", ["2", "10"]), ("name", ["B", "b"])])
def test_csv_paths_relative_to_it_and_labels(csv_listing, labels, classes):
    ds = BufferedDataset(str(csv_listing), ImageDecoder(), labels=labels)
    assert ds.classes == classes
    for sample in drain(ds):
        i = int(Path(sample["path"]).stem)
        assert Path(sample["path"]) == csv_listing.parent / "images" / "a" / f"{i}.png"
        assert sample["label_name"] == classes[sample["label"]]
        assert sample["label"] == classes.index(["2", "10"][i % 2] if labels == "number"
                                                else ["b", "B"][i % 2])
        np.testing.assert_array_equal(plain(sample), pixels(i))


def test_class_numbers_with_gaps_are_renumbered_with_a_warning(csv_listing, shards, caplog):
    """Labels 2 and 10 become classes 0 and 1: said once, as it is not what a class number means."""
    caplog.set_level("WARNING", logger="audiobuffer")
    Source(csv_listing, labels="number")
    ShardStream(shards[0], labels="cls")  # the numbers 0, 1, 2: no warning
    warned = [r.getMessage() for r in caplog.records if "renumbered" in r.getMessage()]
    assert len(warned) == 1 and "'number'" in warned[0] and "10 -> 1" in warned[0], warned


# -- packed shards: class ids as the folder tree gives them --------------------------------------

@pytest.fixture(scope="module")
def numbered_tree(tmp_path_factory):
    """Class folders '2' and '10', two images each, packed with their folder labels."""
    root = tmp_path_factory.mktemp("tree")
    for n, name in enumerate(("2", "10")):
        (root / "tree" / name).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(pixels(n * 2 + i)).save(root / "tree" / name / f"{i}.png")
    pack(root / "tree", root / "packed", shard_size=10**6, labels="parent", patterns=IMAGE_PATTERNS,
         progress=False)
    return root / "tree", root / "packed"


@pytest.mark.parametrize("parser", ["json", "arrow"])
def test_packed_index_numbers_classes_as_the_folder_tree(numbered_tree, parser, monkeypatch):
    import audiobuffer.sources.table as table

    if parser == "arrow":
        monkeypatch.setattr(table, "ARROW_ROWS", 0)  # the bulk reader of a large index, on this one
    tree, packed = numbered_tree
    folder = Source(tree, patterns=IMAGE_PATTERNS, labels="parent")
    assert folder.classes == ["10", "2"]  # torchvision's ImageFolder: plain sorted
    want = {Path(p).relative_to(tree).as_posix(): int(c)
            for p, c in zip(folder.paths, folder.label_of)}
    for labels in ("label", "parent"):
        index = Source(packed / INDEX_NAME, labels=labels)
        assert index.classes == folder.classes, labels
        got = {p.split(".tar/", 1)[1]: int(c) for p, c in zip(index.paths, index.label_of)}
        assert got == want, labels
    stream = BufferedDataset(str(packed / "shard-000000.tar"), ImageDecoder(), labels="label")
    assert stream.classes == folder.classes
    got = {s["path"].split(".tar/", 1)[1]: s["label"] for s in drain(stream)}
    assert got == want


@pytest.mark.parametrize("read", ["indexed again", "streamed without the index"])
def test_packed_shards_keep_the_folder_order_without_their_index(numbered_tree, tmp_path, read):
    """The sidecars number the labels too, so the order outlives the index."""
    tree, packed = numbered_tree
    folder = Source(tree, patterns=IMAGE_PATTERNS, labels="parent")
    shard = tmp_path / "shard-000000.tar"
    shard.write_bytes((packed / "shard-000000.tar").read_bytes())
    if read == "indexed again":
        index_shards(str(shard), progress=False)
        source = Source(tmp_path / INDEX_NAME, labels="label")
    else:
        source = ShardStream(str(shard), labels="label")
    assert source.classes == folder.classes == ["10", "2"]


@pytest.mark.parametrize("parser", ["json", "arrow"])
def test_an_index_whose_classes_miss_a_label_is_refused(numbered_tree, tmp_path, parser,
                                                        monkeypatch):
    import audiobuffer.sources.table as table

    if parser == "arrow":
        monkeypatch.setattr(table, "ARROW_ROWS", 0)
    _, packed = numbered_tree
    text = (packed / INDEX_NAME).read_text(encoding="utf-8")
    data = json.loads(text)
    assert data["classes"] == ["10", "2"]
    data["classes"] = ["10"]
    (tmp_path / "shard-000000.tar").write_bytes((packed / "shard-000000.tar").read_bytes())
    (tmp_path / INDEX_NAME).write_text(json.dumps(data), encoding="utf-8", newline="")
    from audiobuffer import SourceError

    with pytest.raises(SourceError, match=r"label '2'.*classes"):
        Source(tmp_path / INDEX_NAME, labels="label")


# -- every draw from (seed, epoch, item) -----------------------------------------------------------

def crops(spec, **kwargs) -> dict[str, torch.Tensor]:
    decoder = ImageDecoder(8, crop="random_resized", flip=True)
    ds = BufferedDataset(spec, decoder, shuffle=True, num_producers=2, **kwargs)
    ds.set_epoch(1)
    return {s["path"]: s["image"] for s in drain(ds)}


@pytest.mark.parametrize("source", ["streamed", "index", "parquet", "csv"])
def test_same_seed_same_crops(shards, hf_images, csv_listing, source):
    spec = {"streamed": shards[0], "index": str(shards[1]), "parquet": str(hf_images),
            "csv": str(csv_listing)}[source]
    first, second, other = crops(spec, seed=5), crops(spec, seed=5), crops(spec, seed=6)
    assert first.keys() == second.keys() == other.keys()
    assert all(torch.equal(first[p], second[p]) for p in first)
    assert not all(torch.equal(first[p], other[p]) for p in first)


# -- the same sources through YAML -----------------------------------------------------------------

@pytest.mark.parametrize("source", ["streamed", "index", "packed", "parquet", "csv"])
def test_yaml_image_sources(shards, numbered_tree, hf_images, csv_listing, source):
    from audiobuffer.config import build_dataset, parse_config

    section = {"streamed": {"root": shards[0], "labels": "cls"},
               "index": {"root": str(shards[1]), "labels": "cls"},
               "packed": {"root": str(numbered_tree[1] / INDEX_NAME), "labels": "label"},
               "parquet": {"root": str(hf_images), "labels": "label"},
               "csv": {"manifest": str(csv_listing), "labels": "name"}}[source]
    config = parse_config({"source": section, "decode": {"kind": "image", "size": 8,
                                                         "crop": "random_resized", "flip": True}})
    ds = build_dataset(config)
    assert ds.classes == {"streamed": ["0", "1", "2"], "index": ["0", "1", "2"],
                          "packed": ["10", "2"], "parquet": ["zebra", "ant"],
                          "csv": ["B", "b"]}[source]
    samples = drain(ds)
    assert len(samples) == {"streamed": 8, "index": 8, "packed": 4, "parquet": 6, "csv": 4}[source]
    assert all(s["image"].shape == (3, 8, 8) for s in samples)
