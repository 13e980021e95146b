"""The training loop the training scripts share: ranks, checkpoints, mid-epoch resume and Ctrl-C.

``scripts/train_audio.py`` and ``scripts/train_image.py`` build their data and their model, then
hand both to :func:`fit`, which trains the epochs, evaluates after each, and writes checkpoints
that resume mid-epoch, on the same number of ranks or another. Import it after
:func:`~audiobuffer.cli._threads.quiet_openmp` has run: it imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ..engine.resize import merge_states
from ..errors import AudioBufferError, ResumeError
from ..loaders.device import DevicePrefetcher
from ._model import evaluate, make_optimizer, train_step
from ._threads import set_torch_threads, threads_argument

__all__ = ["CHECKPOINT_NAME", "INTERRUPTED", "Interrupts", "Job", "Ranks", "add_arguments",
           "closing", "fit", "load_checkpoint", "parse_args", "resume_command", "script_main",
           "start", "with_state"]

CHECKPOINT_NAME = "last.pt"
CHECKPOINT_FORMAT = 2  # 1: the model only, after each epoch (cannot be resumed)
#: The exit status after Ctrl-C, as a shell reports a process that SIGINT ended (128 + 2).
INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser, *, save_every: int, checkpoint_default: str,
                  resume_note: str) -> None:
    """The options every training script takes: checkpoints, resume, stops, logs and threads.

    Args:
        save_every: ``--save-every``'s default.
        checkpoint_default: what ``--checkpoint-dir``'s help says the default is.
        resume_note: what ``--resume``'s help adds about the setup a checkpoint needs.
    """
    add = parser.add_argument
    add("--checkpoint-dir", type=Path, default=None, metavar="DIR",
        help=f"write checkpoints to DIR/{CHECKPOINT_NAME} (default: {checkpoint_default})")
    add("--save-every", type=int, default=save_every, metavar="N",
        help=f"also checkpoint every N steps within an epoch (default {save_every}; 0: at epoch "
             "ends and on Ctrl-C only)")
    add("--resume", type=Path, default=None, metavar="PATH",
        help=f"continue from a checkpoint (a file, or a folder holding {CHECKPOINT_NAME}), "
             f"mid-epoch too; {resume_note}")
    add("--deterministic", action="store_true",
        help="hand samples out in the epoch's order (ordered=True) and use deterministic kernels, "
             "so that runs repeat; by default batches, and so the per-epoch figures, vary a little")
    add("--progress", action=argparse.BooleanOptionalAction, default=None,
        help="a progress bar within each epoch (default: when stderr is a terminal)")
    add("--max-steps", type=int, default=None, help="stop each epoch after this many steps")
    add("--stop-at-step", type=int, default=None, metavar="N",
        help="checkpoint and stop once N steps are done in all (counting those before a resume), "
             "e.g. to fit a job's time limit; --resume continues")
    add("--seen-log", type=Path, default=None, metavar="DIR",
        help="append the files each rank trains on to DIR/rank{N}.jsonl, one line per step")
    add("--json", type=Path, default=None, help="write the final metrics to this file")
    add("--threads", type=threads_argument, default="auto", metavar="N",
        help="torch's intra-op threads for a CPU step: a count, or 'auto' (the default: torch's "
             "count on a quiet machine, 1 on a busy one; OMP_NUM_THREADS, where set, is kept)")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``argv`` (default: the command line's) parsed and its step counts checked; ``.argv``
    keeps it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    for name in ("save_every", "max_steps", "stop_at_step"):
        value = getattr(args, name)
        least = 0 if name == "save_every" else 1
        if value is not None and value < least:
            parser.error(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
    return args


@dataclass(frozen=True)
class Ranks:
    """Where this process trains: one process, or a rank of ``torchrun``'s."""

    device: torch.device
    distributed: bool
    rank: int
    world_size: int

    def log(self, *parts: Any) -> None:
        """``print`` on rank 0; the other ranks say nothing."""
        if self.rank == 0:
            print(*parts)


def start(args: argparse.Namespace, device: torch.device, *, seed: int,
          wait: str | None) -> Ranks:
    """Join ``torchrun``'s process group (gloo on the CPU, nccl on CUDA) where it started this
    process, set torch's threads (``wait``: what :func:`quiet_openmp` returned) and seed, and
    with ``--deterministic`` ask for deterministic kernels."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    ranks = Ranks(device, distributed, dist.get_rank() if distributed else 0,
                  dist.get_world_size() if distributed else 1)
    ranks.log(set_torch_threads(args.threads, device_type=device.type, wait=wait))
    torch.manual_seed(seed)
    if args.deterministic:
        # cuBLAS's condition for repeatable results
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    return ranks


def script_main(name: str, train: Callable[[], int]) -> NoReturn:
    """Run a training script's ``train`` and exit with its status: the process group torn down
    after it, a library error said in one line (status 2), Ctrl-C before training or a second one
    said too (status 130)."""
    try:
        try:
            code = train()
        finally:
            if dist.is_initialized():
                # No rank tears gloo down while another is in a collective or writing a checkpoint.
                dist.barrier()
                dist.destroy_process_group()
    except AudioBufferError as exc:  # bad options, a checkpoint that does not fit, a bad file
        print(f"{name}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # before training started, or a second Ctrl-C: nothing more saved
        print(f"{name}: interrupted; no checkpoint written since the last one", file=sys.stderr)
        sys.exit(INTERRUPTED)
    sys.exit(code)


# NOTE [ Ctrl-C in the training script ]
# ======================================
# Ctrl-C (SIGINT) only asks to stop: the handler sets a flag, and the loop acts on it between steps,
# where the model, the optimiser, the step count and the dataset's state agree. It then writes a
# checkpoint (mid-epoch, with the dataset's state as of the last step trained), prints one line with
# the command that resumes, and the script exits with status 130. Under torchrun every rank gets the
# signal (from the terminal, and again from torchrun), at different points of its step: the ranks
# agree after each step (an all-reduce of the flag), so all stop after the same step and save it
# together. A second Ctrl-C in one process stops at once (KeyboardInterrupt): the checkpoint on disk
# is then the last one written, whole (_write_checkpoint replaces it atomically).
class Interrupts:
    """Ctrl-C during training, acted on between steps (NOTE [ Ctrl-C in the training script ])."""

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
            os.write(2, b"\ninterrupted: saving a checkpoint after this step "
                        b"(Ctrl-C again: stop now)\n")
        self.requested = True

    def stop(self) -> bool:
        """Whether to stop now: this process was interrupted, or under torchrun any rank was
        (a collective)."""
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
        launcher = (["torchrun", f"--nproc_per_node={local}"] if same
                    else ["torchrun", "<its options>"])
    else:
        launcher = [sys.executable]
    words = [*launcher, sys.argv[0], *kept, "--resume", str(checkpoint.resolve())]
    return subprocess.list2cmdline(words) if sys.platform == "win32" else shlex.join(words)


def interrupted_line(epoch: int, step: int, steps: int, checkpoint: Path, argv: list[str]) -> str:
    """What Ctrl-C prints: where training stopped, the checkpoint, and the command that resumes."""
    return (f"interrupted at epoch {epoch + 1}, step {step} of {steps}: checkpoint "
            f"{checkpoint.resolve()}; resume with: {resume_command(argv, checkpoint)}")


@contextmanager
def closing(*data: Any) -> Iterator[None]:
    """Close each of ``data`` that is not ``None`` on the way out: their producers stop (and an
    isolated loader's helper process)."""
    try:
        yield
    finally:
        for each in data:
            if each is not None:
                each.close()


def with_state(loader: Any, dataset: Any) -> Iterator[tuple[Any, dict]]:
    """Each batch of ``loader`` with ``dataset.state_dict()`` taken just after it.

    That state counts exactly the samples up to this batch: save it once the batch is trained on.
    A state taken in the training loop instead would also count the batches that the
    ``DevicePrefetcher`` has read ahead, and a resumed run would skip them.
    """
    for batch in loader:  # a DataLoader with num_workers=0 reads no further than this batch
        yield batch, dataset.state_dict()


@dataclass
class Job:
    """What :func:`fit` trains: the data, the run's length, where checkpoints go.

    Attributes:
        args: the parsed options of :func:`add_arguments`, with ``argv``.
        ranks: from :func:`start`.
        classes: the class names, in label order (a checkpoint of other classes is refused).
        epochs: epochs in the whole run.
        lr: the one-cycle schedule's peak learning rate; ``weight_decay``: AdamW's.
        key: the batch's input to the model (``"audio"``, ``"image"``).
        train_set: the training data (its ``set_epoch``, ``state_dict``, ``load_state_dict``,
            ``stats``); ``train_loader``: its batches (the same object for an ``IsolatedLoader``).
        test_loader: the test batches, or ``None``.
        save_to: the checkpoint file.
        config: what the checkpoint records of the setup (plain builtins).
        resume: the checkpoint resumed from (:func:`load_checkpoint`), or ``None``.
    """

    args: argparse.Namespace
    ranks: Ranks
    classes: list[str]
    epochs: int
    lr: float
    weight_decay: float
    key: str
    train_set: Any
    train_loader: Any
    test_loader: Any
    save_to: Path
    config: dict[str, Any]
    resume: dict[str, Any] | None


def fit(job: Job, model: nn.Module, *, about: str) -> int:
    """Train ``model`` (on the job's device) for the job's epochs; return the exit status.

    ``about`` starts the first line rank 0 prints (the ranks, steps and device follow).
    """
    with Interrupts(distributed=job.ranks.distributed, announce=job.ranks.rank == 0) as interrupts:
        return _Fit(job, model, about).run(interrupts)


class _Fit:
    """One run of :func:`fit`: the model, optimiser and schedule, and where the run stands."""

    def __init__(self, job: Job, model: nn.Module, about: str) -> None:
        ranks, args = job.ranks, job.args
        self.job = job
        # Every rank must take the same number of steps, or the last gradient all-reduce waits.
        steps = _agree_min(len(job.train_loader), ranks.distributed)
        if args.max_steps is not None:
            steps = min(steps, args.max_steps)
        self.steps = steps
        self.optimizer, self.schedule = make_optimizer(
            model, lr=job.lr, weight_decay=job.weight_decay, epochs=job.epochs,
            steps_per_epoch=steps)
        self.metrics: dict = {"world_size": ranks.world_size, "epochs": [], "stopped_at": None}
        self.start_epoch, self.start_step, self.mine = 0, 0, None
        resume = job.resume
        if resume is not None:
            _check_fits(resume, classes=job.classes, epochs=job.epochs, steps=steps,
                        world_size=ranks.world_size)
            model.load_state_dict(resume["model"])
            self.optimizer.load_state_dict(resume["optimizer"])
            self.start_epoch, self.start_step = resume["epoch"], resume["step"]
            if resume["world_size"] == ranks.world_size:  # else placed once the steps are known
                self.schedule.load_state_dict(resume["schedule"])
            self.metrics["epochs"] = resume["metrics"]
            self.mine = _rank_state(resume, ranks.rank, ranks.world_size)
        self.plain = model
        self.model = DistributedDataParallel(model) if ranks.distributed else model
        ranks.log(f"{about}, {ranks.world_size} rank(s), {steps} steps per epoch, "
                  f"device {ranks.device}")
        if resume is not None:
            where = f"step {self.start_step}"
            if resume["world_size"] != ranks.world_size:  # the steps are of the old ranks' epoch
                where = (f"after step {self.start_step} of its {resume['world_size']} rank(s): "
                         f"what they had not trained on is dealt over {ranks.world_size}")
            ranks.log(f"resuming {args.resume} at epoch {self.start_epoch + 1}, {where}")

    def save(self, epoch: int, step: int, data_state: dict | None, loss_sum: torch.Tensor) -> None:
        """Checkpoint: the next run starts ``epoch`` at ``step``, with this rank's dataset at
        ``data_state``. Collective under torchrun (each rank's dataset state is gathered); rank 0
        writes the file."""
        job, ranks = self.job, self.job.ranks
        cuda = ranks.device.type == "cuda"
        mine = {"dataset": data_state, "loss_sum": loss_sum.tolist(), "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if cuda else None}
        states = _gather(mine, ranks.distributed, ranks.world_size)
        if ranks.rank == 0:
            epochs = self.metrics["epochs"]
            _write_checkpoint(job.save_to, {
                "format": CHECKPOINT_FORMAT, "model": self.plain.state_dict(),
                "optimizer": self.optimizer.state_dict(), "schedule": self.schedule.state_dict(),
                "epoch": epoch, "step": step, "steps_per_epoch": self.steps, "epochs": job.epochs,
                "world_size": ranks.world_size, "ranks": states, "metrics": epochs,
                "classes": job.classes, "config": job.config,
                "test_accuracy": epochs[-1]["test_accuracy"] if epochs else None})

    def _resume_epoch(self, epoch: int) -> tuple[int, torch.Tensor]:
        """The first step of ``epoch`` and its loss sum so far: where a resumed run starts."""
        job, ranks, mine, resume = self.job, self.job.ranks, self.mine, self.job.resume
        first_step = self.start_step if epoch == self.start_epoch else 0
        if epoch != self.start_epoch or mine is None or resume is None:
            return first_step, torch.zeros(2, dtype=torch.float64)
        if mine["dataset"] is not None:
            job.train_set.load_state_dict(mine["dataset"])  # the next iter(): the epoch's rest
        if resume["world_size"] != ranks.world_size:  # the rest dealt anew
            if mine["dataset"] is not None:
                left = _agree_min(len(job.train_loader), ranks.distributed)
                first_step = max(0, self.steps - left)
            _schedule_at(self.schedule, epoch * self.steps + first_step)
        torch.set_rng_state(mine["rng"])
        if mine["cuda_rng"] is not None and ranks.device.type == "cuda":
            torch.cuda.set_rng_state_all(mine["cuda_rng"])
        return first_step, torch.tensor(mine["loss_sum"], dtype=torch.float64)

    def run(self, interrupts: Interrupts) -> int:
        job, ranks, args, steps = self.job, self.job.ranks, self.job.args, self.steps
        log = ranks.log
        show = args.progress if args.progress is not None else sys.stderr.isatty()
        show_progress = ranks.rank == 0 and show
        for epoch in range(self.start_epoch, job.epochs):
            start = time.perf_counter()
            first_step, loss_sum = self._resume_epoch(epoch)
            job.train_set.set_epoch(epoch)
            self.model.train()
            bar = tqdm(total=steps, initial=first_step, desc=f"epoch {epoch + 1}/{job.epochs}",
                       unit="step", disable=not show_progress, leave=False, dynamic_ncols=True)
            stopped, interrupted = None, False
            done = first_step
            # Batches arrive on the device, each with the dataset's state as of its end.
            batches = DevicePrefetcher(with_state(job.train_loader, job.train_set), ranks.device)
            for step, (batch, data_state) in enumerate(batches, start=first_step):
                if step >= steps:
                    break  # leaving the loop stops this epoch's producers
                value = train_step(self.model, batch, self.optimizer, self.schedule, key=job.key)
                count = len(batch["label"])
                loss_sum += torch.tensor([value * count, count], dtype=torch.float64)
                done = step + 1
                bar.set_postfix(loss=f"{value:.4f}", refresh=False)
                bar.update(1)
                if args.seen_log is not None:
                    _log_seen(args.seen_log, ranks.rank, epoch, step, batch["path"])
                if done < steps:
                    if interrupts.stop():  # see NOTE [ Ctrl-C in the training script ]
                        stopped, interrupted = (epoch, done), True
                        self.save(epoch, done, data_state, loss_sum)
                        break
                    if args.stop_at_step is not None and epoch * steps + done >= args.stop_at_step:
                        stopped = (epoch, done)
                        self.save(epoch, done, data_state, loss_sum)
                        break
                    if args.save_every and done % args.save_every == 0:
                        self.save(epoch, done, data_state, loss_sum)
            bar.close()
            if stopped is not None and interrupted:
                self.metrics["stopped_at"] = {"epoch": stopped[0], "step": stopped[1],
                                              "interrupted": True}
                log(interrupted_line(epoch, done, steps, job.save_to, args.argv))
                break
            if stopped is not None:
                self.metrics["stopped_at"] = {"epoch": stopped[0], "step": stopped[1]}
                log(f"stopped at epoch {epoch + 1}, step {done} of {steps}; "
                    f"continue with --resume {job.save_to}")
                break
            self._end_epoch(epoch, start, loss_sum)
            last = epoch + 1 == job.epochs
            if not last and interrupts.stop():
                self.metrics["stopped_at"] = {"epoch": epoch + 1, "step": 0, "interrupted": True}
                log(interrupted_line(epoch + 1, 0, steps, job.save_to, args.argv))
                break
            stop_at = args.stop_at_step
            if stop_at is not None and (epoch + 1) * steps >= stop_at and not last:
                self.metrics["stopped_at"] = {"epoch": epoch + 1, "step": 0}
                log(f"stopped after epoch {epoch + 1}; continue with --resume {job.save_to}")
                break
        if args.json is not None and ranks.rank == 0:
            args.json.write_text(json.dumps(self.metrics, indent=2, default=str), encoding="utf-8",
                                 newline="\n")
        return INTERRUPTED if (self.metrics["stopped_at"] or {}).get("interrupted") else 0

    def _end_epoch(self, epoch: int, start: float, loss_sum: torch.Tensor) -> None:
        """The epoch's loss and test accuracy, said and recorded, and a checkpoint of the next
        epoch's start."""
        job, ranks = self.job, self.job.ranks
        loss_sum = _sum(loss_sum, ranks.distributed)
        accuracy = None
        if job.test_loader is not None:
            accuracy = evaluate(self.model, job.test_loader, ranks.device, key=job.key,
                                reduce=lambda counts: _sum(counts, ranks.distributed))
        entry = {"epoch": epoch, "loss": float(loss_sum[0] / max(1.0, float(loss_sum[1]))),
                 "test_accuracy": accuracy, "seconds": time.perf_counter() - start,
                 "train_stats": job.train_set.stats().as_dict()}
        self.metrics["epochs"].append(entry)
        acc = f", test accuracy {100 * accuracy:.2f}%" if accuracy is not None else ""
        ranks.log(f"epoch {epoch + 1}/{job.epochs}: loss {entry['loss']:.4f}{acc} "
                  f"({entry['seconds']:.1f} s)")
        self.save(epoch + 1, 0, None, torch.zeros(2, dtype=torch.float64))  # the next epoch


def load_checkpoint(path: Path) -> dict:
    """A checkpoint a training script wrote (``path`` or ``path/last.pt``)."""
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise ResumeError(f"--resume: no checkpoint at {str(path)!r}")
    # weights_only: a checkpoint holds tensors and plain builtins, so loading runs no pickled code.
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, truncated, or holding more than plain values
        raise ResumeError(f"--resume: cannot read {str(path)!r} as a checkpoint: "
                          f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        found = state.get("format") if isinstance(state, dict) else None
        raise ResumeError(f"--resume: {str(path)!r} is not a resumable checkpoint of this script "
                          f"(format {found!r}, expected {CHECKPOINT_FORMAT})")
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
                          "; resume with the options and --max-steps it was made with")


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
    """Write ``state`` to ``path`` atomically: a run killed while saving leaves the previous one."""
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
