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
