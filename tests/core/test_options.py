"""LoaderOptions, the options every loader validates once, and the hooks a loader may rely on."""

from __future__ import annotations

import math

import pytest
from helpers import IndexDecoder, fake_paths
from plain_decoders import IndexDecoder as PlainIndexDecoder

from audiobuffer import BatchSlotLoader, BufferedDataset, IsolatedLoader, Source
from audiobuffer.buffer import Buffer
from audiobuffer.engine.pool import BufferPort, ProducerPool
from audiobuffer.options import LoaderOptions


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(num_producers=0), ValueError, "num_producers must be an integer in"),
    (dict(num_producers="eight"), TypeError, "num_producers must be an integer"),
    (dict(buffer_size=0), ValueError, "buffer_size must be an integer in"),
    (dict(seed=-1), ValueError, r"seed must be an integer in \[0, 9223372036854775807\]"),
    (dict(shuffle="yes"), TypeError, "shuffle must be True or False"),
    (dict(on_error="ignore"), ValueError, "on_error must be one of 'raise', 'warn', 'skip', got 'ignore'"),
    (dict(even_shards="even"), ValueError, "even_shards must be one of 'pad', 'drop', None"),
    (dict(rank=1), ValueError, "give rank and world_size together"),
    (dict(rank=2, world_size=2), ValueError, r"rank must be an integer in \[0, 1\]"),
    (dict(timeout=0), ValueError, "timeout must be None or a number of seconds > 0"),
    (dict(warn_after=math.nan), ValueError, "warn_after must be None or a number of seconds > 0"),
    (dict(transform=3), TypeError, "transform must be None or callable"),
    (dict(storage_options="anon"), TypeError, "storage_options must be a mapping of fsspec options or None"),
    (dict(quadratic_duration=15.0), ValueError, "quadratic_duration shape batches by duration: give max_batch_seconds"),
    (dict(sync_buckets=True), ValueError, "sync_buckets shape batches by duration: give max_batch_seconds"),
    (dict(max_batch_seconds=60.0, sync_buckets="yes"), TypeError, "sync_buckets must be True, False or None"),
    (dict(max_batch_seconds=60.0, quadratic_duration=-1.0), ValueError,
     "quadratic_duration must be None or a number of seconds > 0"),
])
def test_every_loader_refuses_the_same_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        LoaderOptions(**kwargs)
    with pytest.raises(error, match=match):
        BufferedDataset(fake_paths(4), IndexDecoder(), **kwargs)
    if "buffer_size" not in kwargs:  # BatchSlotLoader sizes its buffer by num_slots
        with pytest.raises(error, match=match):
            BatchSlotLoader(fake_paths(4), IndexDecoder(), batch_size=2, **kwargs)


def test_no_producer_count_is_stored_as_auto():
    assert LoaderOptions(num_producers=None).num_producers == "auto" == LoaderOptions().num_producers


@pytest.mark.subprocess
def test_every_loader_holds_its_own_pipeline_and_builds_no_other_loader(monkeypatch):
    made = [BufferedDataset(fake_paths(6), IndexDecoder(), seed=4, shuffle=True)]

    def refuse(*args, **kwargs):
        raise AssertionError("a loader built a BufferedDataset")

    monkeypatch.setattr(BufferedDataset, "__init__", refuse)
    made.append(BatchSlotLoader(fake_paths(6), IndexDecoder(), batch_size=2, seed=4, shuffle=True))
    with IsolatedLoader(fake_paths(6), PlainIndexDecoder(), batch_size=2, seed=4, shuffle=True) as isolated:
        made.append(isolated)  # its helper starts at the first iter(): none here
    for loader in made:
        assert (loader.pipeline.options.seed, loader.pipeline.options.shuffle) == (4, True)
        assert loader.source is loader.pipeline.source and len(loader.source) == 6
        assert not hasattr(loader, "dataset")


def test_infinite_waits_mean_no_limit():
    assert LoaderOptions(timeout=math.inf, warn_after=None).timeout == math.inf


def test_listing_options_with_a_ready_source_are_refused(tmp_path):
    source = Source(fake_paths(4))
    for kwargs in (dict(labels="parent"), dict(patterns=["*.wav"]), dict(path_column="file")):
        with pytest.raises(ValueError, match=f"{next(iter(kwargs))} describe how to list a source"):
            BufferedDataset(source, IndexDecoder(), **kwargs)
    assert BufferedDataset(source, IndexDecoder()).source is source


class Waiting(BufferPort):
    """An output port that waits for the consumer and keeps every result (NOTE [ Output port ])."""

    in_place = False
    waits_for_consumer = True

    def __init__(self):
        self.stopped = 0

    def deliver(self, seq, item, out, chunk):
        pass

    def stop(self):
        self.stopped += 1


def test_a_port_that_waits_runs_unordered_with_chunks_of_one_and_is_told_to_stop():
    port = Waiting()
    with pytest.raises(ValueError, match="cannot run in an ordered pool"):
        ProducerPool(lambda seq: None, 4, IndexDecoder(), Buffer(4), num_producers=1, ordered=True, port=port)
    pool = ProducerPool(lambda seq: Source(fake_paths(4)).item(seq), 4, IndexDecoder(), Buffer(4),
                        num_producers=2, port=port)
    assert pool._chunk == 1
    pool.start()
    assert list(pool) == []  # every result kept by the port: nothing comes through the buffer
    pool.close()
    pool.close()
    assert port.stopped == 1  # once, however often the pool is closed


def test_a_slot_loader_refuses_what_its_slots_cannot_do():
    with pytest.raises(TypeError, match="BatchSlotLoader takes no ordered"):
        BatchSlotLoader(fake_paths(4), IndexDecoder(), batch_size=2, ordered=True)
    with pytest.raises(ValueError, match=r"^BatchSlotLoader takes no max_batch_seconds: its slots hold "
                                        r"batch_size rows; batch by duration with BufferedDataset"):
        BatchSlotLoader(fake_paths(4), IndexDecoder(), batch_size=2, max_batch_seconds=5.0)


def test_most_producers_is_the_pinned_count_or_the_usable_cores():
    from audiobuffer.options import usable_cores

    assert LoaderOptions(num_producers=3).most_producers() == 3
    assert LoaderOptions(num_producers="auto").most_producers() == usable_cores()
    assert LoaderOptions().most_producers() == usable_cores()


def test_usable_cores_is_pythons_process_count_where_it_has_one(monkeypatch):
    """Python 3.13's os.process_cpu_count (affinity, -X cpu_count) counts on every platform, not
    os.cpu_count (every core of the machine) off Linux."""
    import os
    import sys

    from audiobuffer.options import usable_cores

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.setattr(os, "process_cpu_count", lambda: 3, raising=False)
    for platform in ("linux", "win32", "darwin"):
        monkeypatch.setattr(sys, "platform", platform)
        assert usable_cores() == 3
    monkeypatch.setattr(os, "process_cpu_count", lambda: None)  # undetermined
    assert usable_cores() == 64


def test_usable_cores_before_python_313(monkeypatch):
    """Without os.process_cpu_count: the affinity on Linux, every core elsewhere."""
    import os
    import sys

    from audiobuffer.options import usable_cores

    monkeypatch.delattr(os, "process_cpu_count", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert usable_cores() == 6
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(sys, "platform", "win32")
    assert usable_cores() == 64
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert usable_cores() == 1
