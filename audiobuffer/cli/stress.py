"""``audiobuffer stress``: many producers and consumers through :class:`Buffer`, against ``queue.Queue``.

Each round moves ``items`` numbered items (each carrying ``payload`` bytes) from P producer threads to
C consumer threads through a bounded buffer of ``capacity``, and checks that every item arrived
exactly once and that the buffer never held more than its capacity. Two kinds of round:

- *contended*: no delays, so the queue itself is the bottleneck; items/s are compared with
  ``queue.Queue(capacity)`` under the same P, C and capacity in the same run;
- *jittered*: random sub-millisecond delays on both sides, to shake out different interleavings
  (full and empty buffers, waiters on both conditions at once).

Consumers of ``Buffer`` run both ways: ``get`` (one item per call, as ``queue.Queue.get``) and
``get_many`` (every ready item under one lock acquisition, as ``BufferedDataset``'s consumer does).

``--minutes N`` repeats rounds for N minutes (a soak) and also checks that the number of threads and of
open file descriptors does not grow.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..buffer import Buffer
from ..errors import BufferClosed
from ._measure import machine_load, trust_line
from .report import write_json

__all__ = ["RoundResult", "build_parser", "main", "run_round", "stress"]

_STOP = object()
JOIN_TIMEOUT = 60.0
QUICK_ITEMS = 20_000  # items per contended round of --quick
JITTER_CHANCE = 0.1  # the share of items after which a jittered side sleeps
JITTER_MAX_S = 0.0005  # the longest such sleep

#: ``audiobuffer stress --help``: plain text (the module docstring is reST for the API docs).
DESCRIPTION = ("Move numbered items from producer threads to consumer threads through audiobuffer's Buffer, "
               "check that each arrives exactly once and that the buffer never holds more than its "
               "capacity, and compare the rate (items per second) with queue.Queue under the same shape.")
JITTER_NOTE = (f"Contended rounds have no delays, so the queue itself is the bottleneck. Jittered rounds "
               f"make each producer and consumer pause for a random 0 to {1000 * JITTER_MAX_S:g} ms at "
               f"{100 * JITTER_CHANCE:g}% of its items (chosen at random), to vary the interleavings (full and "
               f"empty buffer, waiters on both sides); they move a tenth of the items, and their rate "
               f"measures the sleeps, not the queue.")
EPILOG = (f"Rates are items per second (medians over --rounds). {JITTER_NOTE} 'get' takes one item per call "
          f"(as queue.Queue.get); 'get_many' takes every ready item at once (as BufferedDataset does). "
          f"Exit status 1 if any item was lost or duplicated or the bound was exceeded.")


@dataclass
class RoundResult:
    """One round: which queue, its shape, the rate, and what the checks found."""

    impl: str
    producers: int
    consumers: int
    capacity: int
    items: int
    jitter: bool
    seconds: float
    items_per_s: float
    lost: int
    duplicated: int
    peak_fill: int | None
    bound_ok: bool


def _delay(rng: random.Random, jitter: bool) -> None:
    if jitter and rng.random() < JITTER_CHANCE:
        time.sleep(rng.random() * JITTER_MAX_S)  # simulated work between items


def run_round(impl: str, *, producers: int, consumers: int, capacity: int, items: int, payload: int = 0,
              jitter: bool = False, seed: int = 0) -> RoundResult:
    """Move ``items`` items through ``impl`` and check them.

    ``impl`` is ``"buffer"`` (consumers call ``Buffer.get``), ``"buffer-many"`` (consumers call
    ``Buffer.get_many``, taking all that is ready at once) or ``"queue"`` (``queue.Queue.get``).
    """
    if impl.startswith("buffer"):
        buf: Any = Buffer(capacity)
        put: Callable[[Any], None] = buf.put
    else:
        buf = queue.Queue(capacity)
        put = buf.put
    counts = bytearray(items)  # each slot counts one item's arrivals (saturating at 255)
    blob = bytes(payload)

    def produce(p: int) -> None:
        rng = random.Random(seed * 1000 + p)
        for i in range(p, items, producers):
            _delay(rng, jitter)
            put((i, blob))

    def consume(c: int) -> None:
        rng = random.Random(seed * 1000 + 500 + c)
        if impl == "buffer-many":
            get_many = buf.get_many
            while True:
                try:
                    chunk = get_many()
                except BufferClosed:
                    return
                for i, _ in chunk:
                    counts[i] = min(255, counts[i] + 1)
                    _delay(rng, jitter)
        elif impl == "buffer":
            get = buf.get
            while True:
                try:
                    i, _ = get()
                except BufferClosed:
                    return
                counts[i] = min(255, counts[i] + 1)
                _delay(rng, jitter)
        else:
            get = buf.get
            while True:
                item = get()
                if item is _STOP:
                    return
                counts[item[0]] = min(255, counts[item[0]] + 1)
                _delay(rng, jitter)

    workers = [threading.Thread(target=produce, args=(p,), name=f"stress-producer-{p}", daemon=True)
               for p in range(producers)]
    readers = [threading.Thread(target=consume, args=(c,), name=f"stress-consumer-{c}", daemon=True)
               for c in range(consumers)]
    start = time.perf_counter()
    for t in readers + workers:
        t.start()
    for t in workers:
        t.join(JOIN_TIMEOUT)
    if impl.startswith("buffer"):
        buf.close()
    else:
        for _ in readers:
            buf.put(_STOP)
    for t in readers:
        t.join(JOIN_TIMEOUT)
    seconds = time.perf_counter() - start
    if any(t.is_alive() for t in workers + readers):
        raise RuntimeError(f"stress round with {impl} did not finish within {JOIN_TIMEOUT} s")
    lost = counts.count(0)
    duplicated = sum(1 for c in counts if c > 1)
    peak = buf.stats.peak_fill if impl.startswith("buffer") else None  # the bound is checked for Buffer only
    return RoundResult(impl, producers, consumers, capacity, items, jitter, seconds, items / seconds, lost, duplicated,
                       peak, peak is None or peak <= capacity)


def _open_fds() -> int | None:
    """The file descriptors this process holds, or ``None`` where they cannot be counted (no /proc)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def stress(shapes: Sequence[tuple], *, items: int, payload: int, rounds: int, minutes: float | None = None,
           progress: bool = True) -> dict[str, Any]:
    """Run rounds for every (producers, consumers, capacity) shape; medians per shape and queue."""
    deadline = time.monotonic() + 60 * minutes if minutes else None
    results: list[RoundResult] = []
    threads0, fds0 = threading.active_count(), _open_fds()
    threads_peak, fds_peak = threads0, fds0
    seed = 0
    passes = 0
    while True:
        for producers, consumers, capacity in shapes:
            for jitter in (False, True):
                impls = ("buffer", "buffer-many", "queue") if not jitter else ("buffer", "buffer-many")
                for _ in range(rounds):
                    seed += 1
                    for impl in impls:
                        n = items if not jitter else max(1, items // 10)
                        results.append(run_round(impl, producers=producers, consumers=consumers, capacity=capacity,
                                                 items=n, payload=payload, jitter=jitter, seed=seed))
            threads_peak = max(threads_peak, threading.active_count())
            fds = _open_fds()
            fds_peak = None if fds is None or fds_peak is None else max(fds_peak, fds)
        passes += 1
        if deadline is None or time.monotonic() >= deadline:
            break
        if progress:
            left = (deadline - time.monotonic()) / 60
            print(f"  pass {passes}: {len(results)} rounds, {sum(r.items for r in results):,} items, "
                  f"{left:.1f} min left", file=sys.stderr)
    summary = []
    for producers, consumers, capacity in shapes:
        def med(impl: str, jitter: bool, producers: int = producers, consumers: int = consumers,
                capacity: int = capacity) -> float | None:
            rates = [r.items_per_s for r in results if (r.impl, r.producers, r.consumers, r.capacity, r.jitter) ==
                     (impl, producers, consumers, capacity, jitter)]
            return statistics.median(rates) if rates else None

        b, m, q = med("buffer", False), med("buffer-many", False), med("queue", False)
        summary.append({"producers": producers, "consumers": consumers, "capacity": capacity,
                        "buffer_items_per_s": b, "buffer_many_items_per_s": m, "queue_items_per_s": q,
                        "ratio": b / q if b and q else None, "ratio_many": m / q if m and q else None,
                        "jittered_buffer_items_per_s": med("buffer", True)})
    return {
        "rounds": len(results), "passes": passes, "items_moved": sum(r.items for r in results),
        "lost": sum(r.lost for r in results), "duplicated": sum(r.duplicated for r in results),
        "bound_violations": sum(not r.bound_ok for r in results),
        "threads_start": threads0, "threads_peak": threads_peak, "threads_end": threading.active_count(),
        "fds_start": fds0, "fds_peak": fds_peak, "fds_end": _open_fds(),
        "summary": summary, "minutes": minutes, "payload": payload, "items_per_round": items,
        "rounds_per_shape": rounds,
    }


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown table and a line of checks."""
    lines = ["| producers | consumers | capacity | queue.Queue get, items/s | Buffer get, items/s | vs Queue | "
             "Buffer get_many, items/s | vs Queue | Buffer get, jittered, items/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in report["summary"]:
        lines.append(f"| {s['producers']} | {s['consumers']} | {s['capacity']} | {s['queue_items_per_s']:,.0f} | "
                     f"{s['buffer_items_per_s']:,.0f} | {s['ratio']:.2f}x | {s['buffer_many_items_per_s']:,.0f} | "
                     f"{s['ratio_many']:.2f}x | {s['jittered_buffer_items_per_s']:,.0f} |")
    lines.append("")
    lines.append(f"Rates are medians of items per second. {JITTER_NOTE}")
    lines.append("")
    fds = (report["fds_start"], report["fds_peak"], report["fds_end"])
    files = "open files not measured here" if None in fds else f"open files {fds[0]} / {fds[1]} / {fds[2]}"
    lines.append(f"Checks: {report['rounds']} rounds, {report['items_moved']:,} items moved: {report['lost']} lost, "
                 f"{report['duplicated']} duplicated, {report['bound_violations']} rounds over the bound; "
                 f"threads {report['threads_start']} at start, {report['threads_peak']} at most between passes, "
                 f"{report['threads_end']} at the end; {files}.")
    return "\n".join(lines)


def parse_shapes(text: str) -> list[tuple]:
    """``"1x1x64,4x2x16"`` -> [(1, 1, 64), (4, 2, 16)] (producers x consumers x capacity)."""
    shapes = []
    for part in text.split(","):
        try:
            p, c, cap = (int(x) for x in part.strip().split("x"))
        except ValueError:
            raise ValueError(f"--shapes: {part!r} is not PxCxCAPACITY (e.g. 4x2x64)") from None
        if min(p, c, cap) < 1:
            raise ValueError(f"--shapes: {part!r}: every number must be >= 1")
        shapes.append((p, c, cap))
    return shapes


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``audiobuffer stress``."""
    parser = argparse.ArgumentParser(prog="audiobuffer stress", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--shapes", default="1x1x64,4x1x64,2x2x16,8x2x4",
                        help="producers x consumers x capacity, comma-separated (default 1x1x64,4x1x64,2x2x16,8x2x4)")
    parser.add_argument("--items", type=int, default=100_000, help="items per contended round (default 100000)")
    parser.add_argument("--payload", type=int, default=0, help="bytes each item carries (default 0)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per shape and kind; medians reported (default 3)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="soak: repeat the rounds for this many minutes, checking that threads and open files "
                             "stay flat")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK_ITEMS} items, 1 round per shape")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON ('-': stdout)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``audiobuffer stress`` with ``argv`` (the arguments after ``stress``); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as exc:
        parser.error(str(exc))
    if args.items < 1 or args.rounds < 1 or args.payload < 0:
        parser.error("--items and --rounds must be >= 1, --payload >= 0")
    items, rounds = (QUICK_ITEMS, 1) if args.quick else (args.items, args.rounds)
    load_before = machine_load()
    report = stress(shapes, items=items, payload=args.payload, rounds=rounds, minutes=args.minutes)
    report["load"] = trust_line(load_before, machine_load(), smoke=args.quick)
    print(markdown(report))
    print(f"\n{report['load']}")
    write_json(args.json, report)
    ok = report["lost"] == report["duplicated"] == report["bound_violations"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
