import re

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from audiobuffer import pad_collate


def test_pads_to_longest_with_lengths():
    batch = pad_collate([{"audio": torch.ones(3)}, {"audio": torch.full((5,), 2.0)}])
    assert batch["audio"].tolist() == [[1, 1, 1, 0, 0], [2, 2, 2, 2, 2]]
    assert batch["lengths"].dtype == torch.int64 and batch["lengths"].tolist() == [3, 5]


def test_lengths_come_from_num_frames_when_present():
    samples = [{"audio": torch.ones(4), "num_frames": 2}, {"audio": torch.ones(4), "num_frames": 4}]
    assert pad_collate(samples)["lengths"].tolist() == [2, 4]


def test_channels_and_numpy_inputs_and_pad_value():
    batch = pad_collate([{"audio": np.ones((2, 3), np.float32)}, {"audio": torch.ones(2, 1)}], pad_value=-1.0)
    assert batch["audio"].shape == (2, 2, 3)
    assert batch["audio"][1].tolist() == [[1, -1, -1], [1, -1, -1]]


def test_other_fields():
    samples = [{"audio": torch.ones(2), "label": 1, "path": "a.wav", "w": 0.5, "emb": torch.zeros(3),
                "ragged": torch.zeros(i + 1)} for i in range(2)]
    batch = pad_collate(samples)
    assert batch["label"].tolist() == [1, 1] and batch["label"].dtype == torch.int64
    assert batch["path"] == ["a.wav", "a.wav"]
    assert batch["w"].tolist() == [0.5, 0.5]
    assert batch["emb"].shape == (2, 3)
    assert isinstance(batch["ragged"], list) and len(batch["ragged"]) == 2


def test_arrays_of_anything_but_numbers_stay_lists():
    # A tensor holds numbers only: equal-shape arrays of strings or Python objects are kept as lists.
    samples = [{"audio": torch.ones(2), "tags": np.array(["a", "b"]), "meta": np.array([None, 1], dtype=object)}
               for _ in range(2)]
    batch = pad_collate(samples)
    assert isinstance(batch["tags"], list) and batch["tags"][1].tolist() == ["a", "b"]
    assert isinstance(batch["meta"], list) and len(batch["meta"]) == 2


def test_custom_key():
    batch = pad_collate([{"wave": torch.ones(1)}, {"wave": torch.ones(2)}], key="wave")
    assert batch["wave"].shape == (2, 2)


@pytest.mark.parametrize("samples, error, match", [
    ([], TypeError, "at least one"),
    ([torch.ones(3)], TypeError, "sample dicts"),
    ([{"x": torch.ones(1)}], KeyError, "no 'audio'"),
    ([{"audio": torch.ones(1), "a": 1}, {"audio": torch.ones(1)}], KeyError, "lacks"),
    ([{"audio": torch.ones(1)}, ["audio"]], TypeError, "sample dicts, got list"),
    ([{"audio": torch.ones(2, 3)}, {"audio": torch.ones(3, 3)}], ValueError, "only in their last axis"),
    ([{"audio": "abc"}], TypeError, "CPU tensors or numpy"),
    ([{"audio": np.array([0.5, 1.5], dtype=object)}], TypeError, "must hold numbers, got an array of dtype object"),
    ([{"audio": np.array(["a", "b"])}], TypeError, "must hold numbers, got an array of dtype <U1"),
])
def test_errors(samples, error, match):
    with pytest.raises(error, match=match):
        pad_collate(samples)


def test_padding_keeps_the_sign_of_a_negative_zero_and_the_dtype_of_any_pad():
    batch = pad_collate([{"audio": torch.ones(1)}, {"audio": torch.ones(3)}], pad_value=-0.0)
    assert torch.signbit(batch["audio"][0]).tolist() == [False, True, True]
    ints = pad_collate([{"audio": np.ones(1, np.int16)}, {"audio": np.ones(2, np.int16)}])
    assert ints["audio"].dtype == torch.int16 and ints["audio"].tolist() == [[1, 0], [1, 1]]


def test_lengths_are_one_number_per_sample_whatever_num_frames_holds():
    samples = [{"audio": torch.ones(4), "num_frames": torch.tensor([2])},
               {"audio": torch.ones(4), "num_frames": np.int32(4)}]
    lengths = pad_collate(samples)["lengths"]
    assert lengths.shape == (2,) and lengths.dtype == torch.int64 and lengths.tolist() == [2, 4]


def test_result_is_not_a_view_of_the_samples():
    audio = torch.ones(3)
    batch = pad_collate([{"audio": audio}])
    batch["audio"][0, 0] = 5
    assert audio[0] == 1


def test_works_with_pin_memory():
    data = [{"audio": torch.ones(i + 1), "label": i, "path": f"{i}.wav"} for i in range(6)]
    loader = DataLoader(data, batch_size=3, collate_fn=pad_collate, pin_memory=True)
    batches = list(loader)
    assert [b["audio"].shape for b in batches] == [(3, 3), (3, 6)]
    assert batches[1]["path"] == ["3.wav", "4.wav", "5.wav"]
    if torch.cuda.is_available():
        assert batches[0]["audio"].is_pinned()


@pytest.mark.parametrize("dtypes", [("float32", "float32"), ("float32", "float64", "int16"),
                                    ("uint8", "int64"), ("int16", "float32")])
def test_samples_of_one_length_stack_as_padded_ones_would(dtypes):
    """Nothing to pad (fixed-size crops): one copy, cast to the first sample's dtype as a padded
    batch's rows are, each sample's values, a fresh array (the samples' memory untouched)."""
    from audiobuffer._numpy_collate import collate_numpy

    rng = np.random.default_rng(len(dtypes))
    arrays = [(rng.standard_normal((2, 7)) * 300).astype(dtype) for dtype in dtypes]
    views = [a[:, ::2] for a in arrays]  # strided views too
    for samples in (arrays, views):
        batch = collate_numpy([{"audio": a, "index": i} for i, a in enumerate(samples)])
        expected = np.empty((len(samples), *samples[0].shape), samples[0].dtype)
        for row, a in zip(expected, samples):
            row[...] = a
        assert batch["audio"].dtype == samples[0].dtype
        np.testing.assert_array_equal(batch["audio"], expected)
        assert batch["lengths"].tolist() == [samples[0].shape[-1]] * len(samples)
        assert not any(np.shares_memory(batch["audio"], a) for a in samples)
    written = []

    def allocate(shape, dtype):  # the helper's slot allocator: written where it says
        written.append(np.full(shape, 7, dtype))
        return written[-1]

    batch = collate_numpy([{"audio": a} for a in arrays], allocate=allocate)
    assert batch["audio"] is written[0]
    np.testing.assert_array_equal(written[0][1], arrays[1].astype(arrays[0].dtype))


def _equal_batches(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert isinstance(got[name], torch.Tensor) and got[name].dtype == value.dtype, name
            assert torch.equal(got[name], value), name
        else:
            assert got[name] == value, name


def _random_samples(rng: np.random.Generator, count: int) -> list:
    """Samples as decoders make them: mostly of one shape, some of another length, dtype, kind."""
    samples = []
    for i in range(count):
        length = 6 if rng.random() < 0.85 else int(rng.integers(1, 9))
        dtype = "float32" if rng.random() < 0.9 else "float64"
        audio = (rng.standard_normal((2, length)) * 100).astype(dtype)
        value = torch.from_numpy(audio) if rng.random() < 0.5 else audio
        sample = {"audio": value, "index": i, "path": f"{i}.wav", "emb": np.full(3, i, np.int16)}
        if rng.random() < 0.1:
            sample["audio"] = value[:, ::2]  # a strided view
        samples.append(sample)
    return samples


@pytest.mark.parametrize("seed", range(40))
def test_batches_stacked_on_arrival_are_pad_collates(seed):
    """NOTE [ Batches stacked on arrival ]: whatever the samples (one shape, a longer one to pad,
    another dtype, views), each batch is the one pad_collate makes of its samples."""
    from audiobuffer.collate import stack_on_arrival

    rng = np.random.default_rng(seed)
    samples = _random_samples(rng, int(rng.integers(1, 30)))
    size, drop_last = int(rng.integers(1, 9)), bool(rng.random() < 0.5)
    got = list(stack_on_arrival(iter(samples), size, key="audio", drop_last=drop_last))
    groups = [samples[k:k + size] for k in range(0, len(samples), size)]
    if drop_last and len(groups[-1]) < size:
        groups.pop()
    assert len(got) == len(groups)
    for batch, group in zip(got, groups):
        _equal_batches(batch, pad_collate(group))
        audio = batch["audio"].numpy()
        assert not any(np.shares_memory(audio, np.asarray(s["audio"])) for s in group)


def test_batches_stacked_on_arrival_raise_what_pad_collate_raises():
    from audiobuffer.collate import stack_on_arrival

    one = {"audio": torch.ones(2)}
    for samples in ([one, {"audio": "x"}], [one, {"wave": torch.ones(2)}], [one, 3],
                    [{"audio": np.array(["a", "b"])}]):
        with pytest.raises((TypeError, KeyError)) as expected:
            pad_collate(samples)
        with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
            list(stack_on_arrival(iter(samples), 4, key="audio"))


def test_closing_the_batches_closes_the_samples():
    from audiobuffer.collate import stack_on_arrival

    closed = []

    def samples():
        try:
            while True:
                yield {"audio": torch.ones(2)}
        finally:
            closed.append(True)

    batches = stack_on_arrival(samples(), 3, key="audio")
    assert next(batches)["audio"].shape == (3, 2)
    batches.close()
    assert closed == [True]


def test_a_batch_size_beyond_memory_gives_the_short_batch_pad_collate_gives():
    """A batch_size far above the samples there are (the last, short batch of an epoch): the batch
    is pad_collate's, not a MemoryError for rows that never come."""
    from audiobuffer.collate import stack_on_arrival

    samples = [{"audio": np.full(1 << 20, k, np.float64), "index": k} for k in range(2)]
    (batch,) = stack_on_arrival(iter(samples), 1 << 20, key="audio")
    _equal_batches(batch, pad_collate(samples))


def test_rows_of_one_shape_are_written_as_they_arrive_and_taken_as_they_are(monkeypatch):
    """NOTE [ Batches stacked on arrival ]: a batch of one shape and dtype is the RowStack's array,
    not a second copy made at its end; another shape stops the stack."""
    from audiobuffer import _numpy_collate
    from audiobuffer._numpy_collate import RowStack
    from audiobuffer.collate import stack_on_arrival

    stack = RowStack(3, "audio")
    for k in range(2):
        stack.add({"audio": np.full((2, 4), k, np.float32)})
    rows = stack.rows(2)
    assert rows is not None and rows.shape == (2, 2, 4) and rows[1].tolist() == [[1] * 4] * 2
    stack.add({"audio": np.zeros((2, 5), np.float32)})
    assert stack.stopped and stack.rows(3) is None

    def no_pad(*args, **kwargs):
        raise AssertionError("a batch of one shape was collated again at its end")

    monkeypatch.setattr(_numpy_collate, "_pad", no_pad)
    samples = [{"audio": torch.full((2, 4), float(k))} for k in range(5)]
    batches = list(stack_on_arrival(iter(samples), 2, key="audio"))
    assert [b["audio"].shape[0] for b in batches] == [2, 2, 1]
    assert batches[2]["audio"].tolist() == [[[4.0] * 4] * 2]


@pytest.mark.parametrize("batch_size, drop_last, error", [(0, False, ValueError),
                                                           (-2, False, ValueError),
                                                           (2.0, False, TypeError),
                                                           (2, 1, TypeError)])
def test_stack_on_arrival_refuses_a_batch_size_or_drop_last_when_called(batch_size, drop_last,
                                                                        error):
    """Not one batch of every sample for batch_size=0: an error that names the argument, raised
    by the call, before a sample is taken."""
    from audiobuffer.collate import stack_on_arrival

    taken = []

    def samples():
        while True:
            taken.append(1)
            yield {"audio": torch.ones(2)}

    name, value = ("drop_last", 1) if drop_last == 1 else ("batch_size", batch_size)
    with pytest.raises(error, match=f"{name} must .*got {value}"):
        stack_on_arrival(samples(), batch_size, key="audio", drop_last=drop_last)
    assert taken == []
