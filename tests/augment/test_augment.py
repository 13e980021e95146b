"""audiobuffer.augment: each augmentation correct by its definition, every draw a pure function of
(seed, epoch, item, position), exact resume, budgets on perturbed durations, pickling, errors."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import soundfile as sf
import yaml
from helpers import FSDD, wait_no_threads

from audiobuffer import AudioDecoder, BufferedDataset, IsolatedLoader, WorkItem
from audiobuffer.augment import AddNoise, Gain, Reverb, SpeedPerturb
from audiobuffer.augment._draws import generator, uniform, uniform_one
from audiobuffer.augment.reverb import convolve
from audiobuffer.prepare.durations import CACHE_ENV

pytestmark = pytest.mark.timeout(120)

FILES = sorted(str(p) for p in FSDD.glob("*.wav"))
needs_fsdd = pytest.mark.skipif(len(FILES) < 100, reason="the FSDD recordings are not there")
NOISE, RIRS, SPEECH = FILES[:40], FILES[40:50], FILES[100:]


def signal(n: int = 8000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, n)).astype(np.float32) * 0.1


def read(path: str) -> np.ndarray:
    audio, _ = sf.read(path, dtype="float32")
    return audio[None, :]


def all_four(p: float = 1.0) -> list:
    return [
        SpeedPerturb((0.9, 1.0, 1.1), p=p),
        Gain((-6.0, 6.0), p=p),
        AddNoise(NOISE, (10.0, 20.0), p=p),
        Reverb(RIRS, p=p),
    ]


# -- correct by definition -----------------------------------------------------------------------


@pytest.mark.parametrize("factor", [0.9, 1.1, 0.5, 1.7])
@pytest.mark.parametrize("n", [16000, 12345])
def test_speed_perturb_gives_n_over_f_frames_and_frequencies_times_f(factor, n):
    sr, freq = 16000, 440.0
    tone = np.sin(2 * np.pi * freq * np.arange(n) / sr).astype(np.float32)[None, :]
    out = SpeedPerturb([factor])(tone, sr, (0, 0, 0, 0))
    assert out.dtype == np.float32 and out.shape[0] == 1
    assert abs(out.shape[1] - round(n / factor)) <= 1
    spectrum = np.abs(np.fft.rfft(out[0] * np.hanning(out.shape[1]), 8 * sr))
    peak = np.argmax(spectrum) * sr / (8 * sr)
    assert peak == pytest.approx(freq * factor, abs=1.0)


def test_speed_perturb_keeps_channels_apart():
    sr = 8000
    t = np.arange(4000) / sr
    stereo = np.stack([np.sin(2 * np.pi * 300 * t), np.zeros_like(t)]).astype(np.float32)
    out = SpeedPerturb([1.25])(stereo, sr, (0, 0, 0, 0))
    assert out.shape == (2, 3200) and np.abs(out[1]).max() < 1e-6 < np.abs(out[0]).max()


def _drawn_snr(aug: AddNoise, key) -> float:
    rng = generator(key)
    rng.random()  # whether to apply it
    return float(rng.uniform(*aug.snr_db))


@needs_fsdd
@pytest.mark.parametrize("index", range(12))
def test_add_noise_mixes_at_the_drawn_snr(index):
    # FSDD noise clips are as short as the speech, so many of these loop the noise.
    aug = AddNoise(NOISE, snr_db=(-5.0, 30.0))
    speech = read(SPEECH[index])
    key = (7, 1, index, 2)
    out = aug(speech, 8000, key)
    noise = out.astype(np.float64) - speech
    measured = 10 * np.log10(
        np.mean(np.square(speech, dtype=np.float64)) / np.mean(np.square(noise))
    )
    assert abs(measured - _drawn_snr(aug, key)) < 0.2


def test_noise_loops_when_shorter(tmp_path):
    clip = np.linspace(-0.5, 0.5, 100, dtype=np.float32)
    sf.write(tmp_path / "n.wav", clip, 8000, subtype="FLOAT")
    aug = AddNoise([str(tmp_path / "n.wav")], snr_db=0.0)
    speech = signal(1000)
    noise = aug(speech, 8000, (0, 0, 0, 0))[0] - speech[0]
    scale = noise[np.argmax(np.abs(noise))] / clip[np.argmax(np.abs(np.roll(clip, 0)))]
    period = noise / abs(scale)
    np.testing.assert_allclose(period[:100], period[100:200], atol=1e-5)  # the clip again, unbroken


@needs_fsdd
@pytest.mark.parametrize("index", range(6))
def test_reverb_correlates_with_scipy_fftconvolve(index):
    signal_ = pytest.importorskip("scipy.signal")
    aug = Reverb(RIRS)
    speech = read(SPEECH[index])
    key = (3, 0, index, 0)
    out = aug(speech, 8000, key)
    rng = generator(key)
    rng.random()
    rir = read(RIRS[int(rng.integers(len(RIRS)))])[0]
    expected = signal_.fftconvolve(speech[0].astype(np.float64), rir.astype(np.float64))[
        : speech.shape[1]
    ]
    assert out.shape == speech.shape  # trimmed to the input's length
    assert np.corrcoef(out[0], expected)[0, 1] >= 0.999
    energy = np.sum(np.square(out, dtype=np.float64)) / np.sum(np.square(speech, dtype=np.float64))
    assert energy == pytest.approx(1.0, rel=1e-3)  # scaled to the input's energy


def test_reverb_spectra_cache_changes_no_output_is_bounded_and_not_pickled(tmp_path, monkeypatch):
    """Each response's spectrum is kept per FFT length: found or computed, the output is the same
    bits; the cache holds at most SPECTRA_BYTES and a pickled Reverb carries none of it."""
    from audiobuffer.augment import reverb as reverb_module

    rng = np.random.default_rng(4)
    rirs = []
    for i in range(3):
        rirs.append(str(tmp_path / f"r{i}.wav"))
        sf.write(rirs[-1], (rng.standard_normal(400) * np.exp(-np.arange(400) / 80)).astype(np.float32),
                 8000, subtype="FLOAT")
    items = [signal(n, seed=n) for n in (3000, 3100, 5000, 9000)]
    keys = [(0, 0, i, 0) for i in range(40)]
    cold = [Reverb(rirs)(items[k[2] % 4], 8000, k) for k in keys]  # a fresh cache each item
    warm_aug = Reverb(rirs)
    warm = [warm_aug(items[k[2] % 4], 8000, k) for k in keys]
    assert warm_aug._spectra and all(np.array_equal(a, b) for a, b in zip(cold, warm))
    assert len(pickle.dumps(warm_aug)) == len(pickle.dumps(Reverb(rirs)))  # no spectra carried
    copy = pickle.loads(pickle.dumps(warm_aug))
    assert not copy._spectra and copy._spectra_bytes == 0
    assert all(np.array_equal(copy(items[k[2] % 4], 8000, k), w) for k, w in zip(keys, warm))
    one = next(iter(warm_aug._spectra.values())).nbytes
    monkeypatch.setattr(reverb_module, "SPECTRA_BYTES", 2 * one)
    small = Reverb(rirs)
    for k in keys:
        small(items[k[2] % 4], 8000, k)
        assert small._spectra_bytes == sum(v.nbytes for v in small._spectra.values()) <= 2 * one


@pytest.mark.parametrize("n", [1, 7, 16, 17, 100, 1000, 4097, 46000, 73000, 10**6 + 1])
def test_reverb_fft_lengths_are_fast_and_at_most_a_quarter_longer(n):
    from audiobuffer.augment.reverb import _grid_length

    size = _grid_length(n)
    assert n <= size <= max(16, 1.25 * n)
    m = size
    for p in (2, 3, 5):
        while m % p == 0:
            m //= p
    assert m == 1  # 5-smooth


def test_convolve_is_the_full_linear_convolution():
    x, h = signal(1001), np.random.default_rng(1).standard_normal(77)
    np.testing.assert_allclose(convolve(x, h)[0], np.convolve(x[0], h), atol=1e-6)  # float32
    np.testing.assert_allclose(
        convolve(x.astype(np.float64), h)[0], np.convolve(x[0], h), atol=1e-12
    )


def test_gain_within_its_range_and_p():
    x = signal()
    gains = [
        float(np.max(np.abs(Gain((-6.0, 6.0))(x, 8000, (0, 0, i, 0)))) / np.max(np.abs(x)))
        for i in range(50)
    ]
    db = 20 * np.log10(gains)
    assert db.min() >= -6.0 - 1e-4 and db.max() <= 6.0 + 1e-4 and db.max() - db.min() > 6
    assert all(Gain(p=0.0)(x, 8000, (0, 0, i, 0)) is x for i in range(10))
    applied = sum(Gain(p=0.3)(x, 8000, (0, 0, i, 0)) is not x for i in range(1000))
    assert 240 < applied < 360


def test_speed_factor_p_and_choices():
    f = SpeedPerturb((0.9, 1.1), p=0.5).factor(1, 2, np.arange(4000), 0)
    assert set(np.unique(f)) == {0.9, 1.0, 1.1}
    assert 1800 < np.sum(f == 1.0) < 2200 and abs(np.sum(f == 0.9) - np.sum(f == 1.1)) < 200


# -- draws: a pure function of (seed, epoch, item, position) -------------------------------------


def test_draws_differ_by_each_part_of_the_key():
    base = uniform(1, 2, [3], 4, 0)
    for other in (
        uniform(9, 2, [3], 4, 0),
        uniform(1, 9, [3], 4, 0),
        uniform(1, 2, [9], 4, 0),
        uniform(1, 2, [3], 9, 0),
        uniform(1, 2, [3], 4, 9),
    ):
        assert other[0] != base[0]
    vector = uniform(1, 2, np.arange(10), 4, 0)
    assert vector[3] == base[0]  # one item alone or among others: the same draw
    big = 2**63 - 1
    assert [uniform_one(big, 5, i, 1, 1) for i in range(50)] == uniform(big, 5, np.arange(50), 1, 1).tolist()
    speed = SpeedPerturb((0.8, 0.9, 1.1), p=0.6)
    assert [speed.factor_of((3, 4, i, 2)) for i in range(200)] == speed.factor(3, 4, np.arange(200), 2).tolist()


@needs_fsdd
def test_decoder_output_depends_on_the_item_key_only():
    decoder = AudioDecoder(augment=all_four())
    a = decoder(WorkItem(5, SPEECH[0], seed=1, epoch=2))["audio"]
    assert np.array_equal(a, decoder(WorkItem(5, SPEECH[0], seed=1, epoch=2, seq=40))["audio"])
    for item in (
        WorkItem(6, SPEECH[0], seed=1, epoch=2),
        WorkItem(5, SPEECH[0], seed=2, epoch=2),
        WorkItem(5, SPEECH[0], seed=1, epoch=3),
    ):
        other = decoder(item)["audio"]
        assert other.shape != a.shape or not np.array_equal(other, a)


@needs_fsdd
def test_threads_and_order_do_not_change_the_samples():
    def samples(num_producers, ordered):
        ds = BufferedDataset(
            SPEECH[:40],
            AudioDecoder(augment=all_four(p=0.5)),
            shuffle=True,
            seed=4,
            num_producers=num_producers,
            ordered=ordered,
        )
        return {int(s["index"]): s["audio"].numpy() for s in ds}

    one, four = samples(1, True), samples(4, False)
    assert one.keys() == four.keys() and all(np.array_equal(one[i], four[i]) for i in one)
    assert not wait_no_threads()


@needs_fsdd
def test_ranks_draw_differently():
    decoder = AudioDecoder(augment=[SpeedPerturb((0.8, 0.9, 1.1, 1.2))])
    ranks = [
        BufferedDataset(SPEECH[:40], decoder, shuffle=True, seed=4, rank=r, world_size=2)
        for r in (0, 1)
    ]
    items = [[int(s["index"]) for s in ds] for ds in ranks]
    assert not set(items[0]) & set(items[1])
    factors = [decoder.stretch(4, 0, np.array(i)) for i in items]
    assert not np.array_equal(factors[0], factors[1])


# -- exact resume ---------------------------------------------------------------------------------


@needs_fsdd
@pytest.mark.parametrize("k", [1, 13])
def test_a_resumed_epoch_gives_bit_identical_samples(k):
    def dataset():
        return BufferedDataset(
            SPEECH[:30],
            AudioDecoder(crop_seconds=0.5, pad=False, augment=all_four(p=0.7)),
            shuffle=True,
            seed=11,
            num_producers=3,
        )

    whole = dataset()
    whole.set_epoch(3)
    expected = {int(s["index"]): s["audio"].numpy() for s in whole}
    first = dataset()
    first.set_epoch(3)
    it = iter(first)
    seen = {}
    for _ in range(k):
        s = next(it)
        seen[int(s["index"])] = s["audio"].numpy()
    state = pickle.loads(pickle.dumps(first.state_dict()))
    it.close()
    again = dataset()
    again.load_state_dict(state)
    for s in again:
        seen[int(s["index"])] = s["audio"].numpy()
    assert seen.keys() == expected.keys()
    assert all(np.array_equal(seen[i], expected[i]) for i in expected)
    assert not wait_no_threads()


# -- the planner knows perturbed durations ---------------------------------------------------------


@needs_fsdd
@pytest.mark.parametrize("crop", [None, 1.0])
def test_batches_by_duration_hold_the_budget_on_perturbed_durations(crop, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    budget, sr, files = 3.0, 8000, SPEECH[:120]
    decoder = AudioDecoder(crop_seconds=crop, pad=False, augment=[SpeedPerturb((0.5, 1.0, 1.5))])
    ds = BufferedDataset(
        files, decoder, max_batch_seconds=budget, shuffle=True, seed=2, num_producers=2
    )
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        batches = list(ds)
        seen = sorted(int(s["index"]) for b in batches for s in b)
        assert seen == list(range(len(files)))  # every item once
        for batch in batches:
            frames = [int(s["num_frames"]) for s in batch]
            # round(n / f) frames: within half a frame of the planned n / f seconds
            assert len(batch) == 1 or len(batch) * max(frames) <= budget * sr + len(batch) * 0.5
    assert not wait_no_threads()


# -- pickling, the isolated loader ----------------------------------------------------------------


@needs_fsdd
def test_pickled_decoder_lists_its_sources_where_it_runs():
    decoder = AudioDecoder(augment=all_four())
    expected = decoder(WorkItem(3, SPEECH[0], seed=5))["audio"]
    copy = pickle.loads(pickle.dumps(decoder))
    noise = copy.augment[2]
    assert noise.clips._source is None  # listed on first use
    assert np.array_equal(copy(WorkItem(3, SPEECH[0], seed=5))["audio"], expected)
    assert copy.augment_clock.seconds > 0


@needs_fsdd
@pytest.mark.usefixtures("no_helper_left_behind")
def test_isolated_loader_gives_the_samples_of_the_dataset():
    decoder = AudioDecoder(augment=all_four(p=0.6))
    files = SPEECH[:16]
    with IsolatedLoader(files, decoder, batch_size=4, shuffle=True, seed=9, ordered=True) as loader:
        batches = list(loader)
    ds = BufferedDataset(files, decoder, shuffle=True, seed=9, ordered=True)
    samples = list(ds)
    got = [
        (int(i), a[:n].numpy())
        for b in batches
        for i, a, n in zip(b["index"], b["audio"], b["lengths"])
    ]
    assert [i for i, _ in got] == [int(s["index"]) for s in samples]
    assert all(np.array_equal(a, s["audio"].numpy()) for (_, a), s in zip(got, samples))


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: SpeedPerturb(1.1), TypeError, "factors"),
        (lambda: SpeedPerturb([]), TypeError, "factors"),
        (lambda: SpeedPerturb([0.1]), ValueError, "factors"),
        (lambda: SpeedPerturb([1.1], p=1.5), ValueError, "p="),
        (lambda: SpeedPerturb([1.1], p="x"), TypeError, "p="),
        (lambda: Gain((6.0, -6.0)), ValueError, "db"),
        (lambda: Gain("loud"), TypeError, "db"),
        (lambda: Gain(float("nan")), ValueError, "db"),
        (lambda: AddNoise(3), TypeError, "source"),
        (lambda: AddNoise(["a.wav"], snr_db=(1, 2, 3)), TypeError, "snr_db"),
        (lambda: Reverb(["a.wav"], normalize="yes"), TypeError, "normalize"),
        (lambda: AudioDecoder(augment=Gain()), TypeError, "augment"),
        (lambda: AudioDecoder(augment=[Gain(), 3]), TypeError, "augment[1]"),
    ],
)
def test_wrong_arguments_are_named(make, error, words):
    with pytest.raises(error, match=re.escape(words)):
        make()


@pytest.mark.parametrize("make", [AddNoise, Reverb])
def test_a_noise_source_that_lists_nothing_is_named_when_made(tmp_path, make):
    from audiobuffer import SourceError

    name = make.__name__
    with pytest.raises(SourceError, match=rf"{name}\(source=\.\.\.\): no files in"):
        make(str(tmp_path))
    with pytest.raises(SourceError, match=rf"{name}\(source=\.\.\.\): source .* does not exist"):
        make(str(tmp_path / "missing"))


# -- SpecAugment: masks on batched features -------------------------------------------------------


def _bands_of(flags):
    """The (start, width) of each run of True in a 1-d boolean tensor."""
    runs, start = [], None
    for i, on in enumerate(list(flags) + [False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


@pytest.mark.parametrize("seed", range(5))
def test_spec_augment_masks_within_their_bounds(seed):
    torch = pytest.importorskip("torch")
    from audiobuffer.features import SpecAugment

    spec = SpecAugment(
        freq_masks=2, freq_width=8, time_masks=3, time_width=10, mask_value=-1.0, seed=seed
    )
    features = torch.rand(6, 40, 120) + 1.0
    frames = torch.tensor([120, 90, 50, 12, 5, 0])
    out = spec(features, frames)
    assert out.shape == features.shape and torch.equal(
        features >= 1.0, torch.ones_like(features, dtype=torch.bool)
    )
    masked = out == -1.0
    for row in range(6):
        freq_rows = masked[row].all(dim=1)  # a masked bin is masked at every frame
        assert sum(w for _, w in _bands_of(freq_rows.tolist())) <= 2 * 8
        assert all(w <= 2 * 8 for _, w in _bands_of(freq_rows.tolist()))
        time_cols = (
            masked[row][~freq_rows].all(dim=0)
            if (~freq_rows).any()
            else torch.zeros(120, dtype=torch.bool)
        )
        cols = time_cols.nonzero().flatten().tolist()
        assert all(c < int(frames[row]) for c in cols)  # never in the padding
        assert len(cols) <= 3 * 10
        unmasked = ~masked[row]
        assert torch.equal(out[row][unmasked], features[row][unmasked])


def test_spec_augment_is_seeded_and_runs_on_the_batch_device():
    torch = pytest.importorskip("torch")
    from audiobuffer.features import SpecAugment

    x = torch.ones(3, 2, 20, 30)
    a = SpecAugment(freq_masks=1, freq_width=5, time_masks=1, time_width=5, seed=3)(x)
    b = SpecAugment(freq_masks=1, freq_width=5, time_masks=1, time_width=5, seed=3)(x)
    c = SpecAugment(freq_masks=1, freq_width=5, time_masks=1, time_width=5)(
        x, generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(a, b) and torch.equal(a, c) and (a == 0).any() and a.device == x.device
    if torch.cuda.is_available():
        on = SpecAugment(freq_masks=1, freq_width=5, time_masks=1, time_width=5, seed=3)(x.cuda())
        assert on.is_cuda and torch.equal(on.cpu(), a)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(freq_masks=-1), ValueError),
        (dict(time_width=2.5), TypeError),
        (dict(seed=-1), ValueError),
        (dict(mask_value="zero"), TypeError),
    ],
)
def test_spec_augment_arguments(kwargs, error):
    from audiobuffer.features import SpecAugment

    with pytest.raises(error, match=next(iter(kwargs))):
        SpecAugment(**kwargs)


# -- the YAML form ----------------------------------------------------------------------------------------

YAML = """\
source: {files: [a.wav]}
decode:
  sample_rate: 8000
  augment:
    - {kind: speed_perturb, factors: [0.9, 1.0, 1.1]}
    - {kind: gain, db: [-6, 6], p: 0.5}
    - {kind: add_noise, source: noise, snr_db: [10, 20], p: 0.5}
    - {kind: reverb, source: [rirs/r.wav], p: 0.3, normalize: false}
"""


def test_yaml_augment_builds_the_python_augmentations(tmp_path):
    from audiobuffer.config import load_config
    from audiobuffer.config.builders import build_decoder

    (tmp_path / "cfg.yaml").write_text(YAML, encoding="utf-8")
    (tmp_path / "noise").mkdir()
    (tmp_path / "rirs").mkdir()
    for path in (tmp_path / "noise" / "n.wav", tmp_path / "rirs" / "r.wav"):
        sf.write(path, signal(800)[0], 8000)
    decoder = build_decoder(load_config(tmp_path / "cfg.yaml"))
    speed, gain, noise, reverb = decoder.augment
    assert isinstance(speed, SpeedPerturb) and speed.factors == (0.9, 1.0, 1.1) and speed.p == 1.0
    assert isinstance(gain, Gain) and gain.db == (-6.0, 6.0) and gain.p == 0.5
    assert isinstance(noise, AddNoise) and noise.snr_db == (10.0, 20.0)
    assert noise.clips.spec == str(tmp_path / "noise")  # relative to the config's folder
    assert isinstance(reverb, Reverb) and reverb.clips.spec == [str(tmp_path / "rirs" / "r.wav")]
    assert reverb.normalize is False and reverb.p == 0.3


@pytest.mark.parametrize("entry, words", [
    ("{kind: gain, factors: [1.1]}", "kind: gain takes p, db, not factors"),
    ("{kind: add_noise}", "needs source"),
    ("{kind: gain, p: 1.5}", "decode.augment.0.p"),
    ("{kind: speed_perturb, factors: [9]}", "decode.augment.0.factors"),
    ("{kind: speed, factors: [1.1]}", "decode.augment.0.kind"),
    ("{kind: gain, db: [6, -6]}", "decode.augment.0: Gain(db=...)"),
    ("{kind: add_noise, source: /no/such/noise}", "decode.augment.0: AddNoise(source=...): source"),
])
def test_yaml_augment_errors_name_the_entry(entry, words):
    from audiobuffer import ConfigError
    from audiobuffer.config import parse_config
    from audiobuffer.config.builders import build_decoder

    with pytest.raises(ConfigError) as info:
        build_decoder(parse_config({"source": {"files": ["a.wav"]},
                                    "decode": {"augment": [yaml.safe_load(entry)]}}))
    assert words in str(info.value) and "decode: " not in str(info.value)  # the entry named once


# -- time spent augmenting -------------------------------------------------------------------------------

@needs_fsdd
def test_stats_count_the_seconds_spent_augmenting():
    ds = BufferedDataset(SPEECH[:12], AudioDecoder(augment=[Reverb(RIRS)]), num_producers=2)
    assert len(list(ds)) == 12
    stats = ds.stats()
    assert 0 < stats.augment_s <= stats.decode_s
    plain = BufferedDataset(SPEECH[:12], AudioDecoder(), num_producers=2)
    list(plain)
    assert plain.stats().augment_s == 0.0
    assert not wait_no_threads()


@needs_fsdd
@pytest.mark.usefixtures("no_helper_left_behind")
def test_isolated_stats_count_the_helpers_seconds_augmenting():
    decoder = AudioDecoder(augment=[Reverb(RIRS)])
    with IsolatedLoader(SPEECH[:12], decoder, batch_size=4) as loader:
        assert len(list(loader)) == 3
        stats = loader.stats()
    assert stats.augment_s > 0 and decoder.augment_clock.seconds == 0.0  # spent in the helper


def test_run_summary_reports_augmenting():
    from audiobuffer.cli.report import RunSummary
    from audiobuffer.engine.epoch import DatasetStats

    stats = DatasetStats(epoch=0, rank=0, world_size=1, worker=0, num_workers=1, items=10,
                         num_producers=2, decode_s=4.0, augment_s=1.25)
    summary = RunSummary(wall_s=5.0, samples=10)
    summary.add_epoch(stats)
    summary.judge()
    assert summary.augment_s == 1.25 and summary.as_dict()["augment_s"] == 1.25
    assert "decoding 4.00 s (summed over producers; 1.25 s of them augmenting)" in "\n".join(summary.lines())


@pytest.mark.parametrize("index_json", [False, True])
def test_shards_batched_by_duration_hold_the_budget_on_perturbed_durations(tmp_path, index_json):
    """Streamed shards batch by each sidecar's duration, an index by its durations: both stretched."""
    from helpers import write_tone

    from audiobuffer.sources import INDEX_NAME, pack

    rows = []
    for i in range(24):
        seconds = (0.05, 0.1, 0.2)[i % 3]
        path = write_tone(tmp_path / "src" / f"t{i:03d}.wav", seconds=seconds, sample_rate=8000)
        rows.append(f"{path},{seconds!r}\n")
    (tmp_path / "manifest.csv").write_text("path,seconds\n" + "".join(rows), encoding="utf-8", newline="\n")
    index = pack(tmp_path / "manifest.csv", tmp_path / "out", shard_size=20_000, progress=False)
    spec = (str(tmp_path / "out" / INDEX_NAME) if index_json
            else str(tmp_path / "out" / f"shard-{{000000..{len(index.shards) - 1:06d}}}.tar"))
    budget = 0.6
    decoder = AudioDecoder(augment=[SpeedPerturb((0.5, 1.0))])
    ds = BufferedDataset(spec, decoder, max_batch_seconds=budget, duration_column="seconds", buckets=2,
                         shuffle=True, num_producers=2)
    batches = list(ds)
    assert sum(len(b) for b in batches) == 24
    assert all(len(b) == 1 or len(b) * max(int(s["num_frames"]) for s in b) <= budget * 8000 + len(b)
               for b in batches)
    assert not wait_no_threads()


@needs_fsdd
def test_a_state_saved_under_other_speed_factors_is_refused():
    from audiobuffer import ResumeError

    def dataset(factors):
        return BufferedDataset(SPEECH[:30], AudioDecoder(augment=[SpeedPerturb(factors)]), max_batch_seconds=2.0,
                               shuffle=True, seed=1)
    saved = dataset((0.5, 1.0))
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    it.close()
    dataset((0.5, 1.0)).load_state_dict(state)
    with pytest.raises(ResumeError, match="stretch"):
        dataset((0.9, 1.1)).load_state_dict(state)
    assert not wait_no_threads()


# -- scripts/train_audio.py --augment ---------------------------------------------------------------

@needs_fsdd
@pytest.mark.timeout(400)
def test_train_script_trains_with_augment(tmp_path):
    """scripts/train_audio.py --augment trains and evaluates (in this process:
    helpers.run_script_here)."""
    import json

    from helpers import REPO, import_script, run_script_here

    files = [str(FSDD / f"{digit}_jackson_{i}.wav") for digit in range(10) for i in (4, 5, 6)]
    config = yaml.safe_load((REPO / "configs" / "fsdd.yaml").read_text(encoding="utf-8"))
    config.update(source={"files": files, "labels": r"^(\d+)_"}, epochs=1)
    config["loader"]["batch_size"] = 4
    config["train"].update(checkpoint=str(tmp_path / "model.pt"), test_files=r"_4\.wav$")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    script = import_script(REPO / "scripts" / "train_audio.py")
    result = run_script_here(script, "--config", tmp_path / "cfg.yaml", "--augment",
                             FSDD.parent / "recordings", "--max-steps", "2", "--json",
                             tmp_path / "m.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "m.json").read_text())["epochs"][0]["test_accuracy"] is not None


def test_train_script_augment_override_is_speed_and_noise(tmp_path):
    import importlib.util

    from helpers import REPO

    from audiobuffer.config import parse_config
    from audiobuffer.config.builders import build_decoder
    from audiobuffer.config.schema import apply_overrides

    spec = importlib.util.spec_from_file_location("train_audio", REPO / "scripts" / "train_audio.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    (tmp_path / "noise").mkdir()
    sf.write(tmp_path / "noise" / "n.wav", signal(800)[0], 8000)
    data = apply_overrides({"source": {"files": ["a.wav"]}}, [script.augment_override(tmp_path / "noise")])
    speed, noise = build_decoder(parse_config(data)).augment
    assert speed.factors == (0.9, 1.0, 1.1) and speed.p == 1.0
    assert noise.snr_db == (10.0, 20.0) and noise.p == 0.5 and noise.clips.spec == str(tmp_path / "noise")


def test_noise_from_the_index_of_packed_shards(tmp_path):
    """A noise corpus packed into tar shards is read member by member through its index.json."""
    from helpers import write_tone

    from audiobuffer.sources import INDEX_NAME, pack

    rows = [f"{write_tone(tmp_path / 'src' / f'n{i}.wav', seconds=0.2, sample_rate=8000)}\n" for i in range(4)]
    (tmp_path / "noise.csv").write_text("path\n" + "".join(rows), encoding="utf-8", newline="\n")
    pack(tmp_path / "noise.csv", tmp_path / "out", shard_size=4000, progress=False)
    aug = AddNoise(str(tmp_path / "out" / INDEX_NAME), snr_db=5.0)
    assert len(aug.clips) == 4 and aug.clips.source.table.offsets is not None  # members of shards
    speech = signal(3000)
    key = (0, 0, 1, 0)
    noise = aug(speech, 8000, key).astype(np.float64) - speech
    measured = 10 * np.log10(np.mean(np.square(speech, dtype=np.float64)) / np.mean(np.square(noise)))
    assert abs(measured - 5.0) < 0.2
    copy = pickle.loads(pickle.dumps(aug))
    assert np.array_equal(copy(speech, 8000, key), aug(speech, 8000, key))


@needs_fsdd
@pytest.mark.usefixtures("no_helper_left_behind")
def test_isolated_batches_by_duration_hold_the_budget_on_perturbed_durations(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    files, budget = SPEECH[:60], 3.0
    decoder = AudioDecoder(augment=[SpeedPerturb((0.5, 1.0, 1.5))])
    with IsolatedLoader(files, decoder, max_batch_seconds=budget, shuffle=True, seed=2) as loader:
        batches = list(loader)
    assert sorted(int(i) for b in batches for i in b["index"]) == list(range(len(files)))
    for batch in batches:
        rows = len(batch["index"])
        assert rows == 1 or rows * int(batch["lengths"].max()) <= budget * 8000 + rows * 0.5
