import os

import pytest
from helpers import AUDIO_FORMATS, FSDD, wait_no_threads

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


@pytest.fixture(autouse=True)
def no_thread_left_alive():
    """Every test ends with no audiobuffer thread alive (within JOIN_TIMEOUT)."""
    yield
    alive = wait_no_threads()
    assert not alive, f"threads left alive: {alive}"
