import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import make_corpus

from audiobuffer import Source, SourceError
from audiobuffer.engine.plan import epoch_order, shard
from audiobuffer.sources import AUDIO_PATTERNS


@pytest.fixture
def corpus(tmp_path):
    paths = make_corpus(tmp_path / "data", 6, classes=3)
    (tmp_path / "data" / "notes.txt").write_text("not audio")
    return tmp_path / "data", paths


def test_directory_lists_audio_recursively_and_sorted(corpus):
    root, paths = corpus
    source = Source(root)
    assert source.paths == sorted(str(p) for p in paths)
    assert len(source) == 6


def test_directory_patterns(corpus, tmp_path):
    root, _ = corpus
    assert len(Source(root, patterns=["class1/*.wav"])) == 2
    assert len(Source(root, patterns="**/*.wav")) == 6


def test_a_folder_is_listed_as_each_pattern_globs_it(tmp_path):
    """The ``**/NAME`` patterns are matched in one walk: the same files as a glob per pattern,
    folders named like files and names in another case left out, other patterns as they are."""
    from audiobuffer.sources import IMAGE_PATTERNS
    from audiobuffer.sources.listing import _list_dir

    rng = np.random.default_rng(0)
    names = ["a.jpg", "b.JPG", "c.Jpg", "d.png", "e.txt", ".hidden.jpeg", "f.jpg.bak", "g.tiff",
             "h.wav"]
    for i in range(60):
        folder = tmp_path.joinpath(*[f"d{rng.integers(3)}" for _ in range(rng.integers(4))])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}_{names[rng.integers(len(names))]}").write_bytes(b"x")
    (tmp_path / "d0" / "folder.jpg").mkdir(parents=True, exist_ok=True)  # a folder, not a file
    (tmp_path / ".hid").mkdir()
    (tmp_path / ".hid" / "in_hidden.jpg").write_bytes(b"x")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "beyond.jpg").write_bytes(b"x")
    try:
        (tmp_path / "linked.jpg").symlink_to(tmp_path / "d0" / "folder.jpg")  # a link to a folder
        (tmp_path / "d1").mkdir(exist_ok=True)
        (tmp_path / "d1" / "file_link.png").symlink_to(outside / "beyond.jpg")  # to a file
        (tmp_path / "d1" / "broken.jpg").symlink_to(tmp_path / "gone.jpg")
        (tmp_path / "folder_link").symlink_to(outside, target_is_directory=True)  # not walked
    except OSError:  # links need a privilege on Windows
        pass
    for patterns in (IMAGE_PATTERNS, AUDIO_PATTERNS, ("**/*.jpg", "d1/*.png", "*.txt"),
                     ("**/[0-9]_*.jpg",)):
        globbed = sorted({str(p) for pattern in patterns for p in tmp_path.glob(pattern)
                          if p.is_file()})
        assert _list_dir(tmp_path, patterns) == globbed, patterns
    listed = _list_dir(tmp_path, IMAGE_PATTERNS)
    assert not [p for p in listed if p.endswith((".Jpg", "folder.jpg"))]



def test_the_current_folder_is_listed_as_a_glob_names_it(tmp_path, monkeypatch):
    """``Source(".")``: the paths a glob gives (``a/1.wav``, no ``./``), so a walked pattern and a
    globbed one name a file alike and it is listed once."""
    from audiobuffer.sources.listing import _list_dir

    (tmp_path / "a").mkdir()
    for name in ("a/1.wav", "2.wav"):
        (tmp_path / name).write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    expected = [str(Path("2.wav")), str(Path("a/1.wav"))]
    assert _list_dir(Path("."), ["**/*.wav"]) == expected
    assert _list_dir(Path("."), ["**/*.wav", "*.wav"]) == expected

@pytest.mark.parametrize("labels, expected", [
    ("parent", ["class0", "class1", "class2"]),
    (r"^(\d+)_", ["0", "1", "2"]),
    (re.compile(r"^\d+"), ["0", "1", "2"]),
    (lambda p: p.endswith("0.wav"), ["False", "True"]),
])
def test_labels(corpus, labels, expected):
    root, _ = corpus
    source = Source(root, labels=labels)
    assert source.classes == expected
    for i in range(len(source)):
        item = source.item(i)
        assert source.classes[item.label] == item.label_name


def test_no_labels(corpus):
    source = Source(corpus[0])
    item = source.item(0)
    assert item.label is None and item.label_name is None and source.classes == []


def test_numeric_classes_sort_numerically(tmp_path):
    paths = [str(tmp_path / f"{d}_x.wav") for d in (10, 9, 2)]
    assert Source(paths, labels=r"^(\d+)_").classes == ["2", "9", "10"]


def test_folder_classes_in_torchvisions_image_folder_order(tmp_path):
    """labels="parent": the class folders' names in plain sorted order, as torchvision's ImageFolder
    (``find_classes``: ``sorted(entry.name for entry in os.scandir(root) if entry.is_dir())``), so a
    checkpoint's class indices carry over; '10' comes before '2', 'B' before 'a'."""
    import os

    for name in ("2", "10", "a", "B", "1"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.wav").write_bytes(b"")
    image_folder = sorted(entry.name for entry in os.scandir(tmp_path) if entry.is_dir())
    assert image_folder == ["1", "10", "2", "B", "a"]
    source = Source(tmp_path, labels="parent")
    assert source.classes == image_folder
    assert source.class_to_idx == {name: i for i, name in enumerate(image_folder)}
    for i in range(len(source)):
        item = source.item(i)
        assert item.label == image_folder.index(item.label_name)


def test_label_regex_errors(corpus):
    root, _ = corpus
    with pytest.raises(SourceError, match=r"does not match the label expression '\^x'"):
        Source(root, labels="^x")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        Source(root, labels="(unclosed")
    with pytest.raises(TypeError, match="labels"):
        Source(root, labels=3)


def test_csv_manifest_with_fields_and_relative_paths(corpus, tmp_path):
    root, paths = corpus
    manifest = root / "train.csv"
    lines = ["path,speaker,digit"] + [f"{p.relative_to(root)},spk{i % 2},{i % 3}" for i, p in enumerate(paths)]
    manifest.write_text("\n".join(lines) + "\n")
    source = Source(manifest, labels="digit")
    assert source.paths == [str(p) for p in paths]
    item = source.item(4)
    assert item.fields == {"speaker": "spk0", "digit": "1"}
    assert item.label_name == "1" and source.classes == ["0", "1", "2"]


def test_tsv_and_jsonl_manifests(corpus):
    root, paths = corpus
    (root / "m.tsv").write_text("file\tx\n" + "".join(f"{p}\t{i}\n" for i, p in enumerate(paths)))
    assert Source(root / "m.tsv", path_column="file").item(2).fields == {"x": "2"}
    rows = [json.dumps({"path": str(p), "duration": 0.1, "tags": ["a"]}) for p in paths]
    (root / "m.jsonl").write_text("\n".join(rows) + "\n\n")
    item = Source(root / "m.jsonl").item(1)
    assert item.fields == {"duration": 0.1, "tags": ["a"]}


def test_manifest_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("file,label\na.wav,1\n")
    with pytest.raises(SourceError, match=r"has no path column 'path'; its columns are \['file', 'label'\]"):
        Source(bad)
    empty = tmp_path / "empty.csv"
    empty.write_text("path\n")
    with pytest.raises(SourceError, match="no files in manifest"):
        Source(empty)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"path": "a.wav"}\n{oops\n')
    with pytest.raises(SourceError, match="line 2: invalid JSON"):
        Source(broken)
    nested = tmp_path / "nested.jsonl"
    nested.write_text('{"path": "a.wav"}\n' + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(SourceError, match="line 2: JSON nested too deeply"):
        Source(nested)
    with pytest.raises(SourceError, match="does not exist"):
        Source(tmp_path / "missing.csv")


def test_source_errors(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        Source(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no files in"):
        Source(tmp_path / "empty")
    (tmp_path / "a.wav").write_bytes(b"")
    with pytest.raises(SourceError, match="neither a directory nor a manifest"):
        Source(tmp_path / "a.wav")
    with pytest.raises(TypeError, match="source must be"):
        Source(42)
    with pytest.raises(TypeError, match="must hold file paths"):
        Source(["a.wav", 3])


def test_work_item_rng_is_reproducible_and_distinct(corpus):
    source = Source(corpus[0])
    a = source.item(0, epoch=1, seed=7).rng().integers(1 << 30)
    assert a == source.item(0, epoch=1, seed=7).rng().integers(1 << 30)
    assert a != source.item(0, epoch=2, seed=7).rng().integers(1 << 30)


def test_epoch_order():
    assert epoch_order(5, shuffle=False, seed=0, epoch=3).tolist() == [0, 1, 2, 3, 4]
    a = epoch_order(100, shuffle=True, seed=1, epoch=0)
    assert sorted(a.tolist()) == list(range(100))
    assert np.array_equal(a, epoch_order(100, shuffle=True, seed=1, epoch=0))
    assert not np.array_equal(a, epoch_order(100, shuffle=True, seed=1, epoch=1))


@pytest.mark.parametrize("n, count", [(10, 3), (2, 4), (0, 2), (7, 1)])
def test_shards_cover_each_item_once(n, count):
    order = epoch_order(n, shuffle=True, seed=0, epoch=0)
    parts = [shard(order, i, count).tolist() for i in range(count)]
    assert sorted(sum(parts, [])) == list(range(n))
    with pytest.raises(ValueError):
        shard(order, count, count)


# -- manifests as users write them -----------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_manifest_with_a_utf8_byte_order_mark(corpus, suffix):
    # Spreadsheet programs save "CSV UTF-8" with a BOM; it is not part of the first column's name.
    root, paths = corpus
    if suffix == ".jsonl":
        text = "".join(json.dumps({"path": str(p), "speaker": f"spk{i % 2}"}) + "\n" for i, p in enumerate(paths))
    else:
        sep = "," if suffix == ".csv" else "\t"
        text = f"path{sep}speaker\n" + "".join(f"{p}{sep}spk{i % 2}\n" for i, p in enumerate(paths))
    manifest = root / f"bom{suffix}"
    manifest.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    source = Source(manifest, labels="speaker")
    assert source.paths == [str(p) for p in paths]
    assert source.classes == ["spk0", "spk1"] and source.item(1).fields == {"speaker": "spk1"}


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_nul_in_a_manifest_path_is_rejected(tmp_path, suffix):
    manifest = tmp_path / f"m{suffix}"
    if suffix == ".csv":
        manifest.write_text("path\na.wav\nb.wav\x00.txt\n")
    else:
        manifest.write_text(json.dumps({"path": "a.wav"}) + "\n" + json.dumps({"path": "b.wav\x00.txt"}) + "\n")
    with pytest.raises(SourceError, match=r"row 2: the path 'b\.wav\\x00\.txt' holds a NUL character"):
        Source(manifest)


def test_nul_in_a_listed_path_is_rejected():
    with pytest.raises(SourceError, match=r"entry 1: the path 'b\.wav\\x00x' holds a NUL character"):
        Source(["a.wav", "b.wav\x00x"])


def test_labels_that_are_not_a_column_list_the_columns(corpus):
    root, paths = corpus
    manifest = root / "m.csv"
    manifest.write_text("path,speaker\n" + "".join(f"{p},spk{i % 2}\n" for i, p in enumerate(paths)))
    with pytest.raises(SourceError, match=r"labels='speakr' is not a column of the manifest; its columns are "
                                          r"\['path', 'speaker'\]"):
        Source(manifest, labels="speakr")
    # A regular expression is still one; when it matches nothing, the error lists the columns too.
    assert Source(manifest, labels=r"^(\d+)_").classes == ["0", "1", "2"]
    assert Source(manifest, labels=re.compile("wav")).classes == ["wav"]
    with pytest.raises(SourceError, match=r"does not match the label expression '\^spk\.'.*its columns are "
                                          r"\['path', 'speaker'\]"):
        Source(manifest, labels="^spk.")
    # Directories and lists keep taking a string as a regular expression.
    assert Source(root, labels="wav").classes == ["wav"]


def test_repr(corpus, tmp_path):
    root, paths = corpus
    assert repr(Source(root, labels="parent")) == (
        f"Source({str(root)!r} (patterns {list(AUDIO_PATTERNS)}), items=6, classes=3)")
    assert repr(Source([str(p) for p in paths[:2]])) == "Source(a list of 2 paths, items=2)"
    manifest = root / "m.csv"
    manifest.write_text("path\n" + "".join(f"{p}\n" for p in paths))
    assert repr(Source(manifest)) == f"Source(manifest {str(manifest)!r}, items=6)"
