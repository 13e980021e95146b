"""BufferedDataset reading from a real S3-compatible server (moto) on 127.0.0.1: shards by index and by
pattern, single files, folders and manifests by URL, resume, and named errors for what fails.

The server (the ``s3`` fixture, conftest.py) runs in a thread of the test process; faults come from a
proxy in front of it (the ``proxies`` fixture; storage_helpers.py).
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from helpers import make_corpus

from audiobuffer import (
    AudioDecoder,
    BufferedDataset,
    ResumeError,
    SampleError,
    Source,
    SourceError,
    StorageError,
)
from audiobuffer.options import DEFAULT_READ_BLOCK
from audiobuffer.sources import pack
from audiobuffer.sources.stream import ShardStream

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
from storage_helpers import BUCKET, FAST, MotoS3  # noqa: E402  (needs moto)

N = 30


@pytest.fixture(scope="module")
def remote(s3, tmp_path_factory):
    """30 tones uploaded as files (with a manifest of relative paths) and packed into shards with an index."""
    root = tmp_path_factory.mktemp("remote")
    files = make_corpus(root / "src", N, seconds=0.05)
    index = pack(root / "src", root / "out", shard_size=20_000, labels="parent", progress=False)
    base = s3.upload_dir(root / "out", BUCKET, "packed")
    names = {Path(f).relative_to(root / "src").as_posix(): f for f in files}
    for name, path in names.items():
        s3.put(BUCKET, f"files/{name}", Path(path).read_bytes())
    s3.put(BUCKET, "files/lists/train.csv",
           ("path,speaker\n" + "".join(f"../{name},s{i % 2}\n" for i, name in enumerate(sorted(names)))).encode())
    return base, index, names


def _names(samples) -> list[str]:
    return [s["path"].split(".tar/", 1)[1] if ".tar/" in s["path"] else s["path"].split("/files/", 1)[1]
            for s in samples]


def _decode():
    return AudioDecoder(sample_rate=8000)


def _pattern(base: str, index) -> str:
    return f"{base}/shard-{{000000..{len(index.shards) - 1:06d}}}.tar"


@pytest.mark.parametrize("kind", ["index", "pattern"])
def test_s3_shards_every_sample_once(s3, remote, kind):
    base, index, names = remote
    spec = f"{base}/index.json" if kind == "index" else _pattern(base, index)
    ds = BufferedDataset(spec, _decode(), shuffle=True, num_producers=8, labels=r"^(\d+)_",
                         storage_options=s3.options())
    assert len(ds) == N and ds.classes == ["0", "1", "2"]
    for epoch in range(2):
        ds.set_epoch(epoch)
        samples = list(ds)
        assert sorted(_names(samples)) == sorted(names)
        for s in samples:
            assert s["path"].startswith(base + "/shard-")
            assert s["label_name"] == Path(s["path"]).name.split("_")[0]
            assert s["audio"].equal(_decode()(str(names[_names([s])[0]]))["audio"])
    assert ds.stats().read_s > 0


def test_s3_streamed_labels_from_the_sidecars(s3, remote):
    base, index, _ = remote
    ds = BufferedDataset(_pattern(base, index), _decode(), labels="label", storage_options=s3.options())
    assert ds.classes == ["class0", "class1", "class2"]
    assert all(s["label_name"] == Path(s["path"]).parent.name for s in ds)


def test_s3_duration_batches_count_network_waits_as_read_time(s3, remote):
    base, _, names = remote
    ds = BufferedDataset(f"{base}/index.json", _decode(), max_batch_seconds=0.2, num_producers=4,
                         storage_options=s3.options())
    batches = list(ds)
    assert sorted(n for b in batches for n in _names(b)) == sorted(names)
    stats = ds.stats()
    assert stats.read_s > 0 and stats.batches == len(batches)


def test_s3_files_folders_and_manifests(s3, remote):
    _, _, names = remote
    options = s3.options()
    urls = [f"s3://{BUCKET}/files/{name}" for name in sorted(names)]
    by_list = BufferedDataset(urls, _decode(), labels="parent", storage_options=options)
    by_folder = BufferedDataset(f"s3://{BUCKET}/files", _decode(), labels="parent", storage_options=options)
    assert by_folder.source.paths == urls
    manifest = Source(f"s3://{BUCKET}/files/lists/train.csv", labels="speaker", storage_options=options)
    assert manifest.paths == urls  # "../class0/..." resolved against the manifest's URL
    by_manifest = BufferedDataset(manifest, _decode())
    for ds in (by_list, by_folder, by_manifest):
        samples = list(ds)
        assert sorted(_names(samples)) == sorted(names)
    assert {s["label_name"] for s in by_manifest} == {"s0", "s1"}


def test_s3_resume_by_index(s3, remote):
    base, _, names = remote
    spec, options = f"{base}/index.json", s3.options()
    ds = BufferedDataset(spec, _decode(), shuffle=True, num_producers=4, storage_options=options)
    it = iter(ds)
    first = [next(it) for _ in range(13)]
    state = ds.state_dict()
    it.close()
    resumed = BufferedDataset(spec, _decode(), shuffle=True, num_producers=4, storage_options=options)
    resumed.load_state_dict(state)
    assert sorted(_names(first) + _names(resumed)) == sorted(names)


def test_s3_yaml_with_storage_options(s3, remote, tmp_path):
    from audiobuffer.config import build_dataset, load_config

    base, _, names = remote
    opts = s3.options()
    config_file = tmp_path / "remote.yaml"
    config_file.write_text(
        "source:\n"
        f"  root: {base}/index.json\n"
        "  labels: label\n"
        "  storage_options:\n"
        f"    endpoint_url: {opts['endpoint_url']}\n"
        f"    key: {opts['key']}\n"
        f"    secret: {opts['secret']}\n"
        f"    client_kwargs: {{region_name: {opts['client_kwargs']['region_name']}}}\n"
        "decode: {sample_rate: 8000}\n"
        "buffer: {num_producers: 4}\n", encoding="utf-8")
    config = load_config(config_file)
    assert config.source.root == f"{base}/index.json"  # a URL is not resolved against the file's folder
    ds = build_dataset(config)
    assert sorted(_names(ds)) == sorted(names) and ds.classes == ["class0", "class1", "class2"]


# -- failures -------------------------------------------------------------------------------------

def test_s3_missing_objects_are_named(s3, remote, tmp_path):
    _, index, _ = remote
    options = s3.options()
    with pytest.raises(StorageError, match=r"'s3://audio/nowhere/index\.json'.*no such file"):
        BufferedDataset(f"s3://{BUCKET}/nowhere/index.json", _decode(), storage_options=options)
    base = s3.upload_dir(Path(index.shards[0]).parent, BUCKET, "holes")
    s3.client.delete_object(Bucket=BUCKET, Key="holes/shard-000002.tar")
    lost = [m for m in index.members if Path(m.shard).name == "shard-000002.tar"]
    by_index = BufferedDataset(f"{base}/index.json", _decode(), storage_options=options)
    with pytest.raises(SampleError, match=rf"member '[^']+' of '{base}/shard-000002\.tar': no such file") as info:
        list(by_index)
    cause = info.value.__cause__
    assert isinstance(cause, StorageError) and cause.attempts == 1 and cause.member in {m.member for m in lost}
    by_pattern = BufferedDataset(f"{base}/shard-{{000000..000003}}.tar", _decode(), storage_options=options,
                                 on_error="skip")
    samples = list(by_pattern)
    assert len(samples) == sum(Path(m.shard).name in {f"shard-{i:06d}.tar" for i in (0, 1, 3)}
                               for m in index.members)
    (failure,) = by_pattern.stats().failures
    assert failure[1] == f"{base}/shard-000002.tar" and "no such file" in failure[2]


@pytest.mark.parametrize("name", ["file:///etc/passwd", "s3://elsewhere/shard-000000.tar", "/shard-000000.tar",
                                  "../files/shard-000000.tar", "http://127.0.0.1:1/shard-000000.tar"])
def test_s3_index_naming_shards_outside_its_folder_is_refused(s3, remote, name):
    base, index, _ = remote
    data = json.loads(s3.client.get_object(Bucket=BUCKET, Key="packed/index.json")["Body"].read())
    data["shards"][0]["name"] = name
    for member in data["members"]:
        if member["shard"] == Path(index.shards[0]).name:
            member["shard"] = name
    url = s3.put(BUCKET, "elsewhere-index/index.json", json.dumps(data).encode())
    with pytest.raises(SourceError, match=r"index 's3://audio/elsewhere-index/index\.json' shard .* is outside the "
                                          r"folder 's3://audio/elsewhere-index'.*allow_outside=True"):
        Source(url, storage_options=s3.options())


def test_s3_manifest_naming_files_outside_its_bucket_is_refused_unless_allowed(s3, remote):
    _, _, names = remote
    first = sorted(names)[0]
    rows = [f"/files/{first}", f"../../files/{first}", "file:///etc/passwd", f"s3://elsewhere/{first}"]
    for n, row in enumerate(rows):  # under a prefix no other test listed (s3fs caches listings)
        url = s3.put(BUCKET, f"confined/lists/{n}.csv", f"path\n{row}\n".encode())
        if n < 2:  # inside the bucket: a key from its root, or a path relative to the manifest
            assert Source(url, storage_options=s3.options()).paths == [f"s3://{BUCKET}/files/{first}"]
            continue
        with pytest.raises(SourceError, match=rf"manifest '{url}' row 1: '{row}' is outside the bucket or host "
                                              r"'s3://audio'; pass allow_outside=True to Source"):
            Source(url, storage_options=s3.options())
        assert Source(url, storage_options=s3.options(), allow_outside=True).paths == [row]


def test_s3_stopped_server_gives_named_errors(s3, remote):
    base, index, _ = remote
    server = MotoS3()  # a second server on another port, same objects (moto's state is per process)
    try:
        options = s3.options(server.endpoint)
        source = Source(f"{base}/index.json", storage_options=options, retry=FAST)
        stream = ShardStream(_pattern(base, index), storage_options=options, retry=FAST)
        assert len(stream) == N  # listed from the index while the server runs
    finally:
        server.stop()
    with pytest.raises(StorageError, match=r"'s3://audio/packed/index\.json'.*gave up after 3 tries"):
        len(ShardStream(_pattern(base, index), storage_options=options, retry=FAST))
    with pytest.raises(SampleError, match=r"member '.*' of 's3://audio/packed/shard-.*gave up after 3 tries") as info:
        list(BufferedDataset(source, _decode(), num_producers=2))
    assert info.value.__cause__.transient and info.value.__cause__.attempts == 3
    with pytest.raises(SampleError, match=r"'s3://audio/packed/shard-.*gave up after 3 tries"):
        list(BufferedDataset(stream, _decode(), num_producers=2))


@pytest.mark.parametrize("mode", ["503", "reset"])
@pytest.mark.parametrize("kind", ["index", "blocks", "pattern"])
def test_s3_transient_failures_mid_epoch_are_retried(s3, remote, proxies, kind, mode):
    base, index, names = remote
    proxy = proxies(faults={4, 6, 8} if kind == "blocks" else {4, 9, 15}, mode=mode)
    spec = _pattern(base, index) if kind == "pattern" else f"{base}/index.json"
    ds = BufferedDataset(spec, _decode(), num_producers=4, shuffle=True, read_block=4 if kind == "blocks" else None,
                         storage_options=s3.options(proxy.endpoint))
    samples = list(ds)
    assert sorted(_names(samples)) == sorted(names)
    assert proxy.faulted == 3 and ds.stats().failed == 0


def test_s3_truncated_shard_streamed(s3, remote):
    base, index, names = remote
    members = [m for m in index.members if m.shard == index.shards[0]]
    cut = members[1]
    data = Path(index.shards[0]).read_bytes()[:cut.offset + cut.size // 2]
    url = s3.put(BUCKET, "cut/shard-000000.tar", data)
    ds = BufferedDataset([url, *[f"{base}/{Path(s).name}" for s in index.shards[1:]]], _decode(),
                         storage_options=s3.options(), on_error="skip")
    got = _names(ds)
    assert sorted(got) == sorted(set(names) - {m.name for m in members[1:]})
    (failure,) = ds.stats().failures
    assert cut.member in failure[1] and "truncated" in failure[2]


def test_s3_by_index_one_ranged_request_per_member(s3, remote, proxies):
    """No read-ahead beyond the member and no listing: the index (s3fs: a HEAD and a GET), then one ranged
    GET per member."""
    base, _, names = remote
    proxy = proxies()
    ds = BufferedDataset(f"{base}/index.json", _decode(), num_producers=8, read_block=None,
                         storage_options=s3.options(proxy.endpoint))
    assert sorted(_names(ds)) == sorted(names)
    assert proxy.requests == 2 + N


def _block_count(index, block: int) -> int:
    """Blocks of ``block`` consecutive members of one shard (every shard's members packed back to back)."""
    per_shard = [sum(m.shard == shard for m in index.members) for shard in index.shards]
    return sum(-(-count // block) for count in per_shard)


@pytest.mark.parametrize("block", ["auto", 4, 64])
def test_s3_by_index_one_ranged_request_per_block(s3, remote, proxies, block):
    """Blocks of neighbouring members: one ranged GET a block, the same bytes as member reads, each member once."""
    base, index, names = remote
    proxy = proxies()
    ds = BufferedDataset(f"{base}/index.json", _decode(), num_producers=8, shuffle=True, read_block=block,
                         storage_options=s3.options(proxy.endpoint))
    samples = list(ds)
    assert sorted(_names(samples)) == sorted(names)
    for s in samples:
        assert s["audio"].equal(_decode()(str(names[_names([s])[0]]))["audio"])
    size = DEFAULT_READ_BLOCK if block == "auto" else block
    assert proxy.requests == 2 + _block_count(index, size) < 2 + N


@pytest.mark.parametrize("world_size", [1, 3])
def test_s3_blocks_resume_exactly_and_split_ranks(s3, remote, world_size):
    base, _, names = remote
    spec, options = f"{base}/index.json", s3.options()
    got = []
    for rank in range(world_size):
        setup = dict(shuffle=True, num_producers=4, read_block=4, storage_options=options, even_shards=None,
                     rank=rank, world_size=world_size)
        ds = BufferedDataset(spec, _decode(), **setup)
        it = iter(ds)
        first = [next(it) for _ in range(5)]
        state = ds.state_dict()
        it.close()
        resumed = BufferedDataset(spec, _decode(), **setup)
        resumed.load_state_dict(state)
        got += _names(first) + _names(resumed)
        with pytest.raises(ResumeError, match="read_block"):
            BufferedDataset(spec, _decode(), **{**setup, "read_block": None}).load_state_dict(state)
    assert sorted(got) == sorted(names)


def test_s3_a_block_that_fails_fails_each_of_its_members(s3, remote, proxies):
    base, index, names = remote
    proxy = proxies(faults=set(range(3, 200)), mode="403")  # the index reads, then nothing
    ds = BufferedDataset(f"{base}/index.json", _decode(), num_producers=8, shuffle=True, read_block=8,
                         on_error="skip", storage_options=s3.options(proxy.endpoint))
    assert list(ds) == []
    failures = ds.stats().failures
    assert ds.stats().failed == N and len({f[1] for f in failures}) == len(failures)
    assert all(f"{Path(f[1]).name}' of" in f[2] and "access denied" in f[2] for f in failures)
    assert proxy.requests == 2 + _block_count(index, 8)  # a refused block is not asked again per member


# -- bytes that are not the member's ---------------------------------------------------------------

def _tar(order: list[int]) -> bytes:
    """A tar of samples ``s{i:03d}`` (``.wav``: 900 bytes of its own, ``.cls``: ``i``) in ``order``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in order:
            for ext, payload in (("wav", bytes([i]) * 900), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def _read_cls_and_bytes(spec: str, options: dict, block: int | None) -> list[tuple[int, bytes]]:
    def decode(item) -> dict:
        return {"cls": item.fields["cls"], "data": item.read()}

    source = Source(spec, storage_options=options, retry=FAST)
    ds = BufferedDataset(source, decode, num_producers=2, read_block=block)
    return sorted((s["cls"], s["data"]) for s in ds)


@pytest.fixture(scope="module")
def indexed_tar(s3, tmp_path_factory):
    """``s3://audio/rewritten/shard-000000.tar`` (8 samples) and its index, made by ``index_shards``."""
    from audiobuffer.sources import index_shards

    base = f"s3://{BUCKET}/rewritten"
    s3.put(BUCKET, "rewritten/shard-000000.tar", _tar(list(range(8))))
    local = tmp_path_factory.mktemp("rewritten") / "index.json"
    index_shards(f"{base}/shard-000000.tar", local, storage_options=s3.options(), progress=False)
    s3.put(BUCKET, "rewritten/index.json", local.read_bytes())
    return base


@pytest.mark.parametrize("block", [None, 4])
def test_s3_a_shard_rewritten_under_its_index_is_refused(s3, indexed_tar, block):
    spec = f"{indexed_tar}/index.json"
    truth = [(i, bytes([i]) * 900) for i in range(8)]
    assert _read_cls_and_bytes(spec, s3.options(), block) == truth
    s3.put(BUCKET, "rewritten/shard-000000.tar", _tar(list(range(8))[::-1]))  # the same size, another order
    try:
        with pytest.raises(SampleError) as caught:
            _read_cls_and_bytes(spec, s3.options(), block)
    finally:
        s3.put(BUCKET, "rewritten/shard-000000.tar", _tar(list(range(8))))
    assert isinstance(caught.value.__cause__, StorageError)
    assert f"{indexed_tar}/shard-000000.tar" in str(caught.value.__cause__)
    assert "audiobuffer index" in str(caught.value.__cause__)


@pytest.mark.parametrize("block", [None, 4])
def test_s3_a_range_answered_from_the_wrong_offset_is_refused(s3, indexed_tar, proxies, block):
    spec = f"{indexed_tar}/index.json"
    proxy = proxies(shift=1024)  # the length asked for, 1024 bytes further on
    with pytest.raises(SampleError) as caught:
        _read_cls_and_bytes(spec, s3.options(proxy.endpoint), block)
    assert isinstance(caught.value.__cause__, StorageError)
    assert "does not hold member 's00" in str(caught.value.__cause__)
    assert proxy.requests > 1


def test_pack_lists_a_remote_folder_with_its_storage_options(s3, remote, tmp_path):
    _, _, names = remote
    index = pack(f"s3://{BUCKET}/files", tmp_path / "out", shard_size=20_000, progress=False,
                 storage_options=s3.options())
    assert sorted(Path(m.name).name for m in index.members) == sorted(Path(n).name for n in names)
