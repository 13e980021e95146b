"""``audiobuffer probe-budgets CONFIG --step module:function``: find each duration bucket's batch
budget by running the training step (:func:`audiobuffer.probe_budgets`) and write them into the
config as ``loader.max_batch_seconds: {edge: seconds, ...}``.

Exit status: 0 on success, 2 for a bad command line, config or step (one line on stderr), 1 when
no batch of a bucket fits.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import AudioBufferError

__all__ = ["build_parser", "main"]

_PROG = "audiobuffer probe-budgets"


class _UsageError(Exception):
    """A bad command line, config or step: exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `audiobuffer probe-budgets` (the docs list its options from it)."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Run the training step on synthetic batches of each duration bucket's "
        "longest items, find the largest batch that runs without running out of memory, and write "
        "the budgets into the config as loader.max_batch_seconds (a mapping from each bucket's "
        "upper edge to its budget in seconds). The buckets: --edges, else the config's own edges, "
        "else the edges of its items' durations (loader.buckets of them, the last at the longest "
        "item).",
    )
    parser.add_argument("config", metavar="CONFIG.yaml", help="the pipeline config")
    parser.add_argument(
        "--step",
        required=True,
        metavar="MODULE:FUNCTION",
        help="the training step, called with one batch (pad_collate's dict); the module is "
        "imported from the current directory too",
    )
    parser.add_argument(
        "--edges",
        default=None,
        metavar="S,S,...",
        help="each bucket's upper edge in seconds, increasing (e.g. 2,4,8,16)",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=0.1,
        help="the fraction of the largest batch left free (default 0.1)",
    )
    parser.add_argument(
        "--device", default="auto", help="'auto' (cuda if available), 'cpu' or 'cuda[:N]'"
    )
    parser.add_argument(
        "--memory-limit",
        type=_bytes,
        default=None,
        metavar="BYTES",
        help="the most bytes a step may use at its peak, e.g. 80000000000, 8e10 or 75GiB (on CPU "
        "the step returns its peak)",
    )
    parser.add_argument(
        "--max-steps", type=int, default=30, help="the most steps per bucket (default 30)"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--out", default=None, metavar="PATH", help="write the config with the budgets to PATH"
    )
    where.add_argument(
        "--in-place",
        action="store_true",
        help="rewrite CONFIG with the budgets (its comments are not kept)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.ERROR if args.quiet else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    package_logger = logging.getLogger("audiobuffer")
    level = package_logger.level  # restored after: the process may go on
    package_logger.setLevel(logging.ERROR if args.quiet else logging.INFO)
    try:
        return _run(args)
    except (_UsageError, AudioBufferError, TypeError, ValueError) as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a bucket where not even one sample fits
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 1
    finally:
        package_logger.setLevel(level)


def _run(args: argparse.Namespace) -> int:
    import yaml

    from ..config.schema import _load_yaml, load_config, parse_config
    from ..probe import probe_budgets

    path = Path(args.config)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    config = load_config(path)
    step = _import_step(args.step)
    edges = _edges(args.edges, config)
    sample_rate = config.decode.sample_rate or 16000
    budgets = probe_budgets(
        step,
        edges,
        sample_rate=sample_rate,
        device=_device(args.device),
        margin=args.margin,
        memory_limit=args.memory_limit,
        max_steps=args.max_steps,
        quadratic_duration=config.loader.quadratic_duration,
    )
    data = _load_yaml(text)
    loader = data.setdefault("loader", {}) if isinstance(data, dict) else None
    if not isinstance(loader, dict):
        raise _UsageError(f"{path}: its loader section is not a mapping")
    loader["max_batch_seconds"] = {edge: round(seconds, 3) for edge, seconds in zip(edges, budgets)}
    loader.pop("buckets", None)  # the mapping fixes the buckets
    written = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    parse_config(
        _load_yaml(written), base_dir=path.parent
    )  # never write a config that does not load
    target = path if args.in_place else (Path(args.out) if args.out else None)
    if target is None:
        sys.stdout.write(written)
        return 0
    with open(target, "w", encoding="utf-8", newline="\n") as out:
        out.write(written)
    if not args.quiet:
        print(
            f"{_PROG}: wrote {len(budgets)} budgets (loader.max_batch_seconds) to {target}",
            file=sys.stderr,
        )
    return 0


#: Multiples a --memory-limit may be written in.
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}


def _bytes(text: str) -> int:
    """A count of bytes: ``80000000000``, ``8e10``, ``75GiB`` or ``80GB`` (a whole number >= 1)."""
    number = text.strip().rstrip("bBiIkKmMgGtT")
    unit = text.strip()[len(number):].lower()
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is no count of bytes (write e.g. 80000000000, 8e10 or 75GiB)"
        ) from None
    if not (value >= 1 and value.is_integer()):
        raise argparse.ArgumentTypeError(f"{text!r} is no whole number of bytes >= 1")
    return int(value)


def _import_step(spec: str) -> Callable[[dict[str, Any]], Any]:
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise _UsageError(f"--step must be MODULE:FUNCTION (e.g. train:step), got {spec!r}")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _UsageError(f"--step {spec}: cannot import {module_name!r}: {exc}") from None
    step = getattr(module, name, None)
    if not callable(step):
        raise _UsageError(f"--step {spec}: {module_name} has no callable {name!r}")
    return step


def _edges(given: str | None, config: Any) -> list[float]:
    """Each bucket's upper edge: ``--edges``, the config's own, or its items' durations'."""
    if given is not None:
        try:
            return [float(edge) for edge in given.split(",")]
        except ValueError:
            raise _UsageError(
                f"--edges must be seconds separated by commas (2,4,8,16), got {given!r}"
            ) from None
    seconds = config.loader.max_batch_seconds
    if isinstance(seconds, dict):
        return [float(edge) for edge in seconds]
    import numpy as np

    from ..config.builders import build_source
    from ..engine.plan import bucket_edges
    from ..options import DEFAULT_BUCKETS
    from ..prepare.durations import read_durations

    durations, _ = read_durations(
        build_source(config),
        duration_column=config.source.duration_column,
        crop_seconds=config.decode.crop_seconds,
        on_error="skip",
    )
    valid = durations[~np.isnan(durations)]
    if not len(valid) or not valid.max() > 0:
        raise _UsageError("the config's items have no durations to put buckets on: give --edges")
    buckets = config.loader.buckets or (
        len(seconds) if isinstance(seconds, list) else DEFAULT_BUCKETS
    )
    edges = [float(edge) for edge in bucket_edges(valid, buckets) if edge > 0]
    return [*edges, float(valid.max())]


def _device(name: str) -> str:
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
