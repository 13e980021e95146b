"""``audiobuffer index SHARDS... [--out PATH]``: write the index ``pack`` writes for tar shards that exist.

Any WebDataset shards (written by ``webdataset.ShardWriter``, ``tar``, or ``audiobuffer pack``) get
random access, exact resume, the isolated loader and batches by duration without being packed again.
Exit status: 0 on success, 2 for any error (a bad command line, no shard, a shard that cannot be read,
an index that exists without ``--overwrite``), written to stderr as one line; 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .pack import _fail_as, _Parser, _UsageError

__all__ = ["build_parser", "main"]

_PROG = "audiobuffer index"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `audiobuffer index` (the docs list its options from it)."""
    parser = _Parser(
        prog=_PROG,
        description="Read tar shards (local or URLs, brace patterns or globs) once and write the index.json "
                    "that 'audiobuffer pack' writes: each sample's member, offset, size, duration (from its "
                    "header) and fields (its .json keys, .cls, .txt...), for random access by index.")
    parser.add_argument("shards", nargs="+", metavar="SHARDS",
                        help="shard paths, URLs, brace patterns (shard-{000000..000009}.tar) or globs")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="the index to write (default: index.json beside the first shard; for shards in "
                             "object storage, ./index.json, to upload beside them)")
    parser.add_argument("--overwrite", action="store_true", help="replace the index if it exists")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``audiobuffer index`` with ``argv`` (the arguments after ``index``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as exc:
        return _fail_as(_PROG, f"{exc} (see '{_PROG} -h')")
    except SystemExit as exc:  # -h
        return int(exc.code or 0)
    from ..errors import AudioBufferError
    from ..prepare.pack import index_shards

    logging.basicConfig(level=logging.ERROR if args.quiet else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        index = index_shards(args.shards[0] if len(args.shards) == 1 else args.shards, args.out,
                             overwrite=args.overwrite, progress=not (args.no_progress or args.quiet))
    except (AudioBufferError, ValueError, TypeError, OSError) as exc:
        return _fail_as(_PROG, str(exc))
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
    if not args.quiet:
        timed = sum(m.duration is not None for m in index.members)
        print(f"indexed {len(index)} samples in {len(index.shards)} shard(s), {timed} with a duration "
              f"(index {index.url})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
