"""Images: an epoch of training crops through audiobuffer against a Pillow ``Dataset``, torchvision
and SPDL, each fed as its users feed it.

The corpus: ``--images`` (2000) JPEGs of 300 to 600 pixels a side in 10 class folders, made from
the photographs that scikit-learn (``china.jpg``, ``flower.jpg``) and matplotlib
(``grace_hopper.jpg``) ship, by random crops, scales and mirror images (quality 90; made once into
``--corpus``, then reused). The transform: a random resized crop to 224 (torchvision's
``RandomResizedCrop`` rule) and a flip, uint8 ``(3, 224, 224)``, batches of 64.

The approaches, each an epoch in a fresh process (torch, Pillow and audiobuffer imported before the
clock):

- ``audiobuffer``: ``BufferedDataset(root, ImageDecoder(224, crop="random_resized", flip=True),
  labels="parent")`` and ``DataLoader(batch_size=64, collate_fn=image_collate)``, threads;
  ``audiobuffer-torch``: the same with ``backend="torch"`` (simplejpeg decodes, torch resizes);
  ``audiobuffer-torch-batches``: that dataset's ``stacked_batches(64)`` (each image written into
  its batch as it arrives), looped over as it is (through ``DataLoader(batch_size=None)`` to pin);
  ``audiobuffer-nodraft``: with ``draft=False`` (every JPEG decoded at full size);
  ``audiobuffer-pin``: with ``pin_memory=True``;
- ``isolated``: ``IsolatedLoader`` with the same decoder, ``batch_size=64, key="image"``;
  ``isolated-torch``: with ``backend="torch"``;
- ``pillow-wN-fork`` / ``-spawn`` (``-pin``: ``pin_memory=True``): the pipeline as users write it
  without torchvision: a ``Dataset`` that opens each file with Pillow, ``convert("RGB")``, draws
  the box by ``RandomResizedCrop``'s rule with torch's generator, crops, resizes and flips with
  Pillow, fed by ``DataLoader(num_workers=N)``;
- ``torchvision-wN-fork`` / ``-spawn``: ``torchvision.datasets.ImageFolder`` with
  ``transforms.v2.Compose([ToImage(), RandomResizedCrop(224), RandomHorizontalFlip()])`` fed by
  ``DataLoader(num_workers=N)``;
- ``spdl``: SPDL's pipeline: a source of batches of paths, a thread stage (concurrency 2) that
  decodes each file with ``spdl.io.load_image`` and an FFmpeg filter that crops (the same rule),
  scales and flips, then stacks the batch;
- ``threads-torch``: the plain loop, ``ImageDecoder(backend="torch")`` in two plain threads that
  feed a queue, each 64 samples stacked by ``torch.stack`` once they have all come
  (``thread_batches``);
- ``one-thread``: no epoch: each pipeline's work on one image, alone, in one thread (torch's
  intra-op threads set to 1): ``ImageDecoder``'s decode (as ``audiobuffer``'s), with
  ``backend="torch"`` (as ``audiobuffer-torch``'s) and the Pillow ``Dataset``'s ``__getitem__``,
  over every image of the corpus, in chunks of 100 that take turns (the order swapped each
  chunk). Its rows give the ceiling that the machine's cores
  (``os.cpu_count()``) allow each pipeline: images/s = cores / time an image, and a first batch of
  64 no sooner than 64 x time an image / cores; the goals are read against them (``goals``).

An approach that cannot run here is not measured, and its row says why: torchvision where it does
not load (PyPI's wheels link torch's CUDA build, so they fail beside the CPU build), SPDL where its
image decoder does not load (it needs FFmpeg's shared libraries), ``pin_memory`` without a GPU.

Each figure is the median of ``--runs`` (3) runs, the approaches taking turns (each round starting
one approach further on): images/s over the epoch, the first batch (from the loader's
construction), and the peak resident memory of the process tree (the process and its workers,
summed). The load average is recorded before and after.

    python benchmarks/bench_images.py --write   # save results/images.json, render BENCHMARKS.md
    python benchmarks/bench_images.py --images 500 --runs 1 --approaches audiobuffer,pillow-w2-fork
    python benchmarks/bench_images.py --draft   # the reduced decode alone, on 1600 x 1200 photos
    python benchmarks/bench_images.py --device cuda   # JPEGs decoded on the GPU against the CPU

``--device cuda`` runs, in turn, an epoch of the training crops copied to the GPU by
``DevicePrefetcher``: ``host-decode`` (the producers decode, as above), ``host-decode-nodraft``
(every pixel decoded, the pixels the GPU path matches) and ``device-decode``
(``ImageDecoder(jpeg="device")``: the producers read bytes and headers, ``DecodeJpeg`` decodes with
nvjpeg, crops and resizes on the GPU, in the prefetch thread). Besides images/s, the first batch and
the peak memory (the process tree's, and the GPU's), it prints the decode step alone (ms per batch
of 64 on the GPU, against Pillow on one core) and how far nvjpeg's pixels are from the host path's.
It needs CUDA and torchvision, and says so where either is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import harness
from sections.images import OURS, PLAIN_LOOP  # the rows the goals are read on, as on the page

from audiobuffer.cli._photos import make_photo_corpus, shipped_photos

BATCH = 64
SIZE = 224
CLASSES = 10
APPROACHES = (
    "audiobuffer",
    "audiobuffer-torch",
    "audiobuffer-torch-batches",
    "audiobuffer-nodraft",
    "isolated",
    "isolated-torch",
    "pillow-w0",
    "pillow-w2-fork",
    "pillow-w2-spawn",
    "pillow-w4-fork",
    "pillow-w4-spawn",
    "torchvision-w0",
    "torchvision-w2-fork",
    "torchvision-w2-spawn",
    "torchvision-w4-fork",
    "spdl",
    "threads-torch",
    "audiobuffer-pin",
    "pillow-w2-fork-pin",
    "one-thread",
)
#: The approaches of ``--device``: the producers decode, or the device does.
DEVICE_APPROACHES = ("host-decode", "host-decode-nodraft", "device-decode")
#: The approach the ratios are taken against, and the one whose first batch is the spawn start.
BASE, SPAWN = "pillow-w2-fork", "pillow-w2-spawn"
#: The one-thread approach, and its rows: each pipeline's work an image, and how the page names it.
ONE_THREAD = "one-thread"
ALONE = {"one-thread-imagedecoder": "`ImageDecoder`",
         "one-thread-imagedecoder-torch": '`ImageDecoder(backend="torch")`',
         "one-thread-pillow": "Pillow `Dataset`"}
#: Images the one-thread measurement times each pipeline on before taking turns.
CHUNK = 100


# -- the Pillow Dataset, as users write it ---------------------------------------------------------


class PillowFolder:
    """A map-style ``Dataset`` over class folders: Pillow, ``RandomResizedCrop``'s rule, a flip."""

    def __init__(self, root: str | Sequence[str]) -> None:
        if isinstance(root, str):
            classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
            paths = [os.path.join(root, c, f) for c in classes
                     for f in sorted(os.listdir(os.path.join(root, c)))]
        else:
            paths = list(root)
        classes = sorted({os.path.basename(os.path.dirname(p)) for p in paths})
        label = {name: i for i, name in enumerate(classes)}
        self.samples = [(p, label[os.path.basename(os.path.dirname(p))]) for p in paths]

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


# -- the approaches --------------------------------------------------------------------------------


class Approach(NamedTuple):
    """An approach's name taken apart: ``pillow-w2-fork-pin`` is Pillow, 2 workers, fork, pinned."""

    family: str
    workers: int
    method: str | None
    pin: bool
    draft: bool
    backend: str
    batches: bool


def parse(approach: str) -> Approach:
    parts = approach.split("-")
    workers = next((int(p[1:]) for p in parts if p[:1] == "w" and p[1:].isdigit()), 0)
    method = next((p for p in parts if p in ("fork", "spawn")), None)
    return Approach(parts[0], workers, method, "pin" in parts, "nodraft" not in parts,
                    "torch" if "torch" in parts else "pillow", "batches" in parts)


def label(approach: str) -> str:
    """How the page names ``approach``."""
    a = parse(approach)
    pin = ", `pin_memory=True`" if a.pin else ""
    backend = ', `backend="torch"`' if a.backend == "torch" else ""
    if a.family == "audiobuffer":
        name = f"`BufferedDataset.stacked_batches({BATCH})`" if a.batches else "`BufferedDataset`"
        return name + backend + (", `draft=False`" if not a.draft else "") + pin
    if a.family == "isolated":
        return "`IsolatedLoader`" + backend
    if a.family == "spdl":
        return "SPDL pipeline, 2 threads"
    if a.family == "threads":
        return 'the plain loop: 2 threads, `ImageDecoder(backend="torch")`, no library'
    name = "Pillow `Dataset`" if a.family == "pillow" else "torchvision `ImageFolder`"
    return f"{name}, {a.workers} workers" + (f", {a.method}" if a.method else "") + pin


def _loads(code: str) -> str | None:
    """The last line of the error ``python -c code`` ends with; ``None`` when it runs."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def why_not(approaches: Sequence[str], root: Path) -> dict[str, str]:
    """Why each of ``approaches`` that cannot run here cannot (each family checked once)."""
    import torch

    families = {parse(a).family for a in approaches}
    reasons: dict[str, str] = {}
    if "torchvision" in families and _loads("import torchvision.transforms.v2") is not None:
        reasons["torchvision"] = "torchvision did not load"
    if "spdl" in families:
        jpeg = next(root.rglob("*.jpg"))
        error = _loads(f"import spdl.io; spdl.io.load_image({str(jpeg)!r})")
        if error is not None:
            missing = ": FFmpeg's libraries are missing" if "libav" in error else ""
            reasons["spdl"] = f"its image decoder did not load{missing}"
    out = {a: reasons[parse(a).family] for a in approaches if parse(a).family in reasons}
    if not torch.cuda.is_available():
        out.update({a: "no GPU" for a in approaches if parse(a).pin})
    return out


def thread_batches(root: str) -> Iterator[dict[str, Any]]:
    """The plain loop: the files listed as the Pillow ``Dataset`` lists them, shuffled, and decoded
    by ``ImageDecoder(backend="torch")`` in two threads of no library (each takes the next file,
    puts its sample in a queue); each 64 samples stacked by ``torch.stack`` once the 64th has come;
    no buffer bound, order, state or error handling (a producer that raises leaves the consumer to
    its 60 s ``get`` timeout). What the decoder does in a fresh process on these cores with no
    loader around it; not a bound: a loader that stacks as samples arrive may beat its first
    batch."""
    import queue
    import threading

    import torch

    from audiobuffer import ImageDecoder, WorkItem

    decoder = ImageDecoder(SIZE, crop="random_resized", flip=True, backend="torch")
    samples = PillowFolder(root).samples
    order = torch.randperm(len(samples)).tolist()
    taken = iter(range(len(order)))
    lock = threading.Lock()
    done: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def produce() -> None:
        while True:
            with lock:
                n = next(taken, None)
            if n is None:
                return
            path, label = samples[order[n]]
            done.put((decoder(WorkItem(index=order[n], path=path, seed=0)), label))

    threads = [threading.Thread(target=produce, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    for first in range(0, len(order), BATCH):
        rows = [done.get(timeout=60) for _ in range(min(BATCH, len(order) - first))]
        yield {"image": torch.stack([sample["image"] for sample, _ in rows]),
               "label": torch.tensor([label for _, label in rows])}
    for thread in threads:
        thread.join(timeout=60)


def spdl_batches(root: str) -> Iterator[dict[str, Any]]:
    """SPDL's pipeline: a source of batches of paths, a thread stage that decodes and stacks each.

    Each file is decoded by FFmpeg through ``spdl.io.load_image`` with a filter that crops the box
    :meth:`PillowFolder.box` draws (the size read from the JPEG's header), scales it to 224 and
    flips it half the time.
    """
    import numpy as np
    import spdl.io
    import torch
    from PIL import Image
    from spdl.pipeline import PipelineBuilder

    samples = PillowFolder(root).samples
    order = torch.randperm(len(samples)).tolist()
    chunks = [[samples[i] for i in order[k:k + BATCH]] for k in range(0, len(order), BATCH)]

    def decode(path: str) -> np.ndarray:
        with Image.open(path) as im:  # the header only
            width, height = im.size
        top, left, h, w = PillowFolder.box(height, width)
        flip = ",hflip" if torch.rand(1).item() < 0.5 else ""
        desc = (f"crop=w={w}:h={h}:x={left}:y={top},scale=w={SIZE}:h={SIZE}{flip},"
                "format=pix_fmts=rgb24")
        pixels = np.asarray(spdl.io.to_numpy(spdl.io.load_image(path, filter_desc=desc)))
        return pixels.reshape(SIZE, SIZE, 3).transpose(2, 0, 1)

    def decode_batch(chunk: list[tuple[str, int]]) -> dict[str, Any]:
        images = np.stack([decode(path) for path, _ in chunk])
        return {"image": torch.from_numpy(images), "label": torch.tensor([lab for _, lab in chunk])}

    builder: Any = PipelineBuilder().add_source(chunks).pipe(decode_batch, concurrency=2)
    pipeline = builder.add_sink(2).build(num_threads=2)
    with pipeline.auto_stop():
        yield from pipeline.get_iterator(timeout=600)


def loader_of(approach: str, root: str) -> tuple[Any, Any]:
    """The batches of one epoch of ``approach`` over ``root``, and what holds threads to close."""
    import torch
    from torch.utils.data import DataLoader

    from audiobuffer import BufferedDataset, ImageDecoder, IsolatedLoader
    from audiobuffer.collate import image_collate

    a = parse(approach)
    torch.manual_seed(0)
    if a.family in ("audiobuffer", "isolated"):
        decoder = ImageDecoder(SIZE, crop="random_resized", flip=True, draft=a.draft,
                               backend=a.backend)
        if a.family == "isolated":
            isolated = IsolatedLoader(root, decoder, batch_size=BATCH, key="image", labels="parent",
                                      shuffle=True, seed=0)
            return isolated, isolated
        dataset = BufferedDataset(root, decoder, labels="parent", shuffle=True, seed=0)
        if a.batches:  # stacked as the samples arrive: whole batches, no DataLoader needed
            batches: Any = dataset.stacked_batches(BATCH)
            if a.pin:
                batches = DataLoader(batches, batch_size=None, pin_memory=True)
            return batches, dataset
        loader = DataLoader(dataset, batch_size=BATCH, collate_fn=image_collate, pin_memory=a.pin)
        return loader, dataset
    if a.family == "spdl":
        return spdl_batches(root), None
    if a.family == "threads":
        return thread_batches(root), None
    if a.family == "torchvision":
        from torchvision.datasets import ImageFolder
        from torchvision.transforms import v2

        transform = v2.Compose([v2.ToImage(), v2.RandomResizedCrop(SIZE, antialias=True),
                                v2.RandomHorizontalFlip()])
        folder: Any = ImageFolder(root, transform=transform)
    else:
        folder = PillowFolder(root)
    return DataLoader(folder, batch_size=BATCH, shuffle=True, num_workers=a.workers,
                      multiprocessing_context=a.method, pin_memory=a.pin), None


# -- one epoch, in a child process -----------------------------------------------------------------


def child(approach: str, root: str, out: str) -> None:
    """One epoch of ``approach`` over ``root``; its figures written to ``out`` as JSON."""
    import numpy  # noqa: F401 - what each approach imports, imported before the clock
    import PIL.Image  # noqa: F401
    import torch.utils.data  # noqa: F401

    # the package's facade imports a name's modules on its first use: used here, before the clock
    from audiobuffer import BufferedDataset, ImageDecoder, IsolatedLoader  # noqa: F401
    from audiobuffer.collate import image_collate  # noqa: F401

    if parse(approach).family == "torchvision":
        import torchvision.transforms.v2  # noqa: F401
    elif parse(approach).family == "spdl":
        import spdl.io  # noqa: F401
        import spdl.pipeline  # noqa: F401
    start = time.perf_counter()
    batches, holder = loader_of(approach, root)
    first = None
    images = 0
    try:
        for batch in batches:
            if first is None:
                first = time.perf_counter() - start
            images += len(batch["label"] if isinstance(batch, dict) else batch[1])
        total = time.perf_counter() - start
    finally:
        if holder is not None:
            holder.close()
    Path(out).write_text(
        json.dumps({"images": images, "total_s": total, "first_batch_s": first}), encoding="utf-8",
        newline="\n",
    )


def one_thread_child(root: str, out: str) -> None:
    """Each pipeline's work an image alone, in one thread, over every image of ``root``: seconds
    (wall clock and CPU) of ``ImageDecoder``'s decode and of the Pillow ``Dataset``'s
    ``__getitem__``, in chunks of :data:`CHUNK` that take turns; written to ``out`` as JSON."""
    import torch

    from audiobuffer import ImageDecoder, WorkItem

    torch.set_num_threads(1)
    torch.manual_seed(0)
    folder = PillowFolder(root)
    decoder = ImageDecoder(SIZE, crop="random_resized", flip=True)
    fast = ImageDecoder(SIZE, crop="random_resized", flip=True, backend="torch")
    items = [WorkItem(index=i, path=p, seed=0) for i, (p, _) in enumerate(folder.samples)]
    work: dict[str, Callable[[int], object]] = {"imagedecoder": lambda i: decoder(items[i]),
                                                "imagedecoder-torch": lambda i: fast(items[i]),
                                                "pillow": folder.__getitem__}
    for each in work.values():  # warm: the first call's imports and tables
        each(0)
    wall = dict.fromkeys(work, 0.0)
    cpu = dict.fromkeys(work, 0.0)
    for n, first in enumerate(range(0, len(items), CHUNK)):
        chunk = range(first, min(first + CHUNK, len(items)))
        for name in sorted(work, reverse=n % 2 == 1):
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            for i in chunk:
                work[name](i)
            wall[name] += time.perf_counter() - wall_start
            cpu[name] += time.process_time() - cpu_start
    Path(out).write_text(json.dumps({"images": len(items), "wall_s": wall, "cpu_s": cpu}),
                         encoding="utf-8", newline="\n")


# -- JPEGs decoded on the device ---------------------------------------------------------------


def pillow_decode(data: list[Any], device: Any) -> list[Any]:
    """``DecodeJpeg``'s decode with Pillow (``--decode-with pillow``: the mechanism where
    torchvision does not load, not nvjpeg's speed)."""
    import io

    import numpy as np
    import torch
    from PIL import Image

    out = []
    for tensor in data:
        with Image.open(io.BytesIO(tensor.numpy().tobytes())) as im:
            pixels = np.asarray(im.convert("RGB"))
        out.append(torch.from_numpy(pixels.copy()).permute(2, 0, 1).to(device))
    return out


def device_step(device: str, decode_with: str | None) -> Any:
    """The ``DecodeJpeg`` of ``--device`` (torchvision's nvjpeg, or ``--decode-with pillow``)."""
    from audiobuffer import DecodeJpeg

    return DecodeJpeg(device, decode=pillow_decode if decode_with == "pillow" else None)


def device_child(approach: str, root: str, out: str, device: str, decode_with: str | None) -> None:
    """One epoch of a ``--device`` approach over ``root``, batches on ``device``."""
    import numpy  # noqa: F401 - what each approach imports, imported before the clock
    import PIL.Image  # noqa: F401
    import torch
    from torch.utils.data import DataLoader

    from audiobuffer import BufferedDataset, DevicePrefetcher, ImageDecoder
    from audiobuffer.collate import image_collate

    cuda = torch.device(device).type == "cuda"
    step = device_step(device, decode_with) if approach == "device-decode" else None
    start = time.perf_counter()
    decoder = ImageDecoder(SIZE, crop="random_resized", flip=True,
                           draft=approach == "host-decode",
                           jpeg="device" if approach == "device-decode" else "host")
    dataset = BufferedDataset(root, decoder, labels="parent", shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH, collate_fn=image_collate, pin_memory=cuda)
    first = None
    images = 0
    with dataset, DevicePrefetcher(loader, device, transform=step) as prefetch:
        for batch in prefetch:
            if first is None:
                if cuda:
                    torch.cuda.synchronize()
                first = time.perf_counter() - start
            images += batch["image"].shape[0]
    if cuda:
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    gpu_peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0
    Path(out).write_text(
        json.dumps({"images": images, "total_s": total, "first_batch_s": first,
                    "gpu_peak_mib": gpu_peak}),
        encoding="utf-8", newline="\n",
    )


def decode_step_and_difference(root: Path, device: str, decode_with: str | None,
                               runs: int) -> dict[str, float]:
    """The decode step alone on ``BATCH`` photos (median ms over ``runs``), against Pillow on one
    core decoding the same crops, and the pixels' distance to the host path's (``draft=False``)."""
    import torch

    from audiobuffer import ImageDecoder, WorkItem
    from audiobuffer.collate import image_collate

    paths = sorted(str(p) for p in root.rglob("*.jpg"))[:BATCH]
    items = [WorkItem(index=i, path=p, seed=0) for i, p in enumerate(paths)]
    kwargs: dict[str, Any] = {"crop": "random_resized", "flip": True}
    host = ImageDecoder(SIZE, draft=False, **kwargs)
    encoded = image_collate([ImageDecoder(SIZE, jpeg="device", **kwargs)(i) for i in items])
    step = device_step(device, decode_with)
    cuda = torch.device(device).type == "cuda"

    def on_device() -> Any:
        images = step(encoded)["image"]
        if cuda:
            torch.cuda.synchronize()
        return images

    on_device()  # warm: nvjpeg's handles, the allocator
    device_s, _ = harness.median_time(on_device, runs)
    host_s, _ = harness.median_time(lambda: [host(i) for i in items], runs)
    expected = torch.stack([host(i)["image"] for i in items]).to(device)
    diff = (on_device().int() - expected.int()).abs().float()
    return {"images": len(items), "device_ms": device_s * 1000, "host_ms": host_s * 1000,
            "mean_abs_diff": float(diff.mean()), "max_abs_diff": float(diff.max()),
            "differing": float((diff > 0).float().mean())}


def device_unavailable(device: str, decode_with: str | None) -> str | None:
    """Why ``--device`` cannot run here (no CUDA, no torchvision), or ``None``."""
    import torch

    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return (f"--device {device} compares decoding on the GPU with decoding on the CPU, but "
                f"CUDA is not available here (torch {torch.__version__}): run it on a machine "
                f"with a GPU and a CUDA build of torch")
    if decode_with is None:
        from audiobuffer.jpeg import torchvision_decode

        try:
            torchvision_decode()
        except ImportError as exc:
            return f"--device {device}: {exc}"
    return None


def device_bench(args: argparse.Namespace, folder: Path) -> None:
    """``--device``: the epochs, the decode step alone, the table, the saved results."""
    why = device_unavailable(args.device, args.decode_with)
    if why is not None:
        raise SystemExit(why)
    root = make_photo_corpus(folder, args.images, classes=CLASSES)
    load_before = harness.load_average()
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in DEVICE_APPROACHES}
    for _ in range(args.runs):  # the approaches take turns, so a busy spell slows them alike
        for approach in DEVICE_APPROACHES:
            runs[approach].append(run_once(approach, root, args.device, args.decode_with))
    alone = decode_step_and_difference(root, args.device, args.decode_with, max(args.runs, 3))
    load_after = harness.load_average()
    keys = ("images_per_s", "first_batch_s", "peak_mib", "gpu_peak_mib")
    rows = [{"approach": a, **{k: statistics.median(r[k] for r in runs[a]) for k in keys},
             "runs": len(runs[a])} for a in DEVICE_APPROACHES]
    base = rows[0]["images_per_s"]
    print(harness.table(
        ["approach", "images/s", "vs host-decode", "first batch s", "peak MiB (tree)",
         "GPU peak MiB"],
        [[r["approach"], f"{r['images_per_s']:.0f}", f"{r['images_per_s'] / base:.2f}x",
          f"{r['first_batch_s']:.2f}", f"{r['peak_mib']:.0f}", f"{r['gpu_peak_mib']:.0f}"]
         for r in rows]))
    decoder = "Pillow (--decode-with pillow)" if args.decode_with else "nvjpeg"
    print(f"decode step alone, {alone['images']} photos to {SIZE}: {alone['device_ms']:.1f} ms on "
          f"{args.device} ({decoder}), {alone['host_ms']:.1f} ms with Pillow on one core; pixels "
          f"against the host path's (draft=False): mean |diff| {alone['mean_abs_diff']:.3f}, max "
          f"{alone['max_abs_diff']:.0f}, {alone['differing']:.1%} of values differ")
    print(f"load average before {load_before}, after {load_after}; "
          f"{harness.machine_info()['machine']}")
    if args.save:
        measured = harness.results(
            "images-device", rows, command=harness.command_line("bench_images.py", sys.argv[1:]),
            settings={"images": args.images, "runs": args.runs, "batch_size": BATCH, "size": SIZE,
                      "device": args.device, "decoder": decoder, "decode_step": alone,
                      "load_before": load_before, "load_after": load_after})
        args.save.write_text(json.dumps(measured, indent=1), encoding="utf-8", newline="\n")
        print(f"saved {args.save}")


def run_once(approach: str, root: Path, device: str | None = None,
             decode_with: str | None = None) -> dict[str, float]:
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
                *(["--device", device] if device else []),
                *(["--decode-with", decode_with] if decode_with else []),
            ],
            timeout=1800,
            env=env,
        )
        if code != 0 or not out.exists():
            raise RuntimeError(f"{approach} failed (exit {code}): {err}")
        figures = json.loads(out.read_text(encoding="utf-8"))
    if approach == ONE_THREAD:
        return {f"{kind}_ms_{name}": 1000 * seconds / figures["images"]
                for kind in ("wall", "cpu") for name, seconds in figures[f"{kind}_s"].items()}
    return {
        **figures,
        "images_per_s": figures["images"] / figures["total_s"],
        "peak_mib": peak / 2**20,
    }


# -- the results -----------------------------------------------------------------------------------


def rows_of(runs: dict[str, list[dict[str, float]]], skipped: dict[str, str],
            approaches: Sequence[str], cores: int | None = None) -> list[dict[str, Any]]:
    """A row per approach: the medians and each run's figures, the ratios against ``BASE`` and
    ``SPAWN`` (where they ran), or why it did not run; ``one-thread``'s two rows last, with the
    ceilings that ``cores`` (default ``os.cpu_count()``) allow."""
    rows: list[dict[str, Any]] = []
    for approach in approaches:
        if approach == ONE_THREAD:
            continue
        if approach in skipped:
            rows.append({"approach": approach, "label": label(approach),
                         "skipped": skipped[approach]})
            continue
        measured = runs[approach]
        row: dict[str, Any] = {"approach": approach, "label": label(approach),
                               "runs": len(measured)}
        for key in ("images_per_s", "first_batch_s", "peak_mib"):
            row[key] = statistics.median(r[key] for r in measured)
            row[f"{key}_runs"] = [r[key] for r in measured]
        rows.append(row)
    by = {r["approach"]: r for r in rows if "skipped" not in r}
    for row in by.values():
        if BASE in by:
            row["vs_fork"] = row["images_per_s"] / by[BASE]["images_per_s"]
            row["memory_vs_fork"] = row["peak_mib"] / by[BASE]["peak_mib"]
        if SPAWN in by:
            row["first_vs_spawn"] = row["first_batch_s"] / by[SPAWN]["first_batch_s"]
    if ONE_THREAD in approaches and runs.get(ONE_THREAD):
        rows += ceiling_rows(runs[ONE_THREAD], by, cores or os.cpu_count() or 1)
    return rows


def ceiling_rows(measured: Sequence[dict[str, float]], by: dict[str, dict[str, Any]],
                 cores: int) -> list[dict[str, Any]]:
    """A row per pipeline timed alone: its median milliseconds an image (wall clock; CPU beside),
    the images/s ``cores`` allow at that time (``cores`` / time) and the soonest first batch
    (``BATCH`` x time / ``cores``), against ``BASE``'s images/s and ``SPAWN``'s first batch."""
    rows = []
    for approach, name in ALONE.items():
        key = approach.removeprefix("one-thread-")
        if not all(f"wall_ms_{key}" in r for r in measured):  # not timed in these runs
            continue
        ms = statistics.median(r[f"wall_ms_{key}"] for r in measured)
        row: dict[str, Any] = {
            "approach": approach, "label": name, "runs": len(measured),
            "ms_per_image": ms, "ms_per_image_runs": [r[f"wall_ms_{key}"] for r in measured],
            "cpu_ms_per_image": statistics.median(r[f"cpu_ms_{key}"] for r in measured),
            "cores": cores, "ceiling_images_per_s": cores * 1000 / ms,
            "first_batch_floor_s": BATCH * ms / 1000 / cores,
        }
        if BASE in by:
            row["ceiling_vs_fork"] = row["ceiling_images_per_s"] / by[BASE]["images_per_s"]
        if SPAWN in by:
            row["floor_vs_spawn"] = row["first_batch_floor_s"] / by[SPAWN]["first_batch_s"]
        rows.append(row)
    return rows


def goals(rows: Sequence[dict[str, Any]]) -> list[list[object]]:
    """The image pipeline's goals, checked against this run's medians (where both sides ran), each
    beside what the machine allows its ``ImageDecoder`` (its one-thread ceiling, and the plain
    loop of :data:`PLAIN_LOOP`, where measured): on :data:`OURS`' first approach that ran."""
    ran = {r["approach"]: r for r in rows if "skipped" not in r}
    found = next(((a, alone) for a, alone in OURS if a in ran), None)
    if found is None:
        return []
    ours, alone, plain = ran[found[0]], ran.get(found[1], {}), ran.get(PLAIN_LOOP, {})
    checked: list[list[object]] = []
    for key, goal, target, met, bound in (
        ("vs_fork", f"images/s / {BASE}", ">= 1.30x", lambda v: v >= 1.3, "ceiling_vs_fork"),
        ("memory_vs_fork", f"peak memory / {BASE}", "<= 0.60x", lambda v: v <= 0.6, ""),
        ("first_vs_spawn", f"first batch / {SPAWN}'s", "<= 0.05x", lambda v: v <= 0.05,
         "floor_vs_spawn"),
    ):
        if key in ours:
            verdict = "yes" if met(ours[key]) else "**no**"
            allows = [f"one thread: {'<=' if key == 'vs_fork' else '>='} {alone[bound]:.3f}x"] if (
                bound in alone) else []
            if bound and key in plain:
                allows.append(f"plain loop: {plain[key]:.3f}x")
            checked.append([f"{found[0]}: {goal}", f"{ours[key]:.3f}x", target,
                            "; ".join(allows) or "-", verdict])
    return checked


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--images", type=int, default=2000, help="JPEGs in the corpus (default 2000)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each approach (default 3)")
    parser.add_argument(
        "--approaches",
        default=",".join(APPROACHES),
        help=f"comma-separated, of {', '.join(APPROACHES)} (default: all)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help="the corpus folder (default: one in the temporary folder, made once)",
    )
    parser.add_argument(
        "--draft",
        action="store_true",
        help="instead: the decode of 1600 x 1200 JPEGs to 224 with and without draft mode",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="instead: JPEGs decoded on this device (cuda) against the CPU (needs torchvision)",
    )
    parser.add_argument("--decode-with", choices=["pillow"], help=argparse.SUPPRESS)
    parser.add_argument("--save", type=Path, default=None,
                        help="with --device: save its results as JSON in this file")
    harness.add_write_options(parser, "images")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child in DEVICE_APPROACHES:
        device_child(args.child, str(args.corpus), args.out, args.device, args.decode_with)
        return 0
    if args.child == ONE_THREAD:
        one_thread_child(str(args.corpus), args.out)
        return 0
    if args.child:
        child(args.child, str(args.corpus), args.out)
        return 0
    approaches = [a for a in args.approaches.split(",") if a]
    unknown = sorted(set(approaches) - set(APPROACHES))
    if unknown:
        parser.error(f"unknown approaches {unknown}; choose from {', '.join(APPROACHES)}")
    folder = args.corpus or Path(tempfile.gettempdir()) / f"audiobuffer-bench-images-{args.images}"
    if args.device:
        device_bench(args, folder)
        return 0
    if args.runs < 1 or args.images < CLASSES:
        parser.error(f"--runs must be >= 1 and --images >= {CLASSES}")
    if args.draft:
        gain = draft_gain(folder / "large", args.runs)
        print(
            harness.table(
                ["crop", "draft", "ms per image"],
                [[r["crop"], r["draft"], f"{r['ms_per_image']:.1f}"] for r in gain],
            )
        )
        print(f"load average {harness.load_average()}")
        return 0
    made = time.perf_counter()
    root = make_photo_corpus(folder, args.images, classes=CLASSES)
    print(
        f"corpus: {args.images} JPEGs in {root} "
        f"({time.perf_counter() - made:.1f} s to make or find)", file=sys.stderr
    )
    skipped = why_not(approaches, root)
    for approach, reason in skipped.items():
        print(f"{approach}: not run here ({reason})", file=sys.stderr)
    running = [a for a in approaches if a not in skipped]
    load_before = harness.load_average()
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in running}
    for run in range(args.runs):  # the approaches take turns, so a busy spell slows them alike,
        # each round starting one further on, so that no approach always follows the same one
        # (the processes of a spawn start can still be ending as the next approach begins)
        for approach in running[run % len(running):] + running[:run % len(running)]:
            runs[approach].append(run_once(approach, root))
            last = runs[approach][-1]
            if approach == ONE_THREAD:
                print(f"  {approach}: {last['wall_ms_imagedecoder']:.2f} ms an image "
                      f"(ImageDecoder), {last['wall_ms_imagedecoder-torch']:.2f} ms "
                      f"(backend='torch'), {last['wall_ms_pillow']:.2f} ms (Pillow Dataset)",
                      file=sys.stderr)
                continue
            print(f"  {approach}: {last['images_per_s']:.0f} images/s, first batch "
                  f"{last['first_batch_s']:.2f} s, peak {last['peak_mib']:.0f} MiB",
                  file=sys.stderr)
    load_after = harness.load_average()
    cores = os.cpu_count() or 1
    rows = rows_of(runs, skipped, approaches, cores)
    measured = harness.results(
        "images",
        rows,
        command=harness.command_line("bench_images.py", argv),
        settings={
            "images": args.images,
            "runs": args.runs,
            "batch_size": BATCH,
            "size": SIZE,
            "cores": cores,
            "load_before": load_before,
            "load_after": load_after,
        },
    )
    table = [[r["approach"], f"{r['images_per_s']:.0f}", f"{r.get('vs_fork', 0):.2f}x",
              f"{r['first_batch_s']:.2f}", f"{r['peak_mib']:.0f}"]
             for r in rows if "images_per_s" in r]
    table += [[f"{r['approach']}: {r['ms_per_image']:.2f} ms an image; {cores} cores allow",
               f"{r['ceiling_images_per_s']:.0f}",
               f"{r['ceiling_vs_fork']:.2f}x" if "ceiling_vs_fork" in r else "-",
               f"{r['first_batch_floor_s']:.3f}", "-"] for r in rows if "ms_per_image" in r]
    print(harness.table(["approach", "images/s", f"vs {BASE}", "first batch s", "peak MiB (tree)"],
                        table))
    print(f"load average before {load_before}, after {load_after}; "
          f"{harness.machine_info()['machine']}")
    checked = goals(rows)
    if checked:
        print(harness.table(["goal", "measured", "target", "machine allows", "met"], checked))
    harness.write_results(measured, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
