"""Train a small CNN on JPEG photo crops, fed by audiobuffer's producer threads.

The task: which of three photographs a crop comes from. The script makes its images itself, once:
random crops (a third of the photograph's width and height to all of it, 128 to 256 pixels a side,
mirrored half the time) of the photographs scikit-learn (``china.jpg``, ``flower.jpg``) and
matplotlib (``grace_hopper.jpg``) ship, written as JPEGs into an ImageFolder tree, a folder per
photograph: ``--images`` for training, ``--test-images`` other crops for testing. The test crops
come from the same three photographs, so the accuracy says how well the model tells these
photographs apart from a part of one, not how it does on photographs it never saw.

Training reads ``ImageDecoder(size, crop="random_resized", flip=True, backend="torch")`` crops
(torchvision's ``RandomResizedCrop`` and a flip; ``--backend pillow`` for Pillow's decode and
resize), testing ``crop="center"``; both through ``BufferedDataset(root,
decoder, labels="parent")`` and a ``DataLoader`` with ``image_collate``, or with ``--loader
isolated`` through an ``IsolatedLoader`` (the producers in a helper process). The model
(``ImageCNN`` in ``audiobuffer/cli/_model.py``: copy it and change it) takes the uint8 batch and
normalises it on the training device (``audiobuffer.Normalize``). One process:

    python scripts/train_image.py

Two processes on one CPU machine (gloo; each rank decodes and trains on its own shard):

    torchrun --nproc_per_node=2 scripts/train_image.py

Checkpoints and resume are ``scripts/train_audio.py``'s (``audiobuffer/cli/_training.py``): the
model, the optimiser, the schedule and each rank's loader state go to ``last.pt`` in
``--checkpoint-dir`` (default ``runs/train_image/``) every ``--save-every`` steps, at each epoch's
end and on Ctrl-C; ``--resume PATH`` continues mid-epoch, each crop trained on once, and on another
``--nproc_per_node`` too. A crop's box and flip are drawn from the seed, the epoch and the item, so
a resumed epoch draws the crops the unbroken one would have.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from audiobuffer.cli._threads import quiet_openmp

# Before torch loads OpenMP: see NOTE [ torch threads beside producers ].
OPENMP_WAIT = quiet_openmp()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from audiobuffer import BufferedDataset, ImageDecoder, IsolatedLoader  # noqa: E402
from audiobuffer.cli._model import ImageCNN  # noqa: E402
from audiobuffer.cli._photos import make_photo_corpus  # noqa: E402
from audiobuffer.cli._training import (  # noqa: E402
    CHECKPOINT_NAME,
    Job,
    Ranks,
    add_arguments,
    closing,
    fit,
    load_checkpoint,
    parse_args,
    script_main,
    start,
)
from audiobuffer.collate import image_collate  # noqa: E402
from audiobuffer.errors import ConfigError, ResumeError  # noqa: E402
from audiobuffer.loaders.device import resolve_device  # noqa: E402
from audiobuffer.prepare.durations import cache_root  # noqa: E402

#: ``--save-every``'s default: within the default epoch of 38 steps.
SAVE_EVERY = 25
#: The pixels a side of the corpus's images: the least and the most.
SIDES = (128, 256)
#: Each photograph cut into 2 x 2 cells: a class a cell, 12 in all.
GRID = (2, 2)
#: The seeds of the training crops and of the test crops (other crops of the same photographs).
TRAIN_SEED, TEST_SEED = 0, 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--data", type=Path, default=None, metavar="DIR",
        help="where the photo crops are made, once (default: photo-crops/ in audiobuffer's cache "
             "folder); DIR/train-N-2x2 and DIR/test-M-2x2 hold a folder per class")
    add("--images", type=int, default=1200, help="training crops (default 1200)")
    add("--test-images", type=int, default=300, help="test crops (default 300)")
    add("--size", type=int, default=64, help="pixels a side the model sees (default 64)")
    add("--epochs", type=int, default=4, help="epochs (default 4)")
    add("--batch-size", type=int, default=32, help="crops per batch (default 32)")
    add("--lr", type=float, default=3e-3, help="the one-cycle schedule's peak rate (default 3e-3)")
    add("--weight-decay", type=float, default=1e-4, help="AdamW's weight decay (default 1e-4)")
    add("--channels", type=int, default=16, help="the first conv block's channels (default 16)")
    add("--producers", type=int, default=2, help="decoding threads (default 2)")
    add("--backend", choices=("torch", "pillow"), default="torch",
        help="ImageDecoder's backend: simplejpeg decodes and torch resizes (the default), or "
             "Pillow does both")
    add("--loader", choices=("dataset", "isolated"), default="dataset",
        help="BufferedDataset and a DataLoader in this process, or an IsolatedLoader (the "
             "producers in a helper process)")
    add("--seed", type=int, default=0, help="shuffles, crops and the model's start (default 0)")
    add("--device", default="auto", help="'auto' (CUDA where there is one), 'cpu' or 'cuda'")
    add_arguments(parser, save_every=SAVE_EVERY,
                  checkpoint_default=f"runs/train_image/{CHECKPOINT_NAME} under the current "
                                     "directory",
                  resume_note="the options must be the ones it was made with")
    return parser


def make_data(args: argparse.Namespace, ranks: Ranks) -> tuple[Path, Path]:
    """The training and test folders, made once by rank 0 while the other ranks wait."""
    root = args.data if args.data is not None else cache_root() / "photo-crops"
    cells = f"{GRID[0]}x{GRID[1]}"  # a folder of its own for each corpus, never one mixed
    train_root = root / f"train-{args.images}-{cells}"
    test_root = root / f"test-{args.test_images}-{cells}"
    if ranks.rank == 0:
        for folder, n, seed in ((train_root, args.images, TRAIN_SEED),
                                (test_root, args.test_images, TEST_SEED)):
            if not n:
                continue
            try:
                make_photo_corpus(folder, n, seed=seed, classes=None, sides=SIDES,
                                  grid=GRID)
            except FileNotFoundError as exc:
                raise ConfigError(f"cannot make the photo crops in {str(folder)!r}: {exc}") from exc
    if ranks.distributed:
        dist.barrier()
    return train_root, test_root


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("images", "test_images", "size", "epochs", "batch_size", "channels", "producers"):
        value = getattr(args, name)
        least = 0 if name == "test_images" else 1
        if value < least:
            parser.error(f"--{name.replace('_', '-')} must be >= {least}, got {value}")


def _check_resume(resume: dict[str, Any], settings: dict[str, Any]) -> None:
    """Refuse a checkpoint of other crops or another model (the rest of the setup is checked by
    the loop: classes, epochs, steps)."""
    kept = ("images", "test_images", "size", "channels", "seed")
    changed = [f"--{name.replace('_', '-')} {resume['config'].get(name)!r} (now {settings[name]!r})"
               for name in kept if resume["config"].get(name) != settings[name]]
    if changed:
        raise ResumeError("--resume: the checkpoint was made with " + "; ".join(changed) +
                          "; resume with the options it was made with")


def train(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parse_args(parser, argv)
    _check(parser, args)
    ranks = start(args, resolve_device(args.device), seed=args.seed, wait=OPENMP_WAIT)
    settings = {name: getattr(args, name) for name in (
        "images", "test_images", "size", "batch_size", "lr", "weight_decay", "channels", "loader",
        "backend", "seed")}
    resume = load_checkpoint(args.resume) if args.resume is not None else None
    if resume is not None:
        _check_resume(resume, settings)
    train_root, test_root = make_data(args, ranks)

    augment = ImageDecoder(args.size, crop="random_resized", flip=True, backend=args.backend)
    center = ImageDecoder(args.size, crop="center", backend=args.backend)
    # Each rank its shard (torch.distributed). Unordered by default: batches as producers finish.
    common: dict[str, Any] = {"labels": "parent", "num_producers": args.producers,
                              "seed": args.seed}
    ordered = bool(args.deterministic)
    pin = ranks.device.type == "cuda"
    train_set: Any
    train_loader: Any
    test_set: Any = None
    test_loader: Any = None
    if args.loader == "isolated":
        batching = {"batch_size": args.batch_size, "key": "image", "pin_memory": pin}
        train_set = train_loader = IsolatedLoader(str(train_root), augment, shuffle=True,
                                                  ordered=ordered, **batching, **common)
        if args.test_images:
            test_set = test_loader = IsolatedLoader(str(test_root), center, shuffle=False,
                                                    ordered=True, **batching, **common)
    else:
        train_set = BufferedDataset(str(train_root), augment, shuffle=True, ordered=ordered,
                                    **common)
        if args.test_images:
            test_set = BufferedDataset(str(test_root), center, shuffle=False, ordered=True,
                                       **common)
        # A DataLoader's generator of its own: dropout's draws from torch's global one stay those
        # of an unbroken run when a run resumes.
        train_loader, test_loader = (
            DataLoader(data, batch_size=args.batch_size, collate_fn=image_collate, pin_memory=pin,
                       generator=torch.Generator().manual_seed(args.seed))
            if data is not None else None for data in (train_set, test_set))
    with closing(train_set, test_set):  # stops producers (and a helper process)
        model = ImageCNN(len(train_set.classes), channels=args.channels).to(ranks.device)
        job = Job(args=args, ranks=ranks, classes=train_set.classes, epochs=args.epochs,
                  lr=args.lr, weight_decay=args.weight_decay, key="image", train_set=train_set,
                  train_loader=train_loader, test_loader=test_loader,
                  save_to=(args.checkpoint_dir or Path("runs") / "train_image") / CHECKPOINT_NAME,
                  config=settings, resume=resume)
        about = (f"{args.images} train / {args.test_images} test images of {args.size} px, "
                 f"{len(train_set.classes)} classes")
        return fit(job, model, about=about)


if __name__ == "__main__":
    script_main("train_image", train)
