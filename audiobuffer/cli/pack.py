"""``audiobuffer pack SOURCE OUT --shard-size SIZE``: pack a source into tar shards and an index.

Exit status: 0 on success, 2 for any error (a bad command line, a source that cannot be listed, an
output folder that is not empty, a file that cannot be read), written to stderr as one line; 130 on
Ctrl-C.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["build_parser", "main", "parse_size"]

_PROG = "audiobuffer pack"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?)(B?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(text: str) -> int:
    """Bytes from a size like ``1000000``, ``256MB`` (10**6), ``1GiB`` (2**30), ``1.5G``, ``512k``.

    ``K``/``M``/``G``/``T`` with or without ``B`` are powers of 1000; with ``i`` (``KiB``, ``Mi``) powers
    of 1024. Case does not matter.

    Raises:
        ValueError: not a size, or less than one byte.
    """
    match = _SIZE.match(text) if isinstance(text, str) else None
    if match is None or (match.group(3) and not match.group(2)):
        raise ValueError(f"--shard-size must be a size like 256MB, 1GiB or 1000000, got {text!r}")
    number, prefix, binary, _ = match.groups()
    value = float(number) * (1024 if binary else 1000) ** _POWERS[prefix.upper()]
    if value < 1:
        raise ValueError(f"--shard-size must be at least one byte, got {text!r}")
    return int(value)


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise _UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``audiobuffer pack``: a usage error raises instead of exiting (:func:`main` reports it)."""
    parser = _Parser(
        prog=_PROG,
        description="Pack the files of SOURCE (a folder, a manifest) into WebDataset-style tar shards "
                    "OUT/shard-NNNNNN.tar of at most SIZE bytes each, and OUT/index.json (member, offset, "
                    "size, duration, label) for random access.")
    parser.add_argument("source", metavar="SOURCE", help="a folder or a CSV/TSV/JSONL manifest")
    parser.add_argument("out", metavar="OUT", help="the output folder (made if missing; must be empty)")
    parser.add_argument("--shard-size", required=True, metavar="SIZE",
                        help="the most bytes per shard: 256MB, 1GiB, 1000000...")
    parser.add_argument("--labels", default=None,
                        help="'parent', a manifest column, or a regular expression on the file name")
    parser.add_argument("--patterns", nargs="+", default=None, metavar="GLOB",
                        help="glob patterns of a folder source (default: the audio formats; for "
                             "images: '**/*.jpg' '**/*.png')")
    parser.add_argument("--path-column", default="path", help="a manifest's path column (default 'path')")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the shards and index already in OUT")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return parser


def _fail_as(prog: str, message: str) -> int:
    """Print ``message`` as one error line of the command ``prog``; return exit status 2."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def _fail(message: str) -> int:
    return _fail_as(_PROG, message)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``audiobuffer pack`` with ``argv`` (the arguments after ``pack``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as exc:
        return _fail(f"{exc} (see '{_PROG} -h')")
    except SystemExit as exc:  # -h
        return int(exc.code or 0)
    from ..errors import AudioBufferError
    from ..prepare.pack import pack

    try:
        shard_size = parse_size(args.shard_size)
        index = pack(args.source, args.out, shard_size=shard_size, labels=args.labels,
                     patterns=tuple(args.patterns) if args.patterns else None,
                     path_column=args.path_column, overwrite=args.overwrite,
                     progress=not (args.no_progress or args.quiet))
    except (AudioBufferError, ValueError, TypeError, OSError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
    if not args.quiet:
        total = sum(m.size for m in index.members)
        print(f"packed {len(index)} files ({total / 1e6:.1f} MB) into {len(index.shards)} shard(s) in "
              f"{args.out} (index {index.url})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
