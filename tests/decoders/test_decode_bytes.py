"""AudioDecoder on work items that carry their bytes (``WorkItem.read``): shard members, remote objects."""

from __future__ import annotations

import csv

import pytest
import torch
from helpers import AUDIO_FORMATS, write_tone

from audiobuffer import AudioDecoder, DecodeError, WorkItem
from audiobuffer.decoders import audio as audio_module


def _rows():
    manifest = AUDIO_FORMATS / "MANIFEST.tsv"
    if not manifest.is_file():
        return []
    with open(manifest, newline="", encoding="utf-8") as f:
        return list(csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t"))


def _from_bytes(path, data, *, index=0, **kwargs):
    return WorkItem(index=index, path=str(path), read=lambda: data, **kwargs)


def _outcome(decode, item):
    try:
        return decode(item)
    except DecodeError as exc:
        return exc


@pytest.mark.shared_data
@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["path"])
def test_every_format_decodes_the_same_from_bytes(audio_formats, row):
    """WAV (native reader), FLAC, OGG/Vorbis, Opus, MP3, NIST: the same samples from bytes as from the path."""
    path = audio_formats / row["path"]
    decode = AudioDecoder(mono=False, fallback=None)
    from_path = _outcome(decode, str(path))
    member = f"s3://bucket/shard-000000.tar/{row['path']}"  # no such file: only the bytes can be read
    from_bytes = _outcome(decode, _from_bytes(member, path.read_bytes()))
    if isinstance(from_path, Exception):  # files libsndfile cannot read fail from bytes too
        assert isinstance(from_bytes, DecodeError), from_bytes
        assert repr(member) in str(from_bytes)
        return
    assert not isinstance(from_bytes, Exception), from_bytes
    assert torch.equal(from_bytes["audio"], from_path["audio"])
    assert from_bytes["sample_rate"] == from_path["sample_rate"]


def test_bytes_are_read_in_place_of_the_path(tmp_path):
    """The item's path need not exist: the decoder reads the bytes, through no temporary file."""
    source = write_tone(tmp_path / "t.flac", seconds=0.2, sample_rate=8000)
    data = source.read_bytes()
    calls = []

    def read():
        calls.append(1)
        return data

    item = WorkItem(index=3, path="s3://bucket/shard-000000.tar/t.flac", read=read, label=1, label_name="x")
    sample = AudioDecoder(sample_rate=16000)(item)
    expected = AudioDecoder(sample_rate=16000)(str(source))
    assert calls == [1]
    assert torch.equal(sample["audio"], expected["audio"])
    assert sample["path"] == item.path and sample["label"] == 1 and sample["index"] == 3


def test_wav_bytes_native_reader_and_libsndfile_agree(tmp_path, monkeypatch):
    source = write_tone(tmp_path / "t.wav", seconds=0.3, sample_rate=8000, channels=2, subtype="PCM_24")
    data = source.read_bytes()
    decode = AudioDecoder(mono=False, crop_seconds=0.1, crop="random")
    expected = decode(WorkItem(index=5, path=str(source), seed=1))

    def no_libsndfile(*args, **kwargs):
        raise AssertionError("libsndfile was asked to read a WAV the native reader reads")

    with monkeypatch.context() as patch:  # the native reader, from bytes
        patch.setattr(audio_module.sf, "SoundFile", no_libsndfile)
        native = decode(_from_bytes("x/t.wav", data, index=5, seed=1))
    # libsndfile's virtual I/O, from bytes
    virtual = AudioDecoder(mono=False, crop_seconds=0.1, crop="random", native_wav=False)(
        _from_bytes("x/t.wav", data, index=5, seed=1))
    assert torch.equal(native["audio"], expected["audio"])
    assert torch.equal(virtual["audio"], expected["audio"])


def test_undecodable_bytes_name_the_item_and_skip_the_fallback(tmp_path):
    tried = []

    def fallback(path):
        tried.append(path)
        raise AssertionError("the fallback takes paths; it must not be tried for bytes")

    decode = AudioDecoder(fallback=fallback)
    with pytest.raises(DecodeError, match=r"cannot decode 'shard\.tar/bad\.flac'"):
        decode(_from_bytes("shard.tar/bad.flac", b"not audio at all"))
    assert tried == []


def test_a_failing_read_reaches_the_caller(tmp_path):
    from audiobuffer.errors import StorageError

    def read():
        raise StorageError("cannot read 's3://b/x.tar'", url="s3://b/x.tar", member="a.wav")

    with pytest.raises(StorageError, match="s3://b/x.tar"):
        AudioDecoder()(WorkItem(index=0, path="s3://b/x.tar/a.wav", read=read))
