"""Contention: a Python-bound training step fed by each loader, and how much the loader slows it.

    python benchmarks/bench_contention.py --write    # the full run: saves results/contention.json, renders its section
    python benchmarks/bench_contention.py --quick    # a smoke run (32 files, 1 run, light step): prints the section
    python benchmarks/bench_contention.py --device cuda --write   # the step on a GPU: results/contention-cuda.json
    python benchmarks/bench_contention.py --images 640 --write   # the image case

The step stands for a GPU training step, which is Python launching many small kernels: ``rounds``
times ``relu(h @ W) + 0.1`` on an (8, 64) tensor, then ``.item()``, with one intra-op thread. The
light step is 50 rounds (about 0.5 ms), the heavy one 500 (about 5 ms). Producer threads in the
training process hold the GIL for the Python part of every decode, and the step waits for it. With
``--device cuda`` the step's tensors are on the GPU, so it is a GPU step: the same Python, launching
kernels there.

Each corpus is fed, in batches of 16, by:

- ``step-alone``: the data is already there (one decoded batch, reused): the step's own time;
- ``step-copy``: every batch decoded before the clock, each copied into fresh tensors just before its
  step, as a loader hands a batch over: what receiving a batch costs the step with no loader at all;
- ``step-beside``: as ``step-alone``, while another process decodes the corpus over and over in one
  thread, at the helper's lower priority: what decoding anywhere on the machine costs the step (shared
  caches, memory, cores), with no loader in the step's process;
- ``loop``: decode and collate in the training thread, then the step;
- ``buffered-1``, ``buffered-2``, ``buffered-auto``: ``BufferedDataset(num_producers=N)`` into
  ``DataLoader(num_workers=0)`` (``auto``: the default, tuned as the epoch runs; each run is a first
  epoch, so it pays the tuner's trials, which later epochs skip);
- ``isolated-2``, ``isolated-auto``: ``IsolatedLoader(num_producers=2)`` and with its default count:
  the producers in one helper process;
- ``dataloader-2``, ``dataloader-2-spawn``: ``DataLoader(num_workers=2)``, fork and spawn;
- images only: ``buffered-2-torch``, ``isolated-2-torch``: with ``ImageDecoder(backend="torch")``;
  ``isolated-2-torch-start``: and ``start_in_trainer=True``.

With ``--images N``, the corpus is instead ``N`` JPEGs of 300-600 px (``bench_images.py``'s,
made from photographs packages ship) decoded to random resized crops of 224 with flips, in batches
of 64: ``ImageDecoder`` and ``image_collate`` for audiobuffer, ``bench_images.PillowFolder`` (the
Pillow ``Dataset`` as users write it) for ``DataLoader``; the results are ``contention-images``,
and the steps per second of each loader (batches over the epoch's seconds) are compared.

Corpora: FSDD (all its recordings, where ``../shared/data/fsdd/recordings`` exists), generated WAV
and FLAC files of 1-4 s at 16 kHz, and the FLAC files with a per-sample librosa log-mel transform
(``audiobuffer bench``'s ``mel_transform``, see :func:`_transform`), which holds
the GIL in every producer; that corpus runs the light step and the thread-based approaches only.

Every (corpus, approach, run) is a fresh subprocess (``OMP_NUM_THREADS=1``). It imports everything
and warms the step up before its clock starts, then for each step (light, then heavy) builds a fresh
loader and runs one epoch, timing each step call alone (after its batch is in hand), the epoch, and
the time from starting to build the loader to the first batch in hand. The parent samples the peak
RSS of the subprocess's whole tree (the helper process and DataLoader workers included) over its
run. Reported: medians over ``--runs`` runs, all from one invocation, and the isolated loader's goals
checked against them (:func:`goals`).
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import render
from harness import (
    FSDD,
    REPO,
    add_write_options,
    command_line,
    fsdd_files,
    load_average,
    machine_info,
    read_lines,
    results,
    table,
    write_lines,
    write_results,
)

from audiobuffer.cli.bench import BATCH_SIZE, BUFFER_SIZE, make_corpus, run_with_peak_rss

APPROACHES = ["step-alone", "step-copy", "step-beside", "loop", "buffered-1", "buffered-2", "buffered-auto",
              "isolated-2", "isolated-auto", "dataloader-2", "dataloader-2-spawn"]
#: Approaches that run only when ``--approaches`` names them.
OPTIONAL = ["isolated-1"]
#: The approaches that take a per-sample transform (the DataLoader ones decode in ``PathDataset``).
TRANSFORM_APPROACHES = ["step-alone", "step-copy", "step-beside", "loop", "buffered-1", "buffered-2",
                        "buffered-auto", "isolated-2", "isolated-auto"]
IN_PROCESS = ["loop", "buffered-1", "buffered-2", "buffered-auto"]
THREADS = ["buffered-1", "buffered-2", "buffered-auto"]
ISOLATED = ["isolated-2", "isolated-auto"]
LABELS = {
    "step-alone": "step alone (data already there)",
    "step-copy": "step alone, each batch a fresh copy (no loader)",
    "step-beside": "step alone, beside a process decoding the corpus (no loader)",
    "loop": "sequential loop",
    "buffered-1": "BufferedDataset, 1 producer",
    "buffered-2": "BufferedDataset, 2 producers",
    "buffered-auto": "BufferedDataset, auto (the default)",
    "isolated-1": "IsolatedLoader, 1 producer",
    "isolated-2": "IsolatedLoader, 2 producers",
    "isolated-auto": "IsolatedLoader, auto (the default)",
    "dataloader-2": "DataLoader(num_workers=2), fork",
    "dataloader-2-spawn": "DataLoader(num_workers=2), spawn",
    "buffered-2-torch": 'BufferedDataset, 2 producers, ImageDecoder(backend="torch")',
    "isolated-2-torch": 'IsolatedLoader, 2 producers, ImageDecoder(backend="torch")',
    "isolated-2-torch-start": 'IsolatedLoader, 2 producers, backend="torch", start_in_trainer=True',
}
#: The approaches of the image case (``--images``), and its corpus's name and batch size.
#: Approaches of the image case alone: the loader with ImageDecoder(backend="torch").
#: "-start": IsolatedLoader(start_in_trainer=True), which decodes in the trainer until its helper
#: (which imports torch for this backend) is warm.
IMAGE_ONLY = ["buffered-2-torch", "isolated-2-torch", "isolated-2-torch-start"]
IMAGE_APPROACHES = ["step-alone", "buffered-2", "buffered-auto", "isolated-2", "isolated-auto",
                    "dataloader-2", *IMAGE_ONLY]
IMAGE_CORPUS, IMAGE_BATCH = "jpeg", 64
#: Rounds of ``relu(h @ W) + 0.1`` per step.
STEPS = {"light": 50, "heavy": 500}
CORPORA = ["fsdd", "wav", "flac", "flac+mel"]
WARMUP_STEPS = 20
CHILD_TIMEOUT = 300.0
NEIGHBOUR_NICE = 10  # as the IsolatedLoader's helper lowers itself (background=True)
SECTION = "contention"


# -- the subprocess ----------------------------------------------------------------------------


def make_step(rounds: int, device: str = "cpu") -> Callable[[Any], float]:
    """The Python-bound step: ``rounds`` small matmuls on ``device``, then ``.item()`` (the batch is not
    read).

    Every approach runs the very same work, so a slower step can only be waiting for the GIL or a core.
    On a GPU each round launches three small kernels, and ``.item()`` waits for them.
    """
    import torch

    gen = torch.Generator().manual_seed(0)
    h0 = torch.randn(8, 64, generator=gen).to(device)
    weight = (torch.randn(64, 64, generator=gen) / 64).to(device)  # keeps h bounded (>= 0.1) over any rounds

    def step(batch: Any) -> float:
        h = h0
        for _ in range(rounds):
            h = torch.relu(h @ weight) + 0.1
        return h.sum().item()

    return step


def _transform(name: str | None) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """The per-sample transform called ``name`` (``mel``): ``audiobuffer bench``'s log-mel.

    It is defined in the package, so the IsolatedLoader's helper imports it by reference (a transform
    defined in the script being run, ``__main__``, is refused). librosa loads most of itself (scipy,
    numba: about 2 s) on its first call, made here: this process pays it before any clock starts (the
    helper pays it on its first sample, within its first batch).
    """
    if name is None:
        return None
    if name != "mel":
        raise ValueError(f"--transform must be 'mel', got {name!r}")
    import numpy as np

    from audiobuffer.cli.bench import mel_transform

    mel_transform({"audio": np.zeros(2048, dtype=np.float32), "sample_rate": 16000})  # see the docstring
    return mel_transform


def _media(images: bool, backend: Any = "pillow"
           ) -> tuple[Any, Callable[[Any], dict[str, Any]], int]:
    """The decoder, the collate function and the batch size of the audio corpora or the images
    (``backend``: the ``ImageDecoder``'s)."""
    from audiobuffer import AudioDecoder, ImageDecoder, pad_collate
    from audiobuffer.collate import image_collate

    if images:
        decoder = ImageDecoder(224, crop="random_resized", flip=True, backend=backend)
        return decoder, image_collate, IMAGE_BATCH
    return AudioDecoder(), pad_collate, BATCH_SIZE


def _batches(paths: Sequence[str], transform: Any, images: bool = False
             ) -> Iterator[dict[str, Any]]:
    """The sequential loop: decode and collate in this thread."""
    decoder, collate, size = _media(images)
    for i in range(0, len(paths), size):
        samples = [decoder(p) for p in paths[i:i + size]]
        if transform is not None:
            samples = [transform(s) for s in samples]
        yield collate(samples)


def _fresh_copy(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with each tensor copied into a new one, as ``IsolatedLoader`` copies a slot out."""
    import numpy as np
    import torch

    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            fresh = torch.empty(value.shape, dtype=value.dtype)
            np.copyto(fresh.numpy(), value.numpy())
            value = fresh
        out[name] = value
    return out


def _nothing_to_close() -> None:
    """The close of the step-alone and step-copy approaches: they hold no threads."""


def _loader(approach: str, paths: list[str], transform: Any, images: bool = False
            ) -> tuple[Callable[[], Iterator[dict[str, Any]]], Callable[[], None]]:
    """What makes the batches of an epoch (called again: the next epoch of the same loader, as
    training iterates it), and what to call after the last."""
    from torch.utils.data import DataLoader

    from audiobuffer import BufferedDataset, IsolatedLoader
    from audiobuffer.cli.bench import PathDataset

    # "-torch": the images decoded by ImageDecoder(backend="torch"); "-start": start_in_trainer
    parts = approach.split("-")
    backend = "torch" if "torch" in parts else "pillow"
    in_trainer = "start" in parts
    approach = "-".join(p for p in parts if p not in ("torch", "start"))
    decoder, collate, size = _media(images, backend)
    if approach == "loop":
        return lambda: _batches(paths, transform, images), lambda: None
    count = approach.rsplit("-", 1)[1]
    producers: Any = count if count == "auto" else int(count) if count.isdigit() else None
    if approach.startswith("buffered-"):
        ds = BufferedDataset(paths, decoder, num_producers=producers, buffer_size=BUFFER_SIZE, transform=transform)
        batches = DataLoader(ds, batch_size=size, collate_fn=collate)
        return lambda: iter(batches), ds.close
    if approach.startswith("isolated-"):
        loader = IsolatedLoader(paths, decoder, batch_size=size, num_producers=producers,
                                buffer_size=BUFFER_SIZE, transform=transform, pin_memory=False,
                                key="image" if images else "audio", start_in_trainer=in_trainer)
        return lambda: iter(loader), loader.close
    if approach.startswith("dataloader-2"):
        if transform is not None:
            raise ValueError(f"{approach} takes no transform; transform approaches: {TRANSFORM_APPROACHES}")
        spawn = approach.endswith("-spawn")
        extra: dict[str, Any] = {"multiprocessing_context": "spawn"} if spawn else {}
        if images:  # the Pillow Dataset as users write it, and the default collate
            from bench_images import PillowFolder

            dataset: Any = PillowFolder(paths)
        else:
            dataset, extra["collate_fn"] = PathDataset(paths), collate
        # Exhausting the iterator joins the workers, so nothing is left to close; the next epoch
        # starts them again (persistent_workers=False, the default)
        workers = DataLoader(dataset, batch_size=size, num_workers=2, **extra)
        return lambda: iter(workers), lambda: None
    raise ValueError(f"unknown approach {approach!r}; known: {APPROACHES}")


def neighbour(paths: Sequence[str], transform_name: str | None) -> None:
    """The body of the ``step-beside`` neighbour: decode ``paths`` over and over, one thread, at the
    helper's lower priority; print ``ready`` after the first file. Ends when its parent does."""
    from audiobuffer import AudioDecoder

    if hasattr(os, "nice"):
        os.nice(NEIGHBOUR_NICE)
    decoder, transform = AudioDecoder(), _transform(transform_name)
    parent = os.getppid()
    ready = False
    while True:
        for path in paths:
            sample = decoder(path)
            if transform is not None:
                transform(sample)
            if not ready:
                print("ready", flush=True)
                ready = True
            if os.getppid() != parent:  # the measuring process is gone: do not outlive it
                return


def _start_neighbour(file_list: Path, transform: str | None) -> subprocess.Popen[bytes]:
    """Start :func:`neighbour` on ``file_list`` and wait until it decodes."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--neighbour", "--file-list", str(file_list)]
    if transform:
        cmd += ["--transform", transform]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    line = proc.stdout.readline() if proc.stdout is not None else b""
    if line.strip() != b"ready":
        _stop_neighbour(proc)
        raise RuntimeError(f"the step-beside neighbour did not start (exit {proc.returncode})")
    return proc


def _stop_neighbour(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


def _epoch(approach: str, step_name: str, paths: list[str], transform: Any, device: str,
           file_list: Path | None = None, transform_name: str | None = None, images: bool = False
           ) -> dict[str, Any]:
    """One epoch of ``step_name`` steps on ``device`` fed by ``approach``, measured in this process
    (``file_list`` and ``transform_name``: what the ``step-beside`` neighbour decodes; ``images``:
    the corpus is images, and the loader's next epoch is measured too: ``warm_*``)."""
    step = make_step(STEPS[step_name], device)
    for _ in range(WARMUP_STEPS):
        step(None)
    size = _media(images)[2]
    n_batches = -(-len(paths) // size)
    ready = decoded = None
    if approach in ("step-alone", "step-beside"):  # decoded before the clock: the data is already there
        ready = next(_batches(paths[:size], transform, images))
    elif approach == "step-copy":
        decoded = list(_batches(paths, transform, images))
    busy = None
    if approach == "step-beside":
        if file_list is None:
            raise ValueError("step-beside needs the corpus's file list for its neighbour")
        busy = _start_neighbour(file_list, transform_name)
    gc.collect()
    start = time.perf_counter()
    epochs: Callable[[], Iterator[dict[str, Any]]]
    close: Callable[[], None] = _nothing_to_close
    if ready is not None:
        epochs = functools.partial(itertools.repeat, ready, n_batches)
    elif decoded is not None:
        epochs = functools.partial(map, _fresh_copy, decoded)
    else:
        epochs, close = _loader(approach, paths, transform, images)
    first = None
    step_s: list[float] = []
    files = 0
    warm: dict[str, float] = {}
    try:
        for batch in epochs():
            if first is None:
                first = time.perf_counter() - start
            t0 = time.perf_counter()
            step(batch)
            step_s.append(time.perf_counter() - t0)
            files += len(batch["image"] if "image" in batch else batch["lengths"])
        total = time.perf_counter() - start
        if images:  # the next epoch of the same loader: what the rest of a training run pays
            began, steps = time.perf_counter(), 0
            for batch in epochs():
                step(batch)
                steps += 1
            warm["warm_epoch_s"] = time.perf_counter() - began
            warm["warm_steps_per_s"] = steps / warm["warm_epoch_s"]
    finally:
        close()
        if busy is not None:
            _stop_neighbour(busy)
    return {"step_s": statistics.median(step_s), "epoch_s": total,
            "steps_per_s": len(step_s) / total,
            "first_batch_s": None if ready is not None or decoded is not None else first, "batches": len(step_s),
            "files": files, **warm}


def child(approach: str, steps: Sequence[str], paths: list[str], transform_name: str | None,
          device: str, file_list: Path | None = None, images: bool = False) -> dict[str, Any]:
    """The body of the subprocess: one epoch per step, each with a fresh loader."""
    import torch  # everything is imported before any clock starts, as in a training script
    import torch.utils.data

    import audiobuffer
    import audiobuffer.cli.bench  # noqa: F401

    torch.set_num_threads(1)
    transform = _transform(transform_name)
    return {name: _epoch(approach, name, paths, transform, device, file_list, transform_name,
                         images) for name in steps}


# -- the parent --------------------------------------------------------------------------------


def measure(approach: str, steps: Sequence[str], file_list: Path, transform: str | None, out: Path,
            device: str = "cpu", timeout: float = CHILD_TIMEOUT, images: bool = False
            ) -> dict[str, Any]:
    """Run one fresh subprocess; its per-step results plus ``peak_rss_mb`` of its whole tree."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", approach, "--steps", ",".join(steps),
           "--file-list", str(file_list), "--child-out", str(out), "--device", device]
    if transform:
        cmd += ["--transform", transform]
    if images:
        cmd += ["--image-corpus"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    status, err, peak = run_with_peak_rss(cmd, timeout=timeout, env=env)
    if status != 0:
        raise RuntimeError(f"{approach} ({file_list.stem}) failed (exit {status}): {err}")
    result = json.loads(out.read_text(encoding="utf-8"))
    result["peak_rss_mb"] = peak / 2**20
    return result


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def run_corpus(name: str, paths: list[str], approaches: Sequence[str], steps: Sequence[str], runs: int, *,
               transform: str | None, workdir: Path, device: str = "cpu", progress: bool = True,
               images: bool = False) -> dict[str, Any]:
    """Measure every approach ``runs`` times on one corpus (runs interleaved); the medians per step."""
    file_list = workdir / f"{name.replace('+', '-')}.txt"
    write_lines(file_list, paths)
    measured: dict[str, list[dict[str, Any]]] = {a: [] for a in approaches}
    for run in range(runs):  # interleaved, so a slow spell of the machine touches every approach alike
        for approach in approaches:
            out = workdir / f"{file_list.stem}.{approach}.{run}.json"
            measured[approach].append(measure(approach, steps, file_list, transform, out, device,
                                              images=images))
    rows: dict[str, dict[str, Any]] = {}
    for approach, runs_of in measured.items():
        row: dict[str, Any] = {"approach": approach, "runs": len(runs_of),
                               "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs_of)}
        for step in steps:
            row[step] = {key: _median([r[step].get(key) for r in runs_of])
                         for key in ("step_s", "epoch_s", "steps_per_s", "first_batch_s", "batches",
                                     "files", "warm_epoch_s", "warm_steps_per_s")
                         if key in runs_of[0][step]}
        rows[approach] = row
    alone = rows.get("step-alone")
    for row in rows.values():
        for step in steps:
            row[step]["vs_alone"] = row[step]["step_s"] / alone[step]["step_s"] if alone else None
    if progress:
        for row in rows.values():
            parts = [f"{step} {1000 * row[step]['step_s']:.2f} ms ({_x(row[step]['vs_alone'])}), "
                     f"epoch {row[step]['epoch_s']:.2f} s, {row[step]['steps_per_s']:.2f} steps/s"
                     for step in steps]
            print(f"  {name}: {row['approach']}: {'; '.join(parts)}; peak RSS {row['peak_rss_mb']:.0f} MiB",
                  file=sys.stderr)
    return {"name": name, "files": len(paths), "transform": transform, "steps": list(steps),
            "rows": list(rows.values())}


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def goals(results: Sequence[dict[str, Any]]) -> list[list[object]]:
    """Each goal of the isolated loader, checked against this run's medians (where both sides ran)."""
    out: list[list[object]] = []

    def add(goal: str, where: str, value: str, target: str, met: bool) -> None:
        out.append([goal, where, value, target, "yes" if met else "**no**"])

    for corpus, isolated in itertools.product(results, ISOLATED + IMAGE_ONLY[1:]):
        rows = {r["approach"]: r for r in corpus["rows"]}
        iso = rows.get(isolated)
        if iso is None:
            continue
        name, count = corpus["name"], isolated.removeprefix("isolated-")
        for step in corpus["steps"]:
            m = iso[step]
            where = f"{name}, {step} step"
            if m["vs_alone"] is not None:
                add(f"step with IsolatedLoader ({count}) / step alone", where, _x(m["vs_alone"]), "<= 1.05x",
                    m["vs_alone"] <= 1.05)
            # FSDD and FLAC: against the best in-process setting; with a GIL-holding transform, against
            # the in-process threads (goal 3).
            rivals = IN_PROCESS if name in ("fsdd", "flac") else THREADS if corpus["transform"] else []
            in_process = [(rows[a][step]["epoch_s"], a) for a in rivals if a in rows]
            if in_process:
                best, which = min(in_process)
                add(f"epoch time ({count}) / best in-process ({LABELS[which]})", where, f"{m['epoch_s'] / best:.2f}x",
                    "<= 1.00x", m["epoch_s"] <= best)
                # The helper's start (a fresh interpreter, and the transform's libraries, which the
                # in-process settings loaded before their clock) is in this one-epoch measurement, where
                # training pays it once per run: the epoch after the first batch compares the steady rates.
                steady = [(rows[a][step]["epoch_s"] - rows[a][step]["first_batch_s"], a) for a in rivals if a in rows]
                if steady and m["first_batch_s"] is not None:
                    best, which = min(steady)
                    mine = m["epoch_s"] - m["first_batch_s"]
                    add(f"epoch after its first batch ({count}) / best in-process ({LABELS[which]})", where,
                        f"{mine / best:.2f}x", "<= 1.00x", mine <= best)
        first_step = corpus["steps"][0]
        spawn = rows.get("dataloader-2-spawn")
        if spawn is not None and iso[first_step]["first_batch_s"] and spawn[first_step]["first_batch_s"]:
            ratio = iso[first_step]["first_batch_s"] / spawn[first_step]["first_batch_s"]
            add(f"first batch ({count}) / DataLoader(2) spawn", f"{name}, {first_step} step", f"{ratio:.2f}", "<= 0.20",
                ratio <= 0.2)
        fork = rows.get("dataloader-2")
        if fork is not None and name == IMAGE_CORPUS:
            for step in corpus["steps"]:
                ratio = iso[step]["steps_per_s"] / fork[step]["steps_per_s"]
                add(f"steps/s ({count}) / DataLoader(2) fork", f"{name}, {step} step", _x(ratio),
                    ">= 1.20x", ratio >= 1.2)
                if "warm_steps_per_s" in iso[step] and "warm_steps_per_s" in fork[step]:
                    ratio = iso[step]["warm_steps_per_s"] / fork[step]["warm_steps_per_s"]
                    add(f"next epoch's steps/s ({count}) / DataLoader(2) fork's",
                        f"{name}, {step} step", _x(ratio), ">= 1.20x", ratio >= 1.2)
        if fork is not None:
            ratio = iso["peak_rss_mb"] / fork["peak_rss_mb"]
            add(f"peak tree RSS ({count}) / DataLoader(2) fork", name, f"{ratio:.2f}", "<= 0.60", ratio <= 0.6)
    return out


def rows_of(corpora: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (corpus, approach), named by both, with the approach's label."""
    return [{"corpus": corpus["name"], "files": corpus["files"], "label": LABELS[row["approach"]], **row}
            for corpus in corpora for row in corpus["rows"]]


def machine_of_children() -> dict[str, str]:
    """This machine and versions as the measuring subprocesses see them (one intra-op thread)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return machine_info()
    finally:
        torch.set_num_threads(threads)


def _csv(value: str, known: Sequence[str], flag: str, parser: argparse.ArgumentParser) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in known]
    if unknown or not items:
        parser.error(f"{flag} takes a comma-separated subset of {','.join(known)}, got {value!r}")
    return items


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=None, help="runs per approach; medians are reported "
                        "(default 3; --quick: 1)")
    parser.add_argument("--files", type=int, default=None, help="files per generated corpus (default 300; --quick: "
                        "32, and FSDD cut to as many)")
    parser.add_argument("--fsdd", type=Path, default=FSDD, help=f"the FSDD recordings (default {FSDD})")
    parser.add_argument("--corpora", default=",".join(CORPORA), help=f"subset of {','.join(CORPORA)}")
    parser.add_argument("--steps", default=None, help="light,heavy (default both; --quick: light)")
    parser.add_argument("--approaches", default=None,
                        help=f"subset of {','.join(APPROACHES + OPTIONAL)} (default: all but "
                        f"{','.join(OPTIONAL)}; --images: {','.join(IMAGE_APPROACHES)})")
    parser.add_argument("--images", type=int, default=None, metavar="N",
                        help=f"the image case instead: N JPEGs, batches of {IMAGE_BATCH}; saves "
                        f"results/{SECTION}-images.json")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 32 files, 1 run, the light step "
                        "(its numbers mean little)")
    parser.add_argument("--device", default="cpu", help="where the step's tensors live: cpu (default) or cuda; "
                        f"cuda saves the results {SECTION + '-cuda'!r}")
    add_write_options(parser, SECTION)  # named by the case and device: contention-images-cuda
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where corpora are made (default: a temp folder)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--neighbour", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--file-list", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--transform", help=argparse.SUPPRESS)
    parser.add_argument("--image-corpus", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    steps = _csv(args.steps or ("light" if args.quick else "light,heavy"), list(STEPS), "--steps", parser)
    if args.neighbour:
        neighbour(read_lines(args.file_list), args.transform)
        return 0
    if args.child:
        paths = read_lines(args.file_list)
        measured_here = child(args.child, steps, paths, args.transform, args.device,
                              args.file_list, args.image_corpus)
        args.child_out.write_text(json.dumps(measured_here), encoding="utf-8", newline="\n")
        return 0
    files = args.files if args.files is not None else 32 if args.quick else 300
    runs = args.runs if args.runs is not None else 1 if args.quick else 3
    if runs < 1 or files < BATCH_SIZE:
        parser.error(f"--runs must be >= 1 and --files >= {BATCH_SIZE}, got {runs} and {files}")
    if args.write and args.quick:
        parser.error("--write takes a full run; --quick is a smoke test whose numbers mean little")
    images = args.images is not None
    corpora = [IMAGE_CORPUS] if images else _csv(args.corpora, CORPORA, "--corpora", parser)
    default = IMAGE_APPROACHES if images else APPROACHES
    known = APPROACHES + OPTIONAL + (IMAGE_ONLY if images else [])
    approaches = _csv(args.approaches or ",".join(default), known, "--approaches", parser)
    if images and (args.images < IMAGE_BATCH or "step-beside" in approaches):
        parser.error(f"--images must be >= {IMAGE_BATCH}, and step-beside decodes audio only")
    if args.device not in ("cpu", "cuda"):
        parser.error(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device here")
    corpora_measured = []
    started, load_before = time.perf_counter(), load_average()
    with tempfile.TemporaryDirectory(prefix="audiobuffer-contention-") as tmp:
        cache = args.cache_dir or Path(tmp)
        for name in corpora:
            if name == IMAGE_CORPUS:
                from audiobuffer.cli._photos import make_photo_corpus

                root = make_photo_corpus(cache / f"jpeg-{args.images}", args.images)
                paths = sorted(str(p) for p in root.rglob("*.jpg"))
            elif name == "fsdd":
                fsdd = fsdd_files(args.fsdd)
                if not fsdd:
                    continue
                paths = fsdd[::max(1, len(fsdd) // files)][:files] if args.quick else fsdd
            else:
                fmt = name.split("+")[0]
                paths = make_corpus(cache / f"{fmt}-{files}", files, fmt)
            transform = "mel" if name == "flac+mel" else None
            corpus_steps = steps[:1] if transform else steps  # the mel corpus: its first step only
            chosen = [a for a in approaches if not transform or a in TRANSFORM_APPROACHES]
            print(f"{name}: {len(paths)} files, {', '.join(chosen)}; steps {', '.join(corpus_steps)}", file=sys.stderr)
            corpora_measured.append(run_corpus(name, paths, chosen, corpus_steps, runs, transform=transform,
                                               workdir=Path(tmp), device=args.device,
                                               images=images))
    load_after = load_average()
    print(f"took {time.perf_counter() - started:.0f} s; load average before {load_before}, "
          f"after {load_after}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(corpora_measured, indent=2), encoding="utf-8", newline="\n")
    if not corpora_measured:
        print("Contention: no corpus was measured.")
        return 0
    device = "" if args.device == "cpu" else f"-{args.device}"
    name = SECTION + ("-images" if images else "") + device
    measured = results(name, rows_of(corpora_measured), command=command_line("bench_contention.py", argv),
                       machine=machine_of_children(),
                       settings={"runs": runs, "device": args.device, "steps": {s: STEPS[s] for s in steps},
                                 "batch_size": IMAGE_BATCH if images else BATCH_SIZE,
                                 "buffer_size": BUFFER_SIZE, "load_before": load_before,
                                 "load_after": load_after})
    print(render.preview(measured))
    checked = goals(corpora_measured)
    if checked:
        print("\nThe IsolatedLoader's goals, checked against this run:\n")
        print(table(["goal", "where", "measured", "target", "met"], checked))
    write_results(measured, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
