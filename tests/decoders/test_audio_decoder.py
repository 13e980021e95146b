import csv
import gc
import re
import struct
import subprocess
import sys
import threading
import warnings
import weakref
from typing import get_args

import numpy as np
import pytest
import soundfile as sf
import torch
from helpers import write_tone

from audiobuffer import AudioDecoder, BufferedDataset, DecodeError, WorkItem
from audiobuffer.decoders.audio import CropMode, Quality


@pytest.fixture
def stereo(tmp_path):
    return write_tone(tmp_path / "stereo.wav", seconds=1.0, sample_rate=8000, channels=2, subtype="FLOAT")


def test_sample_fields(stereo):
    item = WorkItem(index=7, path=str(stereo), label=2, label_name="two", fields={"speaker": "ann"})
    sample = AudioDecoder()(item)
    assert sample["audio"].dtype == torch.float32 and sample["audio"].shape == (8000,)
    assert (sample["sample_rate"], sample["num_frames"], sample["path"], sample["index"]) == (
        8000, 8000, str(stereo), 7)
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
    path = ramp_file(tmp_path, frames=80000)
    requested = []
    real_read = sf.SoundFile.read

    def spy(self, frames=-1, *args, **kwargs):
        requested.append(frames)
        return real_read(self, frames, *args, **kwargs)

    monkeypatch.setattr(sf.SoundFile, "read", spy)
    sample = AudioDecoder(crop_seconds=0.5, crop="center", native_wav=False)(path)  # test_wav.py: native
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
    path = write_tone(tmp_path / "t.wav", seconds=0.5, sample_rate=8000)
    real_read = sf.SoundFile.read
    monkeypatch.setattr(sf.SoundFile, "read", lambda self, frames=-1, **kw: real_read(self, frames, **kw)[:100])
    with pytest.raises(DecodeError, match="ended after 100 frames; its header promises 4000"):
        AudioDecoder(native_wav=False)(path)  # a short read from libsndfile


@pytest.mark.parametrize("kwargs, error, match", [
    ({"sample_rate": 0}, ValueError, r"^sample_rate must be an integer >= 1 or None, got 0$"),
    ({"sample_rate": 16000.0}, TypeError, r"^sample_rate must be an integer >= 1 or None, got 16000\.0$"),
    ({"crop_seconds": 0}, ValueError, r"^crop_seconds must be None or a number of seconds > 0 and <= 86400, got 0$"),
    ({"crop_seconds": float("inf")}, ValueError, r"^crop_seconds must be .* <= 86400, got inf$"),
    ({"crop_seconds": "1s"}, TypeError, r"^crop_seconds must be None or a number of seconds > 0 .*, got '1s'$"),
    ({"crop": "middle"}, ValueError, r"^crop must be one of 'random', 'start', 'center', got 'middle'$"),
    ({"quality": "best"}, ValueError, r"^quality must be one of 'QQ', 'LQ', 'MQ', 'HQ', 'VHQ', got 'best'$"),
    ({"fallback": "ffmpeg"}, ValueError, r"^fallback must be 'librosa', None or a callable, got 'ffmpeg'$"),
    ({"native_wav": "no"}, TypeError, r"^native_wav must be True or False, got 'no'$"),
    ({"tensors": 1}, TypeError, r"^tensors must be True or False, got 1$"),
])
def test_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        AudioDecoder(**kwargs)


def test_output_and_reader_are_set_per_decoder_and_survive_pickling(tmp_path):
    import pickle

    from audiobuffer.decoders._common import numpy_output

    path = write_tone(tmp_path / "t.wav", seconds=0.1, sample_rate=8000)
    plain = AudioDecoder(tensors=False, native_wav=False)
    twin = pickle.loads(pickle.dumps(plain))
    assert (twin.tensors, twin.native_wav) == (False, False) and repr(twin) == repr(plain)
    audio = twin(path)["audio"]
    assert isinstance(audio, np.ndarray) and torch.equal(AudioDecoder()(path)["audio"], torch.from_numpy(audio))
    default = AudioDecoder()
    assert (default.tensors, default.native_wav) == (True, True)  # the other decoder is untouched
    numpy_output(default)
    assert default.tensors is False and isinstance(default(path)["audio"], np.ndarray)
    numpy_output(lambda item: item)  # a decoder without the choice is left as it is


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
        elif row["frames_header"].startswith("unknown") and "psf_fseek" in result:
            # A stream of unknown length: python-soundfile's read fails at its end, libsndfile decodes it whole.
            assert path in decoded, f"{row['path']} should decode, failed: {failed.get(path)}"
        else:
            # open errors and read errors
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


def test_unknown_length_flac_is_decoded_whole(audio_formats):
    # python-soundfile's read() fails at the end of such a stream (MANIFEST: "Internal psf_fseek()
    # failed"); libsndfile itself decodes all of it.
    path = audio_formats / "flac_testbench/subset/45 - no total number of samples set.flac"
    sample = AudioDecoder(mono=False, fallback=None)(path)
    assert sample["num_frames"] == 336410 and sample["audio"].shape == (2, 336410)
    with sf.SoundFile(path) as f:
        expected = f.read(65536 * 5, dtype="float32", always_2d=True)  # every frame before the failing end
    assert np.array_equal(sample["audio"].numpy().T[:len(expected)], expected)


def test_unknown_length_flac_cut_short_is_reported(audio_formats, tmp_path):
    data = (audio_formats / "flac_testbench/subset/45 - no total number of samples set.flac").read_bytes()
    cut = tmp_path / "cut.flac"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DecodeError, match="header gives no frame count and reading failed after"):
        AudioDecoder(fallback=None)(cut)


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


# -- crops own their frames ------------------------------------------------------------------------

class FromNumpySpy:
    """Records every array the decoder turns into a tensor (its docstring promises ``torch.from_numpy``)."""

    def __init__(self, monkeypatch):
        self.arrays = []
        real = torch.from_numpy

        def spy(array):
            self.arrays.append(array)
            return real(array)

        monkeypatch.setattr(torch, "from_numpy", spy)


def assert_owns_its_frames(array):
    """The array is not a view into a longer one: the sample keeps alive only what it shows."""
    base = array.base
    assert base is None or (isinstance(base, np.ndarray) and base.nbytes == array.nbytes), (
        f"a {array.nbytes}-byte crop keeps a {getattr(base, 'nbytes', '?')}-byte buffer alive")


def test_crops_of_a_fallback_read_do_not_keep_the_whole_file_alive(tmp_path):
    """Ten 1-s crops of a 2-minute file read by the fallback reader: the whole file must be freed."""
    raw = tmp_path / "long.raw"
    raw.write_bytes(b"not a container libsndfile knows")
    decoded = []

    def read_two_minutes(path):
        data = np.full((120 * 8000, 1), 0.25, dtype=np.float32)
        decoded.append(weakref.ref(data))
        return data, 8000

    decoder = AudioDecoder(crop_seconds=1.0, crop="random", fallback=read_two_minutes)
    samples = [decoder(WorkItem(index=i, path=str(raw), seed=0)) for i in range(10)]
    gc.collect()
    assert len(decoded) == 10
    assert all(ref() is None for ref in decoded), "a crop keeps its whole 2-minute file alive"
    assert all(s["audio"].shape == (8000,) and s["num_frames"] == 8000 for s in samples)


@pytest.mark.parametrize("sample_rate, mono", [(None, True), (16000, True), (None, False), (22050, False)])
@pytest.mark.parametrize("path_kind", ["soundfile", "blocks", "fallback"])
def test_a_crop_owns_its_frames_on_every_path(tmp_path, monkeypatch, path_kind, sample_rate, mono):
    path = write_tone(tmp_path / "long.wav", seconds=6.0, sample_rate=24000, channels=1 if mono else 2)
    fallback = "librosa"
    if path_kind == "blocks":  # a stream whose header gives no frame count is read block by block
        monkeypatch.setattr(sf.SoundFile, "frames", property(lambda self: 2**63 - 1))
    elif path_kind == "fallback":
        tone = path

        def read_with_soundfile(p):
            return sf.read(tone, dtype="float32", always_2d=True)

        fallback = read_with_soundfile
        path = tmp_path / "opaque.bin"
        path.write_bytes(b"no header")
    spy = FromNumpySpy(monkeypatch)
    for crop in ("start", "center", "random"):
        sample = AudioDecoder(sample_rate, mono=mono, crop_seconds=0.37, crop=crop, fallback=fallback)(path)
        rate = sample_rate or 24000
        assert sample["num_frames"] == round(0.37 * rate)
    assert len(spy.arrays) == 3
    for array in spy.arrays:
        assert_owns_its_frames(array)


# -- crop length when resampling -------------------------------------------------------------------

@pytest.mark.parametrize("native, out", [(24000, 22050), (44100, 16000), (8000, 22050), (48000, 44100),
                                         (22050, 16000), (16000, 44100)])
def test_resampled_crop_has_round_n_times_r_real_frames(tmp_path, native, out):
    """A crop of N s at rate R holds round(N * R) real frames whenever the file lasts that long."""
    rng = np.random.default_rng(native + out)
    checked = 0
    for seconds in (0.37, 1.0, 1.37, 2.5, 0.999, 1.2345):
        target = round(seconds * out)
        shortest = -(-target * native // out)  # the fewest native frames that last target / out s
        for frames in (shortest, shortest + 1, shortest + int(rng.integers(2, native))):
            path = tmp_path / f"{native}_{frames}.wav"
            if not path.exists():
                sf.write(path, np.full(frames, 0.5, dtype=np.float32), native, subtype="FLOAT")
            for crop in ("start", "center", "random"):
                item = WorkItem(index=int(rng.integers(1000)), path=str(path), seed=3)
                sample = AudioDecoder(out, crop_seconds=seconds, crop=crop)(item)
                audio = sample["audio"].numpy()
                where = f"{native} -> {out} Hz, {seconds} s crop of {frames} frames, crop={crop}"
                assert sample["num_frames"] == target and audio.shape == (target,), where
                assert np.all(audio != 0), f"zero padding inside a long enough file: {where}"
                checked += 1
    assert checked == 6 * 3 * 3


def test_resampled_crops_of_a_real_file(audio_formats):
    """A real 24 kHz FLAC cropped to 1.37 s at 22.05 kHz."""
    path = audio_formats / "flac_testbench/faulty/01 - wrong max blocksize.flac"
    assert sf.info(path).samplerate == 24000
    for crop in ("start", "center", "random"):
        decoder = AudioDecoder(22050, crop_seconds=1.37, crop=crop)
        for index in range(5 if crop == "random" else 1):
            sample = decoder(WorkItem(index=index, path=str(path), seed=0))
            assert sample["num_frames"] == round(1.37 * 22050) == sample["audio"].shape[0]


# -- rates no audio can have -----------------------------------------------------------------------

def write_wav_with_rate(path, rate):
    """A 16-bit PCM WAV whose header says ``rate`` Hz (0 makes it a damaged file)."""
    sf.write(path, (0.5 * np.sin(np.arange(8000) / 5)).astype(np.float32), 8000, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    fmt = data.find(b"fmt ")
    data[fmt + 12:fmt + 16] = struct.pack("<I", rate)
    path.write_bytes(bytes(data))
    return path


def test_a_wav_whose_header_says_0_hz_is_a_decode_error(tmp_path):
    pytest.importorskip("librosa")
    path = write_wav_with_rate(tmp_path / "zero_rate.wav", 0)
    with pytest.raises(DecodeError, match=r"zero_rate\.wav.*sample rate is 0") as info:
        AudioDecoder(sample_rate=16000, crop_seconds=0.5)(path)
    assert info.value.path == str(path)
    with pytest.raises(DecodeError, match=r"zero_rate\.wav.*sample rate is 0"):
        AudioDecoder()(path)


@pytest.mark.parametrize("rate, channels, match", [
    (0, 1, "sample rate is 0"),
    (-8000, 1, "sample rate is -8000"),
    (float("nan"), 1, "sample rate is nan"),
    (float("inf"), 1, "sample rate is inf"),
    (0.2, 1, "sample rate is 0.2"),
    ("8000", 1, "sample rate is '8000'"),
    (8000, 0, "has 0 channels"),
])
def test_fallback_rates_and_channels_no_audio_can_have(tmp_path, rate, channels, match):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"no header")
    decoder = AudioDecoder(crop_seconds=0.5, fallback=lambda p: (np.zeros((4000, channels), np.float32), rate))
    with pytest.raises(DecodeError, match=r"odd\.bin.*" + re.escape(match)) as info:
        decoder(path)
    assert info.value.path == str(path)


def test_a_float_rate_from_the_fallback_is_an_int_in_the_sample(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"no header")
    sample = AudioDecoder(fallback=lambda p: (np.zeros(800, np.float32), np.float64(8000.0)))(path)
    assert sample["sample_rate"] == 8000 and type(sample["sample_rate"]) is int


@pytest.mark.parametrize("make", [lambda y: y[::-1], lambda y: np.broadcast_to(y[:1], (len(y), 1))])
def test_a_fallback_array_of_any_layout_becomes_a_contiguous_writable_tensor(tmp_path, make):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"no header")
    audio = np.arange(50, dtype=np.float32)
    sample = AudioDecoder(fallback=lambda p: (make(audio), 8000))(path)
    expected = make(audio).reshape(-1)
    assert sample["audio"].is_contiguous() and sample["audio"].tolist() == expected.tolist()
    sample["audio"][0] = -1.0  # writable, and none of the reader's array


# -- crop_seconds range ----------------------------------------------------------------------------

@pytest.mark.parametrize("seconds", [1e9, 1e300, 86400.5, float("nan"), float("-inf"), -1.0])
def test_crop_seconds_out_of_range_is_refused_up_front(seconds):
    with pytest.raises(ValueError, match=r"crop_seconds must be None or a number of seconds > 0 and <= 86400"
                                         rf".*got {re.escape(repr(seconds))}"):
        AudioDecoder(crop_seconds=seconds)


def test_crop_seconds_of_one_day_is_accepted():
    assert AudioDecoder(crop_seconds=86400).crop_seconds == 86400


def test_choices_come_from_the_literal_types():
    # One list per option: the Literal type annotates it and the check reads it (typing.get_args).
    assert get_args(CropMode) == ("random", "start", "center")
    assert get_args(Quality) == ("QQ", "LQ", "MQ", "HQ", "VHQ")
    for crop in get_args(CropMode):
        assert AudioDecoder(crop=crop).crop == crop
    for quality in get_args(Quality):
        assert AudioDecoder(quality=quality).quality == quality


def test_yaml_crop_seconds_has_the_same_range(tmp_path):
    from audiobuffer import ConfigError
    from audiobuffer.config import build_decoder, parse_config

    write_tone(tmp_path / "a.wav", seconds=0.1, sample_rate=8000)
    with pytest.raises(ConfigError, match=r"decode\.crop_seconds.*86400"):
        parse_config({"source": {"root": str(tmp_path)}, "decode": {"crop_seconds": 1e9}})
    config = parse_config({"source": {"root": str(tmp_path)}, "decode": {"crop_seconds": 86400}})
    assert build_decoder(config).crop_seconds == 86400


# -- fallback errors and warnings ------------------------------------------------------------------

class Undecodable(Exception):
    """No reader could make sense of the file."""


@pytest.mark.parametrize("raised, reason", [
    (ValueError(), "ValueError: (no message)"),
    (Undecodable(), "Undecodable: No reader could make sense of the file."),
    (RuntimeError("  "), "RuntimeError: (no message)"),
    (OSError("disk on fire"), "OSError: disk on fire"),
])
def test_the_fallback_reason_is_never_empty(tmp_path, raised, reason):
    path = tmp_path / "bad.bin"
    path.write_bytes(b"no header")

    def fail(p):
        raise raised

    with pytest.raises(DecodeError) as info:
        AudioDecoder(fallback=fail)(path)
    assert str(info.value).endswith("fallback reader: " + reason)
    assert info.value.__cause__ is raised


def test_librosa_fallback_failure_names_a_reason_and_prints_no_warning(tmp_path):
    pytest.importorskip("librosa")
    bad = tmp_path / "noise.wav"
    bad.write_bytes(b"this is not audio" * 10)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with pytest.raises(DecodeError) as info:
            AudioDecoder()(bad)
    assert not [str(w.message) for w in shown], "librosa's warnings reached the user"
    message = str(info.value)
    assert re.search(r"noise\.wav.*soundfile: .*Format not recognised.*; fallback reader: librosa: \w+: \S", message)
    assert not message.rstrip().endswith(":"), message


@pytest.mark.subprocess
def test_a_broken_file_prints_no_librosa_warning_in_a_plain_process(tmp_path):
    """Outside pytest's warning filters, as `audiobuffer run` meets it."""
    pytest.importorskip("librosa")
    bad = tmp_path / "noise.wav"
    bad.write_bytes(b"this is not audio" * 10)
    code = ("import sys\nfrom audiobuffer import AudioDecoder, DecodeError\n"
            "for _ in range(3):\n"
            "    try:\n        AudioDecoder()(sys.argv[1])\n"
            "    except DecodeError as exc:\n        print('error:', exc)\n")
    run = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("error: cannot decode") == 3
    assert "Warning" not in run.stderr, run.stderr


def test_quiet_warnings_gate_survives_overlapping_threads(monkeypatch):
    """Two threads inside the gate, leaving in the order catch_warnings gets wrong; others unaffected."""
    from audiobuffer.decoders.audio import _WarningGate

    delivered = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kw: delivered.append(str(message)))
    original = warnings.showwarning
    gate = _WarningGate()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    caught = {}

    def a():
        with gate.capture() as mine:
            a_in.set()
            b_in.wait(10)
            warnings.warn_explicit("from a", UserWarning, "a.py", 1)
        caught["a"] = mine
        a_out.set()

    def b():
        a_in.wait(10)
        with gate.capture() as mine:
            b_in.set()
            a_out.wait(10)
            warnings.warn_explicit("from b", UserWarning, "b.py", 1)
        caught["b"] = mine

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        for t in threads:
            t.start()
        a_in.wait(10)
        warnings.warn_explicit("from main", UserWarning, "main.py", 1)  # while the gate is installed
        for t in threads:
            t.join(10)
            assert not t.is_alive()
        assert warnings.showwarning is original
    assert caught == {"a": ["UserWarning: from a"], "b": ["UserWarning: from b"]}
    assert delivered == ["from main"]
