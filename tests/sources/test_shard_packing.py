"""audiobuffer/prepare/pack.py, sources/index.py and sources/tar.py: packing into tar shards, the
index, streaming, truncated shards (all local)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from helpers import REPO, drop_flac_length, make_corpus, write_tone
from hypothesis import given, settings
from hypothesis import strategies as st

from audiobuffer import AudioDecoder, Source, WorkItem
from audiobuffer.errors import DecodeError, SourceError, StorageError
from audiobuffer.sources import (
    INDEX_NAME,
    iter_shard,
    pack,
    read_index,
    shard_name,
    shuffle_buffer,
    stream_shards,
)


@pytest.fixture
def corpus(tmp_path):
    """24 tones in 3 class folders (``class{c}/{c}_{i:04d}.wav``); returns (root, files)."""
    root = tmp_path / "src"
    return root, make_corpus(root, 24, seconds=0.1)


def _originals(root: Path, files) -> dict[str, bytes]:
    return {Path(f).relative_to(root).as_posix(): Path(f).read_bytes() for f in files}


# -- packing and the index -----------------------------------------------------------------------

def test_pack_index_ranges_give_the_original_bytes(corpus, tmp_path):
    root, files = corpus
    index = pack(root, tmp_path / "out", shard_size=12_000, labels="parent", progress=False)
    originals = _originals(root, files)
    assert len(index.shards) > 2
    assert [m.name for m in index.members] == sorted(originals)
    for member in index.members:
        assert member.reader()() == originals[member.name]
        with open(member.shard, "rb") as f:  # the raw range, read without audiobuffer
            f.seek(member.offset)
            assert f.read(member.size) == originals[member.name]
        assert member.label == member.name.split("/")[0]
        assert member.path == f"{member.shard}/{member.name}"
        info = sf.info(root / member.name)
        assert member.duration == pytest.approx(info.frames / info.samplerate)
    assert index.ranges()[0] == (index.members[0].shard, index.members[0].offset, index.members[0].size)


def test_pack_writes_webdataset_members_and_sidecars(corpus, tmp_path):
    root, _ = corpus
    index = pack(root, tmp_path / "out", shard_size=10**6, labels="parent", progress=False)
    with tarfile.open(index.shards[0]) as tar:
        infos = tar.getmembers()
        names = [i.name for i in infos]
        assert names[:2] == ["class0__0_0000.wav", "class0__0_0000.json"]
        assert all("." not in n.rsplit(".", 1)[0] for n in names)  # key = the name up to the first dot
        assert {(i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) for i in infos} == {(0, 0, 0, "", "", 0o644)}
        meta = json.loads(tar.extractfile("class0__0_0000.json").read())
    assert meta == {"name": "class0/0_0000.wav", "label": "class0", "label_index": 0, "fields": {},
                    "duration": pytest.approx(0.1)}
    data = json.loads((tmp_path / "out" / INDEX_NAME).read_text())
    assert data["format"] == "audiobuffer-shards" and data["shards"][0]["name"] == shard_name(0)
    assert sum(s["members"] for s in data["shards"]) == 24


def test_pack_keeps_shards_under_the_size(corpus, tmp_path):
    root, _ = corpus
    limit = 12_000
    index = pack(root, tmp_path / "out", shard_size=limit, progress=False)
    sizes = [Path(s).stat().st_size for s in index.shards]
    assert all(s <= limit for s in sizes), sizes
    assert Counter(m.shard for m in index.members) and len(index.members) == 24
    # A sample larger than the limit gets a shard of its own instead of failing.
    alone = pack(root, tmp_path / "tiny", shard_size=1, progress=False)
    assert len(alone.shards) == 24


def test_pack_twice_gives_identical_bytes(corpus, tmp_path):
    root, _ = corpus
    one = pack(root, tmp_path / "a", shard_size=12_000, labels="parent", progress=False)
    two = pack(root, tmp_path / "b", shard_size=12_000, labels="parent", progress=False)
    files_a = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files_a == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert INDEX_NAME in files_a and len(files_a) == len(one.shards) + 1
    for name in files_a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert len(two) == len(one)


def test_pack_refuses_a_folder_that_is_not_empty(corpus, tmp_path):
    root, _ = corpus
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(StorageError, match=r"not empty.*overwrite"):
        pack(root, out, shard_size=10**6, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    first = pack(root, out, shard_size=12_000, progress=False, overwrite=True)
    assert len(first.shards) > 1
    second = pack(root, out, shard_size=10**6, progress=False, overwrite=True)  # fewer shards now
    assert sorted(p.name for p in out.iterdir()) == [INDEX_NAME, "notes.txt", shard_name(0)]
    assert len(second.shards) == 1
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match="is a file"):
        pack(root, tmp_path / "file", shard_size=10**6, progress=False)


def test_pack_checks_its_arguments(corpus, tmp_path):
    root, _ = corpus
    with pytest.raises(TypeError, match="shard_size"):
        pack(root, tmp_path / "o", shard_size="1MB")
    with pytest.raises(ValueError, match="shard_size"):
        pack(root, tmp_path / "o", shard_size=0)
    with pytest.raises(ValueError, match="local folder"):
        pack(root, "s3://bucket/out", shard_size=10)
    with pytest.raises(SourceError, match="does not exist"):
        pack(tmp_path / "missing", tmp_path / "o", shard_size=10)
    assert not (tmp_path / "o").exists()  # nothing made for a source that cannot be listed


def test_pack_makes_unique_keys(tmp_path):
    root = tmp_path / "src"
    for name in ("a.b.wav", "a_b.wav", "x/y.wav", "x__y.wav"):
        write_tone(root / name, seconds=0.01)
    index = pack(root, tmp_path / "out", shard_size=10**6, progress=False)
    members = [m.member for m in index.members]
    assert len(set(members)) == 4
    assert all(m.count(".") == 1 for m in members)
    streamed = {s.name: s.data for s in iter_shard(index.shards[0])}
    assert streamed == {n: (root / n).read_bytes() for n in ("a.b.wav", "a_b.wav", "x/y.wav", "x__y.wav")}


def test_pack_manifest_fields_and_labels(tmp_path):
    files = [write_tone(tmp_path / "audio" / f"s{i}.flac", seconds=0.05) for i in range(3)]
    manifest = tmp_path / "list.csv"
    manifest.write_text("path,speaker,text\n" + "".join(
        f"audio/s{i}.flac,spk{i % 2},hello {i}\n" for i in range(3)))
    index = pack(manifest, tmp_path / "out", shard_size=10**6, labels="speaker", progress=False)
    assert [m.name for m in index.members] == ["s0.flac", "s1.flac", "s2.flac"]
    assert [m.label for m in index.members] == ["spk0", "spk1", "spk0"]
    assert [m.fields for m in index.members] == [{"speaker": f"spk{i % 2}", "text": f"hello {i}"} for i in range(3)]
    assert all(m.member.endswith(".flac") for m in index.members)
    assert index.members[0].duration == pytest.approx(0.05)
    sample = next(iter_shard(index.shards[0]))
    assert sample.meta["fields"] == {"speaker": "spk0", "text": "hello 0"} and sample.data == files[0].read_bytes()


def test_pack_records_no_duration_for_files_that_are_not_audio(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "a.txt").write_text("not audio")
    index = pack(root, tmp_path / "out", shard_size=10**6, patterns=["*.txt"], progress=False)
    assert index.members[0].duration is None
    assert index.members[0].reader()() == b"not audio"


def test_read_index_rejects_other_files(tmp_path):
    bad = tmp_path / "index.json"
    bad.write_text("{not json")
    with pytest.raises(SourceError, match="not valid JSON"):
        read_index(bad)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(SourceError, match="not an index"):
        read_index(bad)
    bad.write_text(json.dumps({"format": "audiobuffer-shards", "version": 1, "shards": [],
                               "members": [{"shard": "x.tar"}]}))
    with pytest.raises(SourceError, match="malformed"):
        read_index(bad)
    with pytest.raises(StorageError, match="no such file"):
        read_index(tmp_path / "missing.json")


def _rewrite_index(index_path: Path, edit) -> Path:
    """``index_path``'s index with ``edit(data)`` applied, written back in place."""
    data = json.loads(index_path.read_text(encoding="utf-8"))
    edit(data)
    index_path.write_text(json.dumps(data), encoding="utf-8", newline="\n")
    return index_path


def _packed(tmp_path, n: int = 3) -> Path:
    make_corpus(tmp_path / "src", n, seconds=0.05)
    pack(tmp_path / "src", tmp_path / "data" / "out", shard_size=10**6, progress=False)
    return tmp_path / "data" / "out" / INDEX_NAME


@pytest.mark.parametrize("name", ["../secret.txt", "../../secret.txt", "/etc/passwd", "/dev/zero",
                                  "file:///etc/passwd", "s3://bucket/shard.tar", "sub/../../secret.txt"])
def test_read_index_refuses_shards_outside_its_folder(tmp_path, name):
    """An index is data, maybe from elsewhere: its shard names stay inside its own folder."""
    (tmp_path / "data" / "secret.txt").parent.mkdir(parents=True)
    (tmp_path / "data" / "secret.txt").write_text("secret", encoding="utf-8")
    index = _packed(tmp_path)

    def point_elsewhere(data):
        data["shards"][0]["name"] = name
        for member in data["members"]:
            member["shard"] = name

    _rewrite_index(index, point_elsewhere)
    with pytest.raises(SourceError, match=r"index '.*index\.json' shard '.*' is outside the folder .*"
                                          r"allow_outside=True") as info:
        read_index(index)
    assert "\n" not in str(info.value)


def test_read_index_reads_shards_elsewhere_when_allowed(tmp_path):
    index = _packed(tmp_path)
    moved = tmp_path / "data" / shard_name(0)
    (index.parent / shard_name(0)).rename(moved)
    _rewrite_index(index, lambda data: [e.update(name=f"../{shard_name(0)}") for e in data["shards"]]
                   and [m.update(shard=f"../{shard_name(0)}") for m in data["members"]])
    with pytest.raises(SourceError, match="outside the folder"):
        read_index(index)
    allowed = read_index(index, allow_outside=True)
    assert allowed.shards == (str(moved),) and all(m.reader()() for m in allowed.members)
    from audiobuffer import Source

    assert len(Source(index, allow_outside=True)) == 3
    with pytest.raises(SourceError, match="outside the folder"):
        Source(index)


def test_shard_names_follow_windows_rules_on_windows(monkeypatch):
    """On Windows a drive, a UNC share, a rooted name and backslashed '..' leave the folder too."""
    import ntpath

    from audiobuffer.sources import names as _names

    monkeypatch.setattr(_names, "_LOCAL", ntpath)
    base = "C:\\data\\packed\\index.json"
    for name in ["..\\secret.tar", "D:shard.tar", "C:\\other\\shard.tar", "\\\\server\\share\\shard.tar",
                 "\\shard.tar", "sub\\..\\..\\shard.tar", "/shard.tar"]:
        with pytest.raises(ValueError, match="outside the folder"):
            _names.inside_folder(base, name)
    assert _names.inside_folder(base, "sub/shard.tar") == "C:\\data\\packed\\sub\\shard.tar"


def test_read_index_caps_each_member_by_its_shard(tmp_path):
    index = _packed(tmp_path)
    shard_size = json.loads(index.read_text(encoding="utf-8"))["shards"][0]["size"]
    _rewrite_index(index, lambda data: data["members"][1].update(size=8 << 30))
    with pytest.raises(SourceError, match=rf"member 1 .*bytes \d+\.\.\d+ .*shard '{shard_name(0)}' of "
                                          rf"{shard_size} bytes"):
        read_index(index)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("duration", "abc", r"duration 'abc' is not a number of seconds >= 0"),
    ("duration", -1.0, r"duration -1\.0 is not a number of seconds >= 0"),
    ("duration", float("nan"), r"duration nan is not a number of seconds >= 0"),
    ("duration", True, r"duration True is not a number of seconds >= 0"),
    ("duration", 10**400, r"duration 1000.* is not a number of seconds >= 0"),
    ("fields", ["a"], r"fields \['a'\] is not a JSON object"),
    ("label", ["a"], r"label \['a'\] is not a string, a number or null"),
    ("offset", "12", r"offset '12' is not an integer >= 0"),
    ("size", -5, r"size -5 is not an integer >= 0"),
    ("name", "../../etc/passwd", r"name '\.\./\.\./etc/passwd' is not a relative path inside the shard"),
    ("name", "/etc/passwd", r"name '/etc/passwd' is not a relative path inside the shard"),
    ("shard", "other.tar", r"shard 'other\.tar' is not one of the index's shards"),
])
def test_read_index_names_the_member_of_a_bad_value(tmp_path, key, value, message):
    index = _packed(tmp_path)
    _rewrite_index(index, lambda data: data["members"][2].update({key: value}))
    where = r"index '.*index\.json' member 2 \('[^']+'\) is malformed: "
    with pytest.raises(SourceError, match=where + message) as info:
        read_index(index)
    assert "\n" not in str(info.value)


def test_read_index_of_a_deeply_nested_file_is_one_line(tmp_path):
    nested = tmp_path / INDEX_NAME
    nested.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(SourceError, match=r"index '.*index\.json' is nested too deeply") as info:
        read_index(nested)
    assert "\n" not in str(info.value)
    (tmp_path / "s.json").write_text('{"name": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    with tarfile.open(tmp_path / "deep.tar", "w") as tar:
        for name, payload in (("a.wav", b"RIFF"), ("a.json", (tmp_path / "s.json").read_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(DecodeError, match=r"member 'a\.json' of shard .* is nested too deeply"):
        list(iter_shard(tmp_path / "deep.tar"))


def test_pack_counts_the_frames_of_a_flac_without_a_length(tmp_path):
    """A FLAC whose header gives no total-samples count gets its duration by decoding it once."""
    path = drop_flac_length(write_tone(tmp_path / "src" / "stream.flac", seconds=1.0, sample_rate=16000))
    with sf.SoundFile(path) as f:
        assert f.frames >= 2**62  # libsndfile's "unknown"
    index = pack(tmp_path / "src", tmp_path / "out", shard_size=10**6, progress=False)
    assert [m.duration for m in index.members] == [1.0]


# -- streaming -----------------------------------------------------------------------------------

def test_stream_exactly_once_in_order_without_shuffle(corpus, tmp_path):
    root, files = corpus
    index = pack(root, tmp_path / "out", shard_size=12_000, labels="parent", progress=False)
    samples = list(stream_shards(index.shards))
    assert [s.name for s in samples] == [m.name for m in index.members]
    originals = _originals(root, files)
    for s in samples:
        assert s.data == originals[s.name]
        assert s.files["json"] and s.meta["label"] == s.name.split("/")[0]
        assert s.path.startswith(str(tmp_path / "out" / "shard-")) and s.path.endswith("/" + s.name)


def test_stream_shuffle_buffer_is_seeded(corpus, tmp_path):
    root, _ = corpus
    index = pack(root, tmp_path / "out", shard_size=12_000, progress=False)
    names = [m.name for m in index.members]

    def epoch(seed):
        return [s.name for s in stream_shards(index.shards, shuffle=6, seed=seed)]

    first = epoch(7)
    assert sorted(first) == sorted(names) and len(first) == len(names)  # exactly once
    assert first == epoch(7)  # the same seed, the same order
    assert first != names and first != epoch(8)


@settings(deadline=None, max_examples=60)
@given(n=st.integers(0, 60), size=st.integers(1, 20), seed=st.integers(0, 2**32 - 1))
def test_shuffle_buffer_yields_every_item_once(n, size, seed):
    out = list(shuffle_buffer(range(n), size, np.random.default_rng(seed)))
    assert sorted(out) == list(range(n))
    # No item comes out more than ``size`` places before its turn (a window, not a global shuffle).
    assert all(position >= item - size for position, item in enumerate(out))


def test_shuffle_buffer_checks_its_size():
    with pytest.raises(ValueError, match="shuffle buffer size"):
        list(shuffle_buffer([1], 0, np.random.default_rng(0)))


def _shard_of(index, number: int):
    shard = index.shards[number]
    return shard, [m for m in index.members if m.shard == shard]


@pytest.mark.parametrize("where", ["data", "json", "header", "boundary", "no-end-marker", "end-marker"])
def test_truncated_shard_yields_the_samples_before_the_cut(corpus, tmp_path, where):
    root, _ = corpus
    index = pack(root, tmp_path / "out", shard_size=10**6, progress=False)
    shard, members = _shard_of(index, 0)
    raw = Path(shard).read_bytes()
    with tarfile.open(shard) as tar:
        last = tar.getmembers()[-1]
    end_of_members = last.offset_data + -(-last.size // 512) * 512
    k = 5
    json_data = members[k].offset + -(-members[k].size // 512) * 512 + 512
    cut_at = {
        "data": members[k].offset + 100,  # inside sample k's audio
        "json": json_data + 10,  # inside sample k's sidecar
        "header": members[k].offset - 300,  # inside sample k's audio header
        "boundary": members[k].offset - 512,  # right before sample k's header
        "no-end-marker": end_of_members,  # every member whole, no end-of-archive marker
        "end-marker": end_of_members + 100,  # every member whole, the end-of-archive marker cut
    }[where]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(raw[:cut_at])
    got = []
    with pytest.raises(DecodeError, match=r"cut\.tar' is truncated") as info:
        for sample in iter_shard(cut):
            got.append(sample.name)
    # A sample is known whole when the next one starts: the last one before a cut between members
    # (or in a header) may miss files, so it is not yielded.
    expected = {"data": k, "json": k, "header": k - 1, "boundary": k - 1, "no-end-marker": len(members) - 1,
                "end-marker": len(members) - 1}[where]
    assert got == [m.name for m in members[:expected]]
    if where == "data":
        assert f"member '{members[k].member}'" in str(info.value)
        assert info.value.path == f"{cut}/{members[k].member}"
    if where == "json":
        assert f"member '{members[k].member.rsplit('.', 1)[0]}.json'" in str(info.value)
    if where in ("header", "boundary"):
        assert f"after member '{members[k - 1].member.rsplit('.', 1)[0]}.json'" in str(info.value)
    if where == "no-end-marker":
        assert "without the end-of-archive marker" in str(info.value)


def test_empty_and_malformed_shards(tmp_path):
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with pytest.raises(DecodeError, match="no member and no end-of-archive marker"):
        list(iter_shard(empty))
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"x" * 1024)
    with pytest.raises(DecodeError, match="malformed tar header"):
        list(iter_shard(junk))
    with pytest.raises(StorageError, match="no such file"):
        list(iter_shard(tmp_path / "missing.tar"))


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_stream_reads_other_webdataset_shards(tmp_path, fmt):
    """Shards written by other tools: folders in member names, long names, several files per key, dirs."""
    long_key = "deep/" + "x" * 120 if fmt != tarfile.USTAR_FORMAT else "deep/" + "x" * 60
    files = [("a/s1.flac", b"one"), ("a/s1.cls", b"3"), (f"{long_key}.wav", b"two"), (f"{long_key}.json", b'{"k": 1}'),
             ("s3.txt", b"only text"), ("s4.seg.wav", b"four")]
    shard = tmp_path / "other.tar"
    with tarfile.open(shard, "w", format=fmt) as tar:
        folder = tarfile.TarInfo("a")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    samples = list(iter_shard(shard))
    assert [s.key for s in samples] == ["a/s1", long_key, "s3", "s4"]
    assert samples[0].files == {"flac": b"one", "cls": b"3"} and samples[0].data == b"one"
    assert samples[0].member == "a/s1.flac" and samples[0].meta is None
    assert samples[1].data == b"two" and samples[1].meta == {"k": 1} and samples[1].name == f"{long_key}.wav"
    assert samples[2].data == b"only text"  # no main file: the first member
    assert samples[3].files == {"seg.wav": b"four"}


# -- decoding members from bytes -----------------------------------------------------------------

def test_decoding_members_equals_decoding_the_files(corpus, tmp_path):
    root, files = corpus
    index = pack(root, tmp_path / "out", shard_size=12_000, labels="parent", progress=False)
    decode = AudioDecoder(sample_rate=16000, crop_seconds=0.05, crop="random")
    for i, member in enumerate(index.members):
        from_bytes = decode(WorkItem(index=i, path=member.path, read=member.reader(), seed=3))
        from_file = decode(WorkItem(index=i, path=str(root / member.name), seed=3))
        assert from_bytes["audio"].equal(from_file["audio"])
        assert from_bytes["path"] == member.path


@pytest.mark.shared_data
def test_fsdd_packed_read_back_exactly(fsdd, tmp_path):
    files = sorted(fsdd.glob("*.wav"))[::10]  # 300 recordings
    index = pack(fsdd, tmp_path / "out", shard_size=400_000, labels=r"^(\d+)_",
                 patterns=[f.name for f in files], progress=False)
    assert len(index) == len(files) and len(index.shards) > 3
    originals = {f.name: f.read_bytes() for f in files}
    assert {m.name: m.reader()() for m in index.members} == originals
    assert {m.name: m.label for m in index.members} == {f.name: f.name.split("_")[0] for f in files}
    streamed = Counter(s.name for s in stream_shards(index.shards, shuffle=50, seed=0))
    assert streamed == Counter(originals.keys())
    for m in index.members[:20]:
        assert m.duration == pytest.approx(sf.info(fsdd / m.name).duration)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("name", ["a.wav", "dir/" * 30 + "long.wav", "d" * 99 + "/x.wav", "caf\u00e9.wav", "dir/"])
def test_fast_header_parse_agrees_with_tarfile(fmt, name):
    from audiobuffer.sources.formats.tarheader import ENCODING, ERRORS, parse_header

    info = tarfile.TarInfo(name)
    info.size = 12345
    info.type = tarfile.DIRTYPE if name.endswith("/") else tarfile.REGTYPE
    raw = info.tobuf(fmt, ENCODING, ERRORS)
    pos = 0
    while pos < len(raw):  # the extended headers (a long name, PAX records) before the member's own, then its own
        block = raw[pos:pos + tarfile.BLOCKSIZE]
        expected = tarfile.TarInfo.frombuf(block, ENCODING, ERRORS)
        got = parse_header(block)
        assert got is not None
        assert got[1:] == (expected.size, expected.type)
        if not expected.isdir():
            assert got[0] == expected.name
        pos += tarfile.BLOCKSIZE * (1 + (-(-expected.size // tarfile.BLOCKSIZE) if pos + 512 < len(raw) else 0))
    bad = bytearray(block)
    bad[0] ^= 1  # the checksum no longer fits: left to tarfile (which refuses it)
    assert parse_header(bytes(bad)) is None


def _index_items(index: Path) -> list[tuple]:
    source = Source(str(index), labels="label")
    return [(w.path, w.label_name, dict(w.fields)) for w in (source.item(i) for i in range(len(source)))] + [
        (source.table.offsets.tolist(), source.table.sizes.tolist(), source.table.durations.tolist(),
         source.table.members.tolist())]


def test_a_plain_index_is_read_in_columns_without_json_objects(tmp_path, monkeypatch):
    # pyarrow parses what pack writes into columns; json.loads is not needed (and made to fail here).
    index = _rewrite_index(_packed(tmp_path, 6), lambda data: [m.update({"fields": {"speaker": f"s{i % 2}",
                                                                                     "take": i, "gain": 0.5 * i}})
                                                                for i, m in enumerate(data["members"])])
    expected = _index_items(index)
    by_json = read_index(str(index))

    def no_json(*args, **kwargs):
        raise AssertionError("json.loads called")

    import audiobuffer.sources.index as index_module
    import audiobuffer.sources.table as table_module

    monkeypatch.setattr(table_module, "ARROW_ROWS", 0)  # pyarrow's reader, which a large index gets
    monkeypatch.setattr(index_module.json, "loads", no_json)
    assert _index_items(index) == expected
    assert read_index(str(index)) == by_json
    assert expected[0][2] == {"speaker": "s0", "take": 0, "gain": 0.0} and type(expected[1][2]["take"]) is int


@pytest.mark.parametrize("edit", ["a field some members lack", "a field of mixed types", "no label", "null duration",
                                  "a field of dates", "objects of other keys in a field"])
def test_an_index_of_other_shapes_reads_as_json_says(tmp_path, edit):
    index = _packed(tmp_path, 5)

    def change(data):
        for i, member in enumerate(data["members"]):
            if edit == "a field some members lack" and i % 2:
                member["fields"] = {"extra": i}
            elif edit == "a field of mixed types":
                member["fields"] = {"extra": i if i % 2 else str(i)}
            elif edit == "no label":
                member.pop("label", None)
            elif edit == "null duration" and i == 3:
                member["duration"] = None
            elif edit == "a field of dates":  # strings pyarrow would read as timestamps
                member["fields"] = {"recorded": f"2024-05-0{i + 1}", "at": f"2024-05-01T10:0{i}:00"}
            elif edit == "objects of other keys in a field":  # pyarrow would give each the others' keys as null
                member["fields"] = {"meta": {f"k{i % 2}": i}, "turns": [{f"t{i % 3}": i}]}

    _rewrite_index(index, change)
    items = _index_items(index)
    rows = json.loads(index.read_text(encoding="utf-8"))["members"]
    assert [fields for _, _, fields in items[:-1]] == [m.get("fields", {}) for m in rows]
    assert [label for _, label, _ in items[:-1]] == [m.get("label") for m in rows]
    np.testing.assert_array_equal(items[-1][2], [np.nan if m.get("duration") is None else m["duration"] for m in rows])


def _index_of(tmp_path: Path, members: list[dict], **head: object) -> Path:
    """An index.json (written as pack writes it: UTF-8, no ASCII escapes) of ``members`` in one shard of
    1 MB that need not exist; ``head`` replaces the format, version or shards."""
    data = {"format": "audiobuffer-shards", "version": 1, "shards": [{"name": shard_name(0), "size": 10**6}],
            **head, "members": members}
    index = tmp_path / INDEX_NAME
    index.write_bytes(json.dumps(data, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return index


def _member(i: int, **values: object) -> dict:
    return {"member": f"{i:06d}.wav", "shard": shard_name(0), "name": f"spk/{i}.wav", "offset": 512 * i,
            "size": 100, "duration": 1.5, "label": f"c{i % 2}", **values}


def _both_ways(index: Path, monkeypatch) -> tuple[str, str]:
    """What read_index gives for ``index`` (the repr of its members, or the message it refuses with): from
    pyarrow's columns, and from json alone (pyarrow's parse left out)."""
    import audiobuffer.sources.index as index_module
    import audiobuffer.sources.table as table_module

    def outcome() -> str:
        try:
            return repr(read_index(str(index)))  # repr: 1 and 1.0, '2020-01-01' and a datetime differ
        except SourceError as exc:
            return f"refused: {exc}"

    with monkeypatch.context() as patched:
        patched.setattr(table_module, "ARROW_ROWS", 0)  # pyarrow's reader, which a large index gets
        by_arrow = outcome()
    with monkeypatch.context() as patched:
        patched.setattr(index_module, "_parse_arrow", lambda raw: None)
        by_json = outcome()
    return by_arrow, by_json


NOT_UTF8 = "\udcff\udcfe"  # a marker _not_utf8 turns into the bytes ff fe
SHAPES = {  # index -> what read_index must refuse it with (None: it reads)
    "an ISO date in a field": (lambda tmp: _index_of(tmp, [_member(i, fields={"day": f"2020-01-0{i + 1}"})
                                                           for i in range(3)]), None),
    "an ISO date as a shard name": (lambda tmp: _index_of(tmp, [_member(0, shard="2020-01-01")],
                                                          shards=[{"name": "2020-01-01", "size": 10**6}]), None),
    "an ISO date as the version": (lambda tmp: _index_of(tmp, [_member(0)], version="2020-01-01"),
                                   r"has version '2020-01-01'"),
    "ints and floats in one field": (lambda tmp: _index_of(tmp, [_member(i, fields={"x": i if i % 2 else i + 0.5})
                                                                 for i in range(4)]), None),
    "an int beyond 64 bits in a field": (lambda tmp: _index_of(tmp, [_member(0, fields={"x": 2**64}),
                                                                     _member(1, fields={"x": 1})]), None),
    "objects of other keys in a field": (lambda tmp: _index_of(tmp, [_member(0, fields={"m": {"a": 1}}),
                                                                     _member(1, fields={"m": {"b": 2}})]), None),
    "a list of ints and floats in a field": (lambda tmp: _index_of(tmp, [_member(0, fields={"l": [1, 2.5]})]), None),
    "a field nested 2000 deep": (lambda tmp: _deep_field(tmp, 2000), r"nested too deeply"),
    "a shard size one entry writes as a float": (lambda tmp: _index_of(
        tmp, [_member(0)], shards=[{"name": shard_name(0), "size": 10**6}, {"name": "b.tar", "size": 5.0}]),
        r"shard 1 is malformed: .*got \{'name': 'b\.tar', 'size': 5\.0\}$"),
    "a shard entry without a size": (lambda tmp: _index_of(
        tmp, [_member(0)], shards=[{"name": shard_name(0), "size": 10**6}, {"name": "b.tar"}]),
        r"shard 1 is malformed: .*got \{'name': 'b\.tar'\}$"),
    "bytes that are not UTF-8 in a name": (lambda tmp: _not_utf8(_index_of(tmp, [_member(0, name=NOT_UTF8)])),
                                           r"is not valid JSON"),
    "bytes that are not UTF-8 in a field": (lambda tmp: _not_utf8(_index_of(
        tmp, [_member(i, fields={"s": NOT_UTF8 if i else "ok"}) for i in range(2)])), r"is not valid JSON"),
    "a member one byte past an exabyte shard": (lambda tmp: _index_of(
        tmp, [_member(0, offset=2**60, size=1)], shards=[{"name": shard_name(0), "size": 2**60}]),
        r"member 0 .* bytes 1152921504606846976\.\.1152921504606846977 lie outside its shard"),
    "an object as a label": (lambda tmp: _index_of(tmp, [_member(0), _member(1, label={"a": 1})]),
                             r"member 1 .* label \{'a': 1\} is not a string, a number or null"),
    "a list as a label": (lambda tmp: _index_of(tmp, [_member(0, label=["x"])]),
                          r"member 0 .* label \['x'\] is not a string, a number or null"),
    "lone surrogates in a field": (lambda tmp: _index_of(tmp, [_member(i, fields={"s": f"\ud800{i}"})
                                                               for i in range(20)]), None),
    "durations in integers beyond 2**53": (lambda tmp: _index_of(tmp, [_member(0, duration=2**62 + 1),
                                                                       _member(1, duration=3)]), None),
    "a list that starts with null as a duration": (lambda tmp: _index_of(tmp, [_member(0, duration={"a": [None, 7]})]),
                                                   r"member 0 .* duration \{'a': \[None, 7\]\} is not a number"),
    "a list that starts with null as a shard size": (lambda tmp: _index_of(
        tmp, [_member(0)], shards=[{"name": shard_name(0), "size": [None, "x"]}]), r"shard 0 is malformed"),
    "a lone surrogate in a name": (lambda tmp: _index_of(tmp, [_member(0), _member(1, name="a\ud800.wav")]),
                                   r"member 1 .* name 'a\\ud800\.wav' is not a file name"),
}


def _deep_field(tmp_path: Path, depth: int) -> Path:
    index = _index_of(tmp_path, [_member(0, fields={"deep": "DEEP"})])
    index.write_bytes(index.read_bytes().replace(b'"DEEP"', b"[" * depth + b"]" * depth))
    return index


def _not_utf8(index: Path) -> Path:
    """``index`` with each NOT_UTF8 (written as its surrogates' UTF-8 bytes) turned into the bytes ff fe."""
    marker = NOT_UTF8.encode("utf-8", "surrogatepass")
    index.write_bytes(index.read_bytes().replace(marker, b"\xff\xfe"))
    return index


@pytest.mark.parametrize("shape", list(SHAPES))
def test_pyarrow_and_json_read_an_index_alike(tmp_path, monkeypatch, shape):
    # Whatever pyarrow's parse reads differently from json (dates, numbers, nested objects, bytes) is read
    # by json; both refuse the same index with the same message.
    make, refused = SHAPES[shape]
    by_arrow, by_json = _both_ways(make(tmp_path), monkeypatch)
    assert by_arrow == by_json
    if refused is None:
        assert not by_json.startswith("refused"), by_json
    else:
        assert re.search(refused, by_json.removeprefix("refused: ")), by_json
        assert "\n" not in by_json


@pytest.mark.subprocess
def test_an_index_nested_deeper_than_pyarrow_parses_is_refused_not_a_crash(tmp_path):
    # pyarrow's JSON reader recurses: arrays nested tens of thousands deep overflow its stack (a crash of
    # the process, not an exception), so this runs in a process of its own.
    index = _deep_field(tmp_path, 50_000)
    code = ("import sys\nfrom audiobuffer.sources import read_index\n"
            "try:\n    read_index(sys.argv[1])\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code, str(index)], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("SourceError") and "nested too deeply" in done.stdout


def _nesting_by_hand(text: str, most: int) -> bool:
    """Whether ``text`` stays within ``most`` levels of brackets outside its strings, never below 0."""
    depth, inside = 0, False
    for char in text:
        inside ^= char == '"'
        if not inside and char in "[{]}":
            depth += 1 if char in "[{" else -1
            if not 0 <= depth <= most:
                return False
    return True


@settings(deadline=None, max_examples=300)
@given(st.lists(st.sampled_from(list('[]{}"a\u00e9')), max_size=40), st.integers(1, 8), st.integers(1, 3))
def test_the_nesting_check_reads_strings_across_its_chunks(chars, scan, most):
    import audiobuffer.sources.index as index_module

    text = "".join(chars)
    saved = index_module._SCAN, index_module._ARROW_DEPTH
    index_module._SCAN, index_module._ARROW_DEPTH = scan, most  # chunks of a few bytes: strings cut across them
    try:
        assert index_module._arrow_may_read(text.encode("utf-8")) == _nesting_by_hand(text, most)
    finally:
        index_module._SCAN, index_module._ARROW_DEPTH = saved


# -- a shard rewritten under its index -------------------------------------------------------------

def _webdataset_shard(folder: Path, order: list[int]) -> Path:
    """Shard ``shard-000000.tar`` in ``folder`` written by webdataset's ShardWriter: samples ``s{i:03d}``
    (a WAV tone of frequency 300 + 40 i Hz, all of one length, and a ``.cls`` of ``i``) in ``order``."""
    wds = pytest.importorskip("webdataset")
    folder.mkdir(parents=True, exist_ok=True)
    tones = {}
    for i in order:
        buf = io.BytesIO()
        sf.write(buf, (0.3 * np.sin(np.arange(800) * (300 + 40 * i) / 8000)).astype(np.float32), 8000,
                 format="WAV")
        tones[i] = buf.getvalue()
    with wds.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=1000, verbose=0) as sink:
        for i in order:
            sink.write({"__key__": f"s{i:03d}", "wav": tones[i], "cls": str(i).encode()})
    return folder / "shard-000000.tar"


def _read_all(index: Path, **options: object) -> list[tuple[int, bytes]]:
    """Each sample's label (from its ``cls`` field) and the bytes read for it, by index."""
    def decode(item: WorkItem) -> dict:
        return {"cls": item.fields["cls"], "data": item.read()}

    from audiobuffer import BufferedDataset

    ds = BufferedDataset(str(index), decode, num_producers=2, ordered=True, **options)
    return [(s["cls"], s["data"]) for s in ds]


@pytest.mark.parametrize("block", [None, 4])
def test_a_shard_rewritten_under_its_index_is_refused_not_read_as_other_members(tmp_path, block):
    from audiobuffer import SampleError
    from audiobuffer.sources import index_shards

    shard = _webdataset_shard(tmp_path / "d", list(range(8)))
    index_shards(shard, progress=False)
    index = tmp_path / "d" / INDEX_NAME
    truth = {s.fields["cls"]: s.data for s in iter_shard(shard)}
    assert sorted(_read_all(index, read_block=block)) == sorted(truth.items())
    size = shard.stat().st_size
    _webdataset_shard(tmp_path / "d", list(range(8))[::-1])  # a re-run job: the same name, size and samples
    assert shard.stat().st_size == size
    with pytest.raises(SampleError) as caught:
        _read_all(index, read_block=block)
    cause = caught.value.__cause__
    assert isinstance(cause, StorageError)
    message = str(cause)
    assert str(shard) in message and "s00" in message and "audiobuffer index" in message
    index_shards(shard, overwrite=True, progress=False)  # what the message says to do
    assert sorted(_read_all(index, read_block=block)) == sorted(truth.items())


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_members_with_long_and_unicode_names_read_by_index(tmp_path, fmt):
    """A name the header block cannot hold whole (PAX, GNU long names) or holds split (ustar) reads by index."""
    from audiobuffer.sources import index_shards

    names = ["plain", "d" * 60 + "/" + "e" * 70]
    if fmt != tarfile.USTAR_FORMAT:  # (ustar holds neither)
        names += ["f" * 120, "\u65e5\u672c\u8a9e"]
    payloads = {}
    with tarfile.open(tmp_path / "shard.tar", "w", format=fmt) as tar:
        for n, name in enumerate(names):
            for ext, payload in (("wav", bytes([n]) * (700 + n)), ("cls", str(n).encode())):
                info = tarfile.TarInfo(f"{name}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            payloads[f"{name}.wav"] = bytes([n]) * (700 + n)
    index = index_shards(tmp_path / "shard.tar", progress=False)
    assert {m.member: m.reader()() for m in index.members} == payloads
