"""Decoding an epoch: audiobuffer's loaders against other libraries'; saves results/decode.json, renders its section.

    python benchmarks/bench_decode.py --fsdd ../shared/data/fsdd/recordings   # the full run (several minutes)
    python benchmarks/bench_decode.py --quick                                  # a smoke run, saves nothing

This is ``audiobuffer bench`` (``audiobuffer/cli/bench.py``: the same options, corpora, measurements and
tables) with the peers added to its line-up (:data:`PEERS`); each approach runs in a fresh process of
this script. The peers, where installed (the ``test`` extra holds them):

- ``torchdata-2``: torchdata's ``ParallelMapper(method="thread")``, 2 workers;
- ``prefetch_generator``: the plain loop in a ``BackgroundGenerator``;
- ``spdl-pipeline-N``: SPDL's ``PipelineBuilder``, a thread stage of concurrency N that decodes and
  collates batches (settings in :func:`spdl_pipeline`);
- ``spdl-load_wav``: a loop over ``spdl.io.load_wav`` (SPDL's native WAV parser), on WAV corpora.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import render
from harness import command_line, machine_info, results

from audiobuffer.cli import bench
from audiobuffer.cli.bench import BATCH_SIZE, BUFFER_SIZE, Transform, batches_of, decoding

SECTION = "decode"


def torchdata_mapper(paths: list[str], transform: Transform | None) -> Iterator[dict[str, Any]]:
    """torchdata's nodes: ``ParallelMapper`` (2 threads, out of order) -> ``Batcher`` -> ``pad_collate``."""
    from torchdata.nodes import Batcher, IterableWrapper, Loader, Mapper, ParallelMapper

    from audiobuffer import pad_collate

    node = ParallelMapper(IterableWrapper(paths), map_fn=decoding(transform), num_workers=2, method="thread",
                          in_order=False)
    return iter(Loader(Mapper(Batcher(node, batch_size=BATCH_SIZE, drop_last=False), pad_collate)))


def background_generator(paths: list[str], transform: Transform | None) -> Iterator[dict[str, Any]]:
    """The plain loop (decode, collate) in prefetch_generator's background thread, 4 batches ahead."""
    from prefetch_generator import BackgroundGenerator

    decode = decoding(transform)
    return iter(BackgroundGenerator(batches_of(decode(p) for p in paths), max_prefetch=4))


def spdl_pipeline(paths: list[str], transform: Transform | None, concurrency: int
                  ) -> Iterator[dict[str, Any]]:
    """SPDL's pipeline: a source of batches of paths -> a thread stage that decodes and collates each batch.

    Settings tried on FSDD (3000 tiny WAVs) and 400 generated FLAC files, SPDL 0.8.0, on 2 cores that
    others were using too (load about 4; medians of 1-3 runs, so only the large differences count):

    - the layout the SPDL docs draw, ``source(paths) -> pipe(decode, concurrency=N) -> aggregate(16) ->
      pipe(pad_collate) -> sink``: 2.5-3.3 s on FSDD against 0.26-0.42 s for the loop. Each item crosses
      three asyncio queues and a ``run_in_executor`` in SPDL's event-loop thread, about 0.3 ms of GIL-held
      Python per item here (a pipeline of no-op stages takes 1.8 s for 3000 items);
    - ``aggregate(16)`` first, then one stage decoding and collating a batch: 1.4-1.8 s on FSDD (the
      aggregate stage still moves every path through a queue);
    - a source that yields the batches of paths, then that stage (kept): 0.52 s on FSDD; on FLAC 0.40 s
      with concurrency 4 against 0.68 s with 2, 0.62-0.72 s per item, and 0.58 s for the loop;
    - ``num_threads`` equal to the concurrency (more threads than concurrent tasks idle),
      ``use_thread_output_queue=True`` (no change beyond noise), a sink of ``BUFFER_SIZE // BATCH_SIZE``
      batches (the samples the other approaches decode ahead), ``output_order="completion"`` (the default),
      and the default task hooks (disabling them changed nothing beyond noise).

    Every epoch ends about 0.1 s after its last batch: SPDL's event-loop thread notices the end and the
    stop request by polling every 0.1 s. That is what a user of ``auto_stop()`` pays, so it is measured.
    """
    from spdl.pipeline import PipelineBuilder

    from audiobuffer import pad_collate

    decode = decoding(transform)

    def decode_batch(batch_paths: list[str]) -> dict[str, Any]:
        return pad_collate([decode(p) for p in batch_paths])

    chunks = [paths[i:i + BATCH_SIZE] for i in range(0, len(paths), BATCH_SIZE)]
    builder: PipelineBuilder[list[str], dict[str, Any]] = PipelineBuilder()
    builder = builder.add_source(chunks).pipe(decode_batch, concurrency=concurrency)
    pipeline = builder.add_sink(max(1, BUFFER_SIZE // BATCH_SIZE)).build(num_threads=concurrency)
    with pipeline.auto_stop():
        yield from pipeline.get_iterator(timeout=600)


_WAV_SCALE = {np.dtype(np.int16): 1 / 32768, np.dtype(np.int32): 1 / 2**31}


def load_wav(path: str, index: int) -> dict[str, Any]:
    """``spdl.io.load_wav`` on the file's bytes, as :class:`~audiobuffer.AudioDecoder` would return it (mono)."""
    import spdl.io
    import torch

    with open(path, "rb") as f:
        data = f.read()
    sample_rate = spdl.io.parse_wav(data).sample_rate
    raw = np.asarray(spdl.io.load_wav(data))  # (frames, channels): int16 for PCM 16, as stored
    audio: np.ndarray
    if raw.dtype == np.uint8:
        audio = (raw.astype(np.float32) - 128) / 128
    elif raw.dtype in _WAV_SCALE:
        audio = raw.astype(np.float32) * np.float32(_WAV_SCALE[raw.dtype])  # libsndfile's scaling: exact
    else:
        audio = raw.astype(np.float32)
    audio = audio[:, 0] if audio.shape[1] == 1 else audio.mean(axis=1, dtype=np.float32)
    return {"path": path, "index": index, "audio": torch.from_numpy(np.ascontiguousarray(audio)),
            "sample_rate": sample_rate, "num_frames": audio.shape[0]}


def load_wav_loop(paths: list[str], transform: Transform | None) -> Iterator[dict[str, Any]]:
    """A loop over :func:`load_wav`, collating in this thread (WAV only, no transform)."""
    if transform is not None:
        raise ValueError("spdl-load_wav takes no transform")
    return batches_of(load_wav(p, i) for i, p in enumerate(paths))


PEERS: dict[str, bench.Peer] = {
    "torchdata-2": bench.Peer("torchdata.nodes", torchdata_mapper, "torchdata"),
    "prefetch_generator": bench.Peer("prefetch_generator", background_generator, "prefetch_generator"),
    "spdl-pipeline-2": bench.Peer("spdl.pipeline", functools.partial(spdl_pipeline, concurrency=2), "spdl",
                                  color="tab:orange"),
    "spdl-pipeline-4": bench.Peer("spdl.pipeline", functools.partial(spdl_pipeline, concurrency=4), "spdl",
                                  color="tab:orange"),
    "spdl-load_wav": bench.Peer("spdl.io", load_wav_loop, "spdl", wav_only=True, color="tab:orange"),
}
#: audiobuffer's approaches and the peers, each child a fresh process of this script.
LINEUP = bench.Lineup(
    names=(*bench.APPROACHES, *PEERS),
    quick=(*bench.QUICK_APPROACHES, "torchdata-2", "prefetch_generator", "spdl-pipeline-2", "spdl-load_wav"),
    peers=PEERS,
    child=(str(Path(__file__).resolve()),),
)


def run(argv: list[str]) -> int:
    """``audiobuffer bench`` with :data:`LINEUP`: the command line of ``audiobuffer bench``."""
    return bench.main(argv, lineup=LINEUP, prog="bench_decode.py", description=(__doc__ or "").split("\n")[0])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--quick" in args or "--child" in args or "-h" in args or "--help" in args:
        return run(args)  # a smoke run, a child, or the help: nothing to save
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        status = run(args + ["--json", str(out)])
        if status:
            return status
        by_corpus = json.loads(out.read_text(encoding="utf-8"))
    rows = [{"corpus": corpus, **row} for corpus, corpus_rows in by_corpus.items() for row in corpus_rows]
    measured = results(SECTION, rows, command=command_line("bench_decode.py", args),
                       versions=f"{machine_info()['versions']}; {bench.gil_line(by_corpus, LINEUP).rstrip('.')}",
                       settings={"runs": rows[0]["runs"] if rows else 0, "batch_size": BATCH_SIZE})
    render.publish(measured)
    print(render.preview(measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
