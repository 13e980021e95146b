"""Images: an epoch of training crops through audiobuffer against a Pillow ``Dataset`` and a
``DataLoader``.

The corpus: ``--images`` (2000) JPEGs of 300 to 600 pixels a side in 10 class folders, made from
the photographs that scikit-learn (``china.jpg``, ``flower.jpg``) and matplotlib
(``grace_hopper.jpg``) ship, by random crops, scales and mirror images (quality 90; made once into
``--corpus``, then reused). The transform: a random resized crop to 224 (torchvision's
``RandomResizedCrop`` rule) and a flip, uint8 ``(3, 224, 224)``, batches of 64.

The approaches, each an epoch in a fresh process (torch, Pillow and audiobuffer imported before the
clock):

- ``audiobuffer``: ``BufferedDataset(root, ImageDecoder(224, crop="random_resized", flip=True),
  labels="parent")`` and ``DataLoader(batch_size=64, collate_fn=image_collate)``, threads;
- ``audiobuffer-nodraft``: the same with ``draft=False`` (every JPEG decoded at full size);
- ``pillow-wN-fork`` / ``-spawn``: the pipeline as users write it without torchvision (which does
  not load where torch is the CPU build): a ``Dataset`` that opens each file with Pillow,
  ``convert("RGB")``, draws the box by ``RandomResizedCrop``'s rule with torch's generator, crops,
  resizes and flips with Pillow, fed by ``DataLoader(num_workers=N)``.

Each figure is the median of ``--runs`` (3) runs, the approaches taking turns: images/s over the
epoch, the first batch (from the loader's construction), and the peak resident memory of the
process tree (the process and its workers, summed). The load average is printed before and after;
``--save FILE`` writes the results as JSON.

    python benchmarks/bench_images.py
    python benchmarks/bench_images.py --images 500 --runs 1 --approaches audiobuffer,pillow-w2-fork
    python benchmarks/bench_images.py --draft   # the reduced decode alone, on 1600 x 1200 photos
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

from audiobuffer.cli._photos import make_photo_corpus, shipped_photos

BATCH = 64
SIZE = 224
CLASSES = 10
APPROACHES = (
    "audiobuffer",
    "audiobuffer-nodraft",
    "pillow-w0",
    "pillow-w2-fork",
    "pillow-w2-spawn",
)


# -- the Pillow Dataset, as users write it ---------------------------------------------------------


class PillowFolder:
    """A map-style ``Dataset`` over class folders: Pillow, ``RandomResizedCrop``'s rule, a flip."""

    def __init__(self, root: str) -> None:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = [
            (os.path.join(root, c, f), i)
            for i, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(root, c)))
        ]

    def __len__(self) -> int:
        return len(self.samples)

    @staticmethod
    def box(height: int, width: int) -> tuple[int, int, int, int]:
        """``RandomResizedCrop.get_params`` with scale (0.08, 1) and ratio (3/4, 4/3)."""
        import math

        import torch

        area, log_ratio = height * width, (math.log(3 / 4), math.log(4 / 3))
        for _ in range(10):
            target = area * torch.empty(1).uniform_(0.08, 1.0).item()
            aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
            w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, size=(1,)).item())
                left = int(torch.randint(0, width - w + 1, size=(1,)).item())
                return top, left, h, w
        ratio = width / height
        if ratio < 3 / 4:
            w, h = width, int(round(width / (3 / 4)))
        elif ratio > 4 / 3:
            w, h = int(round(height * (4 / 3))), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __getitem__(self, index: int) -> dict[str, Any]:
        import numpy as np
        import torch
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as im:
            image = im.convert("RGB")
        top, left, h, w = self.box(image.height, image.width)
        image = image.crop((left, top, left + w, top + h)).resize(
            (SIZE, SIZE), Image.Resampling.BILINEAR
        )
        if torch.rand(1).item() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)
        return {"image": pixels, "label": label}


# -- the reduced JPEG decode on large photos -------------------------------------------------------


def draft_gain(folder: Path, runs: int) -> list[dict[str, Any]]:
    """Milliseconds a decode of 1600 x 1200 JPEGs (the shipped photographs scaled up) to 224
    takes, with the reduced decode and without, in this process, one thread: the median of
    ``runs`` rounds of 40."""
    from PIL import Image

    from audiobuffer import ImageDecoder, WorkItem

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, photo in enumerate(shipped_photos()):
        path = folder / f"large-{n}.jpg"
        if not path.exists():
            with Image.open(photo) as im:
                im.convert("RGB").resize((1600, 1200), Image.Resampling.BICUBIC).save(
                    path, quality=90
                )
        paths.append(str(path))
    rows = []
    for crop in ("random_resized", "center"):
        for draft in (True, False):
            decode = ImageDecoder(SIZE, crop=crop, draft=draft)
            rounds = []
            for _ in range(runs):
                start = time.perf_counter()
                for i in range(40):
                    decode(WorkItem(index=i, path=paths[i % len(paths)], seed=0))
                rounds.append((time.perf_counter() - start) / 40 * 1000)
            rows.append({"crop": crop, "draft": draft, "ms_per_image": statistics.median(rounds)})
    return rows


# -- one epoch, in a child process -----------------------------------------------------------------


def child(approach: str, root: str, out: str) -> None:
    """One epoch of ``approach`` over ``root``; its figures written to ``out`` as JSON."""
    import numpy  # noqa: F401 - what each approach imports, imported before the clock
    import PIL.Image  # noqa: F401
    import torch
    from torch.utils.data import DataLoader

    from audiobuffer import BufferedDataset, ImageDecoder
    from audiobuffer.collate import image_collate

    start = time.perf_counter()
    if approach.startswith("audiobuffer"):
        decoder = ImageDecoder(
            SIZE, crop="random_resized", flip=True, draft=approach == "audiobuffer"
        )
        dataset: Any = BufferedDataset(root, decoder, labels="parent", shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=BATCH, collate_fn=image_collate)
    else:
        workers, method = approach.removeprefix("pillow-w").partition("-")[::2]
        torch.manual_seed(0)
        dataset = PillowFolder(root)
        loader = DataLoader(
            dataset,
            batch_size=BATCH,
            shuffle=True,
            num_workers=int(workers),
            multiprocessing_context=method or None,
        )
    first = None
    images = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        images += len(batch["label"])
    total = time.perf_counter() - start
    if hasattr(dataset, "close"):
        dataset.close()
    Path(out).write_text(
        json.dumps({"images": images, "total_s": total, "first_batch_s": first}), encoding="utf-8",
        newline="\n",
    )


def run_once(approach: str, root: Path) -> dict[str, float]:
    """One epoch of ``approach`` in a fresh process, with the peak RSS of its process tree."""
    from audiobuffer.cli._measure import run_with_peak_rss

    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        out = Path(tmp) / "figures.json"
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(harness.REPO), os.environ.get("PYTHONPATH", "")]),
        )
        code, err, peak = run_with_peak_rss(
            [
                sys.executable,
                __file__,
                "--child",
                approach,
                "--corpus",
                str(root),
                "--out",
                str(out),
            ],
            timeout=1800,
            env=env,
        )
        if code != 0 or not out.exists():
            raise RuntimeError(f"{approach} failed (exit {code}): {err}")
        figures = json.loads(out.read_text(encoding="utf-8"))
    return {
        **figures,
        "images_per_s": figures["images"] / figures["total_s"],
        "peak_mib": peak / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--images", type=int, default=2000, help="JPEGs in the corpus (default 2000)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each approach (default 3)")
    parser.add_argument(
        "--approaches",
        default=",".join(APPROACHES),
        help=f"comma-separated, of {', '.join(APPROACHES)}",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help="the corpus folder (default: one in the temporary folder, made once)",
    )
    parser.add_argument(
        "--save", type=Path, default=None, help="write the results as JSON to this file"
    )
    parser.add_argument(
        "--draft",
        action="store_true",
        help="instead: the decode of 1600 x 1200 JPEGs to 224 with and without draft mode",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, str(args.corpus), args.out)
        return
    approaches = [a for a in args.approaches.split(",") if a]
    unknown = sorted(set(approaches) - set(APPROACHES))
    if unknown:
        parser.error(f"unknown approaches {unknown}; choose from {', '.join(APPROACHES)}")
    folder = args.corpus or Path(tempfile.gettempdir()) / f"audiobuffer-bench-images-{args.images}"
    if args.draft:
        gain = draft_gain(folder / "large", args.runs)
        print(
            harness.table(
                ["crop", "draft", "ms per image"],
                [[r["crop"], r["draft"], f"{r['ms_per_image']:.1f}"] for r in gain],
            )
        )
        print(f"load average {harness.load_average()}")
        return
    made = time.perf_counter()
    root = make_photo_corpus(folder, args.images, classes=CLASSES)
    print(
        f"corpus: {args.images} JPEGs in {root} "
        f"({time.perf_counter() - made:.1f} s to make or find)"
    )
    load_before = harness.load_average()
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in approaches}
    for _ in range(args.runs):  # the approaches take turns, so a busy spell slows them alike
        for approach in approaches:
            runs[approach].append(run_once(approach, root))
    load_after = harness.load_average()
    rows = []
    for approach in approaches:
        median = {
            key: statistics.median(r[key] for r in runs[approach])
            for key in ("images_per_s", "first_batch_s", "peak_mib")
        }
        rows.append({"approach": approach, **median, "runs": len(runs[approach])})
    base = {r["approach"]: r for r in rows}.get("pillow-w2-fork")
    table = []
    for r in rows:
        ratio = f"{r['images_per_s'] / base['images_per_s']:.2f}x" if base else "-"
        memory = f"{r['peak_mib'] / base['peak_mib']:.2f}x" if base else "-"
        table.append(
            [
                r["approach"],
                f"{r['images_per_s']:.0f}",
                ratio,
                f"{r['first_batch_s']:.2f}",
                f"{r['peak_mib']:.0f}",
                memory,
            ]
        )
    print(
        harness.table(
            [
                "approach",
                "images/s",
                "vs pillow-w2-fork",
                "first batch s",
                "peak MiB (tree)",
                "memory vs fork",
            ],
            table,
        )
    )
    print(
        f"load average before {load_before}, after {load_after}; "
        f"{harness.machine_info()['machine']}"
    )
    if args.save:
        command = harness.command_line("bench_images.py", sys.argv[1:])
        measured = harness.results(
            "images",
            rows,
            command=command,
            settings={
                "images": args.images,
                "runs": args.runs,
                "batch_size": BATCH,
                "size": SIZE,
                "load_before": load_before,
                "load_after": load_after,
            },
        )
        args.save.write_text(json.dumps(measured, indent=1), encoding="utf-8", newline="\n")
        print(f"saved {args.save}")


if __name__ == "__main__":
    main()
