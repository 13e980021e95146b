"""The native WAV reader (audiobuffer/decoders/_wav.py) against libsndfile, file by file.

The oracle is python-soundfile itself: wherever the reader answers, its float32 samples must equal
``soundfile.read(..., dtype="float32")`` bit for bit, and wherever libsndfile would fail or do
something the reader does not copy, the reader must decline (return None) so that AudioDecoder goes to
libsndfile and its errors stay the same.
"""

import copy
import io
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audiobuffer import AudioDecoder, DecodeError, WorkItem
from audiobuffer.decoders import _wav, _wav_header
from audiobuffer.decoders import audio as audio_module

SUBTYPES = ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE"]
DECLINED_SUBTYPES = ["ULAW", "ALAW", "IMA_ADPCM", "MS_ADPCM", "GSM610", "G721_32", "NMS_ADPCM_16"]
PCM_GUID_TAIL = b"\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"


# -- building files ---------------------------------------------------------------------------------

def chunk(cid: bytes, payload: bytes, pad: bool = True) -> bytes:
    """A RIFF chunk, with the pad byte after an odd payload unless ``pad`` is False."""
    return cid + struct.pack("<I", len(payload)) + payload + (b"\0" if pad and len(payload) & 1 else b"")


def fmt(tag=1, channels=1, rate=8000, bits=16, block_align=None, extra=b"") -> bytes:
    width = (bits + 7) // 8
    block_align = channels * width if block_align is None else block_align
    return chunk(b"fmt ",
                 struct.pack("<HHIIHH", tag, channels, rate, rate * block_align & 0xFFFFFFFF, block_align, bits)
                 + extra)


def fmt_ext(sub=1, channels=2, rate=8000, bits=16, valid=None, tail=PCM_GUID_TAIL) -> bytes:
    ext = struct.pack("<HHI", 22, bits if valid is None else valid, 3) + struct.pack("<I", sub) + tail
    return fmt(0xFFFE, channels, rate, bits, extra=ext)


def riff(*chunks: bytes, riff_size=None, magic=b"RIFF") -> bytes:
    body = b"WAVE" + b"".join(chunks)
    return magic + struct.pack("<I", len(body) if riff_size is None else riff_size) + body


def pcm16(frames=10, channels=1, seed=0) -> bytes:
    return np.random.default_rng(seed).integers(-2**15, 2**15, (frames, channels)).astype("<i2").tobytes()


def sf_bytes(data, rate=8000, subtype="PCM_16", fmt_name="WAV", **kw) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, data, rate, subtype=subtype, format=fmt_name, **kw)
    return buf.getvalue()


def noise(frames, channels, seed=0):
    """Full-scale float64 noise with both extremes, so every scaling is tested at its limits."""
    data = np.random.default_rng(seed).uniform(-1, 1, (frames, channels))
    if frames >= 2:
        data[0], data[-1] = -1.0, 1.0
    return data


def libsndfile(path_or_bytes, start=0, frames=-1):
    """What python-soundfile reads (float32, 2-D), or the exception it raises."""
    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    try:
        with sf.SoundFile(src) as f:
            if start:
                f.seek(start)
            return f.read(frames, dtype="float32", always_2d=True), f.samplerate
    except Exception as exc:
        return exc


def assert_same_as_libsndfile(data: bytes, tmp_path: Path, *, must_read=True):
    """The reader reads ``data`` (as bytes and as a file) exactly as libsndfile does, or declines."""
    path = tmp_path / "x.wav"
    path.write_bytes(data)
    got, got_path = _wav.read_wav(data), _wav.read_wav(path)
    assert (got is None) == (got_path is None)
    ref = libsndfile(path)
    if got is None:
        assert not must_read, f"declined a file libsndfile reads as {ref!r:.80}"
        return None
    assert not isinstance(ref, Exception), f"read a file libsndfile fails on: {ref}"
    for audio, rate in (got, got_path):
        assert audio.dtype == np.float32 and audio.flags.c_contiguous and audio.ndim == 2
        assert rate == ref[1]
        np.testing.assert_array_equal(audio, ref[0])
    return got


# -- every layout soundfile writes ------------------------------------------------------------------

@pytest.mark.parametrize("container", ["WAV", "WAVEX", "RF64"])
@pytest.mark.parametrize("subtype", SUBTYPES)
@pytest.mark.parametrize("channels", [1, 2, 6])
def test_every_subtype_and_container_equals_libsndfile(tmp_path, container, subtype, channels):
    data = sf_bytes(noise(1001, channels), 22050, subtype, container)  # odd frame count: odd data sizes
    audio, rate = assert_same_as_libsndfile(data, tmp_path)
    assert audio.shape == (1001, channels) and rate == 22050
    info = _wav.read_wav_info(data)
    ref = sf.info(io.BytesIO(data))
    assert (info.frames, info.channels, info.samplerate, info.subtype, info.container) == (
        ref.frames, ref.channels, ref.samplerate, ref.subtype, ref.format)
    assert _wav.read_wav_info(tmp_path / "x.wav") == info


@pytest.mark.parametrize("subtype", ["PCM_16", "PCM_32"])
def test_integers_at_their_limits(tmp_path, subtype):
    """Every int16, and int32 values around float32's rounding steps, scale as libsndfile scales them."""
    if subtype == "PCM_16":
        ints = np.arange(-2**15, 2**15, dtype="<i2")
    else:
        around = np.array([2**24, 2**25 + 1, 2**30 + 64, 2**31 - 128, 2**31 - 64, 2**31 - 1], np.int64)
        ints = np.concatenate([around + d for d in range(-3, 1)] + [-around, [-2**31, 0, 1, -1]])
        ints = np.concatenate([ints, np.random.default_rng(0).integers(-2**31, 2**31, 10000)])
        ints = ints.clip(-2**31, 2**31 - 1).astype("<i4")
    data = riff(fmt(bits=ints.itemsize * 8), chunk(b"data", ints.tobytes()))
    audio, _ = assert_same_as_libsndfile(data, tmp_path)
    assert len(audio) == len(ints)


def test_float_values_are_kept_as_stored(tmp_path):
    values = np.array([0.0, -0.0, 1.5, -7.25, 1e-40, np.inf, -np.inf, np.nan, 3e38], "<f4")
    audio, _ = assert_same_as_libsndfile(riff(fmt(3, bits=32), chunk(b"data", values.tobytes())), tmp_path)
    np.testing.assert_array_equal(audio[:, 0], values)
    doubles = np.array([0.1, 1e300, -1e300, 1e-320, np.nan, 2.0 ** -30], "<f8")
    with np.errstate(over="ignore"):
        expected = doubles.astype(np.float32)
    audio, _ = assert_same_as_libsndfile(riff(fmt(3, bits=64), chunk(b"data", doubles.tobytes())), tmp_path)
    np.testing.assert_array_equal(audio[:, 0], expected)


@pytest.mark.parametrize("subtype", DECLINED_SUBTYPES)
def test_codecs_go_to_libsndfile(subtype):
    data = sf_bytes(noise(800, 1), 8000, subtype, "WAV")
    assert _wav.read_wav(data) is None and _wav.read_wav_info(data) is None


@pytest.mark.parametrize("container", ["WAVEX", "RF64"])
@pytest.mark.parametrize("subtype", ["ULAW", "ALAW"])
def test_extensible_codecs_go_to_libsndfile(container, subtype):
    assert _wav.read_wav(sf_bytes(noise(100, 2), 8000, subtype, container)) is None


def test_big_endian_rifx_goes_to_libsndfile():
    data = sf_bytes(noise(100, 1), 8000, "PCM_16", "WAV", endian="BIG")
    assert data[:4] == b"RIFX" and _wav.read_wav(data) is None


# -- odd chunks, odd sizes, truncation -----------------------------------------------------------------

def test_odd_chunks_before_and_after_data(tmp_path):
    pcm = pcm16(101, 2)
    info_list = chunk(b"LIST", b"INFO" + chunk(b"ISFT", b"Lavf58.76.100\0") + chunk(b"INAM", b"odd"))
    layouts = {
        "junk": [fmt(channels=2), chunk(b"JUNK", b"\0" * 27), chunk(b"data", pcm)],
        "list before": [fmt(channels=2), info_list, chunk(b"data", pcm)],
        "unknown, fact, odd": [chunk(b"abcd", b"123"), fmt(channels=2), chunk(b"fact", b"\x65\0\0\0"),
                               chunk(b"xyz!", b"1"), chunk(b"data", pcm)],
        "after data": [fmt(channels=2), chunk(b"data", pcm), info_list, chunk(b"id3 ", b"\1" * 33)],
        "bext, cue, PEAK": [fmt(channels=2), chunk(b"bext", b"\0" * 602),
                            chunk(b"cue ", struct.pack("<I", 1) + b"\0" * 24),
                            chunk(b"PEAK", b"\0" * (8 + 8 * 2)), chunk(b"data", pcm)],
        "big chunk before": [fmt(channels=2), chunk(b"JUNK", b"\0" * 100001), chunk(b"data", pcm)],
        "fmt with extra bytes": [fmt(channels=2, extra=b"\0\0"), chunk(b"data", pcm)],
    }
    for name, chunks in layouts.items():
        audio, _ = assert_same_as_libsndfile(riff(*chunks), tmp_path)
        assert audio.shape == (101, 2), name


def test_list_chunks_written_by_libsndfile_before_and_after_data(tmp_path):
    for when in ("start", "end"):
        path = tmp_path / f"{when}.wav"
        with sf.SoundFile(path, "w", 8000, 2, "PCM_24") as f:
            if when == "start":
                f.title = "a title"
            f.write(noise(999, 2))
            if when == "end":
                f.title, f.artist = "a title!", "x"
        assert b"LIST" in path.read_bytes()
        audio, _ = assert_same_as_libsndfile(path.read_bytes(), tmp_path)
        assert audio.shape == (999, 2)


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_24"])
def test_odd_data_size_with_and_without_its_pad_byte(tmp_path, subtype):
    width = {"PCM_U8": 1, "PCM_24": 3}[subtype]
    raw = np.random.default_rng(1).integers(0, 256, 9 * width).astype(np.uint8).tobytes()  # odd size
    for tail in (b"", b"\0", b"\0" + chunk(b"JUNK", b"abcd")):
        audio, _ = assert_same_as_libsndfile(riff(fmt(bits=8 * width), chunk(b"data", raw, pad=False) + tail),
                                             tmp_path)
        assert len(audio) == 9


def test_zero_length_data(tmp_path):
    for chunks in ([fmt(), chunk(b"data", b"")], [fmt(), chunk(b"data", b""), chunk(b"JUNK", b"1234")]):
        audio, _ = assert_same_as_libsndfile(riff(*chunks), tmp_path)
        assert audio.shape == (0, 1)


def test_unclosed_file_reads_to_the_end_like_libsndfile(tmp_path):
    pcm = pcm16(50)
    data = riff(fmt(), b"data" + struct.pack("<I", 0) + pcm, riff_size=8)  # a writer that never closed
    audio, _ = assert_same_as_libsndfile(data, tmp_path)
    assert len(audio) == 50


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 100, 301])
def test_truncated_data_is_read_as_far_as_it_goes(tmp_path, cut):
    """libsndfile sizes a truncated data chunk from the file (README: what libsndfile does with odd files)."""
    whole = sf_bytes(noise(200, 3), 8000, "PCM_24", "WAV")  # 9-byte frames: cuts land mid-frame
    data = whole[:-cut]
    audio, _ = assert_same_as_libsndfile(data, tmp_path)
    assert _wav.read_wav_info(data).frames == sf.info(io.BytesIO(data)).frames == len(audio)
    assert len(audio) == 200 - -(-cut // 9)


def test_truncated_rf64_is_read_as_far_as_it_goes(tmp_path):
    data = sf_bytes(noise(300, 2), 8000, "PCM_16", "RF64")[:-101]
    audio, _ = assert_same_as_libsndfile(data, tmp_path)
    assert len(audio) == 300 - 26


def test_twelve_and_twenty_bit_samples_sit_in_16_and_24_bit_containers(tmp_path):
    for bits, container in ((12, 2), (20, 3), (5, 1)):
        raw = np.random.default_rng(bits).integers(0, 256, 30 * container).astype(np.uint8).tobytes()
        audio, _ = assert_same_as_libsndfile(riff(fmt(bits=bits), chunk(b"data", raw)), tmp_path)
        assert len(audio) == 30


def test_extensible_with_fewer_valid_bits(tmp_path):
    pcm = np.random.default_rng(2).integers(-2**23, 2**23, 40).astype("<i4")
    raw = b"".join(int(v).to_bytes(4, "little", signed=True)[:3] for v in pcm)
    data = riff(fmt_ext(1, channels=1, bits=24, valid=20), chunk(b"data", raw))
    assert _wav.read_wav_info(data).container == "WAVEX"
    assert_same_as_libsndfile(data, tmp_path)


# -- crops: only the window is read ---------------------------------------------------------------------

@pytest.mark.parametrize("subtype", SUBTYPES)
def test_crops_at_the_edges_equal_libsndfile(tmp_path, subtype):
    path = tmp_path / "long.wav"
    sf.write(path, noise(30000, 2), 16000, subtype=subtype)  # more than the whole-file read
    total = sf.info(path).frames
    for start, frames in [(0, 1), (0, total), (total - 1, 1), (total - 7, 100), (total, 5), (1234, 0),
                          (5, None), (29999, None), (40000, 10)]:
        got, rate = _wav.read_wav(path, start, frames)
        if start > total:  # libsndfile refuses to seek there; the reader reads nothing
            ref = np.zeros((0, 2), np.float32)
        else:
            ref, _ = libsndfile(path, start, -1 if frames is None else frames)
        assert rate == 16000
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(_wav.read_wav(path.read_bytes(), start, frames)[0], ref)


def test_window_callable_picks_the_frames(tmp_path):
    path = tmp_path / "w.wav"
    sf.write(path, noise(5000, 1), 8000, subtype="PCM_16")
    seen = []

    def window(frames, rate):
        seen.append((frames, rate))
        return 4000, 1000

    got, _ = _wav.read_wav(path, window=window)
    assert seen == [(5000, 8000)]
    np.testing.assert_array_equal(got, libsndfile(path, 4000, 1000)[0])
    assert _wav.read_wav(b"not a wav at all", window=window) is None and len(seen) == 1


def test_a_crop_reads_the_head_and_the_window_only(tmp_path, monkeypatch):
    path = tmp_path / "ramp.wav"
    sf.write(path, (np.arange(80000) / 80000).astype(np.float32), 8000, subtype="FLOAT")
    reads = []
    os_read = os.read

    def counting_read(fd, n):
        data = os_read(fd, n)
        reads.append(("read", len(data)))
        return data

    class CountingFile(io.FileIO):
        def read(self, n=-1):
            data = super().read(n)
            reads.append(("file.read", len(data)))
            return data

        def readinto(self, b):
            n = super().readinto(b)
            reads.append(("file.readinto", n))
            return n

    monkeypatch.setattr(os, "read", counting_read)
    monkeypatch.setattr(_wav, "open", lambda fd, mode, buffering, closefd: CountingFile(fd, mode, closefd=closefd),
                        raising=False)
    sample = AudioDecoder(crop_seconds=0.5, crop="center")(path)
    assert reads == [("read", _wav._HEAD), ("file.readinto", 4000 * 4)]  # the first 64 KiB, then the crop
    assert round(float(sample["audio"][0]) * 80000) == 38000


def test_a_large_file_read_whole_reads_its_first_64_kib_once(tmp_path, monkeypatch):
    path = tmp_path / "long.wav"
    sf.write(path, noise(80000, 1), 8000, subtype="FLOAT")
    reads = []
    os_read = os.read

    def counting_read(fd, n):
        data = os_read(fd, n)
        reads.append(("read", len(data)))
        return data

    class CountingFile(io.FileIO):
        def readinto(self, b):
            n = super().readinto(b)
            reads.append(("file.readinto", n))
            return n

    monkeypatch.setattr(os, "read", counting_read)
    monkeypatch.setattr(_wav, "open", lambda fd, mode, buffering, closefd: CountingFile(fd, mode, closefd=closefd),
                        raising=False)
    audio, _ = _wav.read_wav(path)
    size = path.stat().st_size
    assert reads == [("read", _wav._HEAD), ("file.readinto", size - _wav._HEAD)]  # the rest, not the head again
    monkeypatch.undo()
    np.testing.assert_array_equal(audio, libsndfile(path)[0])


def test_a_small_file_is_read_whole_in_one_read_and_one_more_at_its_end(tmp_path, monkeypatch):
    path = tmp_path / "short.wav"
    sf.write(path, noise(1000, 2), 8000, subtype="PCM_16")
    reads = []
    os_read = os.read

    def counting_read(fd, n):
        data = os_read(fd, n)
        reads.append(len(data))
        return data

    monkeypatch.setattr(os, "read", counting_read)
    audio, rate = _wav.read_wav(path)
    assert reads == [44 + 4000, 0] and rate == 8000
    np.testing.assert_array_equal(audio, libsndfile(path)[0])


def test_negative_start_or_frames_is_an_error(tmp_path):
    data = riff(fmt(), chunk(b"data", pcm16(10)))
    with pytest.raises(ValueError, match="start and frames must be >= 0"):
        _wav.read_wav(data, -1)
    with pytest.raises(ValueError, match="start and frames must be >= 0"):
        _wav.read_wav(data, 0, -5)


def test_is_wav_path():
    assert all(map(_wav.is_wav_path, ["a.wav", "B.WAV", "c.Wave", "/x.y/.wav"]))
    assert not any(map(_wav.is_wav_path, ["a.flac", "wav", "a.wav.gz", "a.wv", "a_wave"]))


# -- malformed headers keep libsndfile's errors ---------------------------------------------------------

MALFORMED = {
    "no data chunk": riff(fmt()),
    "data before fmt": riff(chunk(b"data", pcm16(4)), fmt()),
    "short fmt": riff(chunk(b"fmt ", b"\1\0\1\0"), chunk(b"data", pcm16(4))),
    "second fmt": riff(fmt(), fmt(channels=2), chunk(b"data", pcm16(4))),
    "second data": riff(fmt(), chunk(b"data", pcm16(4)), chunk(b"data", pcm16(8))),
    "zero channels": riff(fmt(channels=0, block_align=2), chunk(b"data", pcm16(4))),
    "block align 4 for 16-bit mono": riff(fmt(block_align=4), chunk(b"data", pcm16(4))),
    "24-bit in 32-bit blocks": riff(fmt(bits=24, block_align=4), chunk(b"data", pcm16(4))),
    "zero rate": riff(fmt(rate=0), chunk(b"data", pcm16(4))),
    "rate past 2**31": riff(fmt(rate=2**31 + 5), chunk(b"data", pcm16(4))),
    "36-bit": riff(fmt(bits=36), chunk(b"data", b"\0" * 20)),
    "float16": riff(fmt(3, bits=16), chunk(b"data", pcm16(4))),
    "unknown tag": riff(fmt(0x1234), chunk(b"data", pcm16(4))),
    "extensible too short": riff(fmt(0xFFFE, extra=b"\0\0"), chunk(b"data", pcm16(4))),
    "extensible unknown guid": riff(fmt_ext(9, channels=1), chunk(b"data", pcm16(4))),
    "PEAK of the wrong size": riff(fmt(), chunk(b"PEAK", b"\0" * 12), chunk(b"data", pcm16(4))),
    "PEAK before fmt": riff(chunk(b"PEAK", b"\0" * 16), fmt(), chunk(b"data", pcm16(4))),
    "bad PEAK after data": riff(fmt(), chunk(b"data", pcm16(4)), chunk(b"PEAK", b"\0" * 12)),
    "wavpack in data": riff(fmt(), chunk(b"data", b"wvpk" + pcm16(4))),
    "unprintable marker": riff(fmt(), chunk(b"\x01\x02\x03\x04", b"12"), chunk(b"data", pcm16(4))),
    "chunk past the end": riff(fmt(), b"JUNK" + struct.pack("<I", 1000) + b"x" * 10),
    "smpl chunk": riff(fmt(), chunk(b"smpl", b"\0" * 36), chunk(b"data", pcm16(4))),
    "LIST with data inside": riff(fmt(), chunk(b"LIST", b"INFO" + chunk(b"data", b"abcd")),
                                  chunk(b"data", pcm16(4))),
    "LIST that does not tile": riff(fmt(), chunk(b"LIST", b"INFO" + chunk(b"INAM", b"abc", pad=False)),
                                    chunk(b"data", pcm16(4))),
    "LIST of an unknown kind": riff(fmt(), chunk(b"LIST", b"wavl" + chunk(b"data", b"ab")),
                                    chunk(b"data", pcm16(4))),
    "RIFF only": b"RIFF\4\0\0\0WAVE",
    "not WAVE": riff(fmt(), chunk(b"data", pcm16(4)))[:8] + b"AVI " + riff(fmt())[12:],
    "garbage": b"this is not audio" * 10,
    "empty": b"",
    "RF64 without ds64": riff(fmt(), chunk(b"data", pcm16(4)), magic=b"RF64"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_headers_are_left_to_libsndfile(tmp_path, name):
    """The reader declines, so AudioDecoder reports exactly what libsndfile reports."""
    data = MALFORMED[name]
    assert _wav.read_wav(data) is None and _wav.read_wav_info(data) is None
    path = tmp_path / "bad.wav"
    path.write_bytes(data)
    assert _wav.read_wav(path) is None
    native, plain = decode_both(AudioDecoder(fallback=None), str(path))
    assert same_result(native, plain)


def test_a_missing_file_is_declined(tmp_path):
    assert _wav.read_wav(tmp_path / "gone.wav") is None and _wav.read_wav_info(tmp_path / "gone.wav") is None


# -- AudioDecoder: the same samples with the native path on and off ---------------------------------------

def decode_both(decoder, item):
    """``decoder(item)`` with the native WAV path on, then off: each a sample or the exception raised."""
    results = []
    for native in (True, False):
        twin = copy.copy(decoder)
        twin.native_wav = native
        try:
            results.append(twin(item))
        except DecodeError as exc:
            results.append(exc)
    return results


def same_result(a, b) -> bool:
    if isinstance(a, Exception) or isinstance(b, Exception):
        return type(a) is type(b) and str(a) == str(b)
    return (a.keys() == b.keys() and torch.equal(a["audio"], b["audio"])
            and all(a[k] == b[k] for k in a if k != "audio"))


DECODERS = [
    AudioDecoder(),
    AudioDecoder(mono=False),
    AudioDecoder(sample_rate=16000, crop_seconds=0.05, crop="random"),
    AudioDecoder(mono=False, crop_seconds=0.02, crop="center", pad=False),
    AudioDecoder(crop_seconds=10.0, crop="start"),
]


@pytest.mark.parametrize("subtype", SUBTYPES)
@pytest.mark.parametrize("channels", [1, 2, 6])
def test_audio_decoder_samples_equal_with_native_path_on_and_off(tmp_path, subtype, channels):
    path = tmp_path / "x.wav"
    sf.write(path, noise(3001, channels), 22050, subtype=subtype)
    for decoder in DECODERS:
        for index in range(3):
            item = WorkItem(index=index, path=str(path), seed=7)
            native, plain = decode_both(decoder, item)
            assert not isinstance(native, Exception) and same_result(native, plain), (decoder, index)


def test_audio_decoder_uses_the_native_path_for_wav(tmp_path, monkeypatch):
    wav = tmp_path / "a.WAV"
    sf.write(wav, noise(800, 2), 8000, subtype="PCM_16")

    def no_libsndfile(*args, **kwargs):
        raise RuntimeError("libsndfile was asked")

    monkeypatch.setattr(audio_module.sf, "SoundFile", no_libsndfile)
    sample = AudioDecoder(fallback=None)(wav)
    assert sample["audio"].shape == (800,)
    with pytest.raises(DecodeError, match="libsndfile was asked"):
        AudioDecoder(fallback=None, native_wav=False)(wav)


def test_truncated_wav_gives_the_same_sample_as_libsndfile(tmp_path):
    path = tmp_path / "cut.wav"
    path.write_bytes(sf_bytes(noise(8000, 2), 8000, "PCM_16", "WAV")[:-1001])
    for decoder in DECODERS:
        for index in range(4):
            native, plain = decode_both(decoder, WorkItem(index=index, path=str(path), seed=3))
            assert same_result(native, plain)


# -- random damage: whatever the reader accepts, libsndfile reads the same ------------------------------

BASES = [sf_bytes(noise(n, ch, seed=n), 8000, sub, container)
         for n, ch, sub, container in [(23, 1, "PCM_16", "WAV"), (17, 2, "PCM_24", "WAVEX"),
                                       (9, 3, "FLOAT", "RF64"), (31, 1, "PCM_U8", "WAV"),
                                       (12, 2, "DOUBLE", "WAV"), (8, 1, "PCM_32", "RF64")]]
EXTRA_CHUNKS = [chunk(b"LIST", b"INFO" + chunk(b"ISFT", b"abc")), chunk(b"JUNK", b"x" * 7),
                chunk(b"fact", b"\1\0\0\0"), chunk(b"PEAK", b"\0" * 16), chunk(b"data", b"\0" * 6),
                chunk(b"cue ", b"\0" * 4), chunk(b"\x00abc", b"12"), chunk(b"smpl", b"\0" * 40)]


@st.composite
def damaged_wavs(draw):
    data = bytearray(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["byte", "word", "cut", "chunk", "tail"]))
        if kind == "byte":
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif kind == "word" and len(data) >= 8:
            at = draw(st.integers(4, min(len(data), 120) - 4))
            value = draw(st.sampled_from([0, 1, 3, 4, 8, 16, 44, 2**31, 0xFFFF0000, 0xFFFFFFFF]))
            struct.pack_into("<I", data, at, value)
        elif kind == "cut":
            data = data[:draw(st.integers(0, len(data)))]
        elif kind == "chunk":
            at = draw(st.sampled_from([12, len(data)] + [i for i in range(12, len(data) - 4)
                                                        if data[i:i + 4] in (b"data", b"fact", b"PEAK")]))
            data[at:at] = draw(st.sampled_from(EXTRA_CHUNKS))
        else:
            data += bytes(draw(st.integers(0, 9)))
        if not data:
            break
    return bytes(data)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(damaged_wavs())
def test_damaged_files_are_read_as_libsndfile_reads_them_or_declined(tmp_path, data):
    assert_same_as_libsndfile(data, tmp_path, must_read=False)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(damaged_wavs())
def test_the_plain_header_shortcut_agrees_with_the_chunk_walk(data):
    reader = _wav_header.Reader(data, len(data))
    plain = _wav_header._plain(reader)
    if plain is not None:  # the shortcut answers only for files the walk reads the same way
        assert plain == _wav_header._walk(reader)


def plain_header_cases():
    """Plain 44-byte headers at the edges of the shortcut, and whether it answers for each (else the walk)."""
    body = pcm16(10)
    yield riff(fmt(), chunk(b"data", body)), True
    yield riff(fmt(), chunk(b"data", body)) + b"wxyz", True  # 4 stray bytes: the walk stops there
    yield riff(fmt(), chunk(b"data", body)) + b"vwxyz", False  # 5: the walk looks for a chunk there
    yield riff(fmt(), chunk(b"data", body)) + chunk(b"LIST", b"INFO" + chunk(b"ISFT", b"ab")), False
    yield riff(fmt(bits=8, block_align=1), chunk(b"data", b"\x80" * 7)), True  # odd size, padded
    yield riff(fmt(bits=8, block_align=1), chunk(b"data", b"\x80" * 7, pad=False)), True
    yield riff(fmt(), chunk(b"data", b"")), False  # data size 0: maybe "to the end of the file"
    yield riff(fmt(tag=6, bits=8, block_align=1), chunk(b"data", body)), False  # A-law
    yield riff(fmt(), chunk(b"data", b"wvpk" + body)), False
    yield riff(fmt(), chunk(b"data", body))[:50], True  # truncated data
    yield riff(fmt(), chunk(b"data", body))[:44], True  # no data at all


@pytest.mark.parametrize("data, shortcut", list(plain_header_cases()))
def test_the_plain_header_shortcut_at_its_edges(data, shortcut):
    reader = _wav_header.Reader(data, len(data))
    assert (_wav_header._plain(reader) is not None) == shortcut
    assert _wav_header.parse(reader) == _wav_header._walk(reader)


def test_the_plain_header_shortcut_is_taken_for_a_plain_file():
    data = riff(fmt(channels=2), chunk(b"data", pcm16(10, channels=2)))
    info = _wav_header._plain(_wav_header.Reader(data, len(data)))
    assert info == _wav_header.WavInfo(10, 2, 8000, "PCM_16", "WAV", 44, 4)


# -- real files ------------------------------------------------------------------------------------------

def test_every_wav_in_audio_formats(audio_formats, tmp_path):
    files = sorted(p for p in audio_formats.rglob("*") if p.suffix.lower() in (".wav", ".wave"))
    assert len(files) >= 25
    read, declined = [], []
    for path in files:
        data = path.read_bytes()
        ref = libsndfile(path)
        must_read = (not isinstance(ref, Exception) and data[:4] in (b"RIFF", b"RF64")
                     and sf.info(path).subtype in SUBTYPES and "inconsistent" not in path.name)
        got = assert_same_as_libsndfile(data, tmp_path, must_read=must_read)
        (read if got is not None else declined).append(path.name)
        native, plain = decode_both(AudioDecoder(fallback=None), str(path))
        assert same_result(native, plain), path
    assert "test-44100Hz-le-1ch-4bytes-early-eof.wav" in read  # truncated: 236 frames, as libsndfile
    assert "test-8000Hz-le-3ch-5S-24bit-rf64.wav" in read and "real_8ch.wav" in read
    assert "test-8000Hz-le-1ch-1byte-ulaw.wav" in declined and "test-8000Hz-be-3ch-5S-24bit.wav" in declined


def test_every_fsdd_file_equals_libsndfile(fsdd):
    files = sorted(fsdd.glob("*.wav"))
    assert len(files) == 3000
    decoder = AudioDecoder(sample_rate=16000, crop_seconds=0.25, crop="random")
    for i, path in enumerate(files):
        audio, rate = _wav.read_wav(path)
        ref, ref_rate = sf.read(path, dtype="float32", always_2d=True)
        assert rate == ref_rate and audio.shape == ref.shape, path
        np.testing.assert_array_equal(audio, ref, err_msg=str(path))
        if i % 10 == 0:  # the whole decoder on every tenth file
            native, plain = decode_both(decoder, WorkItem(index=i, path=str(path), seed=1))
            assert same_result(native, plain), path


def test_a_window_past_the_end_reads_what_there_is(tmp_path):
    path = tmp_path / "short.wav"
    sf.write(path, noise(100, 1), 8000, subtype="PCM_16")
    for source in (path, path.read_bytes()):
        audio, _ = _wav.read_wav(source, window=lambda frames, sr: (90, 50))
        np.testing.assert_array_equal(audio, libsndfile(path)[0][90:])
        audio, _ = _wav.read_wav(source, window=lambda frames, sr: (500, 10))
        assert audio.shape == (0, 1)


def test_a_strided_view_a_negative_window_and_a_signalling_nan():
    data = riff(fmt(), chunk(b"data", pcm16(10)))
    doubled = np.frombuffer(data, np.uint8).repeat(2)
    audio, rate = _wav.read_wav(memoryview(doubled)[::2])  # a strided view: copied, then read
    np.testing.assert_array_equal(audio, _wav.read_wav(data)[0])
    with pytest.raises(ValueError, match="the window gave start=-5"):
        _wav.read_wav(data, window=lambda frames, sr: (-5, 10))
    snan = riff(fmt(tag=3, bits=64), chunk(b"data", b"\x01\0\0\0\0\0\xf0\x7f" + struct.pack("<d", 0.5)))
    with np.errstate(all="raise"):
        audio, _ = _wav.read_wav(snan)  # a signalling NaN becomes a NaN, as libsndfile's cast gives, no error
    assert np.isnan(audio[0, 0]) and audio[1, 0] == 0.5
