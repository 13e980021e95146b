"""audiobuffer/sources/storage.py, and shards read from a real S3-compatible server (moto) on 127.0.0.1.

The server runs in a thread of the test process for the module; every test uploads what it needs
under a prefix of its own. Faults come from a proxy in front of the server (storage_helpers.py).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import REPO, make_corpus, open_descriptors

from audiobuffer import Source
from audiobuffer.errors import AudioBufferError, DecodeError, SourceError, StorageError
from audiobuffer.sources import ShardStream, iter_shard, pack, read_index, stream_shards
from audiobuffer.sources.storage import (
    MAX_EXPANSION,
    Retry,
    Storage,
    as_retry,
    expand_braces,
    expand_urls,
    is_transient,
    is_url,
    open_stream,
    read_bytes,
    read_range,
    sibling,
    size,
)

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
from storage_helpers import BUCKET, FAST, FaultProxy, HttpFiles, MotoS3, SilentServer  # noqa: E402  (needs moto)

# The s3 (a moto server with the bucket BUCKET, one per module) and proxies fixtures: conftest.py.


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """30 short tones in 3 class folders, packed into shards of about 10 files each."""
    root = tmp_path_factory.mktemp("corpus")
    files = make_corpus(root / "src", 30, seconds=0.1)
    out = root / "packed"
    index = pack(root / "src", out, shard_size=30_000, labels="parent", progress=False)
    assert len(index.shards) >= 3
    originals = {Path(f).relative_to(root / "src").as_posix(): Path(f).read_bytes() for f in files}
    return out, index, originals


def _upload(s3, packed, prefix: str) -> str:
    out, _, _ = packed
    return s3.upload_dir(out, BUCKET, prefix)


# -- names ---------------------------------------------------------------------------------------

def test_expand_braces_ranges_keep_zero_padding():
    assert expand_braces("shard-{000000..000003}.tar") == [f"shard-{i:06d}.tar" for i in range(4)]
    assert expand_braces("{8..11}") == ["8", "9", "10", "11"]
    assert expand_braces("{3..1}") == ["3", "2", "1"]
    assert expand_braces("{-1..1}") == ["-1", "0", "1"]
    assert expand_braces("{09..11}") == ["09", "10", "11"]


def test_expand_braces_lists_groups_and_nesting():
    assert expand_braces("{train,test}-{0..1}.tar") == ["train-0.tar", "train-1.tar", "test-0.tar", "test-1.tar"]
    assert expand_braces("a{b,{1..2}}c") == ["abc", "a1c", "a2c"]
    assert expand_braces("x{,y}") == ["x", "xy"]
    assert expand_braces("s3://b/no-braces.tar") == ["s3://b/no-braces.tar"]


@pytest.mark.parametrize("pattern", ["a{1..3", "a}1{", "a{x..y}", "a{}", "{1..2}}"])
def test_expand_braces_rejects_malformed(pattern):
    with pytest.raises(ValueError, match="brace pattern"):
        expand_braces(pattern)


def test_expand_braces_refuses_huge_expansions():
    with pytest.raises(ValueError, match=str(MAX_EXPANSION)):
        expand_braces(f"{{0..{MAX_EXPANSION}}}")
    with pytest.raises(ValueError, match=str(MAX_EXPANSION)):
        expand_braces("{0..999}{0..9999}")
    with pytest.raises(TypeError):
        expand_braces(3)


def test_sibling_resolves_against_the_folder():
    assert sibling("s3://b/x/index.json", "shard-000000.tar") == "s3://b/x/shard-000000.tar"
    assert sibling("s3://b/x/y/list.csv", "../a.wav") == "s3://b/x/a.wav"
    assert sibling("s3://b/x/list.csv", "/top/a.wav") == "s3://b/top/a.wav"
    assert sibling("s3://b/x/list.csv", "gs://other/a.wav") == "gs://other/a.wav"
    assert sibling(os.path.join("data", "index.json"), "s.tar") == os.path.join("data", "s.tar")
    with pytest.raises(ValueError, match="leaves the bucket"):
        sibling("s3://b/list.csv", "../a.wav")


def test_is_url():
    assert is_url("s3://b/k") and is_url("https://h/x") and is_url("simplecache::s3://b/k")
    assert not is_url("/data/x.wav") and not is_url(r"C:\data\x.wav") and not is_url("rel/x.wav")


def test_retry_policy_validates_and_backs_off():
    policy = Retry(attempts=4, base_delay=0.5, max_delay=1.5)
    assert [policy.delay(k) for k in (1, 2, 3)] == [0.5, 1.0, 1.5]
    assert as_retry(None) == Retry()
    assert as_retry({"attempts": 2}) == Retry(attempts=2)
    with pytest.raises(ValueError, match="attempts"):
        Retry(attempts=0)
    with pytest.raises(TypeError, match="attempts"):
        Retry(attempts="5")
    with pytest.raises(ValueError, match="base_delay"):
        Retry(base_delay=-1)
    with pytest.raises(ValueError, match="unknown keys"):
        as_retry({"tries": 3})


# -- local files: no fsspec ----------------------------------------------------------------------

def test_local_reads(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 4)
    assert read_bytes(path) == path.read_bytes()
    assert read_range(path, 10, 5) == path.read_bytes()[10:15]
    assert read_range(str(path), 0, 0) == b""
    assert size(path) == 1024
    with open_stream(path) as f:
        assert f.read() == path.read_bytes()


@pytest.mark.skipif(not hasattr(os, "pread"), reason="POSIX pread: the ranged path that loops on short reads")
def test_local_ranged_read_gathers_short_preads(tmp_path, monkeypatch):
    """A pread may return fewer bytes than asked (FUSE, network file systems): the rest is read on."""
    from audiobuffer.sources import storage

    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 4)
    calls = []

    def short_pread(fd, n, offset):
        calls.append(n)
        return os.pread(fd, min(n, 7), offset)

    monkeypatch.setattr(storage, "_PREAD", short_pread)
    assert read_range(path, 3, 50) == path.read_bytes()[3:53]
    assert len(calls) == 8  # 7 bytes a call: 50 bytes in 8 reads
    with pytest.raises(StorageError, match="ends early"):  # short, then the end of the file
        read_range(path, 1020, 10)


def test_local_missing_file_fails_at_once_named(tmp_path):
    missing = tmp_path / "nope.tar"
    with pytest.raises(StorageError, match="nope.tar.*no such file") as info:
        read_range(missing, 0, 10, member="a.wav", retry=FAST)
    assert info.value.attempts == 1 and not info.value.transient
    assert info.value.url == str(missing) and info.value.member == "a.wav"
    assert "'a.wav'" in str(info.value)
    assert isinstance(info.value, OSError) and isinstance(info.value, AudioBufferError)


def test_local_short_read_names_member(tmp_path):
    path = tmp_path / "s.tar"
    path.write_bytes(b"x" * 100)
    with pytest.raises(StorageError, match=r"member 'k\.wav'.*ends early.*90\.\.110.*10 read"):
        read_range(path, 90, 20, member="k.wav")


def test_storage_error_pickles():
    err = StorageError("boom", url="s3://b/k", member="m.wav", attempts=3, transient=True)
    copy = pickle.loads(pickle.dumps(err))
    assert (str(copy), copy.url, copy.member, copy.attempts, copy.transient) == ("boom", "s3://b/k", "m.wav", 3, True)


@pytest.mark.subprocess
def test_importing_needs_no_fsspec(tmp_path):
    """``import audiobuffer`` and local shards work where fsspec cannot be imported."""
    out = tmp_path / "p"
    make_corpus(tmp_path / "src", 4)
    code = (
        "import sys; sys.modules['fsspec'] = None\n"  # any import of fsspec now fails
        "import audiobuffer, audiobuffer.sources.storage, audiobuffer.sources as s\n"
        f"index = s.pack({str(tmp_path / 'src')!r}, {str(out)!r}, shard_size=10**6, progress=False)\n"
        "assert len(list(s.stream_shards(index.shards))) == 4\n"
        "assert all(m.reader()() for m in index.members)\n"
        "try:\n"
        "    audiobuffer.sources.storage.read_bytes('s3://b/k')\n"
        "except audiobuffer.StorageError as exc:\n"  # one line, as every error of the CLI
        "    assert 'audiobuffer[remote]' in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('no StorageError')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# -- what counts as transient --------------------------------------------------------------------

def _client_error(status: int, code: str):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "x"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


def test_is_transient_classifies_what_s3fs_botocore_and_aiohttp_raise():
    import aiohttp
    from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError
    from fsspec.exceptions import FSTimeoutError

    wrapped = OSError(5, "Service Unavailable")  # what s3fs makes of a 503 ClientError
    wrapped.__cause__ = _client_error(503, "503")
    assert is_transient(wrapped)
    assert is_transient(_client_error(500, "InternalError"))
    assert is_transient(_client_error(429, "SlowDown"))
    assert is_transient(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert is_transient(ConnectionClosedError(endpoint_url="http://127.0.0.1:1"))
    assert is_transient(ReadTimeoutError(endpoint_url="http://127.0.0.1:1"))
    assert is_transient(aiohttp.ServerDisconnectedError())
    assert is_transient(aiohttp.ClientPayloadError("cut"))
    assert is_transient(ConnectionResetError(104, "reset"))
    assert is_transient(FSTimeoutError())
    assert is_transient(TimeoutError())
    forbidden = OSError(5, "Forbidden")
    forbidden.__cause__ = _client_error(403, "403")
    assert not is_transient(forbidden)
    assert not is_transient(_client_error(404, "NoSuchKey"))
    assert not is_transient(FileNotFoundError("k"))
    assert not is_transient(PermissionError("k"))
    assert not is_transient(ValueError("bad"))


# -- S3: reading every member exactly once -------------------------------------------------------

def test_s3_by_pattern_reads_every_member_once(s3, packed):
    out, index, originals = packed
    base = _upload(s3, packed, "pattern")
    last = len(index.shards) - 1
    urls = expand_urls(f"{base}/shard-{{000000..{last:06d}}}.tar")
    assert urls == [f"{base}/shard-{i:06d}.tar" for i in range(last + 1)]
    seen = {}
    for sample in stream_shards(urls, shuffle=8, seed=3, storage_options=s3.options(), retry=FAST):
        assert sample.name not in seen
        seen[sample.name] = sample
    assert set(seen) == set(originals)
    for name, sample in seen.items():
        assert sample.data == originals[name]
        assert sample.path.startswith(base + "/shard-") and sample.path.endswith("/" + name)
        assert sample.meta["label"] == name.split("/")[0]


def test_s3_glob_lists_shards(s3, packed):
    _, index, _ = packed
    base = _upload(s3, packed, "glob")
    assert expand_urls(f"{base}/shard-*.tar", storage_options=s3.options()) == [
        f"{base}/shard-{i:06d}.tar" for i in range(len(index.shards))]
    with pytest.raises(SourceError, match="matches no file"):
        expand_urls(f"{base}/nothing-*.tar", storage_options=s3.options())


def test_s3_by_index_reads_every_member_by_range(s3, packed):
    _, _, originals = packed
    base = _upload(s3, packed, "index")
    index = read_index(f"{base}/index.json", storage_options=s3.options(), retry=FAST)
    assert all(shard.startswith(base + "/shard-") for shard in index.shards)
    got = {m.name: m.reader(storage_options=s3.options(), retry=FAST)() for m in index.members}
    assert got == originals
    assert [m.name for m in index.members] == sorted(originals)


@pytest.mark.shared_data
def test_s3_fsdd_by_index_and_pattern(s3, fsdd, tmp_path):
    """Real recordings: packed, uploaded, read back by index and by pattern, each exactly once."""
    files = sorted(fsdd.glob("*.wav"))[::25]  # 120 recordings of every speaker and digit
    index = pack(files, tmp_path / "p", shard_size=200_000, labels=r"^(\d+)_", progress=False)
    base = s3.upload_dir(tmp_path / "p", BUCKET, "fsdd")
    remote = read_index(f"{base}/index.json", storage_options=s3.options())
    originals = {f.name: f.read_bytes() for f in files}
    assert {m.name: m.reader(storage_options=s3.options())() for m in remote.members} == originals
    assert {m.label for m in remote.members} == {str(d) for d in range(10)}
    urls = expand_urls(f"{base}/shard-{{000000..{len(index.shards) - 1:06d}}}.tar")
    streamed = [(s.name, s.data) for s in stream_shards(urls, storage_options=s3.options())]
    assert sorted(streamed) == sorted(originals.items())


def test_s3_decode_member_from_bytes(s3, packed):
    from audiobuffer import AudioDecoder, WorkItem

    out, _, _ = packed
    base = _upload(s3, packed, "decode")
    index = read_index(f"{base}/index.json", storage_options=s3.options())
    decode = AudioDecoder(sample_rate=8000)
    member = index.members[4]
    sample = decode(WorkItem(index=4, path=member.path, read=member.reader(storage_options=s3.options())))
    local = read_index(out / "index.json").members[4]
    expected = decode(WorkItem(index=4, path=local.path, read=local.reader()))
    assert sample["audio"].equal(expected["audio"]) and sample["path"] == member.path


# -- S3: failures --------------------------------------------------------------------------------

def test_s3_missing_object_fails_at_once_named(s3, proxies):
    proxy = proxies()
    options = s3.options(proxy.endpoint)
    url = f"s3://{BUCKET}/missing/shard-000000.tar"
    with pytest.raises(StorageError, match=r"'s3://audio/missing/shard-000000\.tar'.*no such file") as info:
        read_range(url, 0, 100, storage_options=options, retry=FAST, member="a.wav")
    assert info.value.attempts == 1 and not info.value.transient and info.value.member == "a.wav"
    assert proxy.requests == 1  # one GET: no retry by us, s3fs or botocore
    with pytest.raises(StorageError, match="no such file"):
        list(iter_shard(url, storage_options=options, retry=FAST))
    with pytest.raises(StorageError, match="no such file"):
        read_index(f"s3://{BUCKET}/missing/index.json", storage_options=options, retry=FAST)
    with pytest.raises(StorageError, match="no such file"):
        read_bytes("s3://no-such-bucket/x.tar", storage_options=options, retry=FAST)


def test_s3_forbidden_fails_at_once_named(s3, proxies):
    key = s3.put(BUCKET, "forbidden/a.bin", b"abc" * 100)
    proxy = proxies(faults=range(1, 1000), mode="403")
    with pytest.raises(StorageError, match=r"'s3://audio/forbidden/a\.bin'.*(403|access denied)") as info:
        read_range(key, 0, 10, storage_options=s3.options(proxy.endpoint), retry=FAST)
    assert info.value.attempts == 1 and not info.value.transient
    assert proxy.requests == 1


def test_s3_stopped_server_gives_named_error_after_retries(s3):
    server = MotoS3()  # a second server on another port: same objects (moto's state is per process)
    try:
        options = s3.options(server.endpoint)
        url = s3.put(BUCKET, "stopped/a.bin", b"payload")
        assert read_bytes(url, storage_options=options, retry=FAST) == b"payload"
    finally:
        server.stop()
    with pytest.raises(StorageError, match=r"'s3://audio/stopped/a\.bin'.*gave up after 3 tries") as info:
        read_range(url, 0, 3, storage_options=options, retry=FAST, member="m.wav")
    assert info.value.attempts == 3 and info.value.transient
    assert "member 'm.wav'" in str(info.value)
    assert "Could not connect" in str(info.value)


@pytest.mark.parametrize("mode", ["503", "reset"])
def test_s3_transient_failures_are_retried(s3, proxies, mode):
    data = bytes(range(256)) * 64
    url = s3.put(BUCKET, f"flaky-{mode}/a.bin", data)
    proxy = proxies(faults={1, 2}, mode=mode)
    assert read_range(url, 100, 1000, storage_options=s3.options(proxy.endpoint), retry=FAST) == data[100:1100]
    assert proxy.faulted == 2 and proxy.requests == 3


@pytest.mark.parametrize("mode", ["503", "reset"])
def test_s3_transient_failures_give_up_after_the_attempts(s3, proxies, mode):
    url = s3.put(BUCKET, f"down-{mode}/a.bin", b"x" * 100)
    proxy = proxies(faults=range(1, 1000), mode=mode)
    with pytest.raises(StorageError, match=r"'s3://audio/down-.*gave up after 3 tries") as info:
        read_range(url, 0, 10, storage_options=s3.options(proxy.endpoint), retry=FAST, member="k.wav")
    assert info.value.attempts == 3 and info.value.transient and info.value.member == "k.wav"
    # aiohttp resends an idempotent request once by itself when its connection is reset (RFC 9112 9.3.1)
    assert proxy.requests == (3 if mode == "503" else 6)
    if mode == "503":
        assert "HTTP 503" in str(info.value)


# -- HTTP: fsspec's HTTP filesystem ----------------------------------------------------------------

@pytest.fixture
def http(packed):
    """The packed shards served over HTTP on 127.0.0.1, byte ranges honoured (one server per test: the
    thread check of conftest.py sees its threads end)."""
    out, _, _ = packed
    with HttpFiles(out) as server:
        yield server


@pytest.mark.parametrize("mode", ["500", "reset"])
def test_http_streamed_shard_survives_failures_of_its_first_requests(http, packed, mode):
    """fsspec's HTTP filesystem reports a size it could not learn (a 500, a reset) as FileNotFoundError,
    the failure chained as its cause: that is transient and retried, not a missing shard."""
    _, index, originals = packed
    name = Path(index.shards[0]).name
    expected = {m.name for m in index.members if m.shard == index.shards[0]}
    # the first tries at the shard's size fail whole (HEAD, then GET; aiohttp resends one reset request)
    with FaultProxy(("127.0.0.1", http.port), faults=range(1, 5), mode=mode) as proxy:
        samples = list(iter_shard(f"{proxy.endpoint}/{name}", retry=Retry(attempts=6, base_delay=0.001)))
        assert proxy.faulted == 4
    assert {s.name for s in samples} == expected and all(s.data == originals[s.name] for s in samples)


def test_http_missing_object_fails_at_once(http):
    with FaultProxy(("127.0.0.1", http.port)) as proxy:
        with pytest.raises(StorageError, match=r"nowhere\.tar'.*no such file") as info:
            list(iter_shard(f"{proxy.endpoint}/nowhere.tar", retry=FAST))
    assert info.value.attempts == 1 and not info.value.transient


def test_a_server_that_ignores_ranges_is_named(packed):
    out, index, _ = packed
    member = index.members[1]
    with HttpFiles(out, ranges=False) as server:
        url = server.url(Path(member.shard).name)
        with pytest.raises(StorageError, match=rf"member '{member.member}' of '{url}': the server answered a request "
                                               rf"for bytes {member.offset}\.\.{member.offset + member.size} with "
                                               r"\d+ bytes: it ignores HTTP range requests") as info:
            read_range(url, member.offset, member.size, member=member.member, retry=FAST)
    assert "ends early" not in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("url", "needs"), [("gs://bucket/index.json", "gcsfs"),
                                            ("nosuchscheme://bucket/index.json", "nosuchscheme")])
def test_a_url_fsspec_cannot_read_is_one_storage_error(url, needs):
    """No traceback for a scheme fsspec does not know, or whose package is not installed."""
    if needs == "gcsfs" and importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed")
    with pytest.raises(StorageError, match=rf"cannot read '{url}'.*{needs}") as info:
        read_bytes(url)
    assert isinstance(info.value, AudioBufferError) and "\n" not in str(info.value)
    with pytest.raises(StorageError, match=rf"cannot read '{url}'"):
        Source(url)


def test_a_missing_file_is_transient_only_through_its_cause():
    import aiohttp

    def wrapped(cause, *, explicit=True):
        try:
            try:
                raise cause
            except Exception as exc:
                if explicit:
                    raise FileNotFoundError("http://h/x") from exc
                raise FileNotFoundError("http://h/x")  # noqa: B904 - an implicit context on purpose
        except FileNotFoundError as exc:
            return exc

    def status(code):
        return aiohttp.ClientResponseError(None, (), status=code)

    assert is_transient(wrapped(status(500))) and is_transient(wrapped(aiohttp.ServerDisconnectedError()))
    assert not is_transient(wrapped(status(404))) and not is_transient(wrapped(ValueError("x")))
    assert not is_transient(wrapped(status(500), explicit=False))  # raised while handling: not its cause
    assert not is_transient(FileNotFoundError("x"))


# -- a store that accepts connections and never answers ------------------------------------------

def _silent_url(server, scheme: str) -> tuple[str, dict | None]:
    if scheme == "http":
        return f"{server.endpoint}/data/index.json", None
    return "s3://audio/data/index.json", {"endpoint_url": server.endpoint, "key": "k", "secret": "s",
                                          "client_kwargs": {"region_name": "us-east-1"}}


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_a_store_that_never_answers_fails_each_try_after_the_timeout(scheme):
    """Each try gives up after Retry.timeout without an answer (the HTTP clients' own waits are minutes),
    so reads give up after the attempts, whether made by a producer or while the source is listed."""
    retry = Retry(attempts=2, base_delay=0.01, timeout=0.3)
    with SilentServer() as server:
        url, options = _silent_url(server, scheme)
        with pytest.raises(StorageError, match=r"'.*index\.json'.*gave up after 2 tries") as info:
            read_range(url, 0, 10, storage_options=options, retry=retry)
        assert info.value.transient and info.value.attempts == 2
        with pytest.raises(StorageError, match="gave up after 2 tries"):
            Source(url, storage_options=options, retry=retry)  # the index is read as the source is made
        assert server.connections >= 4


def test_the_timeout_reaches_each_client_unless_the_options_set_one():
    from audiobuffer.sources.storage import _make_filesystem

    class Recorder:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    s3 = _make_filesystem(Recorder, "s3", {"config_kwargs": {"read_timeout": 99}}, 5.0).kwargs["config_kwargs"]
    assert (s3["connect_timeout"], s3["read_timeout"]) == (5.0, 99)
    http = _make_filesystem(Recorder, "https", {}, 5.0).kwargs["client_kwargs"]["timeout"]
    assert (http.total, http.sock_connect, http.sock_read) == (None, 5.0, 5.0)
    gcs = _make_filesystem(Recorder, "gs", {}, 5.0).kwargs["requests_timeout"]
    assert (gcs.total, gcs.sock_connect, gcs.sock_read) == (None, 5.0, 5.0)
    assert "client_kwargs" not in _make_filesystem(Recorder, "https", {}, None).kwargs


def test_a_source_holds_its_storage_options_and_retry_as_one_storage(tmp_path, packed):
    make_corpus(tmp_path / "src", 3, seconds=0.05)
    retry = Retry(attempts=2, timeout=3.0)
    storage = Storage.of({"anon": True}, {"attempts": 2, "timeout": 3.0})
    assert storage == Storage({"anon": True}, retry) and storage.timeout == 3.0
    assert pickle.loads(pickle.dumps(storage)) == storage
    source = Source(tmp_path / "src", storage_options={"anon": True}, retry=retry)
    assert source.storage == storage
    assert (source.storage_options, source.retry) == ({"anon": True}, retry)
    assert source.subset([0]).storage is source.storage
    assert Source(tmp_path / "src").storage == Storage() == Storage(None, Retry())
    out, _, _ = packed
    stream = ShardStream(str(out / "shard-*.tar"), storage_options={"anon": True}, retry=retry)
    assert stream.storage == storage
    assert (stream.storage_options, stream.retry) == ({"anon": True}, retry)
    with pytest.raises(TypeError, match="storage_options must be a mapping of fsspec options"):
        Source(tmp_path / "src", storage_options=["anon"])
    with pytest.raises(TypeError, match="retry must be a Retry, a mapping of its fields or None"):
        Storage.of(None, 3)


def test_retry_timeout_is_checked():
    assert Retry().timeout == 30.0 and as_retry({"timeout": 5}).timeout == 5.0
    assert Retry(timeout=None).timeout is None  # the HTTP client's own defaults
    with pytest.raises(ValueError, match="retry timeout must be None or a number of seconds > 0"):
        Retry(timeout=0)
    with pytest.raises(TypeError, match="retry timeout"):
        Retry(timeout="30")


def test_s3_streaming_survives_failures_mid_shard(s3, packed, proxies):
    """Requests failing in the middle of streamed shards are retried: every sample still comes once."""
    _, index, originals = packed
    base = _upload(s3, packed, "stream-faults")
    proxy = proxies(faults={3, 4, 9, 15, 16}, mode="503")
    options = s3.options(proxy.endpoint)
    urls = [f"{base}/{Path(shard).name}" for shard in index.shards]
    samples = []
    for url in urls:  # 4 KiB blocks: each shard takes several ranged requests
        samples.extend(iter_shard(url, storage_options=options, retry=FAST, block_size=4096))
    assert proxy.faulted == 5
    assert {s.name: s.data for s in samples} == originals and len(samples) == len(originals)


def test_s3_concurrent_index_reads_with_failures(s3, packed, proxies):
    """Threads reading members by range at once, with some requests failing and retried."""
    _, _, originals = packed
    base = _upload(s3, packed, "concurrent")
    faults = set(range(2, 42, 5))  # 8 failing requests: 10 tries always get one through
    proxy = proxies(faults=faults, mode="503")
    options = s3.options(proxy.endpoint)
    retry = Retry(attempts=10, base_delay=0.001, max_delay=0.005)
    index = read_index(f"{base}/index.json", storage_options=options, retry=retry)
    with ThreadPoolExecutor(8, thread_name_prefix="audiobuffer-test-reader") as pool:
        got = list(pool.map(lambda m: (m.name, m.reader(storage_options=options, retry=retry)()), index.members))
    assert dict(got) == originals and len(got) == len(originals)
    assert proxy.faulted == len(faults)  # 32 requests at least, plus one per fault: every fault was hit


def test_s3_truncated_shard_yields_members_before_the_cut(s3, packed):
    out, index, _ = packed
    first = index.members[0].shard
    shard_members = [m for m in index.members if m.shard == first]
    cut_member = shard_members[3]
    data = Path(first).read_bytes()[:cut_member.offset + cut_member.size // 2]
    url = s3.put(BUCKET, "truncated/shard-000000.tar", data)
    got = []
    with pytest.raises(DecodeError, match=rf"'{url}' is truncated.*member '{cut_member.member}'"):
        for sample in iter_shard(url, storage_options=s3.options(), retry=FAST):
            got.append(sample.name)
    assert got == [m.name for m in shard_members[:3]]


@pytest.mark.skipif(not hasattr(os, "pread") or not os.path.isdir("/proc/self/fd"), reason="POSIX pread, Linux /proc")
def test_local_ranged_reads_keep_files_open_per_thread_and_close_them_with_it(tmp_path):
    import threading

    from audiobuffer.sources import storage

    paths = []
    for i in range(storage.OPEN_PER_THREAD + 5):
        paths.append(tmp_path / f"{i}.bin")
        paths[-1].write_bytes(bytes([i]) * 10)
    assert open_descriptors(tmp_path) == 0
    seen = {}

    def work():
        for path in paths:
            assert read_range(path, 2, 3) == bytes([int(path.stem)]) * 3
        seen["open"] = open_descriptors(tmp_path)
        paths[-1].write_bytes(b"\x07" * 4)  # truncated in place: the descriptor kept open sees it
        try:
            read_range(paths[-1], 2, 3)
        except StorageError as exc:
            seen["error"] = str(exc)

    thread = threading.Thread(target=work, name="audiobuffer-test-reader")
    thread.start()
    thread.join(10)
    assert seen["open"] == storage.OPEN_PER_THREAD  # the least recently used were closed
    assert "ends early" in seen["error"]
    assert open_descriptors(tmp_path) == 0  # and the rest with the thread


@pytest.mark.skipif(not hasattr(os, "pread"), reason="POSIX pread: files are kept open only there")
def test_a_file_replaced_between_epochs_is_read_anew_by_a_thread_that_lives_on(tmp_path):
    from audiobuffer.sources import storage

    storage.close_kept_files()  # what earlier tests left open in this thread
    path = tmp_path / "shard.bin"
    path.write_bytes(b"old-bytes")
    assert read_range(path, 0, 3) == b"old"  # this (the consumer's) thread keeps the file open
    replacement = tmp_path / "new.bin"
    replacement.write_bytes(b"new-bytes")
    os.replace(replacement, path)
    assert read_range(path, 0, 3) == b"old"  # the kept descriptor still reads the replaced file
    linux = os.path.isdir("/proc/self/fd")
    assert not linux or open_descriptors(tmp_path) == 1  # the replaced file, kept open
    storage.close_kept_files()  # what each epoch's pool does in the consuming thread as it is made
    assert not linux or open_descriptors(tmp_path) == 0  # closed at once
    assert read_range(path, 0, 3) == b"new"


@pytest.mark.skipif(not hasattr(os, "pread"), reason="POSIX pread: files are kept open only there")
def test_an_index_shard_replaced_between_epochs_is_read_anew_when_decoding_inline(tmp_path):
    from audiobuffer import BufferedDataset
    from audiobuffer.sources import pack

    files = []
    for i in range(8):
        files.append(tmp_path / "in" / f"{i}.bin")
        files[-1].parent.mkdir(exist_ok=True)
        files[-1].write_bytes(b"A%d" % i)
    pack(files, tmp_path / "packed", shard_size=1 << 20, patterns=["*.bin"], progress=False)
    ds = BufferedDataset(str(tmp_path / "packed" / "index.json"), lambda item: item.read(),
                         patterns=["*.bin"])  # 8 items: the tuner never leaves the consumer's thread
    assert sorted(ds) == [b"A%d" % i for i in range(8)]
    assert ds.stats().num_producers == 0
    shard = next((tmp_path / "packed").glob("*.tar"))
    data = shard.read_bytes().replace(b"A", b"B")
    shard.with_suffix(".new").write_bytes(data)
    os.replace(shard.with_suffix(".new"), shard)
    assert sorted(ds) == [b"B%d" % i for i in range(8)]
