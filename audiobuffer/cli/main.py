"""The ``audiobuffer`` command line: ``run`` a YAML pipeline, ``config`` (the reference config, or a
config checked and filled in), the ``demo``, ``bench``, ``stress``, ``pack``, ``index`` and
``probe-budgets``.

Exit status: 0 on success, 1 when the pipeline fails (a file under ``on_error: raise``), 2 for a bad
command line or config. Errors go to stderr as one message, without a traceback (``-v`` adds the
traceback of an unexpected error).
"""

from __future__ import annotations

import argparse
import importlib
import io
import logging
import math
import re
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import AudioBufferError, ConfigError
from .report import write_json

if TYPE_CHECKING:
    from ..config import PipelineConfig

__all__ = ["command_parsers", "main"]

logger = logging.getLogger(__name__)

#: Commands that parse their own arguments (a module of this package with a ``main(argv)``), and their
#: line in ``audiobuffer --help``.
_OWN_ARGUMENTS = {
    "bench": "time an epoch of decoding through each loader (see 'audiobuffer bench -h')",
    "stress": "many producers and consumers through Buffer, against queue.Queue (see 'audiobuffer stress -h')",
    "pack": "pack a source into tar shards and an index for random access (see 'audiobuffer pack -h')",
    "index": "write the index of tar shards that exist, for random access (see 'audiobuffer index -h')",
    "probe-budgets": "find each duration bucket's batch budget by running the training step (see "
                     "'audiobuffer probe-budgets -h')",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="audiobuffer", description="Keep a training loop fed: producer threads, a bounded buffer, a DataLoader.")
    parser.add_argument("--version", action="version", version=f"audiobuffer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", metavar="PATH", help="also write the summary as JSON to PATH ('-': stdout)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
        p.add_argument("-q", "--quiet", action="store_true", help="only errors")

    run = sub.add_parser("run", help="drain a YAML-configured pipeline and report where the time went",
                         description="Build the pipeline CONFIG describes, drain it for its epochs, and print a "
                                     "summary: throughput, waits on both sides of the buffer, a verdict. "
                                     "Every config key with its default: 'audiobuffer config --reference' "
                                     "(save it with '> my.yaml', fill in source.root and edit it).")
    run.add_argument("config", metavar="CONFIG.yaml",
                     help="pipeline config; start from 'audiobuffer config --reference > CONFIG.yaml'")
    overrides_help = ("override a config key, e.g. --set buffer.num_producers=8 (repeatable; VALUE is YAML; "
                      "a relative path resolves against the current directory)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=overrides_help)
    common(run)

    config = sub.add_parser("config", help="print the reference config, or check a config and print it filled in",
                            description="With --reference: print the reference config (every key with its default "
                                        "and a comment), to save, fill in source.root and edit: 'audiobuffer "
                                        "config --reference > my.yaml'. With CONFIG.yaml: check it (and the --set "
                                        "overrides) as 'run' would and print it with the defaults filled in and the "
                                        "paths resolved.")
    config.add_argument("config", metavar="CONFIG.yaml", nargs="?", help="the config to check")
    config.add_argument("--reference", action="store_true", help="print the reference config")
    config.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=overrides_help)
    config.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    config.add_argument("-q", "--quiet", action="store_true", help="only errors")

    demo = sub.add_parser("demo", help="train a tiny classifier on a corpus the package makes (no data needed)",
                          description="Make a small labelled corpus of synthetic spoken-digit-like sounds in a "
                                      "cache folder, train a tiny audio classifier on it through the full "
                                      "pipeline, and print the test accuracy and the time split.")
    demo.add_argument("--epochs", type=int, default=12, help="training epochs (default 12)")
    demo.add_argument("--num-producers", type=int, default=2, help="producer threads (default 2)")
    demo.add_argument("--producers", type=int, dest="old_producers", default=None, help=argparse.SUPPRESS)
    demo.add_argument("--threads", type=_threads_arg, default="auto", metavar="N",
                      help="torch's intra-op threads for a CPU step: a count, or 'auto' (the default: one a "
                           "core but one, left to the producers; idle threads asleep; OMP_NUM_THREADS, where "
                           "set, is kept)")
    demo.add_argument("--per-class", type=int, default=50, help="files per class (default 50)")
    demo.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda[:N]' (default auto)")
    demo.add_argument("--cache-dir", type=Path, default=None,
                      help="where the corpus is made (default $AUDIOBUFFER_CACHE_DIR, else "
                           "$XDG_CACHE_HOME/audiobuffer, else ~/.cache/audiobuffer)")
    demo.add_argument("--seed", type=int, default=0)
    common(demo)

    for name, line in _OWN_ARGUMENTS.items():  # listed here, parsed by their own main()
        sub.add_parser(name, help=line, add_help=False)
    return parser


def _threads_arg(value: str) -> Any:
    from ._threads import threads_argument  # on use: the command's start imports little

    return threads_argument(value)


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser by name, in ``audiobuffer --help``'s order (the documentation's command-line
    reference is made from these): ``run``, ``config`` and ``demo``, and those that parse their own
    arguments with the ``build_parser()`` of their module."""
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: _own_module(name).build_parser() if name in _OWN_ARGUMENTS
            else parser for name, parser in commands.choices.items()}


def _own_module(name: str) -> Any:
    """The module of a command that parses its own arguments (``probe-budgets``:
    ``probe_budgets``)."""
    return importlib.import_module(f".{name.replace('-', '_')}", __package__)


def _setup_logging(args: argparse.Namespace) -> None:
    level = logging.ERROR if args.quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("audiobuffer").setLevel(level)


def _load_config(args: argparse.Namespace) -> PipelineConfig:
    """``load_config`` of the command's config and overrides; a deprecated key name is a one-line note on
    stderr (``buffer.producers is deprecated: write buffer.num_producers``), also when the config fails."""
    from ..config.schema import load_config

    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeprecationWarning)
            return load_config(args.config, args.overrides)
    finally:  # outside the recording: a warning shown again is not recorded again
        for warning in caught:
            if issubclass(warning.category, DeprecationWarning):
                print(f"audiobuffer: note: {warning.message}", file=sys.stderr)
            else:  # not ours to swallow: shown as it would have been
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def _cmd_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..config.builders import build_dataset, build_device_step, build_isolated, build_loader
    from ..loaders.device import DevicePrefetcher, resolve_device
    from .report import RunSummary, Timer

    config = _load_config(args)
    try:
        device = resolve_device(config.device)
    except ValueError as exc:
        raise ConfigError(f"{config.origin}: device: {exc}") from None
    step = build_device_step(config, device)  # decode.jpeg: device decodes JPEGs on the device
    dataset: Any  # what has epochs and stats: the dataset, or the IsolatedLoader itself
    loader: Any
    if config.buffer.isolate:  # one object epochs, stats and batches: the IsolatedLoader
        dataset = loader = build_isolated(config)
        files, where = len(loader.source), " in a helper process"
    else:
        dataset = build_dataset(config)
        loader = build_loader(config, dataset)
        files, where = len(dataset.source), ""
    summary = RunSummary(kind=config.decode.kind)
    own_work = Timer()
    out = sys.stderr if args.json == "-" else sys.stdout
    print(f"{args.config}: {files} files, producers {config.buffer.num_producers}{where}, "
          f"{config.epochs} epoch(s), device {device}", file=out)
    start = time.perf_counter()
    with dataset:
        for epoch in range(config.epochs):
            dataset.set_epoch(epoch)
            whole = config.buffer.isolate or loader.batch_size is None  # len() counts batches
            total = len(loader) if whole else math.ceil(len(dataset) / config.loader.batch_size)
            prefetch = DevicePrefetcher(loader, device, transform=step)
            bar = tqdm(prefetch, total=total, desc=f"epoch {epoch + 1}/{config.epochs}",
                       unit="batch",
                       disable=True if args.no_progress or args.quiet else None, leave=False)
            for batch in bar:  # already on the device: DevicePrefetcher copied it ahead
                with own_work:
                    summary.add_batch(batch)
            summary.add_epoch(dataset.stats())
    summary.wall_s = time.perf_counter() - start
    summary.step_s = own_work.seconds
    summary.judge()
    if not args.quiet:
        print("\n".join(summary.lines()), file=out)
    write_json(args.json, {"config": str(args.config), "device": str(device), **summary.as_dict()})
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from ..config.schema import reference_config

    if args.reference == (args.config is not None):
        raise ConfigError("config: give either --reference or CONFIG.yaml")
    if args.reference:
        if args.overrides:
            raise ConfigError("config: --set applies to CONFIG.yaml, not to --reference")
        sys.stdout.write(reference_config())
        return 0
    config = _load_config(args)
    sys.stdout.write(f"# {args.config}: valid; defaults filled in, paths resolved\n")
    sys.stdout.write(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._threads import quiet_openmp

    quiet_openmp()  # before torch is imported: see NOTE [ torch threads beside producers ]
    from .demo import run_demo

    if args.old_producers is not None:
        print("audiobuffer: note: demo --producers is deprecated: write --num-producers", file=sys.stderr)
        args.num_producers = args.old_producers
    for name in ("epochs", "num_producers", "per_class"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    out = sys.stderr if args.json == "-" else sys.stdout
    print("audiobuffer demo: making the corpus (once), then training a tiny classifier on it", file=out)
    try:
        result = run_demo(epochs=args.epochs, per_class=args.per_class, num_producers=args.num_producers,
                          device=args.device, threads=args.threads, cache_dir=args.cache_dir, seed=args.seed,
                          progress=not (args.no_progress or args.quiet))
    except ValueError as exc:
        if "device" in str(exc):
            raise ConfigError(f"--device: {exc}") from None
        raise
    lines = [
        f"corpus        {result['corpus']} ({result['train_files']} train / {result['test_files']} test files, "
        f"{result['classes']} classes; made in {result['corpus_s']:.1f} s)",
        f"training      {result['epochs']} epochs on {result['device']} ({result['num_producers']} producers)",
        f"threads       {result['threads']}",
        f"accuracy      {100 * result['test_accuracy']:.1f}% on the held-out files",
        *result.pop("summary_lines"),
    ]
    if not args.quiet:
        print("\n".join(lines), file=out)
    write_json(args.json, result)
    return 0


def _one_line(message: str, limit: int = 4000) -> str:
    """An error message as one line of at most ``limit`` characters."""
    message = re.sub(r"\s*[\r\n]+\s*", " ", message)
    return message if len(message) <= limit else message[:limit - 3] + "..."


_PACKAGE = str(Path(__file__).resolve().parents[1])


def _format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    line: str | None = None) -> str:
    """audiobuffer's own warnings as one line on the command line (``audiobuffer: warning: ...``), not as a
    source location; any other as Python shows it."""
    if str(Path(filename).resolve()).startswith(_PACKAGE):
        return f"audiobuffer: warning: {_one_line(str(message))}\n"
    return _SHOW_WARNING(message, category, filename, lineno, line)


_SHOW_WARNING = warnings.formatwarning


def _tolerant_stdout() -> None:
    """Let stdout print any file name: a Windows console or redirect (cp1252) cannot encode every
    character, and a print that raised would end the command before its ``--json`` is written."""
    stream = sys.stdout
    if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
        stream.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _tolerant_stdout()
    if argv and argv[0] in _OWN_ARGUMENTS:
        command: Any = _own_module(argv[0])
        return int(command.main(argv[1:]))
    parser = _parser()
    args = parser.parse_args(argv)
    level = logging.getLogger("audiobuffer").level  # restored after: the process may go on
    _setup_logging(args)
    command = {"run": _cmd_run, "config": _cmd_config, "demo": _cmd_demo}[args.command]
    shown = warnings.formatwarning
    warnings.formatwarning = _format_warning
    try:
        return command(args)
    except ConfigError as exc:
        print(f"audiobuffer: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except AudioBufferError as exc:
        # The cause only where it adds something: a sample error already quotes its decoder's message.
        cause = exc.__cause__
        said = cause is None or str(cause) in str(exc)
        why = "" if said else f" (caused by {type(cause).__name__}: {cause})"
        print(f"audiobuffer: error: {exc}{why}"[:4000], file=sys.stderr)
        if args.verbose:
            logger.exception("traceback")
        return 1
    except KeyboardInterrupt:
        print("audiobuffer: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = shown
        logging.getLogger("audiobuffer").setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
