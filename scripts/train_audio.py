"""Train a small CNN on log-mel features, fed by audiobuffer from a YAML pipeline config.

Copy it and change the model: the model (``SpeechCNN``), its optimiser, its training step and its
evaluation are the ones ``audiobuffer demo`` uses, in ``audiobuffer/cli/_model.py``. One process:

    python scripts/train_audio.py --config configs/fsdd.yaml

Two processes on one CPU machine (gloo; each rank decodes and trains on its own shard):

    torchrun --nproc_per_node=2 scripts/train_audio.py --config configs/fsdd.yaml

The config's ``train`` section sets the optimiser, the features, the model width and the test split
(``test_files``: a regex on the file name). Features are computed on the whole batch on the training
device (``audiobuffer.features.LogMel``), not per sample in the producers.

Checkpoints hold the whole training state: model, optimiser, learning-rate schedule, epoch, step, the
random state and each rank's ``BufferedDataset.state_dict()``. They are written to ``last.pt`` in
``--checkpoint-dir`` (default: the config's ``train.checkpoint`` file if it names one, else
``runs/CONFIG-NAME/`` under the current directory, which this repository's .gitignore ignores) every
``--save-every`` steps, at the end of each epoch and on Ctrl-C (after the step under way; the script
then prints the command that resumes and exits with status 130). ``--resume PATH`` continues from one,
mid-epoch too: the resumed epoch trains on exactly the samples of that epoch it had not trained on yet.
A checkpoint of another ``--nproc_per_node`` resumes too: the ranks' dataset states are merged
(``audiobuffer.merge_states``) and the samples not yet trained on are dealt again over the new ranks;
the learning-rate schedule keeps its place as a share of the whole run.

By default samples are batched in the order the producers finish them, so the batches, and with them
the per-epoch loss and accuracy, vary a little from run to run. ``--deterministic`` hands samples out
in the epoch's own order (``ordered=True``) and asks torch for deterministic kernels: the same config
then gives the same figures on the same machine and versions, resumed or not.

``--max-batch-seconds S`` batches by duration (``loader.max_batch_seconds``): each batch holds at most S
seconds of padded audio, cut from duration buckets so that it pads little; steps per epoch are then the
batches of the first epoch, the same on every rank. For an attention model, ``--set
loader.quadratic_duration=Q`` counts a batch of n items whose longest lasts L seconds as n * (L + L*L/Q).

``--augment NOISE`` trains on speed-perturbed audio (0.9, 1.0, 1.1) with noise from NOISE (a folder, a
file list or a manifest) mixed in at 10-20 dB for half the items (``decode.augment``). The test set is
never augmented, whatever the config's ``decode.augment``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from audiobuffer.cli._threads import parse_threads, quiet_openmp, set_torch_threads

OPENMP_WAIT = quiet_openmp()  # before torch loads OpenMP: see NOTE [ torch threads beside producers ]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from tqdm import tqdm  # noqa: E402

from audiobuffer.cli._model import SpeechCNN, evaluate, make_optimizer, train_step  # noqa: E402
from audiobuffer.config import (  # noqa: E402
    build_dataset,
    build_isolated,
    build_loader,
    build_source,
    load_config,
)
from audiobuffer.engine.resize import merge_states  # noqa: E402
from audiobuffer.errors import AudioBufferError, ResumeError  # noqa: E402
from audiobuffer.loaders.device import DevicePrefetcher, resolve_device  # noqa: E402

CHECKPOINT_NAME = "last.pt"
CHECKPOINT_FORMAT = 2  # 1: the model only, after each epoch (cannot be resumed)
#: ``--save-every``'s default: below configs/fsdd.yaml's 85 steps an epoch, so an epoch holds a save.
SAVE_EVERY = 50
#: The exit status after Ctrl-C, as a shell reports a process that SIGINT ended (128 + 2).
INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    try:
        return train(argv)
    finally:
        if dist.is_initialized():
            # No rank tears gloo down while another is still in a collective or writing the checkpoint.
            dist.barrier()
            dist.destroy_process_group()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="pipeline config (YAML)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable), e.g. --set epochs=3")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, metavar="DIR",
                        help=f"write checkpoints to DIR/{CHECKPOINT_NAME} (default: the config's train.checkpoint "
                             f"file if set, else runs/CONFIG-NAME/{CHECKPOINT_NAME} under the current directory)")
    parser.add_argument("--save-every", type=int, default=SAVE_EVERY, metavar="N",
                        help=f"also checkpoint every N steps within an epoch (default {SAVE_EVERY}; 0: at epoch "
                             "ends and on Ctrl-C only)")
    parser.add_argument("--resume", type=Path, default=None, metavar="PATH",
                        help=f"continue from a checkpoint (a file, or a folder holding {CHECKPOINT_NAME}), mid-epoch "
                             "too; the config must be the one it was made with")
    parser.add_argument("--deterministic", action="store_true",
                        help="hand samples out in the epoch's order (ordered=True) and use deterministic kernels, "
                             "so that runs repeat; by default batches, and so the per-epoch figures, vary a little")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="a progress bar within each epoch (default: when stderr is a terminal)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many steps")
    parser.add_argument("--stop-at-step", type=int, default=None, metavar="N",
                        help="checkpoint and stop once N steps are done in all (counting those before a resume), "
                             "e.g. to fit a job's time limit; --resume continues")
    parser.add_argument("--seen-log", type=Path, default=None, metavar="DIR",
                        help="append the files each rank trains on to DIR/rank{N}.jsonl, one line per step")
    parser.add_argument("--json", type=Path, default=None, help="write the final metrics to this file")
    parser.add_argument("--threads", type=_threads_arg, default="auto", metavar="N",
                        help="torch's intra-op threads for a CPU step: a count, or 'auto' (the default: torch's "
                             "count on a quiet machine, 1 on a busy one; OMP_NUM_THREADS, where set, is kept)")
    parser.add_argument("--max-batch-seconds", type=float, default=None, metavar="S",
                        help="batch by duration: at most S seconds of padded audio per batch "
                             "(the same as --set loader.max_batch_seconds=S)")
    parser.add_argument("--augment", default=None, metavar="NOISE",
                        help="speed perturbation (0.9, 1.0, 1.1) and noise from NOISE (a folder, file list or "
                             "manifest) at 10-20 dB SNR for half the items (sets decode.augment); the test set "
                             "is never augmented")
    return parser


def augment_override(noise: str | os.PathLike[str]) -> str:
    """The ``--set`` override of ``--augment NOISE``: speed perturbation, and ``noise`` (a path, made
    absolute, or a URL) mixed in."""
    source = os.fspath(noise)
    source = source if "://" in source else str(Path(source).resolve())
    entries = [{"kind": "speed_perturb", "factors": [0.9, 1.0, 1.1]},
               {"kind": "add_noise", "source": source, "snr_db": [10.0, 20.0], "p": 0.5}]
    return f"decode.augment={json.dumps(entries)}"


# NOTE [ Ctrl-C in the training script ]
# ======================================
# Ctrl-C (SIGINT) only asks to stop: the handler sets a flag, and the loop acts on it between steps,
# where the model, the optimiser, the step count and the dataset's state agree. It then writes a
# checkpoint (mid-epoch, with the dataset's state as of the last step trained), prints one line with
# the command that resumes, and the script exits with status 130. Under torchrun every rank gets the
# signal (from the terminal, and again from torchrun), at different points of its step: the ranks
# agree after each step (an all-reduce of the flag), so all stop after the same step and save it
# together. A second Ctrl-C in one process stops at once (KeyboardInterrupt): the checkpoint on disk is
# then the last one written, whole (_write_checkpoint replaces it atomically).
class Interrupts:
    """Ctrl-C during training, acted on between steps (see NOTE [ Ctrl-C in the training script ])."""

    def __init__(self, *, distributed: bool, announce: bool) -> None:
        self.requested = False
        self._distributed = distributed
        self._announce = announce
        self._previous: Any = None

    def __enter__(self) -> Interrupts:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested and not self._distributed:
            raise KeyboardInterrupt
        if not self.requested and self._announce:
            os.write(2, b"\ninterrupted: saving a checkpoint after this step (Ctrl-C again: stop now)\n")
        self.requested = True

    def stop(self) -> bool:
        """Whether to stop now: this process was interrupted, or under torchrun any rank was (collective)."""
        if not self._distributed:
            return self.requested
        flag = torch.tensor([int(self.requested)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def resume_command(argv: list[str], checkpoint: Path) -> str:
    """The command that resumes this run from ``checkpoint``: this one's, ``--resume`` replaced."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume="):
            kept.append(arg)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        local = os.environ.get("LOCAL_WORLD_SIZE", "1")
        same = os.environ.get("WORLD_SIZE") == local
        launcher = ["torchrun", f"--nproc_per_node={local}"] if same else ["torchrun", "<its options>"]
    else:
        launcher = [sys.executable]
    words = [*launcher, sys.argv[0], *kept, "--resume", str(checkpoint.resolve())]
    return subprocess.list2cmdline(words) if sys.platform == "win32" else shlex.join(words)


def _threads_arg(value: str) -> Any:
    try:
        return parse_threads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--threads ")) from None


def checkpoint_path(args: argparse.Namespace, config: Any) -> Path:
    """Where checkpoints go: --checkpoint-dir, else the config's train.checkpoint, else ./runs/CONFIG-NAME/."""
    if args.checkpoint_dir is not None:
        return args.checkpoint_dir / CHECKPOINT_NAME
    if config.train.checkpoint:
        return Path(config.train.checkpoint)
    return Path("runs") / Path(args.config).stem / CHECKPOINT_NAME


def train(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    for name in ("save_every", "max_steps", "stop_at_step"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "save_every" else 1):
            parser.error(f"--{name.replace('_', '-')} must be >= {0 if name == 'save_every' else 1}, got {value}")

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    by_duration = [] if args.max_batch_seconds is None else [f"loader.max_batch_seconds={args.max_batch_seconds!r}"]
    augment = [] if args.augment is None else [augment_override(args.augment)]
    config = load_config(args.config, args.overrides + by_duration + augment)
    # The test set is never augmented: it measures the model on the recordings as they are.
    plain = config.model_copy(update={"decode": config.decode.model_copy(update={"augment": []})})
    device = resolve_device(config.device)
    if distributed:
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    threads = set_torch_threads(args.threads, device_type=device.type, wait=OPENMP_WAIT)
    if rank == 0:
        print(threads)
    torch.manual_seed(config.seed)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for repeatable results
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    resume = _load_checkpoint(args.resume) if args.resume is not None else None
    save_to = checkpoint_path(args, config)

    # Split one source into train and test by file name; both keep the same classes.
    source = build_source(config)
    test_re = re.compile(config.train.test_files) if config.train.test_files else None
    is_test = [bool(test_re and test_re.search(os.path.basename(p))) for p in source.paths]
    train_source = source.subset([i for i, t in enumerate(is_test) if not t])
    test_source = source.subset([i for i, t in enumerate(is_test) if t]) if any(is_test) else None
    # Each rank its shard (torch.distributed). Unordered by default: batches in the order producers finish.
    ordered = True if args.deterministic else None
    if config.buffer.isolate:  # producers in a helper process: one object holds epochs, state and batches
        train_set = train_loader = build_isolated(config, source=train_source, ordered=ordered)
        test_set = test_loader = (build_isolated(plain, source=test_source, shuffle=False, ordered=True)
                                  if test_source else None)
    else:
        train_set = build_dataset(config, source=train_source, ordered=ordered)
        test_set = build_dataset(plain, source=test_source, shuffle=False, ordered=True) if test_source else None
        train_loader = build_loader(config, train_set)
        test_loader = build_loader(config, test_set) if test_set is not None else None
        # Each iter() of a DataLoader draws a seed from its generator, by default torch's global one, which
        # dropout uses too: a generator of their own keeps a resumed run's dropout in step with an unbroken one.
        for loader in (train_loader, test_loader):
            if loader is not None:
                loader.generator = torch.Generator().manual_seed(config.seed)
    try:
        with Interrupts(distributed=distributed, announce=rank == 0) as interrupts:
            return _train(args, config, device, distributed, rank, world_size, resume, save_to, source,
                          train_source, test_source, train_set, train_loader, test_loader, interrupts)
    finally:
        for data in (train_set, test_set):
            if data is not None:
                data.close()  # stops producers (and an isolated loader's helper process)


def _train(args: argparse.Namespace, config: Any, device: torch.device, distributed: bool, rank: int,
           world_size: int, resume: dict | None, save_to: Path, source: Any, train_source: Any,
           test_source: Any, train_set: Any, train_loader: Any, test_loader: Any,
           interrupts: Interrupts) -> int:

    sample_rate = config.decode.sample_rate or 16000
    t = config.train
    model: nn.Module = SpeechCNN(len(source.classes), sample_rate, n_fft=t.n_fft, hop_length=t.hop_length,
                                 n_mels=t.n_mels, channels=t.channels).to(device)
    # Every rank must take the same number of steps, or the last gradient all-reduce waits forever.
    steps = _agree_min(len(train_loader), distributed)
    if args.max_steps is not None:
        steps = min(steps, args.max_steps)
    optimizer, schedule = make_optimizer(model, lr=t.lr, weight_decay=t.weight_decay, epochs=config.epochs,
                                         steps_per_epoch=steps)
    metrics: dict = {"world_size": world_size, "epochs": [], "stopped_at": None}
    start_epoch, start_step, mine = 0, 0, None
    if resume is not None:
        _check_fits(resume, classes=source.classes, epochs=config.epochs, steps=steps, world_size=world_size)
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        start_epoch, start_step = resume["epoch"], resume["step"]
        if resume["world_size"] == world_size:  # else placed once the epoch's steps are known
            schedule.load_state_dict(resume["schedule"])
        metrics["epochs"] = resume["metrics"]
        mine = _rank_state(resume, rank, world_size)
    if distributed:
        model = DistributedDataParallel(model)
    plain = model.module if isinstance(model, DistributedDataParallel) else model

    log = print if rank == 0 else (lambda *a, **k: None)
    log(f"{len(train_source)} train / {len(test_source) if test_source else 0} test files, "
        f"{len(source.classes)} classes, {world_size} rank(s), {steps} steps per epoch, device {device}")
    if not config.loader.shuffle:  # the default, as in Python: a training config says shuffle: true
        log("loader.shuffle is false: every epoch trains in the source's order (set loader.shuffle: true to "
            "reshuffle each epoch)")
    if resume is not None:
        log(f"resuming {args.resume} at epoch {start_epoch + 1}, step {start_step}")
    show_progress = rank == 0 and (args.progress if args.progress is not None else sys.stderr.isatty())

    def save(epoch: int, step: int, data_state: dict | None, loss_sum: torch.Tensor) -> None:
        """Checkpoint: the next run starts ``epoch`` at ``step``, with this rank's dataset at ``data_state``.

        Collective under torchrun (each rank's dataset state is gathered); rank 0 writes the file.
        """
        ranks = _gather({"dataset": data_state, "loss_sum": loss_sum.tolist(), "rng": torch.get_rng_state(),
                         "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else None},
                        distributed, world_size)
        if rank == 0:
            _write_checkpoint(save_to, {
                "format": CHECKPOINT_FORMAT, "model": plain.state_dict(), "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(), "epoch": epoch, "step": step, "steps_per_epoch": steps,
                "epochs": config.epochs, "world_size": world_size, "ranks": ranks, "metrics": metrics["epochs"],
                "classes": source.classes, "config": config.model_dump(mode="json"),
                "test_accuracy": metrics["epochs"][-1]["test_accuracy"] if metrics["epochs"] else None})

    for epoch in range(start_epoch, config.epochs):
        start = time.perf_counter()
        first_step = start_step if epoch == start_epoch else 0
        loss_sum = torch.zeros(2, dtype=torch.float64)
        if epoch == start_epoch and mine is not None:
            if mine["dataset"] is not None:
                train_set.load_state_dict(mine["dataset"])  # the next iter() yields the rest of this epoch
            if resume is not None and resume["world_size"] != world_size:  # the rest dealt anew
                if mine["dataset"] is not None:
                    first_step = max(0, steps - _agree_min(len(train_loader), distributed))
                _schedule_at(schedule, epoch * steps + first_step)
            loss_sum = torch.tensor(mine["loss_sum"], dtype=torch.float64)
            torch.set_rng_state(mine["rng"])
            if mine["cuda_rng"] is not None and device.type == "cuda":
                torch.cuda.set_rng_state_all(mine["cuda_rng"])
        train_set.set_epoch(epoch)
        model.train()
        bar = tqdm(total=steps, initial=first_step, desc=f"epoch {epoch + 1}/{config.epochs}", unit="step",
                   disable=not show_progress, leave=False, dynamic_ncols=True)
        stopped, interrupted = None, False
        done = first_step
        # Batches arrive on the device, each with the dataset's state as of the end of that batch.
        for step, (batch, data_state) in enumerate(DevicePrefetcher(with_state(train_loader, train_set), device),
                                                   start=first_step):
            if step >= steps:
                break  # leaving the loop stops this epoch's producers
            value = train_step(model, batch, optimizer, schedule)
            loss_sum += torch.tensor([value * len(batch["label"]), len(batch["label"])], dtype=torch.float64)
            done = step + 1
            bar.set_postfix(loss=f"{value:.4f}", refresh=False)
            bar.update(1)
            if args.seen_log is not None:
                _log_seen(args.seen_log, rank, epoch, step, batch["path"])
            if done < steps:
                if interrupts.stop():  # see NOTE [ Ctrl-C in the training script ]
                    stopped, interrupted = (epoch, done), True
                    save(epoch, done, data_state, loss_sum)
                    break
                if args.stop_at_step is not None and epoch * steps + done >= args.stop_at_step:
                    stopped = (epoch, done)
                    save(epoch, done, data_state, loss_sum)
                    break
                if args.save_every and done % args.save_every == 0:
                    save(epoch, done, data_state, loss_sum)
        bar.close()
        if stopped is not None and interrupted:
            metrics["stopped_at"] = {"epoch": stopped[0], "step": stopped[1], "interrupted": True}
            log(interrupted_line(epoch, done, steps, save_to, args.argv))
            break
        if stopped is not None:
            metrics["stopped_at"] = {"epoch": stopped[0], "step": stopped[1]}
            log(f"stopped at epoch {epoch + 1}, step {done} of {steps}; continue with --resume {save_to}")
            break
        loss_sum = _sum(loss_sum, distributed)
        accuracy = (evaluate(model, test_loader, device, reduce=lambda counts: _sum(counts, distributed))
                    if test_loader is not None else None)
        entry = {"epoch": epoch, "loss": float(loss_sum[0] / max(1.0, float(loss_sum[1]))),
                 "test_accuracy": accuracy, "seconds": time.perf_counter() - start,
                 "train_stats": train_set.stats().as_dict()}
        metrics["epochs"].append(entry)
        acc = f", test accuracy {100 * accuracy:.2f}%" if accuracy is not None else ""
        log(f"epoch {epoch + 1}/{config.epochs}: loss {entry['loss']:.4f}{acc} ({entry['seconds']:.1f} s)")
        save(epoch + 1, 0, None, torch.zeros(2, dtype=torch.float64))  # the next epoch, from its start
        if epoch + 1 < config.epochs and interrupts.stop():
            metrics["stopped_at"] = {"epoch": epoch + 1, "step": 0, "interrupted": True}
            log(interrupted_line(epoch + 1, 0, steps, save_to, args.argv))
            break
        if args.stop_at_step is not None and (epoch + 1) * steps >= args.stop_at_step and epoch + 1 < config.epochs:
            metrics["stopped_at"] = {"epoch": epoch + 1, "step": 0}
            log(f"stopped after epoch {epoch + 1}; continue with --resume {save_to}")
            break
    if args.json is not None and rank == 0:
        args.json.write_text(json.dumps(metrics, indent=2, default=str), encoding="utf-8", newline="\n")
    return INTERRUPTED if (metrics["stopped_at"] or {}).get("interrupted") else 0


def interrupted_line(epoch: int, step: int, steps: int, checkpoint: Path, argv: list[str]) -> str:
    """What Ctrl-C prints: where training stopped, the checkpoint, and the command that resumes."""
    return (f"interrupted at epoch {epoch + 1}, step {step} of {steps}: checkpoint {checkpoint.resolve()}; "
            f"resume with: {resume_command(argv, checkpoint)}")


def with_state(loader: Any, dataset: Any) -> Iterator[tuple[Any, dict]]:
    """Each batch of ``loader`` with ``dataset.state_dict()`` taken just after it.

    That state counts exactly the samples up to this batch: save it once the batch is trained on.
    A state taken in the training loop instead would also count the batches that the
    ``DevicePrefetcher`` has read ahead, and a resumed run would skip them.
    """
    for batch in loader:  # a DataLoader with num_workers=0 reads no further than this batch
        yield batch, dataset.state_dict()


def _load_checkpoint(path: Path) -> dict:
    """A checkpoint this script wrote (``path`` or ``path/last.pt``)."""
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise ResumeError(f"--resume: no checkpoint at {str(path)!r}")
    # weights_only: a checkpoint holds tensors and plain builtins only, so loading runs no pickled code.
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, truncated, or holding more than tensors and builtins
        raise ResumeError(f"--resume: cannot read {str(path)!r} as a checkpoint: {type(exc).__name__}: "
                          f"{str(exc)[:200]}") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ResumeError(f"--resume: {str(path)!r} is not a resumable checkpoint of this script "
                          f"(format {state.get('format') if isinstance(state, dict) else None!r}, "
                          f"expected {CHECKPOINT_FORMAT})")
    return state


def _check_fits(state: dict, *, classes: list, epochs: int, steps: int, world_size: int) -> None:
    """Refuse a checkpoint made under another setup: its schedule or dataset state would not fit.
    Another rank count fits (its steps per epoch differ with it)."""
    mismatches = []
    if state["classes"] != classes:
        mismatches.append(f"classes {state['classes']} (now {classes})")
    if state["epochs"] != epochs:
        mismatches.append(f"{state['epochs']} epochs (now {epochs})")
    elif state["world_size"] == world_size and state["steps_per_epoch"] != steps:
        mismatches.append(f"{state['steps_per_epoch']} steps per epoch (now {steps})")
    if mismatches:
        raise ResumeError("--resume: the checkpoint was made with " + "; ".join(mismatches) +
                          "; resume with the config and --max-steps it was made with")


def _rank_state(state: dict, rank: int, world_size: int) -> dict:
    """This rank's part of a checkpoint: its own, or made by another rank count, the ranks' dataset
    states merged (each rank deals itself its share of the rest), their loss sums on rank 0 and the
    random state of rank ``rank`` modulo the old count."""
    ranks = state["ranks"]
    if state["world_size"] == world_size:
        return ranks[rank]
    datasets = [r["dataset"] for r in ranks]
    loss = torch.tensor([r["loss_sum"] for r in ranks], dtype=torch.float64).sum(0)
    own = ranks[rank % len(ranks)]
    return {"dataset": None if all(d is None for d in datasets) else merge_states(datasets),
            "loss_sum": (loss if rank == 0 else torch.zeros(2, dtype=torch.float64)).tolist(),
            "rng": own["rng"], "cuda_rng": own["cuda_rng"]}


def _schedule_at(schedule: torch.optim.lr_scheduler.OneCycleLR, step: int) -> None:
    """Move a fresh one-cycle schedule to ``step`` of its run (and the optimiser's rate with it)."""
    schedule.last_epoch = min(step, schedule.total_steps)
    with warnings.catch_warnings():  # get_lr() outside step() warns; this is step()'s own work
        warnings.simplefilter("ignore", UserWarning)
        rates = schedule.get_lr()
    for group, rate in zip(schedule.optimizer.param_groups, rates):
        group["lr"] = rate
    schedule._last_lr = rates  # what get_last_lr() answers


def _write_checkpoint(path: Path, state: dict) -> None:
    """Write ``state`` to ``path`` atomically: a run killed while saving leaves the previous checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def _log_seen(folder: Path, rank: int, epoch: int, step: int, paths: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"rank{rank}.jsonl", "a", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps({"epoch": epoch, "step": step, "paths": list(paths)}) + "\n")


def _sum(values: torch.Tensor, distributed: bool) -> torch.Tensor:
    if distributed:
        dist.all_reduce(values)
    return values


def _gather(value: Any, distributed: bool, world_size: int) -> list:
    """``value`` from every rank, in rank order (a collective under torchrun)."""
    if not distributed:
        return [value]
    out: list = [None] * world_size
    dist.all_gather_object(out, value)
    return out


def _agree_min(value: int, distributed: bool) -> int:
    if not distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AudioBufferError as exc:  # a bad config, a checkpoint that does not fit, an undecodable file
        print(f"train_audio: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # before training started, or a second Ctrl-C: nothing more was saved
        print("train_audio: interrupted; no checkpoint written since the last one", file=sys.stderr)
        sys.exit(INTERRUPTED)
