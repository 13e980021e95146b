import csv
import threading

import numpy as np
import pytest
import soundfile as sf
import torch

from audiobuffer import AudioDecoder, BufferedDataset, DecodeError, WorkItem
from audiobuffer.decoders import audio as audio_module
from helpers import write_tone


@pytest.fixture
def stereo(tmp_path):
    return write_tone(tmp_path / "stereo.wav", seconds=1.0, sample_rate=8000, channels=2, subtype="FLOAT")


def test_sample_fields(stereo):
    item = WorkItem(index=7, path=str(stereo), label=2, label_name="two", fields={"speaker": "ann"})
    sample = AudioDecoder()(item)
    assert sample["audio"].dtype == torch.float32 and sample["audio"].shape == (8000,)
    assert (sample["sample_rate"], sample["num_frames"], sample["path"], sample["index"]) == (8000, 8000, str(stereo), 7)
    assert (sample["label"], sample["label_name"], sample["speaker"]) == (2, "two", "ann")


def test_mono_mixdown_is_the_channel_mean(stereo):
    data, _ = sf.read(stereo, dtype="float32")
    audio = AudioDecoder()(stereo)["audio"].numpy()
    np.testing.assert_allclose(audio, data.mean(axis=1), atol=1e-7)


def test_keep_channels(stereo):
    data, _ = sf.read(stereo, dtype="float32")
    audio = AudioDecoder(mono=False)(stereo)["audio"]
    assert audio.shape == (2, 8000) and audio.is_contiguous()
    np.testing.assert_array_equal(audio.numpy(), data.T)


def test_resample_length_and_content(tmp_path):
    path = write_tone(tmp_path / "tone.flac", seconds=1.0, sample_rate=8000, freq=300.0)
    sample = AudioDecoder(sample_rate=16000)(path)
    audio = sample["audio"].numpy()
    assert sample["sample_rate"] == 16000 and audio.shape == (16000,) and sample["num_frames"] == 16000
    expected = 0.5 * np.sin(2 * np.pi * 300.0 * np.arange(16000) / 16000)
    np.testing.assert_allclose(audio[200:-200], expected[200:-200], atol=2e-3)


def ramp_file(tmp_path, frames=8000, sample_rate=8000):
    """A file whose sample i holds i / frames: any crop shows where it came from."""
    path = tmp_path / "ramp.wav"
    sf.write(path, (np.arange(frames) / frames).astype(np.float32), sample_rate, subtype="FLOAT")
    return path


def start_of(audio, frames=8000):
    return round(float(audio[0]) * frames)


def test_crop_start_center_and_random(tmp_path):
    path = ramp_file(tmp_path)
    start = AudioDecoder(crop_seconds=0.25, crop="start")(path)
    center = AudioDecoder(crop_seconds=0.25, crop="center")(path)
    assert start["audio"].shape == center["audio"].shape == (2000,)
    assert start_of(start["audio"]) == 0 and start_of(center["audio"]) == 3000
    decoder = AudioDecoder(crop_seconds=0.25, crop="random")
    starts = {start_of(decoder(WorkItem(index=i, path=str(path), seed=1))["audio"]) for i in range(20)}
    assert len(starts) > 10 and all(0 <= s <= 6000 for s in starts)
    again = {start_of(decoder(WorkItem(index=i, path=str(path), seed=1))["audio"]) for i in range(20)}
    assert starts == again  # seeded by (seed, epoch, index): reproducible


def test_crop_reads_only_the_needed_frames(tmp_path, monkeypatch):
    monkeypatch.setattr(audio_module, "_NATIVE_WAV", False)  # the libsndfile path (test_wav.py: native)
    path = ramp_file(tmp_path, frames=80000)
    requested = []
    real_read = sf.SoundFile.read

    def spy(self, frames=-1, *args, **kwargs):
        requested.append(frames)
        return real_read(self, frames, *args, **kwargs)

    monkeypatch.setattr(sf.SoundFile, "read", spy)
    sample = AudioDecoder(crop_seconds=0.5, crop="center")(path)
    assert requested == [4000]
    assert start_of(sample["audio"], 80000) == 38000


def test_pad_short_file_and_keep_real_length(tmp_path):
    path = write_tone(tmp_path / "short.wav", seconds=0.1, sample_rate=8000)
    sample = AudioDecoder(crop_seconds=0.5)(path)
    assert sample["audio"].shape == (4000,) and sample["num_frames"] == 800
    assert torch.all(sample["audio"][800:] == 0) and sample["audio"][:800].abs().max() > 0.1
    unpadded = AudioDecoder(crop_seconds=0.5, pad=False)(path)
    assert unpadded["audio"].shape == (800,)


def test_crop_after_resample_has_exact_length(tmp_path):
    path = write_tone(tmp_path / "t.wav", seconds=1.0, sample_rate=44100)
    sample = AudioDecoder(sample_rate=16000, crop_seconds=0.3)(path)
    assert sample["audio"].shape == (4800,) and sample["num_frames"] == 4800


def test_missing_file(tmp_path):
    with pytest.raises(DecodeError, match="no such file") as info:
        AudioDecoder()(tmp_path / "gone.wav")
    assert info.value.path == str(tmp_path / "gone.wav")


def test_garbage_file_names_both_causes(tmp_path):
    bad = tmp_path / "noise.wav"
    bad.write_bytes(b"this is not audio" * 10)
    with pytest.raises(DecodeError, match=r"noise\.wav.*soundfile: .*fallback reader") as info:
        AudioDecoder()(bad)
    assert info.value.__cause__ is not None
    with pytest.raises(DecodeError, match="Format not recognised") as info:
        AudioDecoder(fallback=None)(bad)
    assert isinstance(info.value.__cause__, sf.LibsndfileError)


def test_fallback_reader_is_used_for_files_libsndfile_cannot_open(tmp_path):
    raw = tmp_path / "tone.raw16"
    pcm = (np.sin(np.arange(4000) / 5) * 20000).astype("<i2")
    raw.write_bytes(pcm.tobytes())

    def read_raw(path):
        data = np.frombuffer(open(path, "rb").read(), dtype="<i2").astype(np.float32) / 32768
        return data[:, None], 4000

    sample = AudioDecoder(sample_rate=8000, crop_seconds=0.5, crop="start", fallback=read_raw)(raw)
    assert sample["sample_rate"] == 8000 and sample["audio"].shape == (4000,) and sample["num_frames"] == 4000
    expected = AudioDecoder(sample_rate=8000, crop_seconds=0.5, crop="start")(
        write_tone_from(tmp_path / "same.wav", pcm, 4000))["audio"]
    np.testing.assert_allclose(sample["audio"], expected, atol=1e-6)


def write_tone_from(path, pcm, sample_rate):
    sf.write(path, pcm, sample_rate, subtype="PCM_16")
    return path


def test_truncated_flac_is_an_error_not_a_short_sample(tmp_path):
    path = write_tone(tmp_path / "t.flac", seconds=1.0, sample_rate=16000)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DecodeError, match=r"t\.flac"):
        AudioDecoder(fallback=None)(path)


def test_short_read_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(audio_module, "_NATIVE_WAV", False)  # a short read from libsndfile
    path = write_tone(tmp_path / "t.wav", seconds=0.5, sample_rate=8000)
    real_read = sf.SoundFile.read
    monkeypatch.setattr(sf.SoundFile, "read", lambda self, frames=-1, **kw: real_read(self, frames, **kw)[:100])
    with pytest.raises(DecodeError, match="ended after 100 frames; its header promises 4000"):
        AudioDecoder()(path)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"sample_rate": 0}, ValueError, "sample_rate"),
    ({"sample_rate": 16000.0}, TypeError, "sample_rate"),
    ({"crop_seconds": 0}, ValueError, "crop_seconds"),
    ({"crop_seconds": float("inf")}, ValueError, "crop_seconds"),
    ({"crop_seconds": "1s"}, TypeError, "crop_seconds"),
    ({"crop": "middle"}, ValueError, "crop must be one of"),
    ({"quality": "best"}, ValueError, "quality"),
    ({"fallback": "ffmpeg"}, ValueError, "fallback"),
])
def test_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        AudioDecoder(**kwargs)


def test_decoder_takes_work_items_or_paths_only():
    with pytest.raises(TypeError, match="WorkItem or a path"):
        AudioDecoder()(42)


# -- real files ----------------------------------------------------------------------------------------

def read_manifest(root):
    with open(root / "MANIFEST.tsv", newline="") as f:
        lines = [line for line in f if not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t"))


def test_every_audio_format_decodes_or_is_reported(audio_formats):
    rows = read_manifest(audio_formats)
    assert len(rows) > 70
    paths = [str(audio_formats / r["path"]) for r in rows]
    ds = BufferedDataset(paths, AudioDecoder(), on_error="skip", num_producers=4)
    decoded = {s["path"]: s for s in ds}
    stats = ds.stats()
    failed = {f[1]: f[2] for f in stats.failures}
    assert stats.yielded + stats.failed == len(rows)
    for row, path in zip(rows, paths):
        result = row["sf_decode"]
        if result.startswith("ok:") and not row["frames_header"].startswith("unknown"):
            assert path in decoded, f"{row['path']} should decode ({result}), failed: {failed.get(path)}"
            sample = decoded[path]
            assert sample["num_frames"] == int(result[3:]), row["path"]
            assert sample["sample_rate"] == int(row["samplerate"])
            assert torch.isfinite(sample["audio"]).all()
        else:
            # open errors, read errors and streams of unknown length that fail before their end
            assert path in failed, f"{row['path']} ({result}) should be reported"
            assert path not in decoded


def test_many_threads_open_good_and_bad_files_at_once(audio_formats):
    """libsndfile keeps the last open error in global state; every error must still be the file's own."""
    rows = read_manifest(audio_formats)
    good = [r for r in rows if r["sf_decode"].startswith("ok:") and not r["frames_header"].startswith("unknown")]
    bad = [r for r in rows if r["sf_decode"].startswith("open-error")]
    assert good and bad
    work = (good[:15] + bad) * 6
    decoder = AudioDecoder(fallback=None, crop_seconds=0.05, crop="start")
    wrong = []
    lock = threading.Lock()

    def run(part):
        for row in part:
            path = str(audio_formats / row["path"])
            try:
                decoder(path)
                ok = True
            except DecodeError as exc:
                ok = False
                expected = row["sf_decode"].split(": ", 1)[-1]
                if row["sf_decode"].startswith("open-error") and expected not in str(exc):
                    with lock:
                        wrong.append((row["path"], str(exc)))
            if ok != row["sf_decode"].startswith("ok:"):
                with lock:
                    wrong.append((row["path"], "decoded" if ok else "failed"))

    threads = [threading.Thread(target=run, args=(work[i::8],), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert not wrong, wrong[:5]


def test_unknown_length_flac_is_reported_not_truncated(audio_formats):
    path = audio_formats / "flac_testbench/subset/45 - no total number of samples set.flac"
    with pytest.raises(DecodeError, match="header gives no frame count and reading failed after 327680 frames"):
        AudioDecoder(fallback=None)(path)


def test_fsdd_every_file_once_with_correct_labels(fsdd):
    ds = BufferedDataset(fsdd, AudioDecoder(sample_rate=16000, crop_seconds=1.0), num_producers=4,
                         buffer_size=64, shuffle=True, seed=0, labels=r"^(\d+)_")
    assert len(ds) == 3000 and ds.classes == [str(d) for d in range(10)]
    for epoch in range(2):
        ds.set_epoch(epoch)
        seen = {}
        for sample in ds:
            assert sample["path"] not in seen
            seen[sample["path"]] = sample["label"]
            assert sample["audio"].shape == (16000,) and 0 < sample["num_frames"] <= 16000
        assert len(seen) == 3000
        for path, label in seen.items():
            assert int(path.rsplit("/", 1)[1].split("_")[0]) == label
