"""Packed shards and object storage: FSDD from local shards and from an S3 server with 20 ms of latency.

    python benchmarks/bench_storage.py                        # ../shared/data/fsdd/recordings: results/storage.json
    python benchmarks/bench_storage.py --runs 5 --remote-files 600 --producers 32 --no-write   # print only

Two goals, each measured in one run of this script (medians of ``--runs`` runs, the approaches
interleaved run by run so that a noisy neighbour hits them alike):

1. **Local shards.** The FSDD recordings packed into tar shards with an index (``audiobuffer.sources.pack``);
   one epoch of ``BufferedDataset("packed/index.json", AudioDecoder(), shuffle=True)`` (members read by
   byte range, decoded from bytes) against the per-file loop ``soundfile.read(path)`` over the
   original files. Goal: at least 3x. The streamed shards (``shard-*.tar``) are timed too.
2. **S3 with latency.** The first ``--remote-files`` recordings packed and uploaded to moto's S3 server,
   which runs in a subprocess on 127.0.0.1 behind a proxy (a second subprocess) that holds every
   request 20 ms before forwarding it. One epoch by index with ``--producers`` threads, a member a
   request (``read_block=None``) and in blocks of ``--blocks`` members a request (``read_block``, with the
   first producer count), and one of the streamed shards (``shard-*.tar``, the default producer count),
   against a single-threaded loop over
   the same members through the same proxy (one ranged request each, then ``soundfile.read``). Goal: at
   least 10x, with the peak memory of the epoch bounded by the buffer. A second single-threaded loop
   reads the shards whole (one request each, ``tarfile``, ``soundfile.read``), so that the table shows
   what packing gains apart from the threads.

Nothing outside 127.0.0.1 is contacted. Needs moto[server], s3fs and psutil (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import render
from harness import FSDD, PeakRSS, command_line, interleaved, results, table

from audiobuffer.options import usable_cores

KEY = SECRET = "bench"
REGION = "us-east-1"
BUCKET = "bench"
DELAY = 0.020
#: The key of the streamed shards' epochs in the remote results (the index's are producer counts, and
#: ``block<N>`` for blocks of N members a request).
STREAMED = "streamed"
BLOCK = "block"


# -- the servers (subprocesses) -------------------------------------------------------------------

def serve_moto() -> None:
    """Run moto's S3 server on a free port of 127.0.0.1; print the port; stop when stdin closes."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(json.dumps({"port": server.get_host_and_port()[1]}), flush=True)
    sys.stdin.read()
    server.stop()


def serve_proxy(upstream_port: int, delay: float) -> None:
    """Run a proxy on 127.0.0.1 that holds each request ``delay`` s, then forwards it; stop when stdin closes.

    One request per connection (the forwarded request says ``Connection: close``), so every request,
    ranged GETs and HEADs alike, pays the delay once.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                request = _read_request(conn)
                if request is None:
                    return
                time.sleep(delay)
                with socket.create_connection(("127.0.0.1", upstream_port), timeout=30) as up:
                    up.sendall(request)
                    while chunk := up.recv(1 << 16):
                        conn.sendall(chunk)
            except OSError:
                return

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def _read_request(conn: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    kept, length = [lines[0]], 0
    for line in lines[1:]:
        name = line.partition(b":")[0].strip().lower()
        if name == b"content-length":
            length = int(line.partition(b":")[2])
        if name not in (b"connection", b"keep-alive"):
            kept.append(line)
    kept.append(b"Connection: close")
    while len(body) < length:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return None
        body += chunk
    return b"\r\n".join(kept) + b"\r\n\r\n" + body


class _Child:
    """A server subprocess of this script; ``port`` is what it printed; ``stop()`` closes its stdin."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = json.loads(self.proc.stdout.readline())["port"]

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# -- measuring ------------------------------------------------------------------------------------

def _epoch(ds: object) -> Callable[[], int]:
    def run() -> int:
        n = 0
        for _ in ds:  # type: ignore[attr-defined]
            n += 1
        return n
    return run


# -- the two goals --------------------------------------------------------------------------------

def local(files: list[Path], work: Path, runs: int, shard_size: int) -> dict[str, object]:
    import soundfile as sf

    from audiobuffer import AudioDecoder, BufferedDataset
    from audiobuffer.sources import pack

    index = pack(files, work / "local", shard_size=shard_size, progress=False)
    decode = AudioDecoder()

    def loop() -> None:
        for path in files:
            sf.read(path, dtype="float32")

    fns: dict[str, Callable[[], object]] = {"soundfile loop over the files": loop}
    for kind, source in (("index", "index.json"), ("streamed shards", "shard-*.tar")):
        for producers in ("auto", 1, 2):
            count = ({} if producers == "auto" else {"num_producers": producers})
            ds = BufferedDataset(str(work / "local" / source), decode, shuffle=True, buffer_size=256, **count)
            name = "auto (the default)" if producers == "auto" else f"{producers} producer{'s' * (producers != 1)}"
            fns[f"{kind}, {name}"] = _epoch(ds)
    for fn in fns.values():
        fn()  # warm: imports, page cache
    times = interleaved(fns, runs)
    return {"times": times, "files": len(files), "shards": len(index.shards), "costs": _costs(files, work, runs)}


def _costs(files: list[Path], work: Path, runs: int) -> dict[str, float]:
    """Single-thread microseconds per file of each part of an epoch by index (medians of ``runs``)."""
    import soundfile as sf

    from audiobuffer import AudioDecoder, BufferedDataset, Source, WorkItem

    source = Source(str(work / "local" / "index.json"))
    items = [source.item(i) for i in range(len(source))]
    data = [item.read() for item in items]
    decode = AudioDecoder()
    bare = [WorkItem(index=i, path=item.path, read=lambda d=d: d) for i, (item, d) in enumerate(zip(items, data))]
    n = len(items)

    def nothing(item: object) -> int:
        return 0

    parts: dict[str, Callable[[], object]] = {
        "`soundfile.read(path)` of a file": lambda: [sf.read(f, dtype="float32") for f in files],
        "ranged read of a member (`item.read()`)": lambda: [item.read() for item in items],
        "decode of a member's bytes (`AudioDecoder`)": lambda: [decode(item) for item in bare],
        "making the work item (`Source.item`)": lambda: [source.item(i) for i in range(n)],
        "an epoch with a decoder that does nothing (items, pool, hand-over)":
            _epoch(BufferedDataset(source, nothing, num_producers=1, shuffle=True, buffer_size=256)),
    }
    return {name: statistics.median(t) / n * 1e6 for name, t in interleaved(parts, runs).items()}


def remote(files: list[Path], work: Path, runs: int, producers: list[int], loop_runs: int,
           blocks: list[int]) -> dict[str, object]:
    import tarfile

    import boto3
    import fsspec
    import psutil
    import soundfile as sf

    from audiobuffer import AudioDecoder, BufferedDataset
    from audiobuffer.sources import pack, read_index
    from audiobuffer.sources.storage import read_range

    pack(files, work / "remote", shard_size=4_000_000, progress=False)
    moto = _Child("--serve", "moto")
    proxy = _Child("--serve", "proxy", str(moto.port), str(DELAY))
    try:
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto.port}", aws_access_key_id=KEY,
                              aws_secret_access_key=SECRET, region_name=REGION)
        client.create_bucket(Bucket=BUCKET)
        for path in sorted((work / "remote").iterdir()):
            client.upload_file(str(path), BUCKET, f"fsdd/{path.name}")
        options = {"endpoint_url": f"http://127.0.0.1:{proxy.port}", "key": KEY, "secret": SECRET,
                   "client_kwargs": {"region_name": REGION}}
        url = f"s3://{BUCKET}/fsdd/index.json"
        members = read_index(url, storage_options=options).members
        parties = {"moto": psutil.Process(moto.proc.pid), "proxy": psutil.Process(proxy.proc.pid),
                   "client": psutil.Process()}

        def cpu() -> dict[str, float]:
            return {name: sum(p.cpu_times()[:2]) for name, p in parties.items()}

        def loop() -> None:
            for m in members:
                sf.read(io.BytesIO(read_range(m.shard, m.offset, m.size, storage_options=options)),
                        dtype="float32")

        shard_urls = sorted({m.shard for m in members})

        def shard_loop() -> None:  # what a user without audiobuffer writes for packed shards
            for shard in shard_urls:
                with fsspec.open(shard, "rb", **options) as f, tarfile.open(fileobj=io.BytesIO(f.read())) as tar:
                    for info in tar:
                        if info.name.endswith(".wav"):
                            sf.read(io.BytesIO(tar.extractfile(info).read()), dtype="float32")  # type: ignore[union-attr]

        decode = AudioDecoder()
        buffer_size = 64
        out: dict[str, object] = {"members": len(members), "buffer_size": buffer_size,
                                  "largest_sample": max(decode(str(f))["audio"].nbytes for f in files)}
        epochs: dict[int | str, dict[str, object]] = {}
        settings: list[tuple[int | str, str, dict[str, object]]] = [
            (count, url, {"num_producers": count, "read_block": None}) for count in producers]
        settings += [(f"{BLOCK}{block}", url, {"num_producers": producers[0], "read_block": block}) for block in blocks]
        settings.append((STREAMED, f"s3://{BUCKET}/fsdd/shard-*.tar", {}))
        for count, source, kwargs in settings:
            ds = BufferedDataset(source, decode, shuffle=True, buffer_size=buffer_size, storage_options=options,
                                 **kwargs)  # type: ignore[arg-type]
            one = _epoch(ds)
            one()  # warm: the filesystem, its connections, imports
            times, rss = [], []
            before = cpu()
            for _ in range(runs):
                with PeakRSS() as peak:
                    start = time.perf_counter()
                    one()
                    times.append(time.perf_counter() - start)
                rss.append(peak.peak - peak.before)
            after = cpu()
            stats = ds.stats()
            epochs[count] = {"times": times, "rss": rss, "read_s": stats.read_s if stats else 0.0,
                             "decode_s": stats.decode_s if stats else 0.0,
                             "cpu_ms": {k: (after[k] - before[k]) / (runs * len(members)) * 1e3 for k in after}}
        before = cpu()
        out["loop"] = interleaved({"loop": loop}, loop_runs)["loop"]
        after = cpu()
        out["loop_cpu_ms"] = {k: (after[k] - before[k]) / (loop_runs * len(members)) * 1e3 for k in after}
        shard_loop()  # warm
        out["shard_loop"] = interleaved({"shards": shard_loop}, runs)["shards"]
        out["shards"] = len(shard_urls)
        out["epochs"] = epochs
        return out
    finally:
        proxy.stop()
        moto.stop()


# -- the results ----------------------------------------------------------------------------------

#: Each goal: at least this many times the per-file (local) or per-member (S3) loop.
GOALS = {"local": 3.0, "s3": 10.0}
#: In blocks over S3: at least this many times the per-member loop, and within this factor of the streamed shards.
BLOCK_GOALS = (20.0, 2.0)


def rows_of(loc: dict, rem: dict | None) -> list[dict[str, object]]:
    """One row per approach: where, the median epoch and each run, files/s, the speed against that place's
    single-threaded per-file loop and, for the S3 epochs by audiobuffer, the peak RSS rise."""
    med = {name: statistics.median(t) for name, t in loc["times"].items()}
    base = med["soundfile loop over the files"]
    rows: list[dict[str, object]] = [
        {"where": "local", "approach": name, "median_s": m, "files_per_s": loc["files"] / m, "vs_loop": base / m,
         "peak_rss_rise_mb": None, "runs_s": loc["times"][name]} for name, m in med.items()]
    if rem is None:
        return rows
    n, loop = rem["members"], statistics.median(rem["loop"])

    def row(name: str, times: list[float], rss: float | None) -> dict[str, object]:
        m = statistics.median(times)
        return {"where": "s3", "approach": name, "median_s": m, "files_per_s": n / m, "vs_loop": loop / m,
                "peak_rss_rise_mb": rss, "runs_s": times}

    rows += [row("single-threaded loop: one ranged GET per member, then `soundfile.read`", rem["loop"], None),
             row(f"single-threaded loop over the shards ({rem['shards']}): one GET each, `tarfile`, "
                 "`soundfile.read`", rem["shard_loop"], None)]
    producers = next(c for c in rem["epochs"] if isinstance(c, int))
    for count, epoch in rem["epochs"].items():
        if count == STREAMED:
            name = "`BufferedDataset(\"s3://.../shard-*.tar\")`: streamed shards, auto (the default)"
        elif str(count).startswith(BLOCK):
            name = (f"`BufferedDataset(\"s3://.../index.json\", num_producers={producers}, "
                    f"read_block={str(count)[len(BLOCK):]})`")
        else:
            name = f"`BufferedDataset(\"s3://.../index.json\", num_producers={count}, read_block=None)`"
        rows.append(row(name, epoch["times"], max(epoch["rss"]) / 2**20))
    return rows


def settings_of(loc: dict, rem: dict | None, args: argparse.Namespace) -> dict[str, object]:
    """What the run was, and what explains it: each part's cost per file, and over S3 the CPU time each
    request took in the server, the proxy and the client, with the cap that puts on the threads here."""
    settings: dict[str, object] = {"runs": args.runs, "loop_runs": args.loop_runs, "files": loc["files"],
                                   "shards": loc["shards"], "costs_us": loc["costs"]}
    if rem is not None:
        cpu = rem["loop_cpu_ms"]
        per_request = sum(cpu.values())
        by_index = {c: statistics.median(e["times"]) for c, e in rem["epochs"].items() if c != STREAMED}
        best = rem["epochs"][min(by_index, key=by_index.__getitem__)]
        cores = 1e3 * usable_cores()  # ms of CPU a second on this machine, which server, proxy and client share
        per_member = statistics.median(rem["loop"]) / rem["members"]
        # each epoch's ceiling here: the loop's time a member over the CPU a member cost (all parties) per core
        settings["cpu_cap"] = {str(c): {"cpu_ms": sum(e["cpu_ms"].values()),
                                        "cap": per_member * cores / sum(e["cpu_ms"].values())}
                               for c, e in rem["epochs"].items()}
        settings.update({"remote_files": rem["members"], "remote_shards": rem["shards"], "delay_ms": 1000 * DELAY,
                         "producers": args.producers, "request_cpu_ms": cpu,
                         "request_cap": statistics.median(rem["loop"]) / rem["members"] * cores / per_request,
                         "best_read_s": best["read_s"], "best_decode_s": best["decode_s"],
                         "buffer_size": rem["buffer_size"], "largest_sample_kib": rem["largest_sample"] / 1024})
    return settings


def goal_lines(rows: list[dict[str, object]]) -> list[str]:
    """Each goal against this run's best epoch by index."""
    lines = []
    for where, target in GOALS.items():
        by_index = [r for r in rows if r["where"] == where and "index" in str(r["approach"])]
        if by_index:
            best = max(by_index, key=lambda r: float(r["vs_loop"]))  # type: ignore[arg-type]
            ratio = float(best["vs_loop"])  # type: ignore[arg-type]
            lines.append(f"Goal, {where}: the index at least {target:g}x the per-file loop. Measured {ratio:.2f}x "
                         f"({best['approach']}): {'met' if ratio >= target else 'not met'}.")
    blocked = [r for r in rows if r["where"] == "s3" and "read_block=" in str(r["approach"])
               and "read_block=None" not in str(r["approach"])]
    streamed = [r for r in rows if r["where"] == "s3" and "streamed" in str(r["approach"])]
    if blocked and streamed:
        best = max(blocked, key=lambda r: float(r["vs_loop"]))  # type: ignore[arg-type]
        ratio, behind = float(best["vs_loop"]), float(best["median_s"]) / float(streamed[0]["median_s"])  # type: ignore[arg-type]
        loop, within = BLOCK_GOALS
        lines.append(f"Goal, s3 in blocks: at least {loop:g}x the per-member loop and within {within:g}x of the "
                     f"streamed shards. Measured {ratio:.1f}x and {behind:.2f}x the streamed epoch "
                     f"({best['approach']}): {'met' if ratio >= loop and behind <= within else 'not met'}.")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--serve", "moto"]:
        serve_moto()
        return 0
    if argv[:2] == ["--serve", "proxy"]:
        serve_proxy(int(argv[2]), float(argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=FSDD, help=f"the FSDD recordings (default {FSDD})")
    parser.add_argument("--runs", type=int, default=5, help="runs of each approach (medians)")
    parser.add_argument("--loop-runs", type=int, default=3, help="runs of the remote loop (slow: 20 ms a file)")
    parser.add_argument("--remote-files", type=int, default=600, help="recordings uploaded to the S3 server")
    parser.add_argument("--producers", type=int, nargs="+", default=[16],
                        help="producer threads reading from S3 a member a request (each count is timed)")
    parser.add_argument("--blocks", type=int, nargs="*", default=[8, 32, 128],
                        help="members a request (read_block) by index from S3, with the first producer count")
    parser.add_argument("--shard-size", type=int, default=4_000_000, help="bytes per local shard")
    parser.add_argument("--no-remote", action="store_true", help="skip the S3 part")
    parser.add_argument("--no-write", action="store_true", help="print, do not save results/storage.json")
    args = parser.parse_args(argv)
    files = sorted(args.root.glob("*.wav"))
    if not files:
        parser.error(f"no .wav files in {args.root}")
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
        work = Path(tmp)
        loc = local(files, work, args.runs, args.shard_size)
        step = max(1, len(files) // args.remote_files)
        rem = None if args.no_remote else remote(files[::step][:args.remote_files], work, args.runs,
                                                  args.producers, args.loop_runs, args.blocks)
    rows = rows_of(loc, rem)
    measured = results("storage", rows, command=command_line("bench_storage.py", argv),
                       settings=settings_of(loc, rem, args))
    print(render.preview(measured))
    print("\nWhat one recording costs, single thread, microseconds (medians):\n")
    print(table(["part", "us per file"], [[name, f"{us:.0f}"] for name, us in loc["costs"].items()]))
    print("\n" + "\n".join(goal_lines(rows)))
    if not args.no_write:
        render.publish(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
