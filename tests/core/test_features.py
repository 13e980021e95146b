import numpy as np
import pytest
import torch

from audiobuffer.features import LogMel, MelSpectrogram, Spectrogram, mel_filterbank

librosa = pytest.importorskip("librosa")

# Tolerances: the STFT runs in float32 in torch, in float32/64 in librosa.
RTOL = 1e-4


@pytest.fixture
def signals():
    rng = np.random.default_rng(0)
    t = np.arange(8000) / 8000
    chirp = np.sin(2 * np.pi * (200 + 1500 * t) * t)
    return np.stack([0.3 * rng.standard_normal(8000), 0.5 * chirp]).astype(np.float32)


@pytest.mark.parametrize("htk", [False, True])
def test_filterbank_matches_librosa(htk):
    ours = mel_filterbank(16000, 512, 64, f_min=30.0, f_max=7000.0, htk=htk)
    ref = librosa.filters.mel(sr=16000, n_fft=512, n_mels=64, fmin=30.0, fmax=7000.0, htk=htk)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-8)


def test_spectrogram_matches_librosa_stft(signals):
    ours, _ = Spectrogram(256, hop_length=80)(torch.from_numpy(signals))
    ref = np.abs(librosa.stft(signals, n_fft=256, hop_length=80))
    np.testing.assert_allclose(ours.numpy(), ref, rtol=RTOL, atol=1e-4)


def test_mel_matches_librosa(signals):
    ours, _ = MelSpectrogram(8000, 256, hop_length=80, n_mels=40)(torch.from_numpy(signals))
    ref = librosa.feature.melspectrogram(y=signals, sr=8000, n_fft=256, hop_length=80, n_mels=40)
    np.testing.assert_allclose(ours.numpy(), ref, rtol=RTOL, atol=1e-5 * ref.max())


def test_log_mel_matches_power_to_db(signals):
    # Compared 80 dB below each example's peak: under that, both sides hold float32 FFT round-off
    # (around 1e-10 of power), where decibels differ wildly while the powers agree to 1e-9.
    ours, _ = LogMel(8000, 256, hop_length=80, n_mels=40, top_db=80.0)(torch.from_numpy(signals))
    mel = librosa.feature.melspectrogram(y=signals, sr=8000, n_fft=256, hop_length=80, n_mels=40)
    for ex in range(len(signals)):
        ref = librosa.power_to_db(mel[ex], ref=1.0, top_db=80.0)
        np.testing.assert_allclose(ours[ex].numpy(), ref, atol=5e-3)  # decibels: 0.1% in power
        assert ours[ex].min() >= ours[ex].max() - 80.0 - 1e-4


def test_lengths_become_frame_counts_and_batching_is_per_example(signals):
    mel = MelSpectrogram(8000, 256, hop_length=80, n_mels=40)
    batch, frames = mel(torch.from_numpy(signals), torch.tensor([8000, 4000]))
    assert frames.tolist() == [101, 51]
    single, _ = mel(torch.from_numpy(signals[1:2, :4000]))
    # frames whose window lies inside the first 4000 samples do not depend on what follows
    inside = (4000 - 128) // 80 + 1
    np.testing.assert_allclose(batch[1, :, :inside].numpy(), single[0, :, :inside].numpy(), rtol=1e-4, atol=1e-6)


def test_channels_dimension_is_kept(signals):
    out, _ = MelSpectrogram(8000, 256, hop_length=80, n_mels=40)(torch.from_numpy(signals).view(1, 2, 8000))
    assert out.shape == (1, 2, 40, 101)


def test_filterbank_validation():
    with pytest.raises(ValueError, match="f_min"):
        mel_filterbank(8000, 256, 40, f_max=5000)
    with pytest.raises(ValueError, match=r"^norm must be one of 'slaney', None, got 'l2'$"):
        mel_filterbank(8000, 256, 40, norm="l2")
    with pytest.raises(ValueError, match=r"^norm must be one of 'slaney', None, got 'area'$"):
        MelSpectrogram(8000, 256, norm="area")
    assert mel_filterbank(8000, 256, 40, norm=None).shape == (40, 129)


@pytest.mark.parametrize("module", [Spectrogram, MelSpectrogram, LogMel])
def test_forward_is_documented(module):
    doc = module.forward.__doc__
    assert doc, f"{module.__name__}.forward has no docstring"
    for section in ("Args:", "audio:", "lengths:", "Returns:", "frames"):
        assert section in doc, f"{module.__name__}.forward's docstring lacks {section!r}"
