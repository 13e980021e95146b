"""Train a small CNN on log-mel features, fed by audiobuffer from a YAML pipeline config.

Copy it and change the model: the model (``SpeechCNN``), its optimiser, its training step and its
evaluation are the ones ``audiobuffer demo`` uses, in ``audiobuffer/cli/_model.py``; the loop,
its checkpoints and its resume, shared with ``scripts/train_image.py``, in
``audiobuffer/cli/_training.py``. One process:

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
from pathlib import Path
from typing import Any

from audiobuffer.cli._threads import quiet_openmp

OPENMP_WAIT = quiet_openmp()  # before torch loads OpenMP: see NOTE [ torch threads beside producers ]

import torch  # noqa: E402

from audiobuffer.cli._model import SpeechCNN  # noqa: E402
from audiobuffer.cli._training import (  # noqa: E402
    CHECKPOINT_NAME,
    Job,
    add_arguments,
    closing,
    fit,
    load_checkpoint,
    parse_args,
    script_main,
    start,
)
from audiobuffer.config import (  # noqa: E402
    build_dataset,
    build_isolated,
    build_loader,
    build_source,
    load_config,
)
from audiobuffer.loaders.device import resolve_device  # noqa: E402

#: ``--save-every``'s default: below configs/fsdd.yaml's 85 steps an epoch, so an epoch holds a save.
SAVE_EVERY = 50


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="pipeline config (YAML)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable), e.g. --set epochs=3")
    add_arguments(parser, save_every=SAVE_EVERY,
                  checkpoint_default=f"the config's train.checkpoint file if set, else "
                                     f"runs/CONFIG-NAME/{CHECKPOINT_NAME} under the current "
                                     "directory",
                  resume_note="the config must be the one it was made with")
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


def checkpoint_path(args: argparse.Namespace, config: Any) -> Path:
    """Where checkpoints go: --checkpoint-dir, else the config's train.checkpoint, else ./runs/CONFIG-NAME/."""
    if args.checkpoint_dir is not None:
        return args.checkpoint_dir / CHECKPOINT_NAME
    if config.train.checkpoint:
        return Path(config.train.checkpoint)
    return Path("runs") / Path(args.config).stem / CHECKPOINT_NAME


def train(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    by_duration = [] if args.max_batch_seconds is None else [f"loader.max_batch_seconds={args.max_batch_seconds!r}"]
    augment = [] if args.augment is None else [augment_override(args.augment)]
    config = load_config(args.config, args.overrides + by_duration + augment)
    # The test set is never augmented: it measures the model on the recordings as they are.
    plain = config.model_copy(update={"decode": config.decode.model_copy(update={"augment": []})})
    ranks = start(args, resolve_device(config.device), seed=config.seed, wait=OPENMP_WAIT)
    resume = load_checkpoint(args.resume) if args.resume is not None else None

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
    with closing(train_set, test_set):  # stops producers (and a helper process)
        sample_rate = config.decode.sample_rate or 16000
        t = config.train
        model = SpeechCNN(len(source.classes), sample_rate, n_fft=t.n_fft, hop_length=t.hop_length,
                          n_mels=t.n_mels, channels=t.channels).to(ranks.device)
        if not config.loader.shuffle:  # the default, as in Python: training configs shuffle
            ranks.log("loader.shuffle is false: every epoch trains in the source's order (set "
                      "loader.shuffle: true to reshuffle each epoch)")
        job = Job(args=args, ranks=ranks, classes=source.classes, epochs=config.epochs, lr=t.lr,
                  weight_decay=t.weight_decay, key="audio", train_set=train_set,
                  train_loader=train_loader, test_loader=test_loader,
                  save_to=checkpoint_path(args, config), config=config.model_dump(mode="json"),
                  resume=resume)
        tests = len(test_source) if test_source else 0
        about = f"{len(train_source)} train / {tests} test files, {len(source.classes)} classes"
        return fit(job, model, about=about)


if __name__ == "__main__":
    script_main("train_audio", train)
