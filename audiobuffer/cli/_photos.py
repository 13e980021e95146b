"""A JPEG corpus in class folders made from the photographs that installed packages ship.

``benchmarks/bench_images.py`` times epochs over one; ``scripts/train_image.py`` trains on one.
Each image is a random crop of a photograph (scikit-learn's ``china.jpg`` and ``flower.jpg``,
matplotlib's ``grace_hopper.jpg``), scaled and mirrored half the time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["PHOTOS", "make_photo_corpus", "shipped_photos"]

#: The photographs packages ship: (package, path inside it).
PHOTOS = (
    ("sklearn", "datasets/images/china.jpg"),
    ("sklearn", "datasets/images/flower.jpg"),
    ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
)


def shipped_photos() -> list[Path]:
    """The photographs found in the installed packages (without importing them)."""
    found = []
    for package, inside in PHOTOS:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin is not None:
            path = Path(spec.origin).parent / inside
            if path.is_file():
                found.append(path)
    return found


def make_photo_corpus(folder: Path, n: int, *, seed: int = 0, classes: int | None = 10,
                      sides: tuple[int, int] = (300, 600), grid: tuple[int, int] = (1, 1)) -> Path:
    """``n`` JPEGs (quality 90) of ``sides`` pixels a side in class folders under ``folder``, made
    once (a marker file names the settings and the photographs; a corpus left half made is made
    again, and one made with other settings or photographs is replaced).

    Image ``i`` is a random crop of photograph ``i % len(photos)`` (of its cell ``i //
    len(photos)``, in turn, of a ``grid`` laid over it), from a third of the cell's width and height
    to all of it, scaled so its longer side lies in ``sides`` (and both sides within it), and
    mirrored half the time; every draw from ``seed``.

    Args:
        classes: that many folders ``class00``, ``class01``, ... dealt the images in turn (labels
            that say nothing of the pixels); ``None``: a folder per photograph, named after its
            file (``china``, ``flower``, ``grace_hopper``), and with a ``grid``, per cell of one
            (``china-r0c1``: row 0, column 1), so the label says where the crop is from.
        sides: the least and the most pixels a side.
        grid: rows and columns of cells each photograph is cut into.

    Raises:
        FileNotFoundError: no shipped photograph is installed (scikit-learn or matplotlib).
    """
    import numpy as np
    from PIL import Image

    low, high = sides
    rows, columns = grid
    found = shipped_photos()
    if not found:
        raise FileNotFoundError("no shipped photograph found: pip install scikit-learn or "
                                "matplotlib")
    made_of = "+".join(p.stem for p in found)  # a package installed later makes another corpus
    marker = folder / (f"corpus-{n}-{seed}-{classes or 'photo'}-{low}-{high}-{rows}x{columns}-"
                       f"{made_of}.done")
    if marker.exists():
        return folder
    stale = [m for m in folder.glob("corpus-*.done") if m != marker]
    if stale:  # made here before with other settings: its crops go, so that none is mixed in
        for old in folder.glob("*/[0-9][0-9][0-9][0-9][0-9].jpg"):
            old.unlink()
        for old in stale:
            old.unlink()
    photos = [Image.open(p).convert("RGB") for p in found]
    rng = np.random.default_rng(seed)
    for i in range(n):
        photo = photos[i % len(photos)]
        row, column = divmod(i // len(photos) % (rows * columns), columns)
        x0, y0 = photo.width * column // columns, photo.height * row // rows
        width = photo.width * (column + 1) // columns - x0
        height = photo.height * (row + 1) // rows - y0
        w = int(rng.integers(width // 3, width + 1))
        h = int(rng.integers(height // 3, height + 1))
        left = x0 + int(rng.integers(0, width - w + 1))
        top = y0 + int(rng.integers(0, height - h + 1))
        long_side = int(rng.integers(low, high + 1))
        scale = long_side / max(w, h)
        size = (max(low, round(w * scale)), max(low, round(h * scale)))  # both sides in range
        size = (min(size[0], high), min(size[1], high))
        image = photo.resize(size, Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        label = found[i % len(photos)].stem + (f"-r{row}c{column}" if rows * columns > 1 else "")
        label = label if classes is None else f"class{i % classes:02d}"
        target = folder / label
        target.mkdir(parents=True, exist_ok=True)
        image.save(target / f"{i:05d}.jpg", quality=90)
    marker.write_text("", encoding="utf-8", newline="\n")
    return folder
