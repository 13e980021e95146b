"""``audiobuffer.ray.read``: one epoch as a Ray dataset, decoded in Ray's workers, on a local
cluster of two CPUs started once for the module."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

NO_RAY = "the Ray Data bridge needs ray[data] (pip install -e '.[ray]')"
ray = pytest.importorskip("ray", reason=NO_RAY)
pytest.importorskip("ray.data", reason=NO_RAY)
psutil = pytest.importorskip("psutil")

import audiobuffer.ray as abray  # noqa: E402
from audiobuffer import AudioDecoder, BufferedDataset, DecodeError  # noqa: E402

# One cluster for the module (it takes seconds to start): its tests stay in one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.xdist_group("ray")]

#: Seconds Ray's processes get to end after ray.shutdown().
SHUTDOWN_TIMEOUT = 30.0
#: A few hundred FSDD recordings (the whole 3000 once): every epoch costs Ray the start of an
#: execution.
SUBSET = 240
DIGIT = r"^(\d+)_"


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs; at the end, every process it started has ended."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    context = ray.data.DataContext.get_current()
    bars = context.enable_progress_bars
    context.enable_progress_bars = False
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    started: list[psutil.Process] = []
    try:
        yield
    finally:
        started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        ray.shutdown()
        context.enable_progress_bars = bars
    _, alive = psutil.wait_procs(started, timeout=SHUTDOWN_TIMEOUT)
    assert not alive, f"Ray processes left after ray.shutdown(): {[p.pid for p in alive]}"


@pytest.fixture
def subset(cluster, fsdd):
    """The first FSDD recordings (missing: a skip, a failure in CI, as for the fixture fsdd)."""
    return sorted(str(p) for p in fsdd.glob("*.wav"))[:SUBSET]


def _indices(dataset, collate=None, batch_size=32):
    collate = collate or abray.PadCollate()
    found: list[int] = []
    for batch in dataset.iter_torch_batches(batch_size=batch_size, collate_fn=collate):
        found.extend(batch["index"].tolist())
    return found


def test_every_fsdd_recording_once_through_iter_torch_batches(cluster, fsdd):
    dataset = abray.read(fsdd, AudioDecoder(sample_rate=8000), shuffle=True, labels=DIGIT)
    seen: list[int] = []
    for batch in dataset.iter_torch_batches(batch_size=64, collate_fn=abray.PadCollate()):
        audio, lengths = batch["audio"], batch["lengths"]
        assert audio.ndim == 2 and audio.shape[0] == len(lengths) == len(batch["label"])
        assert int(lengths.max()) == audio.shape[1]
        assert set(batch) >= {"audio", "lengths", "index", "label", "sample_rate"}
        seen.extend(batch["index"].tolist())
    assert sorted(seen) == list(range(3000))


def test_the_benchmarks_floor_is_an_epoch_with_nothing_decoded(cluster, monkeypatch):
    """benchmarks/bench_ray.py's floor: every index once through Ray Data, and no file opened
    (its paths name none)."""
    import importlib.util

    from helpers import REPO

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_ray", REPO / "benchmarks" / "bench_ray.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    paths = [f"/nowhere/{i}.wav" for i in range(1000)]
    assert sorted(bench.floor_epoch(paths, 8000, 0)) == list(range(1000))


def test_rows_are_samples_with_their_fields(subset):
    rows = abray.read(subset[:8], AudioDecoder(sample_rate=8000), labels=DIGIT).take_all()
    assert sorted(r["index"] for r in rows) == list(range(8))
    for row in rows:
        assert row["path"] == subset[row["index"]]
        assert row["label_name"] == row["path"].rsplit("/", 1)[1].split("_")[0]
        assert isinstance(row["audio"], np.ndarray) and row["audio"].ndim == 1
        assert row["num_frames"] == len(row["audio"])


def test_order_and_draws_are_those_of_the_seed_and_epoch(subset):
    decoder = AudioDecoder(sample_rate=8000, crop_seconds=0.2, crop="random")

    def epoch(number, seed=3):
        rows = abray.read(subset, decoder, epoch=number, seed=seed, shuffle=True, ordered=True,
                          rows_per_block=40).take_all()
        return [r["index"] for r in rows], {r["index"]: r["audio"] for r in rows}

    order, audio = epoch(1)
    again, audio_again = epoch(1)
    assert sorted(order) == list(range(SUBSET))
    assert order == again and all(np.array_equal(audio[i], audio_again[i]) for i in order)
    other, audio_other = epoch(2)
    assert other != order and sorted(other) == sorted(order)
    assert any(not np.array_equal(audio[i], audio_other[i]) for i in order)  # random crops differ
    # the epoch BufferedDataset runs with the same options: the same order and the same crops
    local = BufferedDataset(subset, decoder, seed=3, shuffle=True, ordered=True)
    local.set_epoch(1)
    samples = list(local)
    assert [s["index"] for s in samples] == order
    assert all(np.array_equal(s["audio"].numpy(), audio[s["index"]]) for s in samples)


def test_batches_by_duration_are_rows_within_budget_as_planned(subset):
    budget = 6.0
    decoder = AudioDecoder(sample_rate=8000)
    dataset = abray.read(subset, decoder, max_batch_seconds=budget, shuffle=True, epoch=1)
    batches = []
    for batch in dataset.iter_torch_batches(batch_size=1, collate_fn=abray.BatchCollate()):
        audio, lengths = batch["audio"], batch["lengths"]
        assert audio.shape[0] * audio.shape[1] / 8000 <= budget
        assert int(lengths.max()) == audio.shape[1]
        batches.append(frozenset(batch["index"].tolist()))
    assert sorted(i for b in batches for i in b) == list(range(SUBSET))  # every item once
    local = BufferedDataset(subset, decoder, max_batch_seconds=budget, shuffle=True)
    local.set_epoch(1)
    planned = [frozenset(s["index"] for s in b) for b in local]
    assert sorted(batches, key=min) == sorted(planned, key=min)  # the batches BufferedDataset makes


def test_batch_collate_takes_one_row_at_a_time(subset):
    dataset = abray.read(subset[:40], AudioDecoder(sample_rate=8000), max_batch_seconds=2.0)
    with pytest.raises(Exception, match=r"batch_size=1"):
        next(iter(dataset.iter_torch_batches(batch_size=2, collate_fn=abray.BatchCollate())))


def test_ranks_share_the_epoch_each_item_once(subset):
    shares = [_indices(abray.read(subset, AudioDecoder(sample_rate=8000), shuffle=True, rank=rank,
                                  world_size=3, even_shards=None)) for rank in range(3)]
    assert sorted(i for share in shares for i in share) == list(range(SUBSET))
    assert {len(share) for share in shares} == {SUBSET // 3}


@pytest.fixture
def with_bad_file(subset, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    for path in subset[:30]:
        shutil.copy(path, folder)
    (folder / "5_bad_0.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEjunk" + bytes(64))
    return folder


def test_a_bad_file_raises_naming_it(with_bad_file):
    dataset = abray.read(with_bad_file, AudioDecoder(sample_rate=8000, fallback=None))
    with pytest.raises(DecodeError, match="5_bad_0.wav"):
        _indices(dataset)


@pytest.mark.parametrize("policy", ["skip", "warn"])
def test_a_bad_file_is_left_out_under_skip_and_warn(with_bad_file, policy):
    decoder = AudioDecoder(sample_rate=8000, fallback=None)
    dataset = abray.read(with_bad_file, decoder, on_error=policy)
    rows = dataset.take_all()
    paths = sorted(r["path"].rsplit("/", 1)[1] for r in rows)
    assert len(paths) == 30 and "5_bad_0.wav" not in paths


def test_options_are_checked_before_anything_runs(tmp_path):
    decoder = AudioDecoder()
    with pytest.raises(TypeError, match="did you mean 'shuffle'"):
        abray.read(tmp_path, decoder, shufle=True)
    with pytest.raises(ValueError, match="rows_per_block must be an integer >= 1"):
        abray.read(tmp_path, decoder, rows_per_block=0)
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        abray.read(tmp_path, decoder, epoch=-1)
    with pytest.raises(ValueError, match="map_options sets 'batch_size'"):
        abray.read(tmp_path, decoder, map_options={"batch_size": 4})
    with pytest.raises(ValueError, match=r"buffer_size must be an integer in \[1, "):
        abray.read(tmp_path, decoder, buffer_size=0)


@pytest.mark.timeout(120)
def test_map_options_cannot_claim_the_decoding_keeps_the_row_count(subset):
    """A task turns one row (a block's bounds) into many: with Ray told otherwise, count() and
    limit() were those of the blocks (5 and 50 here, not 50 and 13)."""
    decoder = AudioDecoder(sample_rate=8000)
    with pytest.raises(ValueError, match="map_options sets 'udf_modifying_row_count'"):
        abray.read(subset[:50], decoder, rows_per_block=10,
                   map_options={"udf_modifying_row_count": False})
    dataset = abray.read(subset[:50], decoder, rows_per_block=10)
    assert dataset.count() == 50 and len(dataset.limit(13).take_all()) == 13


def _some_labelled(missing: str):
    """A decoder of samples of ``10 + index`` frames; every third has no ``label``
    (``missing="key"``) or a ``label`` of ``None`` (``missing="none"``) (``missing=""``: every
    sample has its label), and ``extra`` is ``None`` in every sample. A function made here:
    Ray's workers get it by value, not by import."""

    def decode(item):
        sample = {"index": item.index, "audio": np.full(10 + item.index, item.index, np.float32),
                  "extra": None}
        if item.index % 3 or not missing:
            sample["label"] = item.index
        elif missing == "none":
            sample["label"] = None
        return sample

    return decode


@pytest.mark.timeout(120)
@pytest.mark.parametrize("missing", ["key", "none"])
def test_pad_collate_refuses_a_column_of_numbers_with_missing_values(subset, missing):
    """Ray makes a column of numbers with a missing value floats, the gap NaN: a label of NaN."""
    dataset = abray.read(subset[:12], _some_labelled(missing), rows_per_block=12)
    with pytest.raises(ValueError, match=r"PadCollate: 'label' has no value in 4 of 12 rows"):
        _indices(dataset, batch_size=12)
    # every sample labelled: the labels as integers, and the column of None left out
    labelled = abray.read(subset[:12], _some_labelled(""), rows_per_block=12)
    batch = next(iter(labelled.iter_torch_batches(batch_size=12, collate_fn=abray.PadCollate())))
    assert not batch["label"].is_floating_point() and "extra" not in batch
    assert batch["label"].tolist() == batch["index"].tolist()


@pytest.mark.timeout(120)
def test_batch_collate_refuses_a_batch_with_missing_values(subset):
    """A batch's labels [None, 1, 2, None, ...] came as floats, NaN for None."""
    dataset = abray.read(subset[:12], _some_labelled("none"), max_batch_seconds=100.0, buckets=1)
    with pytest.raises(ValueError, match=r"BatchCollate: 'label' has no value in 4 of 12 samples"):
        next(iter(dataset.iter_torch_batches(batch_size=1, collate_fn=abray.BatchCollate())))


@pytest.mark.timeout(120)
def test_without_rank_a_torch_distributed_process_reads_its_share(subset, monkeypatch):
    """As BufferedDataset: in a process group (a Ray Train worker's), each rank took the whole
    epoch, every item once per rank."""
    import torch.distributed as dist

    decoder = AudioDecoder(sample_rate=8000)
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    shares = []
    for rank in range(3):
        monkeypatch.setattr(dist, "get_rank", lambda group=None, rank=rank: rank)
        local = BufferedDataset(subset, decoder, shuffle=True, ordered=True)
        local.set_epoch(2)
        expected = [s["index"] for s in local]
        share = [r["index"] for r in abray.read(subset, decoder, shuffle=True, ordered=True,
                                                epoch=2).take_all()]
        assert share == expected and len(share) == SUBSET // 3
        shares.append(share)
    assert sorted(i for share in shares for i in share) == list(range(SUBSET))
    # rank and world_size given: they win, as in BufferedDataset
    whole = abray.read(subset, decoder, rank=0, world_size=1).take_all()
    assert sorted(r["index"] for r in whole) == list(range(SUBSET))


def test_pad_collate_errors_name_the_option_and_the_column():
    for value in ("x", None, True):
        with pytest.raises(TypeError, match=rf"pad_value must be a number, got {value!r}"):
            abray.PadCollate(pad_value=value)
    assert abray.PadCollate(pad_value=np.float32(-1.5)).pad_value == -1.5
    with pytest.raises(TypeError, match=r"PadCollate: 'audio' must hold arrays of numbers, got a "
                                        r"column of <U5"):
        abray.PadCollate()({"audio": np.array(["a.wav", "b.wav"]), "index": np.arange(2)})



def test_pad_collate_refuses_a_column_of_arrays_it_cannot_stack():
    """Only ``key`` is padded: another column of arrays of unequal shapes was left out of the batch,
    where one of equal shapes was stacked, so the column came in some batches and not in others."""
    def ragged(*shapes):
        column = np.empty(len(shapes), dtype=object)
        column[:] = [np.ones(shape, np.float32) for shape in shapes]
        return column

    collate = abray.PadCollate()
    equal = collate({"audio": ragged(3, 5), "mel": ragged((2, 4), (2, 4)), "index": np.arange(2)})
    assert tuple(equal["mel"].shape) == (2, 2, 4)
    with pytest.raises(ValueError, match=r"PadCollate: 'mel' holds arrays of unequal shapes "
                                         r"\(\(2, 3\), \(2, 4\)\)"):
        collate({"audio": ragged(3, 5), "mel": ragged((2, 3), (2, 4)), "index": np.arange(2)})

def _scaled():
    """A transform written for BufferedDataset's tensors (torch's ``std`` is the sample's, numpy's
    the population's), made here: Ray's workers get it by value, not by import."""

    def scale(sample):
        return {**sample, "audio": sample["audio"] / sample["audio"].std()}

    return scale


@pytest.mark.timeout(120)
def test_a_transform_gets_the_decoder_output_of_buffered_dataset(subset):
    """The decoder's tensors, as in BufferedDataset; the workers gave it numpy arrays instead."""
    decoder = AudioDecoder(sample_rate=8000)
    rows = abray.read(subset[:6], decoder, transform=_scaled()).take_all()
    local = {s["index"]: s["audio"].numpy() for s in BufferedDataset(subset[:6], decoder,
                                                                     transform=_scaled())}
    assert len(rows) == 6
    assert all(np.array_equal(row["audio"], local[row["index"]]) for row in rows)


def _slow_for(indices, seconds):
    """A transform that sleeps ``seconds`` on the items ``indices``, made here: Ray's workers get
    it by value."""
    import time

    slow = frozenset(indices)

    def transform(sample):
        if sample["index"] in slow:
            time.sleep(seconds)
        return sample

    return transform


@pytest.mark.timeout(120)
def test_ranks_in_step_keep_the_plan_order_of_their_batches(subset):
    """sync_buckets (the default with ranks): each step's batches from one bucket on every rank,
    as BufferedDataset hands them on; the blocks came as decoded, the first batch last."""
    decoder = AudioDecoder(sample_rate=8000)
    options = dict(max_batch_seconds=3.0, rank=1, world_size=2, shuffle=True)
    local = BufferedDataset(subset[:120], decoder, **options)
    local.set_epoch(1)
    planned = [[s["index"] for s in batch] for batch in local]
    dataset = abray.read(subset[:120], decoder, epoch=1, rows_per_block=1,
                         transform=_slow_for(planned[0], 1.0), **options)
    batches = [b["index"].tolist()
               for b in dataset.iter_torch_batches(batch_size=1, collate_fn=abray.BatchCollate())]
    assert batches == planned


def test_default_rows_per_block_checks_its_arguments():
    with pytest.raises(ValueError, match=r"units must be an integer >= 0, got -5"):
        abray.default_rows_per_block(-5)
    with pytest.raises(TypeError, match=r"units must be an integer >= 0, got 2.5"):
        abray.default_rows_per_block(2.5)
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"samples_per_unit must be a finite number > 0"):
            abray.default_rows_per_block(10, bad)
    with pytest.raises(TypeError, match=r"samples_per_unit must be a finite number > 0"):
        abray.default_rows_per_block(10, "3")
    assert abray.default_rows_per_block(0) == 1


def test_map_options_keys_are_keyword_names(tmp_path):
    with pytest.raises(TypeError, match=r"map_options' keys must be map_batches keyword names, "
                                        r"got 1"):
        abray.read(tmp_path, AudioDecoder(), map_options={1: 2})
