import os

import pytest
from helpers import AUDIO_FORMATS, FSDD, isolated_leftovers, wait_no_threads

# CI sets this so that missing shared data fails the run instead of skipping tests.
REQUIRE_SHARED = os.environ.get("AUDIOBUFFER_REQUIRE_SHARED_DATA") == "1"


def _need(path, what):
    if path.is_dir():
        return path
    reason = f"{what} not found at {path} (it lives in ../shared beside the repository)"
    if REQUIRE_SHARED:
        pytest.fail(reason + "; AUDIOBUFFER_REQUIRE_SHARED_DATA=1 makes this a failure")
    pytest.skip(reason)


@pytest.fixture
def fsdd():
    """The 3000 real FSDD recordings."""
    return _need(FSDD, "the FSDD recordings")


@pytest.fixture
def audio_formats():
    """Real files in many formats, some malformed, with MANIFEST.tsv."""
    return _need(AUDIO_FORMATS, "the audio_formats collection")


def pytest_sessionstart(session):
    """audioread looks for its backends once per process by starting programs (``ldconfig``,
    ``ffmpeg -version``): done before any test (in each worker), so that a test whose decoder falls
    back to librosa on a bad file does not start them, whatever ran before it in its worker."""
    try:
        import audioread
    except ImportError:
        return
    audioread.available_backends()


@pytest.fixture(autouse=True)
def no_thread_left_alive():
    """Every test ends with no audiobuffer thread alive (within JOIN_TIMEOUT)."""
    yield
    alive = wait_no_threads()
    assert not alive, f"threads left alive: {alive}"


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on 127.0.0.1 (one per test module) with the bucket ``storage_helpers.BUCKET``."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from storage_helpers import BUCKET, MotoS3

    server = MotoS3()
    try:
        server.make_bucket(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxies(s3):
    """A factory of fault proxies (``storage_helpers.FaultProxy``) in front of the S3 server; all are
    stopped at teardown."""
    from storage_helpers import FaultProxy

    made = []

    def make(**kwargs):
        proxy = FaultProxy((s3.host, s3.port), **kwargs)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()


@pytest.fixture
def no_helper_left_behind(monkeypatch):
    """The test ends with no child process and none of its isolated loaders' shared-memory segments."""
    with isolated_leftovers(monkeypatch):
        yield


# Markers for running the suite in part (CONTRIBUTING.md): each test gets them from its module or
# the fixtures it uses, so a new test in a module is marked without a decorator.
#: Modules whose tests start processes (the helper, torchrun, the command line, scripts).
SUBPROCESS_MODULES = {
    "test_isolated", "test_helper_process", "test_channel", "test_distributed", "test_train_audio",
    "test_train_image", "test_nodes", "test_start_in_trainer", "test_bench_command",
    "test_benchmark_scripts", "test_packaging", "test_init", "test_device", "test_docs",
    "test_torch_free", "test_helper_warm_up",
}
#: Modules that are slow as a whole (benchmark smoke runs, every example of the docs).
SLOW_MODULES = {
    "test_bench_command", "test_benchmark_scripts", "test_docs", "test_train_audio", "test_demo",
}
#: Fixtures of tests that start a helper process or the command in a process of its own, wherever
#: their module is.
SUBPROCESS_FIXTURES = {"no_helper_left_behind", "cli_process"}
#: Fixtures that start a server on the loopback address.
NETWORK_FIXTURES = {"s3", "proxies"}


def pytest_collection_modifyitems(config, items):
    """Mark each test (see above), then put the slow ones first: run in parallel (pytest-xdist), the
    long tests then start early instead of leaving one worker busy at the end while the others wait.
    The order is the same in every worker, as pytest-xdist requires."""
    for item in items:
        module = item.module.__name__ if item.module is not None else ""
        if module in SUBPROCESS_MODULES or SUBPROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.subprocess)
        if module in SLOW_MODULES or item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.slow)
        if NETWORK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.network)
        needs_cuda = any("CUDA" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))
        if needs_cuda or item.get_closest_marker("cuda") is not None:
            item.add_marker(pytest.mark.gpu)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the rest keep order
