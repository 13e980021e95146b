"""The photo corpus (audiobuffer/cli/_photos.py) the image benchmark and training script use."""

import pytest
from PIL import Image

from audiobuffer.cli._photos import make_photo_corpus, shipped_photos

pytestmark = pytest.mark.skipif(not shipped_photos(), reason="no shipped photograph installed")


def _sizes(folder):
    return {p.relative_to(folder).as_posix(): Image.open(p).size for p in folder.rglob("*.jpg")}


def test_a_class_a_cell_of_each_photograph_and_sizes_within_range(tmp_path):
    photos = len(shipped_photos())
    made = make_photo_corpus(tmp_path, 4 * photos, seed=3, classes=None, sides=(40, 80),
                             grid=(2, 2))
    sizes = _sizes(made)
    folders = sorted({name.split("/")[0] for name in sizes})
    stems = sorted(p.stem for p in shipped_photos())
    assert folders == sorted(f"{s}-r{r}c{c}" for s in stems for r in (0, 1) for c in (0, 1))
    assert len(sizes) == 4 * photos
    assert all(40 <= side <= 80 for size in sizes.values() for side in size)


def test_made_once_and_the_same_from_the_same_seed(tmp_path):
    first = _sizes(make_photo_corpus(tmp_path / "a", 6, seed=1, classes=2, sides=(40, 60)))
    assert sorted({name.split("/")[0] for name in first}) == ["class00", "class01"]
    again = make_photo_corpus(tmp_path / "b", 6, seed=1, classes=2, sides=(40, 60))
    assert _sizes(again) == first
    (again / "class00" / "00000.jpg").unlink()
    make_photo_corpus(again, 6, seed=1, classes=2, sides=(40, 60))  # the marker says it is made
    assert len(_sizes(again)) == 5


def test_a_corpus_of_other_settings_or_photographs_replaces_the_one_there(tmp_path, monkeypatch):
    make_photo_corpus(tmp_path, 12, seed=1, classes=None, sides=(40, 60))
    # fewer: none of the 12 is left
    make_photo_corpus(tmp_path, 6, seed=1, classes=None, sides=(40, 60))
    assert len(_sizes(tmp_path)) == 6
    photos = shipped_photos()
    if len(photos) < 2:
        pytest.skip("one shipped photograph: no package to install later")
    monkeypatch.setattr("audiobuffer.cli._photos.shipped_photos", lambda: photos[:1])
    make_photo_corpus(tmp_path, 6, seed=1, classes=None, sides=(40, 60))
    assert {name.split("/")[0] for name in _sizes(tmp_path)} == {photos[0].stem}
    monkeypatch.setattr("audiobuffer.cli._photos.shipped_photos", lambda: photos)
    # a package came: made again
    make_photo_corpus(tmp_path, 6, seed=1, classes=None, sides=(40, 60))
    assert {name.split("/")[0] for name in _sizes(tmp_path)} == {p.stem for p in photos}
    assert len(_sizes(tmp_path)) == 6 and len(list(tmp_path.glob("corpus-*.done"))) == 1
