"""BufferedDataset over packed shards on the local disk (no server): by index, streamed by pattern, resume,
truncated shards, labels from names and sidecars, YAML; audiobuffer/sources/stream.py and
audiobuffer/sources/listing.py."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import drop_flac_length, make_corpus, write_tone

from audiobuffer import AudioDecoder, BufferedDataset, DecodeError, SampleError, Source, SourceError
from audiobuffer.engine.plan import epoch_order
from audiobuffer.engine.state import unpack_consumed
from audiobuffer.sources import INDEX_NAME, pack
from audiobuffer.sources.stream import MEMBER_STRIDE, ShardStream

N = 30  # files in the corpus: 3 classes, about 5 per shard


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """30 tones (``class{c}/{c}_{i:04d}.wav``) packed with labels='parent' into 6 shards, and the originals."""
    root = tmp_path_factory.mktemp("packed")
    files = make_corpus(root / "src", N, seconds=0.05)
    index = pack(root / "src", root / "out", shard_size=20_000, labels="parent", progress=False)
    assert len(index.shards) >= 4
    return root / "out", index, {Path(f).relative_to(root / "src").as_posix(): f for f in files}


def _pattern(out: Path, index) -> str:
    return str(out / f"shard-{{000000..{len(index.shards) - 1:06d}}}.tar")


def _names(samples) -> list[str]:
    """Each sample's original relative name (its path after the shard's)."""
    return [s["path"].split(".tar/", 1)[1] for s in samples]


def _decode():
    return AudioDecoder(sample_rate=8000)


# -- exactly once ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("kind", ["pattern", "glob", "list", "index"])
def test_every_sample_once_per_epoch(packed, kind, shuffle):
    out, index, originals = packed
    spec = {"pattern": _pattern(out, index), "glob": str(out / "shard-*.tar"), "list": list(index.shards),
            "index": str(out / INDEX_NAME)}[kind]
    ds = BufferedDataset(spec, _decode(), shuffle=shuffle, num_producers=3, labels=r"^(\d+)_")
    assert len(ds) == N
    for epoch in range(2):
        ds.set_epoch(epoch)
        samples = list(ds)
        assert sorted(_names(samples)) == sorted(originals)
        for s in samples:
            shard, name = s["path"].split(".tar/", 1)
            assert Path(shard + ".tar").is_file()  # the path names the shard...
            assert s["label_name"] == Path(name).name.split("_")[0]  # ...and the regex applies to the name
            assert ds.classes[s["label"]] == s["label_name"]
            expected = _decode()(str(originals[name]))["audio"]
            assert s["audio"].equal(expected)
    stats = ds.stats()
    assert stats.yielded == N and stats.failed == 0 and stats.read_s > 0


def test_index_plan_shuffles_across_every_member(packed):
    """With the index, the epoch's order is the plan's permutation of all members, not shard by shard."""
    out, index, _ = packed
    ds = BufferedDataset(str(out / INDEX_NAME), _decode(), shuffle=True, seed=5, ordered=True, num_producers=4)
    ds.set_epoch(2)
    got = [s["path"] for s in ds]
    assert got == [index.members[i].path for i in epoch_order(N, shuffle=True, seed=5, epoch=2)]


def test_streamed_shards_split_by_rank_and_shard(packed):
    out, index, originals = packed
    seen = []
    for rank in range(2):
        ds = BufferedDataset(_pattern(out, index), _decode(), shuffle=True, rank=rank, world_size=2,
                             even_shards=None, num_producers=2)
        samples = list(ds)
        assert len(samples) == len(ds)
        seen.append(_names(samples))
        shards = {s["path"].split(".tar/")[0] for s in samples}
        assert len(shards) == len(index.shards) // 2 + (rank < len(index.shards) % 2)
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(originals)


def test_streamed_sample_items(packed):
    """A streamed sample's index: shard number * MEMBER_STRIDE + its position; its fields from the sidecar."""
    out, index, _ = packed
    ds = BufferedDataset(list(index.shards), lambda item: (item.index, item.path, dict(item.fields)))
    got = sorted(ds)
    shard_of = {p: n for n, p in enumerate(index.shards)}
    for (i, path, fields), member in zip(got, index.members):
        assert path == member.path and fields == {}
        assert i // MEMBER_STRIDE == shard_of[member.shard]
    assert len({i for i, _, _ in got}) == N


# -- labels ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["pattern", "index"])
def test_labels_from_the_sidecar_and_from_the_names(packed, kind):
    out, index, _ = packed
    spec = _pattern(out, index) if kind == "pattern" else str(out / INDEX_NAME)
    by_sidecar = BufferedDataset(spec, _decode(), labels="label")
    assert by_sidecar.classes == ["class0", "class1", "class2"]
    assert all(s["label_name"] == Path(s["path"]).parent.name for s in by_sidecar)
    by_parent = BufferedDataset(spec, _decode(), labels="parent")
    assert by_parent.classes == ["class0", "class1", "class2"]
    with pytest.raises(SourceError, match="does not match the label expression"):
        BufferedDataset(spec, _decode(), labels=r"^(\d+)x")
    with pytest.raises(SourceError, match="not a column"):
        BufferedDataset(spec, _decode(), labels="lable")


def test_streamed_listing_from_the_index_or_a_scan(packed, tmp_path):
    """len() and classes come from the index beside the shards, else from reading the shards once."""
    out, index, _ = packed
    bare = tmp_path / "bare"
    bare.mkdir()
    for shard in index.shards:  # the shards without their index
        (bare / Path(shard).name).write_bytes(Path(shard).read_bytes())
    with_index = ShardStream(_pattern(out, index), labels="label")
    scanned = ShardStream(str(bare / "shard-*.tar"), labels="label")
    assert len(with_index) == len(scanned) == N
    assert with_index.classes == scanned.classes == ["class0", "class1", "class2"]
    assert with_index.listing().counts == scanned.listing().counts
    unlisted = ShardStream(str(bare / "shard-*.tar"))  # no labels, no index: nothing read, no length
    with pytest.raises(TypeError, match="length of .* is unknown.*index.json"):
        len(unlisted)
    assert unlisted._listed is None
    ds = BufferedDataset(unlisted, _decode())
    assert "items=unknown" in repr(ds)
    assert len(list(ds)) == N


# -- resume ---------------------------------------------------------------------------------------

def test_resume_by_index_is_exact(packed):
    out, _, originals = packed
    spec = str(out / INDEX_NAME)
    ds = BufferedDataset(spec, _decode(), shuffle=True, seed=1, num_producers=3)
    ds.set_epoch(1)
    it = iter(ds)
    first = [next(it) for _ in range(11)]
    state = ds.state_dict()
    it.close()
    resumed = BufferedDataset(spec, _decode(), shuffle=True, seed=1, num_producers=3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert sorted(_names(first) + _names(rest)) == sorted(originals)


def test_resume_streamed_at_shard_boundaries(packed):
    """Shards whose every sample was handed on are not streamed again; the others come again whole."""
    out, index, originals = packed
    spec = _pattern(out, index)
    ds = BufferedDataset(spec, _decode(), shuffle=True, seed=2, num_producers=1, buffer_size=1)
    it = iter(ds)
    first = [next(it) for _ in range(12)]
    state = ds.state_dict()
    it.close()
    by_shard = Counter(s["path"].split(".tar/")[0] + ".tar" for s in first)
    sizes = Counter(m.shard for m in index.members)
    done = {shard for shard, n in by_shard.items() if n == sizes[shard]}
    assert done  # 12 samples from one producer in order: at least the first shard was completed
    resumed = BufferedDataset(spec, _decode(), shuffle=True, seed=2, num_producers=2)
    resumed.load_state_dict(state)
    rest = list(resumed)
    again = {s["path"].split(".tar/")[0] + ".tar" for s in rest}
    assert not again & done
    assert set(_names(first)) | set(_names(rest)) == set(originals)
    assert len(rest) == N - sum(sizes[s] for s in done)


# -- failures -------------------------------------------------------------------------------------

def _truncated_copy(index, tmp_path: Path) -> tuple[Path, list, int]:
    """The shards copied to tmp_path with shard 1 cut in the middle of its third member."""
    for shard in index.shards:
        (tmp_path / Path(shard).name).write_bytes(Path(shard).read_bytes())
    (tmp_path / INDEX_NAME).write_bytes((Path(index.shards[0]).parent / INDEX_NAME).read_bytes())
    members = [m for m in index.members if m.shard == index.shards[1]]
    cut = members[2]
    path = tmp_path / Path(index.shards[1]).name
    path.write_bytes(path.read_bytes()[:cut.offset + cut.size // 2])
    return path, members, 2


def test_truncated_shard_streamed(packed, tmp_path, caplog):
    _, index, originals = packed
    path, members, cut = _truncated_copy(index, tmp_path)
    spec = str(tmp_path / "shard-*.tar")
    with caplog.at_level(logging.WARNING, logger="audiobuffer"):
        ds = BufferedDataset(spec, _decode(), on_error="warn", num_producers=2)
        samples = list(ds)
    stats = ds.stats()
    assert stats.failed == 1 and str(path) in stats.failures[0][1]
    assert members[cut].member in stats.failures[0][1] and "truncated" in stats.failures[0][2]
    assert "truncated" in caplog.text
    lost = {m.name for m in members[cut:]}
    assert sorted(_names(samples)) == sorted(set(originals) - lost)
    # on_error="raise": the samples before the cut come first, then the error names shard and member
    got = []
    with pytest.raises(DecodeError, match=rf"{path.name}.*truncated.*{members[cut].member}"):
        for s in BufferedDataset([str(path)], _decode()):
            got.append(s)
    assert sorted(_names(got)) == sorted(m.name for m in members[:cut])


def test_truncated_shard_by_index(packed, tmp_path):
    """By index, each member past the cut fails on its own (per on_error); the others decode."""
    _, index, originals = packed
    path, members, cut = _truncated_copy(index, tmp_path)
    ds = BufferedDataset(str(tmp_path / INDEX_NAME), _decode(), on_error="skip", num_producers=3)
    samples = list(ds)
    lost = {m.name for m in members[cut:]}
    assert sorted(_names(samples)) == sorted(set(originals) - lost)
    stats = ds.stats()
    assert stats.failed == len(lost)
    assert all(str(path) in f[1] and "ends early" in f[2] for f in stats.failures)


def test_missing_shard_fails_at_once_or_is_one_named_failure(packed, tmp_path):
    _, index, _ = packed
    with pytest.raises(SourceError, match=r"shard-999999\.tar.*does not exist"):
        BufferedDataset(list(index.shards) + [str(tmp_path / "shard-999999.tar")], _decode())
    gone = tmp_path / "gone.tar"
    gone.write_bytes(Path(index.shards[0]).read_bytes())
    ds = BufferedDataset(list(index.shards[1:]) + [str(gone)], _decode(), on_error="skip")
    gone.unlink()  # gone after the dataset was made: the epoch reports it, named, and goes on
    assert len(list(ds)) == N - sum(m.shard == index.shards[0] for m in index.members)
    (failure,) = ds.stats().failures
    assert failure[1] == str(gone) and "no such file" in failure[2]


# -- what streamed shards refuse ------------------------------------------------------------------

def test_streamed_shards_refuse_what_needs_random_access(packed):
    out, index, _ = packed
    from audiobuffer import BatchSlotLoader, IsolatedLoader

    with pytest.raises(ValueError, match="ordered=True needs random access.*index.json"):
        BufferedDataset(_pattern(out, index), _decode(), ordered=True)
    with pytest.raises(ValueError, match="index.json"):
        IsolatedLoader(_pattern(out, index), _decode(), batch_size=4)
    with pytest.raises(ValueError, match="index.json"):
        BatchSlotLoader(_pattern(out, index), _decode(), batch_size=4)
    with pytest.raises(SourceError, match="names tar shards.*index.json"):
        Source(_pattern(out, index))
    with pytest.raises(ValueError, match="storage_options describe how to list a source"):
        BufferedDataset(Source(str(out / INDEX_NAME)), _decode(), storage_options={"anon": True})
    with pytest.raises(TypeError, match="storage_options must be a mapping"):
        BufferedDataset(str(out / INDEX_NAME), _decode(), storage_options="anon")
    with pytest.raises(SourceError, match="matches no file"):
        BufferedDataset(str(out / "nothing-*.tar"), _decode())


@pytest.mark.subprocess
def test_index_source_subset_and_isolated_loader(packed):
    """A Source of an index splits like any other, and its members are read in the helper process too."""
    out, index, originals = packed
    from audiobuffer import IsolatedLoader

    source = Source(str(out / INDEX_NAME), labels="label")
    part = source.subset(range(0, N, 3))
    assert part.item(1).read() == Path(originals[index.members[3].name]).read_bytes()
    with IsolatedLoader(source, _decode(), batch_size=8, num_producers=2) as loader:
        rows = sum(len(batch["label"]) for batch in loader)
    assert rows == N


def test_images_from_an_index(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    from audiobuffer import IMAGE_PATTERNS, ImageDecoder

    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (8, 6, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    pack(tmp_path, tmp_path / "out", shard_size=10**6, patterns=IMAGE_PATTERNS, progress=False)
    decode = ImageDecoder()
    for sample in BufferedDataset(str(tmp_path / "out" / INDEX_NAME), decode):
        original = decode(str(tmp_path / Path(sample["path"]).name))
        assert sample["image"].equal(original["image"])


# -- YAML -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["index", "pattern"])
def test_yaml_root_takes_an_index_or_a_pattern(packed, kind):
    from audiobuffer.config import build_dataset, parse_config

    out, index, originals = packed
    root = str(out / INDEX_NAME) if kind == "index" else _pattern(out, index)
    config = parse_config({"source": {"root": root, "labels": "label", "storage_options": {"anon": True}},
                           "decode": {"sample_rate": 8000}})
    assert config.source.storage_options == {"anon": True}
    ds = build_dataset(config)
    assert sorted(_names(ds)) == sorted(originals) and ds.classes == ["class0", "class1", "class2"]


def test_yaml_errors_name_the_key(packed, tmp_path):
    from audiobuffer import ConfigError
    from audiobuffer.config import build_source, parse_config

    with pytest.raises(ConfigError, match="source.root: no such file"):
        parse_config({"source": {"root": str(tmp_path / "index.json")}})
    with pytest.raises(ConfigError, match="source.storage_options"):
        parse_config({"source": {"root": str(packed[0] / INDEX_NAME), "storage_options": "anon"}})
    config = parse_config({"source": {"root": str(tmp_path / "shard-{0..3}.tar")}})
    with pytest.raises(ConfigError, match=r"source.root: .*shard-0\.tar.*does not exist"):
        build_source(config)


@pytest.mark.shared_data
def test_fsdd_packed_by_index_and_pattern(fsdd, tmp_path):
    """Real recordings: 300 files packed, read back by index and by pattern, each exactly once, as decoded from
    the files."""
    files = sorted(fsdd.glob("*.wav"))[::10]
    index = pack(files, tmp_path / "p", shard_size=500_000, labels=r"^(\d+)_", progress=False)
    decode = AudioDecoder(sample_rate=8000)
    expected = {f.name: decode(str(f))["audio"] for f in files}
    for spec in (str(tmp_path / "p" / INDEX_NAME), _pattern(tmp_path / "p", index)):
        ds = BufferedDataset(spec, decode, shuffle=True, labels=r"^(\d+)_", num_producers=4)
        samples = list(ds)
        assert sorted(_names(samples)) == sorted(expected) and ds.classes == [str(d) for d in range(10)]
        assert all(s["audio"].equal(expected[_names([s])[0]]) for s in samples)


# -- batches by duration over shards --------------------------------------------------------------

def test_batches_by_duration_from_an_index_use_its_durations(packed, monkeypatch):
    out, index, originals = packed
    import audiobuffer.prepare.durations as durations

    def no_header(path):  # the index already knows every member's duration
        raise AssertionError(f"opened the header of {path}")

    monkeypatch.setattr(durations, "header_seconds", no_header)
    ds = BufferedDataset(str(out / INDEX_NAME), _decode(), max_batch_seconds=0.2, shuffle=True, num_producers=2)
    assert np.allclose(ds.batching.durations, 0.05, atol=1e-3)
    batches = list(ds)
    assert all(len(b) * max(s["audio"].shape[-1] for s in b) <= 0.2 * 8000 for b in batches)
    assert sorted(n for b in batches for n in _names(b)) == sorted(originals)


def test_batches_by_duration_refuse_sources_without_durations(packed, tmp_path):
    out, index, _ = packed
    with pytest.raises(ValueError, match="max_batch_seconds on streamed shards needs duration_column.*index.json"):
        BufferedDataset(_pattern(out, index), _decode(), max_batch_seconds=1.0)
    unknown = tmp_path / INDEX_NAME  # an index without durations (packed by another tool)
    unknown.write_text((out / INDEX_NAME).read_text().replace('"duration"', '"length"'))
    for shard in index.shards:
        (tmp_path / Path(shard).name).symlink_to(shard)
    with pytest.raises(SourceError, match="duration_column.*audiobuffer pack"):
        BufferedDataset(str(unknown), _decode(), max_batch_seconds=1.0)


def test_batches_by_duration_name_the_member_of_an_index_without_its_duration(packed, tmp_path):
    """One null duration among many: the error names that member and its shard, not the whole index."""
    out, index, _ = packed
    data = json.loads((out / INDEX_NAME).read_text(encoding="utf-8"))
    data["members"][4]["duration"] = None
    one_null = tmp_path / INDEX_NAME
    one_null.write_text(json.dumps(data), encoding="utf-8", newline="\n")
    for shard in index.shards:
        (tmp_path / Path(shard).name).symlink_to(shard)
    member = index.members[4]
    with pytest.raises(SourceError) as caught:
        BufferedDataset(str(one_null), _decode(), max_batch_seconds=0.2)
    message = str(caught.value)
    assert repr(member.member) in message and repr(str(tmp_path / Path(member.shard).name)) in message, message
    assert "1 of 30" in message and "has none" not in message and "audiobuffer pack" not in message


def test_batches_by_duration_refuse_an_index_with_a_duration_that_is_not_one(packed, tmp_path):
    """A NaN duration would leave its item out of every batch, unreported: the index is refused, naming it."""
    out, index, _ = packed
    data = json.loads((out / INDEX_NAME).read_text(encoding="utf-8"))
    data["members"][4]["duration"] = float("nan")
    broken = tmp_path / INDEX_NAME
    broken.write_text(json.dumps(data), encoding="utf-8", newline="\n")  # json writes NaN as NaN
    for shard in index.shards:
        (tmp_path / Path(shard).name).symlink_to(shard)
    with pytest.raises(SourceError, match=r"member 4 \('[^']+'\) is malformed: duration nan is not a number of "
                                          r"seconds >= 0"):
        BufferedDataset(str(broken), _decode(), max_batch_seconds=0.2)


def test_batches_by_duration_over_packed_flacs_without_a_length(tmp_path):
    """pack decodes a FLAC whose header gives no length, so batches by duration read its index."""
    for i in range(4):
        drop_flac_length(write_tone(tmp_path / "src" / f"{i}.flac", seconds=0.05 * (i + 1), sample_rate=8000))
    index = pack(tmp_path / "src", tmp_path / "out", shard_size=10**6, progress=False)
    assert [m.duration for m in index.members] == [0.05, 0.1, 0.15, 0.2]
    ds = BufferedDataset(index.url, _decode(), max_batch_seconds=0.2)
    assert sorted(len(s["audio"]) for b in ds for s in b) == [400, 800, 1200, 1600]


SECONDS = [0.05, 0.1, 0.15, 0.3, 0.05, 0.2]  # the tones' lengths, in turn
TIMED = 36  # tones packed with their lengths
BUDGET = 0.6  # max_batch_seconds of the tests below: from 2 to 12 tones a batch


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    """36 tones of mixed lengths packed from a manifest: each sidecar's fields carry its ``seconds``."""
    root = tmp_path_factory.mktemp("timed")
    rows = []
    for i in range(TIMED):
        seconds = SECONDS[i % len(SECONDS)]
        path = write_tone(root / "src" / f"t{i:03d}.wav", seconds=seconds, sample_rate=8000)
        rows.append(f"{path},{seconds!r}\n")
    manifest = root / "manifest.csv"
    manifest.write_text("path,seconds\n" + "".join(rows), encoding="utf-8", newline="\n")
    index = pack(manifest, root / "out", shard_size=30_000, progress=False)
    assert len(index.shards) >= 5
    return root / "out", index


def _by_duration(spec, **kwargs):
    kwargs = {"max_batch_seconds": BUDGET, "duration_column": "seconds", "buckets": 3, "shuffle": True, **kwargs}
    return BufferedDataset(spec, _decode(), **kwargs)


def _frames(batch) -> list[int]:
    return [s["audio"].shape[-1] for s in batch]


def _shard_sizes(index) -> Counter:
    return Counter(Path(m.shard).name for m in index.members)


def _shard_names(samples) -> Counter:
    return Counter(Path(s["path"].split(".tar/")[0] + ".tar").name for s in samples)


@pytest.mark.parametrize("epoch", [0, 1])
def test_streamed_shards_batch_by_duration_from_a_sidecar_field(timed, epoch):
    """Streamed shards are batched as they stream, by the duration in each sample's sidecar: every sample
    once, every batch within the budget (or alone), and the padding figure is what the batches show."""
    out, index = timed
    ds = _by_duration(_pattern(out, index), num_producers=2)
    with pytest.raises(TypeError, match="batches of streamed shards.*unknown"):
        len(ds)  # cut as the samples stream: the count is not known before
    ds.set_epoch(epoch)
    batches = list(ds)
    names = [n for batch in batches for n in _names(batch)]
    assert sorted(names) == sorted(m.name for m in index.members)
    limit = round(BUDGET * 8000)
    assert all(len(b) == 1 or len(b) * max(_frames(b)) <= limit for b in batches)
    assert max(len(b) for b in batches) > 2  # short tones share batches
    padded = sum(len(b) * max(_frames(b)) for b in batches)
    real = sum(sum(_frames(b)) for b in batches)
    stats = ds.stats()
    assert stats.done and stats.batches == len(batches) and stats.empty_batches == 0
    assert stats.padding == pytest.approx((padded - real) / padded, abs=1e-6)
    assert (stats.items, stats.yielded, stats.failed, stats.shards) == (TIMED, TIMED, 0, len(index.shards))


def test_streamed_batches_resume_at_shard_boundaries(timed):
    """A shard counts as consumed once every one of its samples was handed on in a batch: a resumed epoch
    streams every other shard whole, and no sample is lost."""
    out, index = timed
    spec, sizes = _pattern(out, index), _shard_sizes(index)
    ds = _by_duration(spec, seed=4, num_producers=1, buffer_size=2)
    first = []
    it = iter(ds)
    for batch in it:  # up to the first batch whose hand-on completes a shard
        first.append(batch)
        state = ds.state_dict()
        if any(unpack_consumed(state[ds.STATE_CONSUMED], state[ds.STATE_ITEMS])):
            break
    it.close()
    resumed = _by_duration(spec, seed=4, num_producers=2)
    resumed.load_state_dict(state)
    rest = list(resumed)
    first_names = [n for b in first for n in _names(b)]
    rest_names = [n for b in rest for n in _names(b)]
    assert rest and set(first_names) | set(rest_names) == {m.name for m in index.members}  # nothing lost
    assert len(set(rest_names)) == len(rest_names)
    streamed = _shard_names([s for b in rest for s in b])
    assert all(n == sizes[shard] for shard, n in streamed.items())  # whole shards again
    skipped = set(sizes) - set(streamed)
    assert skipped  # the shards handed on whole before the state was taken
    skipped_names = {m.name for m in index.members if Path(m.shard).name in skipped}
    assert skipped_names <= set(first_names)
    assert resumed.stats().resumed == len(skipped)  # resume counts shards


def test_streamed_sample_without_its_duration_fails_alone(tmp_path):
    """A sample whose sidecar lacks the duration field (or holds no duration there) fails per on_error,
    named with its shard, its name and the field; the others are batched."""
    files = [write_tone(tmp_path / "src" / f"u{i}.wav", seconds=0.1, sample_rate=8000) for i in range(6)]
    manifest = tmp_path / "manifest.csv"
    manifest.write_text("path,seconds\n" + "".join(f"{f},{'' if i == 2 else 0.1}\n" for i, f in enumerate(files)),
                        encoding="utf-8", newline="\n")
    index = pack(manifest, tmp_path / "out", shard_size=6_000, progress=False)
    spec = _pattern(tmp_path / "out", index)
    ds = _by_duration(spec, on_error="skip")
    got = sorted(n for b in ds for n in _names(b))
    assert got == sorted(f.name for i, f in enumerate(files) if i != 2)
    stats = ds.stats()
    assert (stats.items, stats.yielded, stats.failed) == (6, 5, 1)
    (failure,) = stats.failures
    assert failure[1].endswith(".tar/u2.wav") and "'seconds'" in failure[2] and "''" in failure[2]
    with pytest.raises(SampleError, match=r"\.tar/u\d\.wav.*no duration.*'length'"):
        list(_by_duration(spec, duration_column="length"))


def test_isolated_loader_refuses_streamed_batches_by_duration(timed):
    out, index = timed
    from audiobuffer import IsolatedLoader

    with pytest.raises(ValueError, match="IsolatedLoader reads files or an index.*index.json"):
        IsolatedLoader(_pattern(out, index), _decode(), max_batch_seconds=BUDGET, duration_column="seconds")


# -- what a streamed epoch counts -----------------------------------------------------------------

@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("truncated", [False, True])
def test_streamed_counts_add_up(timed, tmp_path, batched, truncated):
    """Of streamed shards, ``items`` counts samples (as they stream) and ``shards`` the shards, so that
    ``yielded + failed == items`` holds there too, a shard cut short included."""
    out, index = timed
    spec, lost = _pattern(out, index), 0
    if truncated:
        _, members, cut = _truncated_copy(index, tmp_path)
        spec, lost = str(tmp_path / "shard-*.tar"), len(members) - cut
    kwargs = {"max_batch_seconds": BUDGET, "duration_column": "seconds"} if batched else {}
    ds = BufferedDataset(spec, _decode(), on_error="skip", num_producers=2, **kwargs)
    samples = [s for b in ds for s in b] if batched else list(ds)
    stats = ds.stats()
    assert stats.done and stats.yielded == len(samples) == TIMED - lost
    assert stats.failed == int(truncated)  # a cut shard: one failure for the rest of it
    assert stats.yielded + stats.failed == stats.items
    assert stats.shards == len(index.shards) and stats.resumed == 0
