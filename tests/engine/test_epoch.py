"""The epoch consumer fed into a sink (``feed`` in audiobuffer/engine/epoch.py), as the isolated
loader's helper process runs it: batches with the positions they consume, failures under the error
policy."""

from __future__ import annotations

import pytest
from helpers import duration_manifest, fake_paths
from plain_decoders import IndexDecoder

from audiobuffer.engine.epoch import BatchEpochRun, feed, run_epoch
from audiobuffer.engine.pipeline import Pipeline
from audiobuffer.engine.plan import EpochShard
from audiobuffer.engine.pool import Failure
from audiobuffer.options import LoaderOptions
from audiobuffer.prepare.durations import CACHE_ENV

pytestmark = pytest.mark.timeout(60)


class ListSink:
    """A sink that keeps what it is handed; it refuses the samples of the items in ``refuse``."""

    def __init__(self, run, refuse: tuple[int, ...] = ()) -> None:
        self.run = run
        self.refuse = set(refuse)
        self.batches: list[tuple[list[int], list[int]]] = []  # (items, positions)
        self.rows: list[list[int]] = []
        self.skipped: list[int] = []
        self.failed: list[tuple[int, bool]] = []
        self.ended: list[int] | None = None

    def put(self, samples, seqs, positions):
        misfits = {i: Failure(ValueError("refused"), self.run.make_item(seq), "collate")
                   for i, (sample, seq) in enumerate(zip(samples, seqs))
                   if sample["index"] in self.refuse}
        if misfits:
            return misfits
        self.batches.append(([s["index"] for s in samples], list(positions)))
        self.rows.append(list(seqs))
        return {}

    def skip(self, position):
        self.skipped.append(position)

    def fail(self, failure, *, fatal):
        self.failed.append((failure.item.index, fatal))

    def end(self, positions):
        self.ended = list(positions)


def fed(source, *, batch_size=None, drop_last=False, refuse=(), policy="skip", decoder=None,
        **options):
    options = LoaderOptions(ordered=True, on_error=policy, **options)
    pipeline = Pipeline.build(source, decoder or IndexDecoder(), options)
    run = run_epoch(pipeline, EpochShard(0))
    sink = ListSink(run, refuse)
    run.pool.start()
    try:
        feed(run, sink, policy, batch_size=batch_size, drop_last=drop_last)
    finally:
        run.pool.close()
    return run, sink


def items(sink):
    return [i for batch, _ in sink.batches for i in batch]


def positions(sink):
    return sorted([p for _, ps in sink.batches for p in ps] + sink.skipped + (sink.ended or []))


@pytest.mark.parametrize("policy", ["skip", "warn"])
def test_samples_go_in_batches_each_with_the_positions_it_consumes(policy):
    run, sink = fed(fake_paths(10), batch_size=4, policy=policy, decoder=IndexDecoder(fail=(3,)))
    assert [batch for batch, _ in sink.batches] == [[0, 1, 2, 4], [5, 6, 7, 8], [9]]
    assert sink.batches[0][1] == [0, 1, 2, 3, 4]  # the failure goes with the batch after it
    assert positions(sink) == list(range(10)) and sink.ended == []
    assert sink.failed == [(3, False)] and run.failed == 1


def test_drop_last_leaves_the_short_batch_and_its_positions_go_at_the_end():
    _, sink = fed(fake_paths(10), batch_size=4, drop_last=True)
    assert items(sink) == list(range(8)) and sink.ended == [8, 9]


def test_a_raised_failure_is_told_as_fatal_and_ends_the_epoch():
    _, sink = fed(fake_paths(10), batch_size=4, policy="raise", decoder=IndexDecoder(fail=(5,)))
    assert sink.failed == [(5, True)]
    assert items(sink) == [0, 1, 2, 3] and sink.ended is None


def test_a_sample_the_sink_refuses_fails_as_its_item_and_the_batch_fills_up():
    run, sink = fed(fake_paths(10), batch_size=4, refuse=(2,))
    assert [batch for batch, _ in sink.batches] == [[0, 1, 3, 4], [5, 6, 7, 8], [9]]
    assert positions(sink) == list(range(10))
    assert sink.failed == [(2, False)] and run.failures[0][:2] == (2, fake_paths(10)[2])


def test_a_refused_sample_under_raise_ends_the_epoch():
    _, sink = fed(fake_paths(10), batch_size=4, refuse=(2,), policy="raise")
    assert sink.failed == [(2, True)] and sink.batches == [] and sink.ended is None


@pytest.fixture
def duration_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))


@pytest.mark.usefixtures("duration_cache")
def test_batches_by_duration_go_whole_and_empty_ones_are_skipped(tmp_path):
    source = duration_manifest(tmp_path, [1.0] * 6)
    options = dict(max_batch_seconds=2.0, buckets=1, duration_column="seconds")
    run, sink = fed(source, **options)
    assert isinstance(run, BatchEpochRun) and sorted(items(sink)) == list(range(6))
    assert all(len(ps) == 1 for _, ps in sink.batches) and positions(sink) == [0, 1, 2]
    assert [run.layout.indices[seq] for seqs in sink.rows for seq in seqs] == items(sink)
    run, sink = fed(source, decoder=IndexDecoder(fail=tuple(range(6))), **options)
    assert sink.batches == [] and sorted(sink.skipped) == [0, 1, 2] and sink.ended == []
    assert sorted(i for i, _ in sink.failed) == list(range(6)) and run.empty_batches == 3
