"""Shards written by other tools, read as WebDataset reads them: every member of a sample other than its audio
is a field (``.cls``, ``.txt``, ``.json`` keys...), keys with dots, members in any order within a sample;
audiobuffer/sources/tar.py and stream.py. The shards are written by ``webdataset.ShardWriter`` itself where the
test says so, else by ``tarfile``."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from helpers import drain, write_tar

from audiobuffer import AudioDecoder, BufferedDataset, SourceError
from audiobuffer.sources import iter_shard, read_index
from audiobuffer.sources.tar import member_value, split_key

N = 12


def _audio(i: int, fmt: str) -> bytes:
    """A short tone whose length names the sample (800 + i frames at 8 kHz)."""
    out = io.BytesIO()
    t = np.arange(800 + i) / 8000
    sf.write(out, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 8000, format=fmt.upper(),
             subtype="PCM_16")
    return out.getvalue()




@pytest.fixture(scope="module")
def wds_shards(tmp_path_factory):
    """Two corpora written by webdataset.ShardWriter: .wav + .cls with dotted keys, .flac + .json."""
    webdataset = pytest.importorskip("webdataset", reason="webdataset writes these shards (pip install webdataset)")
    root = tmp_path_factory.mktemp("wds")
    with webdataset.ShardWriter(str(root / "cls-%06d.tar"), maxcount=5, verbose=0) as sink:
        for i in range(N):
            sink.write({"__key__": f"utt.{i:03d}", "wav": _audio(i, "wav"), "cls": i % 3})
    with webdataset.ShardWriter(str(root / "json-%06d.tar"), maxcount=5, verbose=0) as sink:
        for i in range(N):
            sink.write({"__key__": f"s{i:03d}", "flac": _audio(i, "flac"),
                        "json": {"label": "yes" if i % 2 else "no", "speaker": f"spk{i % 4}", "text": f"say {i}"}})
    return root


def test_shardwriter_cls_labels_and_dotted_keys(wds_shards):
    ds = BufferedDataset(str(wds_shards / "cls-{000000..000002}.tar"), AudioDecoder(), labels="cls",
                         num_producers=2, shuffle=True, seed=1)
    assert ds.classes == ["0", "1", "2"]
    samples = drain(ds)
    frames = sorted(s["audio"].shape[-1] - 800 for s in samples)
    assert frames == list(range(N))  # every sample once: the dotted keys did not merge samples
    for s in samples:
        i = s["audio"].shape[-1] - 800
        assert s["cls"] == i % 3 and s["label_name"] == str(i % 3) and ds.classes[s["label"]] == str(i % 3)
        assert s["path"].endswith(f"utt.{i:03d}.wav")


def test_shardwriter_json_keys_are_fields(wds_shards):
    ds = BufferedDataset(str(wds_shards / "json-*.tar"), AudioDecoder(), labels="label", num_producers=2)
    assert ds.classes == ["no", "yes"] and len(ds) == N
    samples = drain(ds)
    assert len(samples) == N
    for s in samples:
        i = s["audio"].shape[-1] - 800
        assert (s["speaker"], s["text"], s["label_name"]) == (f"spk{i % 4}", f"say {i}", "yes" if i % 2 else "no")


def test_a_custom_decoder_sees_every_field(wds_shards):
    seen = []

    def decoder(item):
        seen.append(dict(item.fields))
        return {"n": len(item.read())}

    drain(BufferedDataset(str(wds_shards / "json-*.tar"), decoder, labels="speaker", num_producers=1))
    assert len(seen) == N and all(set(f) == {"label", "speaker", "text"} for f in seen)


def test_the_fields_are_what_webdataset_itself_reads(wds_shards):
    webdataset = pytest.importorskip("webdataset")
    theirs = {s["__key__"]: s["json"] for s in webdataset.WebDataset(
        str(wds_shards / "json-{000000..000002}.tar"), shardshuffle=False).decode()}
    ours = {s["path"].rpartition("/")[2].partition(".")[0]: {k: s[k] for k in ("label", "speaker", "text")}
            for s in drain(BufferedDataset(str(wds_shards / "json-*.tar"), AudioDecoder(), num_producers=1))}
    assert len(theirs) == N and ours == theirs


def test_members_in_any_order_several_extensions_and_numbers(tmp_path):
    members = []
    for i in range(6):
        meta = [(f"k{i}.json", json.dumps({"speaker": f"s{i}", "gain": 0.5}).encode()),
                (f"k{i}.txt", f" word {i}\n".encode()), (f"k{i}.index", str(i).encode()),
                (f"k{i}.seconds.txt", b"0.1")]
        audio = (f"k{i}.wav", _audio(i, "wav"))
        members += [*meta, audio] if i % 2 else [audio, *reversed(meta)]
    shard = write_tar(tmp_path / "mixed.tar", members)
    samples = drain(BufferedDataset(str(shard), AudioDecoder(), labels="speaker", num_producers=2))
    assert len(samples) == 6
    for s in samples:
        i = s["audio"].shape[-1] - 800
        assert s["path"].endswith(f"k{i}.wav")
        assert (s["txt"], s["seconds.txt"], s["gain"]) == (f"word {i}", 0.1, 0.5)
        assert s["label_name"] == f"s{i}"


def test_a_label_field_missing_from_the_shards_names_the_fields(tmp_path):
    shard = write_tar(tmp_path / "a.tar", [("a.wav", _audio(0, "wav")), ("a.cls", b"1")])
    with pytest.raises(SourceError, match="cls"):
        BufferedDataset(str(shard), AudioDecoder(), labels="speaker")


def test_split_key_and_member_values():
    assert split_key("d/utt.000.wav") == ("d/utt", "000.wav")
    assert split_key("d/utt.000.wav", dotted=True) == ("d/utt.000", "wav")
    assert split_key("README", dotted=True) == ("README", "")
    assert [member_value(b) for b in (b"7\n", b"-2", b"2.5", b"1e3", b"nan", b"1_0", b" hi ", b"\xff\xfe")] == \
        [7, -2, 2.5, 1000.0, "nan", "1_0", "hi", b"\xff\xfe"]


def test_dotted_keys_are_told_from_extensions_with_dots(tmp_path):
    # WebDataset's own multi-part extensions (one key, "left.png" and "right.png") stay one sample, while
    # keys with dots (two members with the same last extension, every name with two dots) split.
    views = write_tar(tmp_path / "views.tar", [("a.json", b"{}"), ("a.left.wav", b"L"), ("a.right.wav", b"R"),
                                                 ("b.json", b"{}"), ("b.left.wav", b"L"), ("b.right.wav", b"R")])
    assert [sorted(s.files) for s in iter_shard(views)] == [["json", "left.wav", "right.wav"]] * 2
    dotted = write_tar(tmp_path / "dotted.tar", [(f"x.{i}.{ext}", b"1") for i in range(3) for ext in ("cls", "wav")])
    assert [(s.key, sorted(s.files)) for s in iter_shard(dotted)] == [(f"x.{i}", ["cls", "wav"]) for i in range(3)]


# -- an index for shards that exist ---------------------------------------------------------------------

def _indexed(wds_shards, tmp_path, pattern: str) -> Path:
    """A copy of the shards matching ``pattern`` in ``tmp_path``, indexed by ``audiobuffer index``."""
    from audiobuffer.cli.main import main

    for shard in sorted(wds_shards.glob(pattern)):
        (tmp_path / shard.name).write_bytes(shard.read_bytes())
    assert main(["index", str(tmp_path / pattern), "--no-progress", "-q"]) == 0
    return tmp_path / "index.json"


def _by_name(samples) -> dict[str, dict]:
    keep = ("cls", "label", "speaker", "text", "label_name")
    return {s["path"].rpartition("/")[2]: {k: s.get(k) for k in keep} for s in samples}


@pytest.mark.parametrize(("pattern", "labels"), [("cls-*.tar", "cls"), ("json-*.tar", "label")])
def test_by_index_the_same_samples_fields_and_labels_as_streamed(wds_shards, tmp_path, pattern, labels):
    index = _indexed(wds_shards, tmp_path, pattern)
    by_index = BufferedDataset(index, AudioDecoder(), labels=labels, num_producers=2, shuffle=True)
    streamed = BufferedDataset(sorted(str(p) for p in tmp_path.glob(pattern)), AudioDecoder(), labels=labels,
                               num_producers=2)
    assert len(by_index) == N and by_index.classes == streamed.classes
    indexed, read = drain(by_index), drain(streamed)
    assert len(indexed) == N and _by_name(indexed) == _by_name(read)
    durations = sorted(m.duration for m in read_index(index).members)
    assert durations == pytest.approx(sorted((800 + i) / 8000 for i in range(N)))


def test_by_index_resume_is_exact(wds_shards, tmp_path):
    index = _indexed(wds_shards, tmp_path, "cls-*.tar")
    ds = BufferedDataset(index, AudioDecoder(), labels="cls", shuffle=True, seed=3, num_producers=2)
    ds.set_epoch(1)
    it = iter(ds)
    first = [next(it) for _ in range(5)]
    state = ds.state_dict()
    it.close()
    resumed = BufferedDataset(index, AudioDecoder(), labels="cls", shuffle=True, seed=3, num_producers=2)
    resumed.load_state_dict(state)
    rest = drain(resumed)
    ds.close()
    names = [s["path"] for s in first + rest]
    assert len(names) == N and len(set(names)) == N


def test_by_index_the_isolated_loader_and_duration_batches(wds_shards, tmp_path, no_helper_left_behind):
    from audiobuffer import IsolatedLoader

    index = _indexed(wds_shards, tmp_path, "json-*.tar")
    with IsolatedLoader(index, AudioDecoder(), labels="label", batch_size=5, num_producers=2) as loader:
        batches = list(loader)
    assert sum(len(b["label"]) for b in batches) == N
    assert sorted(n for b in batches for n in b["speaker"]) == sorted(f"spk{i % 4}" for i in range(N))
    ds = BufferedDataset(index, AudioDecoder(), labels="label", max_batch_seconds=0.5, num_producers=2)
    batches = drain(ds)
    assert sum(len(b) for b in batches) == N
    assert all(len(b) * max(s["audio"].shape[-1] for s in b) / 8000 <= 0.5 for b in batches)


def test_index_refuses_to_overwrite_and_shards_outside_its_folder(wds_shards, tmp_path, capsys):
    from audiobuffer.cli.main import main
    from audiobuffer.sources import index_shards

    index = _indexed(wds_shards, tmp_path, "cls-*.tar")
    assert main(["index", str(tmp_path / "cls-*.tar"), "--no-progress"]) == 2
    assert "exists" in capsys.readouterr().err
    (tmp_path / "sub").mkdir()
    with pytest.raises(SourceError, match="not inside the folder of the index"):
        index_shards(str(tmp_path / "cls-*.tar"), tmp_path / "sub" / "index.json", progress=False)
    assert index.is_file()


def test_streamed_foreign_shards_batch_by_a_json_duration(tmp_path):
    members = []
    for i in range(N):
        seconds = json.dumps({"seconds": (800 + i) / 8000}).encode()
        members += [(f"u{i:02d}.wav", _audio(i, "wav")), (f"u{i:02d}.json", seconds)]
    shard = write_tar(tmp_path / "timed.tar", members)
    ds = BufferedDataset(str(shard), AudioDecoder(), max_batch_seconds=0.5, duration_column="seconds", num_producers=2)
    batches = drain(ds)
    assert sorted(s["audio"].shape[-1] - 800 for b in batches for s in b) == list(range(N))
    assert all(len(b) * max(s["seconds"] for s in b) <= 0.5 + 1e-9 for b in batches)


def _repeated_key_shard(tmp_path: Path) -> Path:
    """A shard whose key ``k`` comes twice in a row (``k.wav k.cls k.wav k.cls``) between two good samples."""
    return write_tar(tmp_path / "repeated.tar", [
        ("a.wav", _audio(0, "wav")), ("a.cls", b"0"),
        ("k.wav", _audio(1, "wav")), ("k.cls", b"1"), ("k.wav", _audio(2, "wav")), ("k.cls", b"2"),
        ("z.wav", _audio(3, "wav")), ("z.cls", b"3")])


def test_a_key_repeated_in_a_row_is_an_error_naming_the_shard_and_key(tmp_path, capsys):
    from audiobuffer import DecodeError, SampleError
    from audiobuffer.cli.main import main
    from audiobuffer.sources import index_shards

    shard = _repeated_key_shard(tmp_path)
    wds = pytest.importorskip("webdataset")
    with pytest.raises(ValueError, match="duplicate file name"):  # what webdataset itself says
        list(wds.WebDataset(str(shard), shardshuffle=False))
    expected = rf"shard {str(shard)!r} .*key 'k'.*'k\.wav'"
    with pytest.raises(DecodeError, match=expected):  # streamed: the sample before comes, then the error
        for sample in iter_shard(shard):
            assert sample.key == "a"
    with pytest.raises(SampleError) as caught:
        list(BufferedDataset(str(shard), AudioDecoder(), num_producers=1))
    assert isinstance(caught.value.__cause__, DecodeError) and "key 'k'" in str(caught.value.__cause__)
    with pytest.raises(DecodeError, match=expected):
        index_shards(shard, progress=False)
    assert main(["index", str(shard), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(shard) in err and "key 'k'" in err, err
    assert not (tmp_path / "index.json").exists() and not (tmp_path / "index.json.partial").exists()


@pytest.mark.parametrize("where", ["member", "sidecar"])
def test_index_refuses_a_member_named_outside_its_shard_and_writes_nothing(tmp_path, capsys, where):
    from audiobuffer.cli.main import main

    if where == "member":
        outer = [("../up.wav", _audio(1, "wav")), ("../up.cls", b"1")]
        named = "../up.wav"
    else:  # a packed sidecar's "name" is the original path the index records
        sidecar = {"name": "../../etc/up.wav", "label": None, "duration": None, "fields": {}}
        outer = [("up.wav", _audio(1, "wav")), ("up.json", json.dumps(sidecar).encode())]
        named = "../../etc/up.wav"
    shard = write_tar(tmp_path / "outer.tar", [("a.wav", _audio(0, "wav")), ("a.cls", b"0"), *outer])
    assert main(["index", str(shard), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(shard) in err and repr(named) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outer.tar"]  # no index, whole or partial


def test_an_index_that_would_not_read_back_is_not_left_behind(tmp_path, monkeypatch):
    from audiobuffer.sources import index_shards

    shard = write_tar(tmp_path / "outer.tar", [("a.wav", _audio(0, "wav")), ("../up.wav", _audio(1, "wav"))])
    module = sys.modules["audiobuffer.prepare.pack"]  # (audiobuffer.sources.pack is the function)
    monkeypatch.setattr(module, "_check_names", lambda *args: None, raising=False)  # past the first check
    with pytest.raises(SourceError, match=r"name '\.\./up\.wav' is not a relative path inside the shard"):
        index_shards(shard, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outer.tar"]
